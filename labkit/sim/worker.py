"""A simulated worker: its own SQLite connections, its own clock, its planned faults.

A :class:`Worker` belongs to one :class:`~labkit.sim.engine.Sim` and acts in its
virtual time. Its body is a plain generator function; every method that can
take time is a generator too, called with ``yield from``. Each worker has its
OWN connection to the resource database, opened with ``busy_timeout_ms=0``:
``BEGIN IMMEDIATE`` either takes the write lock at once or raises
:class:`~labkit.Busy`, which the worker records as a ``wait`` event and retries
after ``sim.tick`` virtual seconds. The waiting you see is the waiting SQLite
really imposed.

Faults are planned per worker and fire at NAMED POINTS the scenario passes
with ``yield from w.point("after-read")``: a pause (a long timeout, also inside
an open transaction that holds the write lock) or a crash (:class:`Crashed` is
raised there, so an open ``with fence.guard(...)`` rolls back). Messages to the
authority take ``request_latency`` and ``response_latency`` seconds (a number,
or a ``(low, high)`` range drawn from the sim's rng); a lost response makes
the worker wait ``timeout`` seconds and raise :class:`NoResponse`. A worker's
own :class:`LocalClock` may run ``offset`` seconds away and ``drift`` faster
or slower; only that worker reads it.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, Iterable

import simpy

from labkit.db import check_name, execute, transaction
from labkit.errors import BadArgument, Busy, LabkitError, LeaseLost, StaleGeneration
from labkit.fence import Fence, Tx
from labkit.sim.history import Event
from labkit.idempotency import run_once
from labkit.lease import Lease
from labkit.errors import check_number

if TYPE_CHECKING:
    from labkit.sim.engine import Sim

__all__ = [
    "Worker",
    "LocalClock",
    "Crashed",
    "NoResponse",
    "upsert_invoice",
    "JOB",
    "LEASE",
    "TICK",
]

JOB = "invoice-run"  # the fenced job, and the job_id of every invoice
LEASE = "invoice-run"  # the lease's name at the authority
TICK = 0.5  # virtual seconds between retries of a locked database (Sim's default tick)


def upsert_invoice(db, invoice: str, amount: int, generation: int, *, job: str = JOB) -> None:
    """Write one invoice row by UPSERT: a later write replaces an earlier one, whatever its generation.

    This is the resource with no protection of its own: an older owner really
    can overwrite a newer owner's invoice when nothing stops it.
    """
    execute(
        db,
        """
        INSERT INTO invoices(job_id, invoice_id, amount, generation)
        VALUES (:job, :invoice, :amount, :generation)
        ON CONFLICT(job_id, invoice_id) DO UPDATE SET
            amount = excluded.amount, generation = excluded.generation""",
        {"job": job, "invoice": invoice, "amount": amount, "generation": generation},
    )


class Crashed(LabkitError):
    """A worker crashed at a named point; its open transaction rolls back.

    Attributes:
        worker: who crashed. point: where.
    """

    def __init__(self, worker: str, point: str) -> None:
        self.worker, self.point = worker, point
        super().__init__(f"{worker} crashed at {point!r}; its open transaction was rolled back")


class NoResponse(LabkitError):
    """The authority's answer was lost: the worker waited ``timeout`` s and does not know the outcome.

    Attributes:
        worker: who asked. action: what it asked for.
    """

    def __init__(self, worker: str, action: str) -> None:
        self.worker, self.action = worker, action
        super().__init__(f"{worker}'s {action} got no response; the authority may have acted on it")


class LocalClock:
    """A worker's own clock: ``offset + (1 + drift) * env.now``. Only that worker reads it."""

    def __init__(self, env: simpy.Environment, offset: float = 0.0, drift: float = 0.0) -> None:
        self.env, self.offset, self.drift = env, offset, drift

    def now(self) -> float:
        """Return this worker's reading of the time."""
        return self.offset + (1.0 + self.drift) * float(self.env.now)

    def __repr__(self) -> str:
        return f"LocalClock(now={self.now():g}, offset={self.offset:g}, drift={self.drift:g})"


class Worker:
    """A simulated worker: its own SQLite connections, its local clock, its planned faults.

    Every method that can take virtual time is a generator: call it with
    ``yield from``. Every attempt is appended to ``sim.history`` with the answer.

    Args (keyword-only, via :meth:`labkit.sim.engine.Sim.worker`):
        pauses: ``{point: seconds}``; each fires once, the first time the worker passes ``point``.
        crash_at: a point name; the worker raises :class:`Crashed` there.
        request_latency, response_latency: seconds per message to/from the authority,
            a number or a ``(low, high)`` range drawn from ``sim.rng``.
        lose: action names (``"acquire"``, ``"renew"``, ``"release"``) whose next response is
            lost, once per listed name; ``loss`` is a probability for every response.
        timeout: how long a worker waits for a lost response before :class:`NoResponse`.
        offset, drift: skew this worker's :attr:`clock` only.

    Attributes:
        name, sim, env, clock, db (own connection to the resource database).

    Example:
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
        sim: "Sim",
        name: str,
        *,
        pauses: dict | None = None,
        crash_at: str | None = None,
        request_latency=0.0,
        response_latency=0.0,
        lose: Iterable[str] = (),
        loss: float = 0.0,
        timeout: float = 5.0,
        offset: float = 0.0,
        drift: float = 0.0,
    ) -> None:
        self.sim, self.name, self.env = sim, name, sim.env
        self.pauses = {
            check_name(k, "pauses"): check_number(v, "pause") for k, v in (pauses or {}).items()
        }
        self.crash_at = None if crash_at is None else check_name(crash_at, "crash_at")
        self.request_latency = self._latency(request_latency, "request_latency")
        self.response_latency = self._latency(response_latency, "response_latency")
        self.lose = [check_name(a, "lose") for a in lose]
        self.loss = check_number(loss, "loss", high=1.0)
        self.timeout = check_number(timeout, "timeout")
        self.clock = LocalClock(sim.env, float(offset), float(drift))
        self._conns: dict[str, Any] = {}
        self._fences: dict[tuple, Fence] = {}
        self.held_until: float | None = None  # the holder's expiry in the last "held" answer
        self.db = self.connection("resource")

    @staticmethod
    def _latency(value, name):
        if isinstance(value, (tuple, list)):
            if len(value) != 2:
                raise BadArgument(name, f"must be seconds or a (low, high) pair, got {value!r}")
            low, high = check_number(value[0], name), check_number(value[1], name)
            if low > high:
                raise BadArgument(name, f"low {low} is above high {high}")
            return (low, high)
        return check_number(value, name)

    # -- bookkeeping ------------------------------------------------------------------
    def record(
        self,
        action: str,
        outcome: str = "ok",
        *,
        generation=None,
        key=None,
        target=None,
        until=None,
    ) -> Event:
        """Append ``Event(now, self.name, action, outcome, ...)`` to the history and return it."""
        return self.sim.record(
            self.name, action, outcome, generation=generation, key=key, target=target, until=until
        )

    def connection(self, name: str = "resource"):
        """This worker's own connection to database ``name`` (``busy_timeout_ms=0``)."""
        if name not in self._conns:
            self._conns[name] = self.sim.connect(name)
        return self._conns[name]

    def fence(self, job: str = JOB, db: str = "resource") -> Fence:
        """The :class:`~labkit.Fence` of ``job`` on this worker's connection to ``db``."""
        if (job, db) not in self._fences:
            self._fences[job, db] = Fence(self.connection(db), job)
        return self._fences[job, db]

    def close(self) -> None:
        """Close this worker's connections (an open transaction rolls back)."""
        for db in self._conns.values():
            db.conn.close()
        self._conns.clear()

    # -- faults and time --------------------------------------------------------------
    def point(self, name: str):
        """Pass the named point: pause there if planned (once), crash there if planned."""
        if self.crash_at == name:
            self.record("crash", "ok", target=name)
            raise Crashed(self.name, name)
        if name in self.pauses:
            yield from self.pause(self.pauses.pop(name), name)

    def pause(self, seconds: float, point: str | None = None):
        """Stop for ``seconds`` of virtual time (a GC pause, a frozen VM); recorded with its end."""
        seconds = check_number(seconds, "seconds")
        self.record("pause", "ok", target=point, until=float(self.env.now) + seconds)
        yield self.env.timeout(seconds)
        self.record("resume", "ok", target=point)

    def _draw(self, latency) -> float:
        return self.sim.rng.uniform(*latency) if isinstance(latency, tuple) else latency

    def locked(self, fn: Callable, *args, db: str = "resource", target=None):
        """Call ``fn(*args)``; while it raises :class:`~labkit.Busy`, record a wait and retry after a tick."""
        while True:
            try:
                return fn(*args)
            except Busy:
                self.record("wait", "busy", target=target or db)
                yield self.env.timeout(self.sim.tick)

    def wait_for_lock(self, db: str = "resource", target=None):
        """Wait (recording ``wait`` events) until ``BEGIN IMMEDIATE`` on ``db`` would succeed now.

        The simulation runs one worker at a time, so nothing can take the lock
        between this and the transaction the caller opens next (without yielding).
        """
        conn = self.connection(db)

        def probe():
            execute(conn, "BEGIN IMMEDIATE")
            execute(conn, "ROLLBACK")

        yield from self.locked(probe, db=db, target=target)

    # -- messages to the authority -------------------------------------------------------
    def _ask(self, action: str, fn: Callable):
        yield self.env.timeout(self._draw(self.request_latency))
        answer = fn()  # the authority acts now, at its own time
        return answer

    def reply(self, action: str):
        """The answer to ``action`` travels back: ``response_latency``, or lost (see ``lose``/``loss``).

        Raises:
            NoResponse: after waiting ``timeout`` s, when this response is lost.
        """
        lost = action in self.lose or (self.loss > 0 and self.sim.rng.random() < self.loss)
        if action in self.lose:
            self.lose.remove(action)
        if lost:
            yield self.env.timeout(self.timeout)
            self.record("response", "lost", target=action)
            raise NoResponse(self.name, action)
        yield self.env.timeout(self._draw(self.response_latency))

    def acquire(self, ttl: float, name: str = LEASE):
        """Ask the authority for lease ``name``: returns the :class:`~labkit.Lease` or None if held.

        Recorded at the authority's time as ``acquire``/``ok`` (with ``until``) or ``held``.

        Raises:
            NoResponse: the answer was lost (the authority may have granted it).
        """
        authority = self.sim.authority
        lease = yield from self._ask("acquire", lambda: authority.try_acquire(name, self.name, ttl))
        if lease is None:
            held = authority.current(name)
            self.held_until = held and held.expires_at
            self.record(
                "acquire",
                "held",
                target=name,
                generation=held and held.generation,
                until=self.held_until,
            )
        else:
            self.record(
                "acquire", "ok", generation=lease.generation, target=name, until=lease.expires_at
            )
        yield from self.reply("acquire")
        return lease

    def acquire_when_free(self, ttl: float, name: str = LEASE, poll: float | None = None):
        """Call :meth:`acquire` until it returns a lease.

        Between attempts it waits ``poll`` seconds, or (``poll=None``) until the
        expiry the authority reported for the current holder.
        """
        poll = None if poll is None else check_number(poll, "poll", positive=True)
        while True:
            lease = yield from self.acquire(ttl, name)
            if lease is not None:
                return lease
            until = self.held_until
            wait = poll if poll is not None or until is None else until - self.env.now
            yield self.env.timeout(max(wait, self.sim.tick if wait <= 0 else 0.0))

    def renew(self, lease: Lease):
        """Ask the authority to renew ``lease``: the new Lease, or None if it was lost."""
        authority = self.sim.authority

        def ask():
            try:
                return authority.renew(lease)
            except LeaseLost:
                return None

        new = yield from self._ask("renew", ask)
        self.record(
            "renew",
            "ok" if new else "lost",
            generation=lease.generation,
            target=lease.name,
            until=new and new.expires_at,
        )
        yield from self.reply("renew")
        return new

    def release(self, lease: Lease):
        """Ask the authority to release ``lease``: True if it was ours and is now gone."""
        authority = self.sim.authority

        def ask():
            try:
                authority.release(lease)
                return True
            except LeaseLost:
                return False

        done = yield from self._ask("release", ask)
        self.record(
            "release", "ok" if done else "lost", generation=lease.generation, target=lease.name
        )
        yield from self.reply("release")
        return done

    # -- the resource ---------------------------------------------------------------------
    def read(
        self, invoices: Iterable[str], job: str = JOB, db: str = "resource"
    ) -> dict[str, dict]:
        """Read these invoices (a read never waits in WAL); record one ``read`` per invoice.

        Returns:
            invoice id -> row dict, for the invoices that exist.
        """
        invoices = list(invoices)
        rows = {
            r[0]: {"invoice_id": r[0], "amount": r[1], "generation": r[2]}
            for r in execute(
                self.connection(db),
                "SELECT invoice_id, amount, generation FROM invoices WHERE job_id = ?",
                (job,),
            )
        }
        for invoice in invoices:
            self.record(
                "read", "ok", target=invoice, generation=rows.get(invoice, {}).get("generation")
            )
        wanted = set(invoices)
        return {k: v for k, v in rows.items() if k in wanted}

    def write(
        self,
        invoice: str,
        amount: int,
        generation: int,
        *,
        fenced: bool = True,
        key: str | None = None,
        job: str = JOB,
        inside: str = "inside-write",
        read: bool = False,
    ):
        """Upsert one invoice in one transaction, through ``fence.guard(generation)`` when ``fenced``.

        Waits for the write lock first (``wait`` events). Inside the open
        transaction it passes point ``inside`` (a planned pause there holds the
        lock; a planned crash rolls back). With ``key``, the upsert runs under
        :func:`~labkit.run_once`, so a repeat of the same key has no effect. With
        ``read``, it reads ``invoice`` inside the transaction, after the fence is raised.

        Returns:
            The recorded outcome: ``"ok"``, ``"rejected"`` (stale) or ``"duplicate"``.
        """
        yield from self.wait_for_lock(target=invoice)
        repeated = [True]

        def effect(tx):
            repeated[0] = False
            upsert_invoice(tx.conn, invoice, amount, generation, job=job)
            return invoice

        try:
            opened = self.fence(job).guard(generation) if fenced else _plain(self.db, generation)
            with opened as tx:
                if read:
                    self.read([invoice], job)
                if key is None:
                    effect(tx)
                else:
                    run_once(tx, key, effect, payload={"invoice": invoice, "amount": amount})
                yield from self.point(inside)
        except StaleGeneration:
            return self.record(
                "write", "rejected", generation=generation, key=key, target=invoice
            ).outcome
        except Crashed:
            self.record("write", "crashed", generation=generation, key=key, target=invoice)
            raise
        if fenced:
            self.record("raise", "ok", generation=generation, target=job)
        outcome = "duplicate" if repeated[0] else "ok"
        return self.record("write", outcome, generation=generation, key=key, target=invoice).outcome

    def raise_fence(self, generation: int, job: str = JOB, db: str = "resource"):
        """Raise the fence of ``job`` to ``generation`` and commit, writing nothing else.

        Returns:
            True if raised (recorded ``raise``/``ok``), False if stale (``raise``/``rejected``).
        """
        yield from self.wait_for_lock(db, target=job)
        try:
            with self.fence(job, db).guard(generation):
                yield from self.point("inside-raise")
        except StaleGeneration:
            self.record("raise", "rejected", generation=generation, target=job)
            return False
        self.record("raise", "ok", generation=generation, target=job)
        return True


@contextlib.contextmanager
def _plain(db, generation):
    """``transaction(db)`` shaped like a guard: an unfenced write transaction."""
    with transaction(db) as conn:
        yield Tx(conn, (0, generation))
