"""Lesson 04 on a real Redis: a counter that hands out the same token twice after a failover.

A lease is ``SET lease NX PX ttl`` and its token ``INCR`` on a counter, in one script on the
primary. :func:`story` plays it on a throwaway primary and replica (``redis_pair``): token 6
is on the replica; the link stalls; A takes 7, which ``WAIT`` says no replica has; the primary
is SIGKILLed and the replica promoted; B takes 7 again, and the lease too, at once: the replica
never saw A's ``SET NX PX`` either, so two holders act at the same time. The fence at the
resource (SQLite) passes both, since equal tokens pass. With ``protected``, each primary also carries an epoch
from a durable authority (a SQLite row of its own), tokens are ``(epoch, counter)``, and A's
late ``(1, 7)`` is below B's ``(2, 7)``. Real time is read on purpose, through the clock.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from labkit.clock import RealClock, read_clock
from labkit.db import connect, ensure, ensure_schema, execute, rowcount, transaction
from labkit.engines.redis_pair import RedisPair, require
from labkit.engines.servers import PREFIX, Step
from labkit.errors import LabkitError, StaleGeneration, check_number
from labkit.fence import Fence, show

__all__ = ["RedisStory", "Step", "issue", "release", "story", "take_epoch"]

JOB = "invoice-run"
LEASE, COUNTER, EPOCH = (f"{kind}:{JOB}" for kind in ("lease", "token", "epoch"))
# the grant: the lease if free, then the token (the epoch this primary carries, 0 if none)
ACQUIRE = """if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end
return {tonumber(redis.call('GET', KEYS[3]) or '0'), redis.call('INCR', KEYS[2])}"""
RELEASE = """if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])"""
UPSERT = """INSERT INTO invoices VALUES ($1, $2, $3, $4) ON CONFLICT (job_id, invoice_id)
    DO UPDATE SET amount = excluded.amount, generation = excluded.generation"""
WAIT_MS = 10  # A's WAIT 1: the stalled link acknowledges nothing, however long it waits
EPOCHS = "CREATE TABLE redis_epochs (name TEXT PRIMARY KEY, epoch INTEGER NOT NULL)"


@dataclass(frozen=True, slots=True)
class RedisStory:
    """What :func:`story` saw: its ``steps``; the tokens A and B were granted; what ``WAIT 1``
    answered before the stall (``replicated``) and on A's connection after its grant
    (``waited``); each write at the resource as ``(who, invoice, token, "ok" | "rejected")``;
    the servers' pids (all stopped); seconds to start them and for the whole run; the
    ``version`` the primary reported (``INFO server``)."""

    protected: bool
    steps: tuple[Step, ...]
    a_token: object
    b_token: object
    replicated: int
    waited: int
    verdicts: tuple[tuple[str, str, object, str], ...]
    server_pids: tuple[int, ...]
    start_seconds: float
    total_seconds: float
    version: str = ""

    @property
    def reissued(self) -> bool:
        """Whether B was handed exactly A's token."""
        return self.a_token == self.b_token

    @property
    def overlap(self) -> tuple[float, float] | None:
        """``(when B was granted, when A's lease ends)`` if B got the lease while A's still ran:
        the promoted replica had never seen A's ``SET NX PX`` either (the lease is lost too)."""
        grants = {s.worker: s for s in self.steps if s.action == "acquire" and s.outcome == "ok"}
        a, b = grants.get("A"), grants.get("B")
        return (b.time, a.until) if a and b and b.time < a.until else None

    @property
    def text(self) -> str:
        """The story in a few lines."""
        seen = next(s.generation for s in self.steps if s.action == "replicated")
        writes = "; ".join(f"{w} {inv} with {t}: {v}" for w, inv, t, v in self.verdicts)
        if self.reissued:
            twice = f"✗ two holders with one token, {self.a_token}"
        else:
            twice = f"✓ B's {self.b_token} is above A's {self.a_token}"
        both = self.overlap and (
            f"✗ the lease was lost too: B was granted at t={self.overlap[0]:.2f} s while A's lease "
            f"ran to t={self.overlap[1]:.2f} s: two holders at once"
        )
        late = next((v for w, inv, _, v in self.verdicts if w == "A" and inv == "INV-2"), "")
        stopped = f"A's late write: {late}" + (
            " (the fence stopped it)" if late == "rejected" else ""
        )
        lines = [
            f"servers in sync in {self.start_seconds:.2f} s",
            f"the replica has token {seen}: WAIT 1 on the writer's connection → {self.replicated}",
            f"link stalled; A is granted {self.a_token}; WAIT 1 on A's connection → {self.waited}"
            " (WAIT only counts acknowledgements: it does not make Redis strongly consistent)",
            "primary SIGKILLed; replica promoted (REPLICAOF NO ONE)",
            f"B is granted {self.b_token} on the promoted replica",
            f"at the fenced resource: {writes}",
            twice,
            *([both] if both else []),
            stopped,
            f"the whole run took {self.total_seconds:.2f} s",
        ]
        return "\n".join(lines)


def issue(redis, owner: str, ttl: float):
    """Grant ``owner`` the lease for ``ttl`` s and return its token (an int in epoch 0, else
    ``(epoch, counter)``), or None if the lease is held."""
    got = redis.eval(ACQUIRE, 3, LEASE, COUNTER, EPOCH, owner, max(1, round(ttl * 1000)))
    return None if got is None else show(tuple(got))


def release(redis, owner: str) -> bool:
    """Delete the lease if ``owner`` holds it; return whether it did."""
    return bool(redis.eval(RELEASE, 1, LEASE, owner))


def take_epoch(db, name: str, seen: int) -> int:
    """Commit and return epoch ``seen + 1`` of ``name`` if ``seen`` is still its last epoch,
    else raise: of two promotions that saw the same epoch, one wins."""
    ensure_schema(db, "redis_epochs", EPOCHS)
    probe, add = (
        "SELECT 1 FROM redis_epochs WHERE name = $1",
        "INSERT INTO redis_epochs VALUES ($1, 0)",
    )
    ensure(db, probe, (name,), add, (name,))
    sql = "UPDATE redis_epochs SET epoch = $1 WHERE name = $2 AND epoch = $3"
    with transaction(db):
        if rowcount(db, sql, (seen + 1, name, seen)) != 1:
            raise LabkitError(f"epoch {seen} of {name!r} is not the last: someone took the next")
    return seen + 1


def story(
    protected: bool, *, ttl: float = 1.0, pause: float | None = None, clock=None
) -> RedisStory:
    """Start a primary and a replica, play the story, stop them on every path; return a
    :class:`RedisStory`. A pauses ``pause`` s after its first write (default 1.5 x ``ttl``, so
    it wakes after its lease). Raises MissingBinary without ``redis-server``."""
    ttl = check_number(ttl, "ttl", positive=True, high=60)
    pause = 1.5 * ttl if pause is None else check_number(pause, "pause", high=60)
    clock = RealClock() if clock is None else clock
    require()
    began = read_clock(clock)
    with contextlib.ExitStack() as stack:
        pair = stack.enter_context(RedisPair())
        start = read_clock(clock) - began
        pids = (pair.primary.process.pid, pair.replica.process.pid)
        folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-redis-run-"))
        stack.callback(shutil.rmtree, folder, True)
        dbs = []  # the fenced resource, and the durable authority of epochs
        for name in ("resource.db", "authority.db"):
            dbs.append(connect(str(folder / name)))
            stack.callback(dbs[-1].conn.close)
        play = _Play(pair, *dbs, clock, protected)
        stack.callback(play.close)
        play.run(ttl, pause)
    return RedisStory(
        protected=protected,
        steps=tuple(play.steps),
        a_token=play.tokens["A"],
        b_token=play.tokens["B"],
        replicated=play.replicated,
        waited=play.waited,
        verdicts=tuple(play.verdicts),
        server_pids=pids,
        start_seconds=start,
        total_seconds=read_clock(clock) - began,
        version=play.version,
    )


class _Play:
    """The story's steps, one connection each for the operator, A and B."""

    def __init__(self, pair: RedisPair, resource, authority, clock, protected: bool) -> None:
        self.pair, self.resource, self.authority = pair, resource, authority
        self.clock, self.protected, self.t0 = clock, protected, read_clock(clock)
        self.steps: list[Step] = []
        self.verdicts: list[tuple] = []
        self.tokens: dict = {}
        self.clients: list = []
        self.fence = Fence(resource, JOB)

    def now(self) -> float:
        return read_clock(self.clock) - self.t0

    def record(self, worker, action, outcome="ok", generation=None, target=None, until=None):
        self.steps.append(
            Step(self.now(), worker, action, outcome, generation, None, target, until)
        )

    def connect(self, server):
        self.clients.append(server.client())
        return self.clients[-1]

    def close(self) -> None:
        for client in self.clients:
            client.close()

    def run(self, ttl: float, pause: float) -> None:
        pair, epoch, beat = self.pair, 0, ttl / 10
        ops = self.connect(pair.primary)
        self.version = ops.info("server")["redis_version"]
        if self.protected:
            epoch = self.new_epoch(ops, 0, "the primary")
        for _ in range(6):  # six earlier holders
            ops.incr(COUNTER)
        for _ in range(10):  # the story needs the replica to have all six: on a loaded machine
            self.replicated = ops.wait(1, 1000)  # its acknowledgement can take over 1 s
            if self.replicated:
                break
        on_replica = int(pair.replica.admin.get(COUNTER) or 0)
        self.record("ops", "replicated", "ok", show((epoch, on_replica)), "the replica")
        pair.proxy.stall()
        self.record("ops", "stall", "ok", None, "replication link")
        a = self.connect(pair.primary)
        # From A's grant to B's, nothing waits: B must be granted while A's lease still runs,
        # and on a loaded machine every pause here eats that margin (WAIT's timeout is short
        # for that reason: with the link stalled it answers 0 however long it waits).
        self.acquire("A", a, ttl)
        self.waited = a.wait(1, WAIT_MS)
        self.record("A", "WAIT", f"{self.waited} replicas", self.tokens["A"], f"WAIT 1 {WAIT_MS}")
        self.read("A")
        self.write("A", "INV-1", 100)
        resume = self.now() + pause
        self.record("A", "pause", "ok", None, "after-write", until=resume)
        pair.kill_primary()
        self.record("ops", "kill", "ok", None, "primary, SIGKILL")
        pair.promote()
        self.record("ops", "promote", "ok", None, "replica: REPLICAOF NO ONE")
        b = self.connect(pair.replica)
        if self.protected:  # before any client is sent to the new primary
            self.new_epoch(b, 1, "the promoted replica")
        self.acquire("B", b, ttl)
        self.read("B")
        for invoice in ("INV-1", "INV-2"):
            time.sleep(2 * beat)
            self.write("B", invoice, 200)
        time.sleep(2 * beat)
        self.record("B", "release", "ok" if release(b, "B") else "lost", self.tokens["B"], JOB)
        time.sleep(max(0.0, resume - self.now()))
        self.record("A", "resume", "ok", None, "after-write")
        self.write("A", "INV-2", 100)
        a = self.connect(pair.replica)  # A's client, sent to the new primary
        self.record("A", "release", "ok" if release(a, "A") else "lost", self.tokens["A"], JOB)

    def new_epoch(self, redis, seen: int, where: str) -> int:
        epoch = take_epoch(self.authority, JOB, seen)
        redis.set(EPOCH, epoch)
        self.record("ops", "epoch", "ok", (epoch, 0), f"epoch {epoch} on {where}")
        return epoch

    def acquire(self, who: str, redis, ttl: float) -> None:
        """Take the lease, trying every tenth of ``ttl`` while it is held (for 3 x ``ttl``)."""
        for _ in range(30):
            sent = self.now()
            if (got := issue(redis, who, ttl)) is not None:
                self.tokens[who] = got
                return self.record(who, "acquire", "ok", got, JOB, until=sent + ttl)
            self.record(who, "acquire", "held", None, JOB)
            time.sleep(ttl / 10)
        raise LabkitError(f"{who} found the Redis lease held for {3 * ttl:g} s")

    def read(self, who: str) -> None:
        sql = "SELECT generation FROM invoices WHERE job_id = $1 AND invoice_id = $2"
        for invoice in ("INV-1", "INV-2"):
            rows = execute(self.resource, sql, (JOB, invoice))
            self.record(who, "read", "ok", rows[0][0] if rows else None, invoice)

    def write(self, who: str, invoice: str, amount: int) -> None:
        token = self.tokens[who]
        try:
            with self.fence.guard(token) as tx:
                tx.execute(UPSERT, (JOB, invoice, amount, tx.token[1]))
        except StaleGeneration:
            self.record(who, "write", "rejected", token, invoice)
        else:
            self.record(who, "raise", "ok", token, JOB)
            self.record(who, "write", "ok", token, invoice)
        self.verdicts.append((who, invoice, token, self.steps[-1].outcome))
