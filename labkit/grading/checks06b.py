"""Grading check of exercise 06, task 06.3 (registered in :mod:`labkit.grading`).

* 06.3 the version-wait protocol: B claims A's lease only after a whole unchanged duration,
  with one conditional UPDATE, and waits again from a fresh read after its wait dropped.

The judge's world runs on its own clock; the answer sees it only through ``wait``. A claim is
a steal if the record's holder showed a sign of life (a heartbeat) less than one stored
duration before it: both then believe they hold the lease. Where the first call rightly claims
nothing, A stops and the answer is called again: a safe answer must still claim, in time.
"""

from __future__ import annotations

import math
import re
from random import Random

from labkit.clock import VirtualClock
from labkit.db import execute
from labkit.grading import Schedule, expect_all, hostile, task
from labkit.grading.lab import Tracer, scratch
from labkit.mechanisms.timing import VersionLease
from labkit.sim.history import Event

TOL = 1e-9  # relative: a wait of exactly the duration is a full one
LIMIT = 12  # the judge stops a call that waits more than this many durations in all
ROWS = "SELECT name, owner, generation, version, duration FROM version_leases ORDER BY name"
WRITE = re.compile(r"\s*(UPDATE|INSERT|REPLACE)\b", re.IGNORECASE)
READ = re.compile(r"\s*SELECT\b.*\bversion_leases\b", re.IGNORECASE | re.DOTALL)
STORIES = ("quiet", "live", "race", "drop_live", "drop_dies")
LIVE = ("live", "drop_live")  # A goes on heartbeating


class _World:
    """A's heartbeats on the judge's connection, and the contender's ``wait``."""

    def __init__(self, leases, mine, clock, history, d: float) -> None:
        self.leases, self.mine, self.clock, self.history, self.d = leases, mine, clock, history, d
        self.signs: list[tuple] = []  # A's heartbeats: (time, landed, injected, at statement)
        self.beats: list[float] = []  # when A heartbeats while the call runs
        self.drop_at, self.alive, self.tracer = None, True, None
        self.start()

    def start(self) -> None:
        """A new call: nothing waited, nothing claimed yet."""
        self.run = self.total = self.asked = 0.0
        self.claim, self.dropped, self.calls, self.t0 = None, 0, 0, self.clock.now()

    def beat(self, injected: bool = False) -> bool:
        """A heartbeats: the version moves if A still holds the record."""
        now, at = self.clock.now(), len(self.tracer.sql) if self.tracer else 0
        try:
            new = self.leases.heartbeat(self.mine)
            outcome = "ok" if new else "lost"
        except Exception:  # noqa: BLE001 -- busy: B's transaction holds the write lock
            new, outcome = None, "busy"
        self.signs.append((now, new is not None, injected, at))
        self.mine, self.alive = new or self.mine, outcome != "lost"
        g = self.mine.generation
        self.history.append(Event(now, "A", "renew", outcome, g, target=self.mine.name))
        return new is not None

    def look(self) -> None:
        """Note when the judge first sees the record taken from A."""
        if self.claim is None:
            sql = ROWS.replace("ORDER BY", "WHERE name = ? ORDER BY")
            row = execute(self.leases.db, sql, (self.mine.name,))
            if row and row[0][1:3] != ("A", self.mine.generation):
                t = self.clock.now()
                self.claim = {"t": t, "run": self.run, "dropped": self.dropped, "asked": self.asked}
                self.claim["steal"] = any(  # a busy heartbeat at the claim's instant came after
                    0 <= t - s < self.d * (1 - TOL) and (ok or t > s) for s, ok, *_ in self.signs
                )  # it: the claim held the lock
                self.history.append(Event(t, "B", "acquire", "ok", row[0][2], target=row[0][0]))

    def wait(self, seconds) -> bool:
        """Wait ``seconds`` on B's clock: True if the connection stayed up all the while."""
        self.look()
        ok = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
        if not ok or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"wait() takes a number of seconds, got {seconds!r}")
        self.calls, start = self.calls + 1, self.clock.now()
        if self.total + seconds > LIMIT * self.d or self.calls > 200:
            raise RuntimeError(f"the judge stops a call that waits past {LIMIT} durations")
        self.asked, end = max(self.asked, seconds), start + seconds
        cut = self.drop_at is not None and start <= self.drop_at < end
        stop = self.drop_at if cut else end
        self.history.append(Event(start, "B", "wait", "ok", until=stop))
        while self.alive and self.beats and self.beats[0] <= stop:
            self.clock.advance(max(0.0, self.beats.pop(0) - self.clock.now()))
            self.beat()
        self.clock.advance(max(0.0, stop - self.clock.now()))
        self.total += stop - start
        if cut:
            self.drop_at, self.run, self.dropped = None, 0.0, self.dropped + 1
            self.history.append(Event(stop, "B", "response", "lost", target="connection"))
        else:
            self.run += seconds
        return not cut

    def call(self, answer, db, name: str) -> dict:
        """Call the answer once; what it did: its result, claim, waits and drops."""
        got = answer(db, name, "B", wait=lambda seconds: self.wait(seconds))
        self.look()
        if self.claim is None and self.total:
            self.history.append(Event(self.clock.now(), "B", "acquire", "held", target=name))
        moved = any(ok and not inj and s > self.t0 for s, ok, inj, _ in self.signs)
        c = self.claim or {}
        return {
            "got": got,
            "c": self.claim,
            "steal": c.get("steal"),
            "run": c.get("run", 0.0),
            "dropped": self.dropped,
            "moved": moved,
        }


def _knobs(rng: Random) -> dict:
    return {
        "story": rng.choice(STORIES),
        "duration": rng.choice([1.5, 3.0, 5.0, 10.0, 20.0, 45.0, 90.0]),
        "beat": rng.uniform(0.6, 0.97),  # A's heartbeat interval, in durations
        "phase": rng.uniform(0.05, 0.99),  # A's next heartbeat, in intervals
        "drop": rng.uniform(0.1, 0.45),  # when B's first wait drops, in durations
        "quiet": rng.uniform(0.0, 0.6),  # how long A has been silent, in durations
        "inject_at": rng.randrange(1, 6),
    }


VERSION_HOSTILE = hostile(
    "story duration beat phase drop quiet inject_at each",
    ("A died just after its last heartbeat", "quiet", 10.0, 0.9, 0.5, 0.3, 0.05, 0),
    ("A is dead; the stored duration is 2 s", "quiet", 2.0, 0.9, 0.5, 0.3, 0.0, 0),
    ("A heartbeats during B's wait", "live", 10.0, 0.9, 0.95, 0.3, 0.0, 0),
    ("A heartbeats late in a 60 s duration", "live", 60.0, 0.95, 0.97, 0.3, 0.0, 0),
    ("B's wait drops; A is alive, its next heartbeat still to come", "drop_live", 10.0, 0.9,
     0.9, 0.4, 0.0, 0),
    ("A heartbeats, then B's wait drops; A is alive", "drop_live", 20.0, 0.85, 0.3, 0.4, 0.0, 0),
    ("A's last heartbeat lands just before B's wait drops", "drop_dies", 10.0, 0.9, 0.3, 0.35,
     0.0, 0),
    ("A heartbeats just before the claim's 1st statement", "race", 10.0, 0.9, 0.5, 0.3, 0.1, 1),
    ("A heartbeats just before the claim's 2nd statement", "race", 5.0, 0.9, 0.5, 0.3, 0.2, 2),
    ("A heartbeats just before the claim's 3rd statement, and each later one", "race", 10.0,
     0.9, 0.5, 0.3, 0.0, 3, "inject_at"),
)  # fmt: skip


@task(
    "06.3",
    "the version-wait protocol",
    VERSION_HOSTILE,
    count=16,
    make=_knobs,
    returns=(int, type(None)),
    properties={
        "claims": "a lease quiet for a whole duration is claimed: generation and version bumped, "
        "the new generation returned",
        "full duration": "the claim comes only after waiting the record's whole stored duration",
        "unchanged version": "a heartbeat during the wait (a moved version) stops the claim",
        "race": "a heartbeat between the claim's statements stops it: one conditional UPDATE",
        "reconnect": "after a dropped wait it reads the record again and waits a whole duration",
    },
)
def version_wait_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 06.3: ``answer(db, name, me, *, wait) -> new generation | None``."""
    rng, k, story = schedule.rng, schedule.knobs, schedule.knobs["story"]
    d = round(k["duration"] * rng.uniform(0.9, 1.1), 3)
    h = k["beat"] * d
    name = rng.choice(["invoice-run", "report", "nightly"]) + f"-{rng.randrange(100)}"
    with scratch() as tmp:
        db, other = tmp.open(), tmp.open()
        clock = VirtualClock(2 * d)  # the run starts at 0: A acquired a little earlier
        leases = VersionLease(other, clock)
        for i in range(rng.randrange(0, 6)):  # earlier holders: a generation nobody can guess
            leases.release(leases.claim(leases.observe(name), f"earlier-{i}", duration=d))
        leases.claim(leases.observe("archive"), "C", duration=d)  # a record that is not B's
        mine = leases.claim(leases.observe(name), "A", duration=d)
        for _ in range(rng.randrange(0, 4)):
            mine = leases.heartbeat(mine)
        world, t0, alive = _World(leases, mine, clock, history, d), clock.now(), story in LIVE
        p = k["phase"] * (h if story != "drop_dies" else k["drop"] * d)
        last = t0 + p - h if alive or story == "drop_dies" else t0 - k["quiet"] * d
        world.signs.append((last, True, False, 0))
        history.append(Event(last - d / 2, "A", "acquire", "ok", mine.generation, target=name))
        history.append(Event(last, "A", "renew", "ok", mine.generation, target=name))
        beats = int(LIMIT / k["beat"]) + 2 if alive else int(story == "drop_dies")
        world.beats = [t0 + p + n * h for n in range(beats)]
        world.drop_at = t0 + k["drop"] * d if story.startswith("drop") else None
        before, g, v = execute(other, ROWS), mine.generation, mine.version
        world.tracer = tracer = Tracer(db)
        if story == "race":
            tracer.before(k["inject_at"], lambda: _attempt(world))
        try:
            calls = [world.call(answer, db, name)]
            if calls[0]["c"] is None and story in (*LIVE, "race"):
                world.beats, world.drop_at, tracer.action = [], None, None  # A stops for good
                world.start()
                calls.append(world.call(answer, db, name))
        finally:
            db.conn.set_trace_callback(None)
        if alive and world.beats:  # A goes on: its next heartbeat
            clock.advance(max(0.0, world.beats[0] - clock.now()))
            world.beat()
        _judge(world, story, calls, before, execute(other, ROWS), g, v, name)


def _attempt(world: _World) -> bool:
    try:
        return world.beat(injected=True)
    except Exception:  # noqa: BLE001 -- the trace callback swallows it anyway
        return False


def _blame(world: _World, c: dict) -> str:
    """The property a steal breaks: waited too little, after a drop, or a heartbeat ignored
    (read after A's injected heartbeat, before the write: unchanged version; not read: race)."""
    full = world.d * (1 - TOL)
    if c["run"] < full:
        return "reconnect" if c["dropped"] and c["asked"] >= full else "full duration"
    injected = [s for s in world.signs if s[2] and s[1] and 0 <= c["t"] - s[0] < full]
    if not injected:
        return "unchanged version"
    rest = world.tracer.sql[injected[-1][3] - 1 :]
    first = next((i for i, sql in enumerate(rest) if WRITE.match(sql)), len(rest))
    return "unchanged version" if any(READ.match(sql) for sql in rest[:first]) else "race"


def _judge(world: _World, story: str, calls: list, before, after, g: int, v: int, name: str):
    d = world.d
    full = d * (1 - TOL)
    first, last = calls[0], calls[-1]
    row = next((r for r in after if r[0] == name), None)
    blamed = {_blame(world, x["c"]) for x in calls if x["steal"]}
    won = last["c"] is not None and not last["steal"]  # the last call claimed, in time
    checks = [
        (prop, prop not in blamed, RULES[prop], DETAILS[prop].format(d=d, ran=x["run"]), acted)
        for prop, acted, x in (
            ("full duration", won and last["run"] >= full, last),
            ("unchanged version", story in LIVE and first["moved"] and won, first),
            ("race", story == "race" and won, last),
            ("reconnect", story == "drop_live" and first["dropped"] and won, first),
        )
    ]
    if story == "drop_dies" and first["dropped"] and not first["steal"]:
        rule = (
            "after a dropped wait, B reads the record again, waits a whole quiet duration from "
            "there, and claims"
        )
        detail = f"B returned {first['got']!r}; A's last heartbeat came before the drop"
        checks.append(("reconnect", won, rule, detail, True))
    if story == "quiet":
        rule = "a lease whose holder stays quiet for a whole duration is claimed"
        detail = f"B returned {first['got']!r}, left {row}"
        checks.append(("claims", first["c"] is not None, rule, detail, True))
    unclaimed = "B returns None when it did not claim"
    for x in calls:
        if x["c"] is None:
            checks.append(
                ("claims", x["got"] is None, unclaimed, f"it returned {x['got']!r}", False)
            )
    if last["c"] is not None:
        got = last["got"]
        others = [r for r in after if r[0] != name] == [r for r in before if r[0] != name]
        owner = "a claim makes B the owner with the next generation (its fencing token)"
        moved = f"the version went from {world.mine.version} to {row[3]}"
        returned = f"it returned {got!r}; the record's generation is {row[2]}"
        changed = f"the other records went from {before} to {after}"
        claims = [
            (row[1] == "B" and row[2] == g + 1, owner, f"the record became {row}"),
            (row[3] > world.mine.version >= v, "a claim moves the version", moved),
            (got == row[2] and type(got) is int, "the claim returns the new generation", returned),
            (others, "a claim changes only the named lease's record", changed),
        ]
        checks += [("claims", ok, rule, detail, True) for ok, rule, detail in claims]
    expect_all(
        [(ok, rule, detail, prop) for prop, ok, rule, detail, acted in checks if acted or not ok]
    )


RULES = {
    "full duration": "the claim comes only after an unbroken wait of the record's whole stored "
    "duration since the read it compares with",
    "unchanged version": "a version that moved during the wait stops the claim (B returns None "
    "and leaves the record to A)",
    "race": "a heartbeat between the claim's statements stops the claim: one conditional "
    "UPDATE ... WHERE version = :seen decides",
    "reconnect": "after a dropped wait, B reads the record again and waits a whole duration "
    "from that read before it claims",
}
DETAILS = {
    "full duration": "B claimed after {ran:.6g} s of unbroken waiting; the duration is {d:g} s, "
    "and A heartbeated less than that before",
    "unchanged version": "B claimed although A heartbeated less than {d:g} s before",
    "race": "A heartbeated after B's last read of the record, and B overwrote it anyway",
    "reconnect": "B claimed {ran:.6g} s after its wait dropped, with A alive",
}
