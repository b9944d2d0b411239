"""Lesson 06: waiting for a lease someone else holds.

:func:`herd`: a crowd of contenders wakes when the lease is released (no
backoff, full-jitter backoff, or a watch queue that wakes one at a time).
:func:`stale_watch`: a watcher reconnects to a buffered notification and must
recheck before acting. :func:`version_wait`: a protocol that compares no
clocks (:class:`~labkit.mechanisms.timing.VersionLease`) still needs the fence. Import
them from :mod:`labkit.scenarios`.

Example:
    >>> from labkit.scenarios import herd
    >>> herd(protected=False, contenders=20).verdict
    'none: 20 contenders made 152 attempts and 152 wake-ups for 8 grants'
    >>> herd(contenders=20).verdict
    'watch: 20 contenders made 9 attempts and 10 wake-ups for 9 grants'
"""

from __future__ import annotations

from labkit.db import execute, transaction
from labkit.errors import BadArgument
from labkit.sim.engine import scenario
from labkit.sim.steps import amount, with_tokens, write_with_token
from labkit.mechanisms.timing import VersionLease, backoff
from labkit.sim.worker import LEASE
from labkit.errors import check_number

__all__ = ["herd", "stale_watch", "version_wait"]

_STRATEGIES = ("none", "jitter", "watch")


@scenario
def herd(
    sim,
    *,
    protected,
    contenders=100,
    strategy="watch",
    hold=1.0,
    poll=1.0,
    base=0.5,
    cap=8.0,
    horizon=8.0,
    ttl=10.0,
):
    """Lesson 06: ``contenders`` wake up when the lease is released; how many attempts and wake-ups?

    H holds the lease until t=1 and releases it; every contender then wants it,
    and each winner holds it ``hold`` s and releases. Contenders give up
    ``horizon`` s after the first release. Every attempt is a real
    ``try_acquire`` on the authority. Unprotected (``"none"``): no backoff,
    every loser retries every ``poll`` s in lockstep. Protected, ``strategy``:
    ``"jitter"`` (losers sleep :func:`~labkit.mechanisms.timing.backoff`, full jitter,
    ``base``/``cap``) or ``"watch"`` (contenders queue; each release wakes only
    the next one). The counts are in ``tables["herd"]`` (one row) and
    ``tables["herd_seconds"]`` (attempts and wake-ups per second).

    Knobs:
        contenders: how many want the lease (1 .. 5000). strategy: ``"jitter"`` or ``"watch"``.
        hold: how long each winner holds (s). poll: the no-backoff retry interval (s).
        base, cap: the backoff's first and largest window (s). horizon: how long contenders try (s).
        ttl: the lease's length (s).
    """
    n = check_number(contenders, "contenders", integer=True, low=1, high=5000)
    if strategy not in _STRATEGIES[1:]:
        raise BadArgument("strategy", f"must be 'jitter' or 'watch', got {strategy!r}")
    hold, poll = (
        check_number(hold, "hold", positive=True),
        check_number(poll, "poll", positive=True),
    )
    base, cap = check_number(base, "base", positive=True), check_number(cap, "cap", positive=True)
    horizon, ttl = check_number(horizon, "horizon"), check_number(ttl, "ttl", positive=True)
    used = strategy if protected else "none"
    authority, env, rng = sim.authority, sim.env, sim.rng
    released = 1.0
    stats = {"attempts": 0, "wakeups": 0, "grants": 0}
    seconds: dict[int, list[int]] = {}
    queue: list = []  # watch: waiting contenders, in arrival order
    holder = {"generation": None, "until": None}

    def count(what: str) -> None:
        stats[what] += 1
        seconds.setdefault(int(env.now), [0, 0])[what == "wakeups"] += 1

    def wake_next() -> None:
        if used == "watch" and queue:  # watch: a release wakes only the next in line
            count("wakeups")
            queue.pop(0).succeed()

    def hold_then_release(name: str, lease):
        yield env.timeout(hold)
        authority.release(lease)
        sim.record(name, "release", generation=lease.generation, target=LEASE)
        wake_next()

    def attempt(name: str):
        count("attempts")
        lease = authority.try_acquire(LEASE, name, ttl)
        if lease is None:
            sim.record(
                name,
                "acquire",
                "held",
                generation=holder["generation"],
                target=LEASE,
                until=holder["until"],
            )
            return None
        holder.update(generation=lease.generation, until=lease.expires_at)
        stats["grants"] += 1
        sim.record(
            name, "acquire", generation=lease.generation, target=LEASE, until=lease.expires_at
        )
        return lease

    def contender(name: str):
        yield env.timeout(released)
        tries = 0
        while env.now <= released + horizon:
            if used == "watch":
                woken = env.event()
                queue.append(woken)
                yield woken
            elif tries:
                yield env.timeout(
                    poll if used == "none" else backoff(tries - 1, base=base, cap=cap, rng=rng)
                )
            if env.now > released + horizon:
                return
            if tries or used != "watch":
                count("wakeups")
            tries += 1
            lease = attempt(name)
            if lease is not None:
                yield from hold_then_release(name, lease)
                return

    def first_holder(w):
        lease = yield from w.acquire(ttl)
        holder.update(generation=lease.generation, until=lease.expires_at)
        yield env.timeout(released)
        yield from w.release(lease)
        wake_next()

    def tally():
        yield env.timeout(released + horizon + hold + 1.0)
        db = sim.database("resource")
        with transaction(db):
            execute(
                db,
                "CREATE TABLE herd (strategy TEXT, contenders INTEGER, attempts INTEGER, "
                "wakeups INTEGER, grants INTEGER)",
            )
            execute(
                db,
                "INSERT INTO herd VALUES (?, ?, ?, ?, ?)",
                (used, n, stats["attempts"], stats["wakeups"], stats["grants"]),
            )
            execute(
                db, "CREATE TABLE herd_seconds (second INTEGER, attempts INTEGER, wakeups INTEGER)"
            )
            for second, (attempts, wakeups) in sorted(seconds.items()):
                execute(
                    db, "INSERT INTO herd_seconds VALUES (?, ?, ?)", (second, attempts, wakeups)
                )

    sim.start(sim.worker("H"), first_holder)
    for i in range(n):
        env.process(contender(f"c{i + 1}"))
    env.process(tally())
    sim.layout.update({"herd": "resource", "herd_seconds": "resource"})

    def wording(history, violations, tables):
        row = tables["herd"][0]
        return (
            f"{used}: {row['contenders']} contenders made {row['attempts']} attempts and "
            f"{row['wakeups']} wake-ups for {row['grants']} grants"
        )

    return wording


@scenario
def stale_watch(sim, *, protected, outage=6.0, session=3.0):
    """Lesson 06: a watcher reconnects, receives a stale notification, and must recheck before acting.

    A queue lock: each contender joins with a number from the permanent counter
    (its fencing token) and a session kept alive by heartbeats; the holder is
    the lowest live number; each waiter watches its predecessor. A (7) holds,
    W (8) watches A, X (9) watches W. W's network drops at t=2 for ``outage``
    s: its session (``session`` s) expires, its entry is removed, and X moves
    up. A releases at t=6 and X takes over. When W reconnects it receives the
    buffered "A is gone". Unprotected, W takes that as its turn and writes with
    8 (no fence). Protected, W rechecks the queue, finds its entry gone, joins
    again and waits; writes go through the fence.

    Knobs:
        outage: how long W's network is down (s). session: a session's lifetime without heartbeats (s).
    """
    outage, session = (
        check_number(outage, "outage"),
        check_number(session, "session", positive=True),
    )
    db, env = sim.database("authority"), sim.env
    with transaction(db):
        execute(
            db,
            "CREATE TABLE waiters (seq INTEGER PRIMARY KEY, worker TEXT NOT NULL, "
            "session_until REAL NOT NULL)",
        )
    sim.layout["waiters"] = "authority"
    watchers: dict[int, list] = {}  # seq watched -> [(worker name, event)]
    offline: dict[str, list] = {}  # worker -> notifications buffered while offline

    def notify(seq: int) -> None:
        for name, event in watchers.pop(seq, []):
            if name in offline:
                offline[name].append(event)
            elif not event.triggered:
                event.succeed("live")

    def reaper():
        while env.now < 2.0 + outage + 12.0:
            with transaction(db):
                gone = execute(
                    db, "DELETE FROM waiters WHERE session_until <= ? RETURNING seq", (env.now,)
                )
            for (seq,) in gone:
                sim.record("authority", "notify", target=f"session of {seq} expired")
                notify(seq)
            yield env.timeout(0.5)

    def join(w) -> int:
        """Take the next number, enter the queue with a new session, and keep that session alive."""
        with transaction(db):
            seq = execute(
                db,
                "INSERT INTO lease_counter(name, generation) VALUES (?, 1) ON CONFLICT(name) "
                "DO UPDATE SET generation = generation + 1 RETURNING generation",
                (LEASE,),
            )[0][0]
            execute(db, "INSERT INTO waiters VALUES (?, ?, ?)", (seq, w.name, env.now + session))
        env.process(heartbeats(w, seq))
        return seq

    def heartbeats(w, seq):
        while True:
            if w.name not in offline:
                with transaction(db):
                    alive = execute(
                        db,
                        "UPDATE waiters SET session_until = ? WHERE seq = ? "
                        "AND session_until > ? RETURNING seq",
                        (env.now + session, seq, env.now),
                    )
                if not alive:
                    return
            yield env.timeout(1.0)

    def lower(seq: int):
        rows = execute(
            db, "SELECT max(seq) FROM waiters WHERE seq < ? AND session_until > ?", (seq, env.now)
        )
        return rows[0][0]

    def take_turn(w, invoices, work=1.0):
        seq = join(w)
        while True:
            if not execute(
                db, "SELECT 1 FROM waiters WHERE seq = ? AND session_until > ?", (seq, env.now)
            ):
                seq = join(w)  # our session expired: join again, with a new number
                continue
            before = lower(seq)
            if before is None:
                w.record(
                    "acquire", "ok", generation=seq, target=LEASE
                )  # lowest live number: our turn
                break
            event = env.event()
            watchers.setdefault(before, []).append((w.name, event))
            how = yield event
            sim.record(w.name, "notify", generation=seq, target=f"{before} is gone ({how})")
            if how == "replayed" and not protected:
                break  # a notification kept over the outage, taken as the turn
        w.read(list(invoices))
        for invoice in invoices:
            yield env.timeout(work)
            yield from write_with_token(w, invoice, amount(w, 100), seq, fenced=protected)
        with transaction(db):
            left = execute(db, "DELETE FROM waiters WHERE seq = ? RETURNING seq", (seq,))
        w.record("release", "ok" if left else "lost", generation=seq, target=LEASE)
        notify(seq)

    def network(w):
        yield env.timeout(2.0)
        offline[w.name] = []
        w.record("pause", target="network down", until=env.now + outage)
        yield env.timeout(outage)
        for event in offline.pop(w.name):
            if not event.triggered:
                event.succeed("replayed")
        w.record("resume", target="network back")

    a, w_, x = sim.worker("A"), sim.worker("W"), sim.worker("X")
    with_tokens(sim)
    env.process(reaper())
    sim.start(a, take_turn, ("INV-1", "INV-2"), work=3.0)
    sim.start(w_, take_turn, ("INV-1", "INV-2"), at=0.5)
    env.process(network(w_))
    sim.start(x, take_turn, ("INV-1", "INV-2", "INV-3"), at=1.0)


@scenario
def version_wait(sim, *, protected, pause=30.0, duration=10.0, heartbeat=3.0, offset=0.0):
    """Lesson 06: the version-wait protocol compares no clocks, and still needs the fence.

    :class:`~labkit.mechanisms.timing.VersionLease`: A claims (generation 7) and bumps the
    record's version every ``heartbeat`` s, until it pauses at t=4 for
    ``pause`` s. B observes the version, waits the record's ``duration`` on its
    own clock (``offset`` s away from everyone's: it does not matter) and
    claims only if the version did not move; else it observes again. A wakes
    up and writes INV-1 with 7. Unprotected, writes are plain upserts and A's
    lands on B's run; protected, they go through the fence and A's bounces.

    Knobs:
        pause: A's stop (s). duration: the lease duration stored in the record (s).
        heartbeat: A's version bumps (s). offset: B's clock offset (s).
    """
    pause, duration = (
        check_number(pause, "pause"),
        check_number(duration, "duration", positive=True),
    )
    heartbeat, offset = (
        check_number(heartbeat, "heartbeat", positive=True),
        check_number(offset, "offset"),
    )
    setup = VersionLease(sim.database("authority"), sim.clock)
    for n in range(6):  # six earlier holders, each released
        setup.release(setup.claim(setup.observe(LEASE), f"earlier-{n + 1}", duration=duration))
    sim.layout["version_leases"] = "authority"

    def run_a(w):
        leases = VersionLease(w.connection("authority"), w.clock)
        mine = leases.claim(leases.observe(LEASE), "A", duration=duration)
        w.record("acquire", generation=mine.generation, target=LEASE)
        w.read(["INV-1"])
        beats = [t for t in (heartbeat * k for k in range(1, 100)) if t < 4.0]
        for t in beats:  # alive and working until t=4
            yield w.env.timeout(t - w.env.now)
            mine = leases.heartbeat(mine)
            w.record("renew", generation=mine.generation, target=LEASE)
        yield w.env.timeout(4.0 - w.env.now)
        yield from w.pause(pause, "gc")
        yield from write_with_token(w, "INV-1", amount(w, 100), mine.generation, fenced=protected)
        alive = leases.heartbeat(mine)
        w.record("renew", "ok" if alive else "lost", generation=mine.generation, target=LEASE)
        if alive:
            w.record(
                "release",
                "ok" if leases.release(alive) else "lost",
                generation=mine.generation,
                target=LEASE,
            )

    def run_b(w):
        leases = VersionLease(w.connection("authority"), w.clock)
        while True:
            seen = leases.observe(LEASE)
            if not leases.ready(seen):
                yield w.env.timeout(seen.duration - leases.waited(seen))
            mine = leases.claim(seen, "B", duration=duration)
            if mine is not None:
                break
            w.record("acquire", "held", generation=seen.generation, target=LEASE)
        w.record("acquire", generation=mine.generation, target=LEASE)
        if protected:
            yield from w.raise_fence(mine.generation)
        w.read(["INV-1", "INV-2"])
        for invoice in ("INV-1", "INV-2"):
            yield w.env.timeout(1.0)
            yield from write_with_token(
                w, invoice, amount(w, 200), mine.generation, fenced=protected
            )
        released = leases.release(mine)
        w.record("release", "ok" if released else "lost", generation=mine.generation, target=LEASE)

    with_tokens(sim)
    sim.start(sim.worker("A"), run_a)
    sim.start(sim.worker("B", offset=offset), run_b, at=0.5)
