"""A simulated worker: its own SQLite connections, its own clock, its planned faults.

A locked database answers at once: the worker records a ``wait`` and retries after ``sim.tick``
virtual seconds, so the waiting drawn is the waiting SQLite imposed. Methods that take virtual
time are generators."""

import contextlib
from typing import Any, Callable, Iterable

from labkit.db import execute
from labkit.errors import Busy, LabkitError, LeaseLost, StaleGeneration, check_number
from labkit.fence import Fence, unfenced
from labkit.lease import Lease
from labkit.sim.history import Event

__all__ = ["Worker", "LocalClock", "Crashed", "NoResponse", "upsert_invoice"]

JOB = "invoice-run"  # the fenced job, and the job_id of every invoice
LEASE = "invoice-run"  # the lease's name at the authority


def upsert_invoice(db, invoice: str, amount, generation, *, epoch=None) -> None:
    """UPSERT one invoice row of :data:`JOB`: a later write replaces an earlier one, whatever its
    generation (the resource has no protection of its own); ``epoch`` also writes that column.
    Named parameters let a protected table's refusal say which generation it refused."""
    row = {"amount": amount, "generation": generation} | ({} if epoch is None else {"epoch": epoch})
    columns, values = ", ".join(row), ", ".join(":" + c for c in row)
    updates = ", ".join(f"{c} = excluded.{c}" for c in row)
    sql = f"""INSERT INTO invoices(job_id, invoice_id, {columns}) VALUES (:job, :invoice, {values})
        ON CONFLICT(job_id, invoice_id) DO UPDATE SET {updates}"""
    execute(db, sql, {"job": JOB, "invoice": invoice, **row})


class Crashed(LabkitError):
    """``worker`` crashed at named ``point``; its open transaction rolls back."""

    def __init__(self, worker: str, point: str) -> None:
        self.worker, self.point = worker, point
        super().__init__(f"{worker} crashed at {point!r}; its open transaction was rolled back")


class NoResponse(LabkitError):
    """The answer to ``worker``'s ``action`` was lost: the authority may or may not have acted."""

    def __init__(self, worker: str, action: str) -> None:
        self.worker, self.action = worker, action
        super().__init__(f"{worker}'s {action} got no response; the authority may have acted on it")


class LocalClock:
    """A clock reading ``offset + (1 + drift) * env.now``: a worker's own, or (0, 0) the sim's."""

    def __init__(self, env, offset: float = 0.0, drift: float = 0.0) -> None:
        self.env, self.offset, self.drift = env, offset, drift

    def now(self) -> float:
        """Return this clock's reading of the virtual time."""
        return self.offset + (1.0 + self.drift) * float(self.env.now)


class Worker:
    """A simulated worker of one :class:`~labkit.sim.engine.Sim`, recording every attempt.

    Faults (keyword-only): ``pauses`` ``{point: seconds}``, each once, the first time the
    worker passes ``point``; ``crash_at`` a point where it raises :class:`Crashed`;
    ``request_latency`` and ``response_latency``, seconds per message to and from the
    authority; ``lose``, actions whose next response is lost (once per listed name), each
    raising :class:`NoResponse` after ``timeout`` s; ``offset`` and ``drift`` of its clock.

    >>> from labkit.sim.engine import Sim
    >>> def body(w):
    ...     lease = yield from w.acquire(10)
    ...     yield from w.point("after-read")
    ...     yield from w.write("INV-1", 100, lease.generation)
    >>> with Sim(seed=0) as sim:
    ...     _ = sim.start(sim.worker("A", pauses={"after-read": 30}), body)
    ...     sim.run()
    ...     [(e.action, e.time) for e in sim.history]
    [('acquire', 0.0), ('pause', 0.0), ('resume', 30.0), ('raise', 30.0), ('write', 30.0)]
    """

    def __init__(
        self,
        sim,
        name: str,
        *,
        pauses: dict | None = None,
        crash_at: str | None = None,
        request_latency: float = 0.0,
        response_latency: float = 0.0,
        lose: Iterable[str] = (),
        timeout: float = 5.0,
        offset: float = 0.0,
        drift: float = 0.0,
    ) -> None:
        self.sim, self.name, self.env = sim, name, sim.env
        self.pauses = {k: check_number(v, "pause") for k, v in (pauses or {}).items()}
        self.crash_at, self.lose, self.timeout = crash_at, list(lose), timeout
        self.request_latency = check_number(request_latency, "request_latency")
        self.response_latency = check_number(response_latency, "response_latency")
        self.clock = LocalClock(sim.env, float(offset), float(drift))
        self._conns: dict[str, Any] = {}
        self._fences: dict[str, Fence] = {}
        self.held_until: float | None = None  # the holder's expiry in the last "held" answer
        self.db = self.connection("resource")

    def record(self, action: str, outcome: str = "ok", **fields) -> Event:
        """Append ``Event(now, self.name, action, outcome, **fields)`` to the history; return it."""
        return self.sim.record(self.name, action, outcome, **fields)

    def connection(self, name: str = "resource"):
        """This worker's own connection to database ``name`` (``busy_timeout_ms=0``)."""
        if name not in self._conns:
            self._conns[name] = self.sim.connect(name)
        return self._conns[name]

    def fence(self, db: str = "resource") -> Fence:
        """The :class:`~labkit.Fence` of :data:`JOB` on this worker's connection to ``db``."""
        if db not in self._fences:
            self._fences[db] = Fence(self.connection(db), JOB)
        return self._fences[db]

    def close(self) -> None:
        """Close this worker's connections (an open transaction rolls back)."""
        for db in self._conns.values():
            db.conn.close()
        self._conns.clear()

    def point(self, name: str):
        """Pass the named point: pause there if planned (once), crash there if planned."""
        if self.crash_at == name:
            self.record("crash", "ok", target=name)
            raise Crashed(self.name, name)
        if name in self.pauses:
            yield from self.pause(self.pauses.pop(name), name)

    def pause(self, seconds: float, point: str | None = None):
        """Stop for ``seconds`` of virtual time (a GC pause, a frozen VM); recorded with its end."""
        self.record("pause", "ok", target=point, until=float(self.env.now) + seconds)
        yield self.env.timeout(seconds)
        self.record("resume", "ok", target=point)

    def locked(self, fn: Callable, *args, target: str = "resource"):
        """Call ``fn(*args)``; while it raises ``Busy``, record a wait and retry after a tick."""
        while True:
            try:
                return fn(*args)
            except Busy:
                self.record("wait", "busy", target=target)
                yield self.env.timeout(self.sim.tick)

    def wait_for_lock(self, db: str = "resource", target=None):
        """Wait (recording ``wait`` events) until ``BEGIN IMMEDIATE`` on ``db`` would succeed now;
        one worker runs at a time, so the lock stays free until the caller next yields."""
        conn = self.connection(db)
        yield from self.locked(execute, conn, "BEGIN IMMEDIATE", target=target or db)
        execute(conn, "ROLLBACK")

    def _ask(self, fn: Callable):
        yield self.env.timeout(self.request_latency)
        return fn()  # the authority acts now, at its own time

    def reply(self, action: str):
        """The answer to ``action`` travels back; if it is lost (see ``lose``), raise
        :class:`NoResponse` after waiting ``timeout`` s."""
        if action in self.lose:
            self.lose.remove(action)
            yield self.env.timeout(self.timeout)
            self.record("response", "lost", target=action)
            raise NoResponse(self.name, action)
        yield self.env.timeout(self.response_latency)

    def heard(self, authority, lease: Lease | None, token=None) -> None:
        """Record an acquire's answer: ``ok`` with ``token`` (or the generation), or ``held``."""
        if lease is None:
            held = authority.current(LEASE)
            self.held_until, current = held and held.expires_at, held and held.generation
            self.record("acquire", "held", generation=current, target=LEASE, until=self.held_until)
        else:
            token = lease.generation if token is None else token
            self.record("acquire", "ok", generation=token, target=LEASE, until=lease.expires_at)

    def acquire(self, ttl: float):
        """Ask for the lease: a Lease, or None if held; NoResponse if the answer is lost."""
        authority = self.sim.authority
        lease = yield from self._ask(lambda: authority.try_acquire(LEASE, self.name, ttl))
        self.heard(authority, lease)
        yield from self.reply("acquire")
        return lease

    def acquire_when_free(self, ttl: float, poll=None, *, attempt=None, clock=None):
        """Try ``attempt()`` (default :meth:`acquire`) until it returns a lease; return the lease.
        Between tries it waits ``poll`` s, or until the expiry in the last ``held`` answer (read
        on ``clock``, default the sim's), at least a tick."""
        clock = clock or self.sim.clock
        while True:
            lease = yield from (attempt() if attempt else self.acquire(ttl))
            if lease is not None:
                return lease
            until = self.held_until
            wait = poll if poll is not None or until is None else until - clock.now()
            yield self.env.timeout(max(wait or 0.0, self.sim.tick))

    def renew(self, lease: Lease):
        """Ask the authority to renew ``lease``: the new Lease, or None if it was lost."""
        return (yield from self._tell("renew", lease))

    def keep(self, lease: Lease, lock: str):
        """Before protected work: wait for the write lock (recorded on ``lock``), then renew
        ``lease`` once half its ttl has passed. The lease to act with, or None: do no more work."""
        yield from self.wait_for_lock(target=lock)
        if lease.expires_at - self.sim.clock.now() > lease.ttl / 2:
            return lease
        return (yield from self.renew(lease))

    def release(self, lease: Lease):
        """Ask the authority to release ``lease``: True if it was ours and is now gone."""
        return bool((yield from self._tell("release", lease)))

    def _tell(self, action: str, lease: Lease):
        """Send ``authority.<action>(lease)`` and record ``ok`` or ``lost``; None if lost."""

        def ask():
            with contextlib.suppress(LeaseLost):
                return getattr(self.sim.authority, action)(lease) or True

        answer = yield from self._ask(ask)
        outcome, until = ("ok", getattr(answer, "expires_at", None)) if answer else ("lost", None)
        self.record(action, outcome, generation=lease.generation, target=lease.name, until=until)
        yield from self.reply(action)
        return answer

    def read(self, invoices: Iterable[str]) -> None:
        """Read these invoices (never waiting, in WAL); record a ``read`` of each generation."""
        sql = "SELECT invoice_id, generation FROM invoices WHERE job_id = $1"
        seen = dict(execute(self.db, sql, (JOB,)))
        for invoice in invoices:
            self.record("read", "ok", target=invoice, generation=seen.get(invoice))

    def write(
        self, invoice: str, amount, generation, *, fenced=True, inside="inside-write", read=False
    ):
        """Upsert one invoice in one transaction, through the fence when ``fenced``; return
        ``"ok"`` or ``"rejected"``. Inside it passes point ``inside`` (a pause there holds the
        lock); ``read`` reads the invoice first; ``generation`` may be an ``(epoch, n)`` token."""
        yield from self.wait_for_lock(target=invoice)
        epoch, n = None, generation
        if self.sim.epochs:
            epoch, n = generation if isinstance(generation, tuple) else (0, generation)
        began, fields = float(self.env.now), {"generation": generation, "target": invoice}
        try:
            opened = self.fence().guard(generation) if fenced else unfenced(self.db, generation)
            with opened as tx:
                if read:
                    self.read([invoice])
                upsert_invoice(tx.conn, invoice, amount, n, epoch=epoch)
                yield from self.point(inside)
        except StaleGeneration:
            return self.record("write", "rejected", **fields).outcome
        except Crashed:
            self.record("write", "crashed", **fields)
            raise
        if fenced:
            self.record("raise", "ok", generation=generation, target=JOB)
        fields["began"] = began if began < self.env.now else None  # held open over time?
        return self.record("write", "ok", **fields).outcome

    def raise_fence(self, generation: int, db: str = "resource"):
        """Raise the fence on ``db`` to ``generation`` and commit: True, or False if stale."""
        yield from self.wait_for_lock(db, target=JOB)
        try:
            with self.fence(db).guard(generation):
                yield from self.point("inside-raise")
        except StaleGeneration:
            self.record("raise", "rejected", generation=generation, target=JOB)
            return False
        self.record("raise", "ok", generation=generation, target=JOB)
        return True
