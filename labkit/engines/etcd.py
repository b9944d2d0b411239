"""Lesson 04 on a real etcd cluster: who issues the tokens, and where that stops working.

:func:`story`: A, B and C take turns at the lease (acquire, a fenced write, release; one lets
its lease expire), and the leader is SIGKILLed halfway: every token is above all before it.
:func:`restore_story`: the limit. Restored from a snapshot, the cluster issues a revision again,
and only the fence at the resource (a SQLite file in the run's folder) refuses the stale write.
Every step is recorded with real times (:class:`~labkit.engines.servers.Step`, one to one with
the checker's events).
Leases are :mod:`labkit.engines.etcd_leases`, the cluster :mod:`labkit.engines.etcd_cluster`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import dataclass

from labkit.clock import RealClock, read_clock
from labkit.db import connect
from labkit.engines.etcd_cluster import Cluster, LeaderKiller, require
from labkit.engines.etcd_leases import EtcdLease, EtcdLeases, authority
from labkit.engines.servers import PREFIX as FOLDERS, Step
from labkit.errors import Busy, LabkitError, StaleGeneration, check_number
from labkit.fence import Fence, unfenced

__all__ = ["Cluster", "EtcdLease", "EtcdLeases", "EtcdStory", "LeaderKiller", "RestoreStory"]
__all__ += ["Step", "authority", "demo", "require", "restore_story", "story"]

JOB, INVOICE = "invoice-run", "INV-1"  # labkit.sim's job (engines sit below sim)
UPSERT = """INSERT INTO invoices VALUES ($1, $2, $3, $4) ON CONFLICT (job_id, invoice_id)
    DO UPDATE SET amount = excluded.amount, generation = excluded.generation"""
_CLOCK = RealClock()  # a real-engine run: real time, read through the one clock protocol


class _Run:
    """A cluster, its issuer, a fenced SQLite file in a temp folder, and the steps so far."""

    def __init__(self, cluster: Cluster, folder: str) -> None:
        self.cluster, self.t0, self.steps = cluster, read_clock(_CLOCK), []
        self.leases = EtcdLeases(cluster.endpoints, _CLOCK)
        self.db = connect(f"{folder}/resource.db", busy_timeout_ms=2000)
        self.snapshot = f"{folder}/snapshot.db"

    def now(self) -> float:
        return read_clock(_CLOCK) - self.t0

    def note(self, who, action, outcome, generation=None, target=JOB, until=None, at=None):
        when = self.now() if at is None else at - self.t0
        self.steps.append(Step(when, who, action, outcome, generation, None, target, until))

    def acquire(self, who: str, ttl: int = 1) -> EtcdLease:
        """Acquire for ``who``, waiting out a holder, an election or an outage (10 s at most)."""
        deadline = self.now() + 10
        while self.now() < deadline:
            with contextlib.suppress(Busy):
                if lease := self.leases.try_acquire(JOB, who, ttl):
                    until = lease.expires_at - self.t0  # the grant's send time + ttl
                    self.note(who, "acquire", "ok", lease.generation, JOB, until, at=lease.since)
                    return lease
            time.sleep(0.02)
        raise LabkitError(f"{who} could not acquire {JOB!r} from etcd in 10 s")

    def write(self, who: str, token: int, amount: int, fenced: bool = True):
        """Write the invoice with ``token`` through the fence (or not); return the fence's
        StaleGeneration, or None if the write landed."""
        try:
            with Fence(self.db, JOB).guard(token) if fenced else unfenced(self.db, token) as tx:
                tx.execute(UPSERT, (JOB, INVOICE, amount, token))
        except StaleGeneration as refusal:
            self.note(who, "write", "rejected", token, INVOICE)
            return refusal
        if fenced:  # the guard raised the fence in the write's own transaction
            self.note(who, "raise", "ok", token)
        self.note(who, "write", "ok", token, INVOICE)
        return None

    def release(self, who: str, lease: EtcdLease) -> None:
        before = read_clock(_CLOCK)
        self.leases.release(lease)
        self.note(who, "release", "ok", lease.generation, at=before)


@contextlib.contextmanager
def _run(cluster: Cluster | None):
    """A run on ``cluster`` (None: a new one, stopped at the end) in a temp folder, removed at
    the end on every exit path."""
    prefix = f"{FOLDERS}{os.getpid()}-etcdrun-"
    with tempfile.TemporaryDirectory(prefix=prefix) as folder, contextlib.ExitStack() as stack:
        run = _Run(cluster or stack.enter_context(Cluster()), folder)
        stack.callback(run.db.conn.close)
        yield run


@dataclass(frozen=True, slots=True)
class EtcdStory:
    """What :func:`story` saw: the ``tokens`` issued, in order; the leader IDs ``before`` and
    ``after`` the kill, which came just before token number ``killed_before``; the holder whose
    lease ``expired`` (token); how long the cluster took to start (``started_in``) and the whole
    run (``seconds``); every ``step``; the ``version`` a member reported."""

    tokens: tuple[int, ...]
    before: str
    after: str
    killed_before: int
    expired: int
    started_in: float
    seconds: float
    steps: tuple[Step, ...]
    version: str = ""

    @property
    def increasing(self) -> bool:
        return all(a < b for a, b in zip(self.tokens, self.tokens[1:]))

    @property
    def text(self) -> str:
        k, ok = self.killed_before, "✓" if self.increasing else "✗"
        lines = [
            f"etcd, 3 members on 127.0.0.1, started in {self.started_in:.2f} s",
            f"tokens (create_revision): {' '.join(map(str, self.tokens[:k]))}",
            f"leader {self.before} SIGKILLed; {self.after} elected",
            f"tokens after the kill: {' '.join(map(str, self.tokens[k:]))}",
            f"the holder of {self.expired} let its lease expire; the next token was still higher",
            f"{ok} every token is above all before it ({len(self.tokens)} acquisitions, "
            + f"{self.seconds:.1f} s in all)",
        ]
        return "\n".join(lines)


def story(acquisitions: int = 20, *, ttl: int = 1, cluster: Cluster | None = None) -> EtcdStory:
    """Start a cluster (unless given one); A, B and C take turns: acquire, write through the
    fence, release (one lets its lease expire instead). Halfway, the leader is SIGKILLed, a new
    one verified, and the old one started again. Stop everything on every path (a given cluster
    stays up). Raises MissingBinary without etcd."""
    require()
    acquisitions = check_number(acquisitions, "acquisitions", integer=True, low=4, high=1000)
    began = read_clock(_CLOCK)
    with _run(cluster) as run:
        tokens, half, version = [], acquisitions // 2, run.cluster.version()
        for i in range(acquisitions):
            who = "ABC"[i % 3]
            if i == half:
                before, victim = run.cluster.kill_leader()
                run.note("etcd", "crash", "leader")
                after = run.cluster.wait_leader(other_than=before)
                victim.launch()  # it rejoins as a follower
            lease = run.acquire(who, ttl)
            tokens.append(lease.generation)
            run.write(who, lease.generation, 100 + i)
            if i == half - 2:  # no keepalive: etcd ends the lease, and the next waits for that
                expired = lease.generation
                continue
            run.release(who, lease)
        started = run.cluster.started_in
    seconds = read_clock(_CLOCK) - began
    return EtcdStory(
        tuple(tokens), before, after, half, expired, started, seconds, tuple(run.steps), version
    )


@dataclass(frozen=True, slots=True)
class RestoreStory:
    """What :func:`restore_story` saw: ``before`` the snapshot A's token; after it B's and C's
    (``issued``); after the restore D's ``reissued`` token; D's write ``refusal`` (None: it
    landed); the fence's token at the end (``fence``); ``seconds``; every ``step``; the
    ``version`` a member reported."""

    before: int
    issued: tuple[int, int]
    reissued: int
    refusal: StaleGeneration | None
    fence: int
    seconds: float
    steps: tuple[Step, ...]
    version: str = ""

    @property
    def text(self) -> str:
        again = self.reissued <= max(self.issued)
        lines = [
            f"A holds {self.before}; snapshot; B holds {self.issued[0]}, C holds {self.issued[1]}",
            "the cluster is restored from the snapshot",
            f"{'✓' if again else '✗'} D holds {self.reissued}: "
            + ("a token issued before, again" if again else "above every earlier token"),
            f"D writes with {self.reissued}: {self.refusal or 'its write LANDED'}",
            f"the fence holds {self.fence} ({self.seconds:.1f} s in all)",
        ]
        return "\n".join(lines)


def restore_story(*, fenced: bool = True, cluster: Cluster | None = None) -> RestoreStory:
    """The limit: A, snapshot, B and C, restore, D. D's token is one that B already had, below
    C's; the fence (``fenced``) refuses D's write, else it lands. Starts a cluster (unless given
    one, which it restores) and stops it at the end."""
    require()
    began = read_clock(_CLOCK)
    with _run(cluster) as run:
        tokens, version = [], run.cluster.version()
        for who in "ABC":
            if who == "B":
                run.cluster.snapshot(run.snapshot)
            lease = run.acquire(who)
            tokens.append(lease.generation)
            run.write(who, lease.generation, 100)
            run.release(who, lease)
        run.cluster.restore(run.snapshot)
        run.note("etcd", "crash", "restored")
        lease = run.acquire("D")
        refusal = run.write("D", lease.generation, 999, fenced)
        run.release("D", lease)
        fence = Fence(run.db, JOB).current()
    return RestoreStory(
        before=tokens[0],
        issued=tuple(tokens[1:]),
        reissued=lease.generation,
        refusal=refusal,
        fence=fence,
        seconds=read_clock(_CLOCK) - began,
        steps=tuple(run.steps),
        version=version,
    )


def demo() -> tuple[EtcdStory, RestoreStory] | None:
    """The lesson's ▶ button: play both stories and print them, or say what to install."""
    try:
        require()
    except LabkitError as missing:  # MissingBinary names the package; or no etcd3gw
        return print(f"✗ this demo needs etcd: {missing}")
    print((first := story()).text, "", (limit := restore_story()).text, sep="\n")
    return first, limit
