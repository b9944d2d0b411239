"""Recovery is part of ownership: durable claims, progress, a careful sweeper, operation ids.

A lease lets a successor in, but it says nothing about the work a crashed
holder left half done. Three pieces make that work visible and safe to redo:

* :class:`Claims`: one durable row per job in ``claims`` (owner, generation,
  state, progress, updated_at, version), updated by conditional statements only.
* :meth:`Claims.sweep`: finds claims that are unfinished and have not moved for
  a while, and requeues each with ONE conditional ``UPDATE`` that also requires
  the version it observed, so a claim that moved on meanwhile is left alone.
* :func:`produce`: one unit of work under the fence and :func:`~labkit.run_once`
  with the unit's :func:`operation_key`, so a retry never repeats a unit that
  already took effect, even when the progress checkpoint lags behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.clock import Clock, check_clock, read_clock
from labkit.db import check_name, ensure_schema, execute, transaction
from labkit.errors import BadArgumentType, LeaseLost
from labkit.fence import Fence, Tx, check_tx
from labkit.idempotency import run_once
from labkit.errors import check_number, MAX_INT

__all__ = ["Claim", "Claims", "operation_key", "produce"]

_SCHEMA = """CREATE TABLE claims (
    job TEXT PRIMARY KEY,
    owner TEXT,
    generation INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL CHECK (state IN ('queued', 'claimed', 'done')),
    progress INTEGER NOT NULL DEFAULT 0,
    updated_at REAL NOT NULL,
    version INTEGER NOT NULL DEFAULT 0)"""
_COLUMNS = "job, owner, generation, state, progress, updated_at, version"


@dataclass(frozen=True, slots=True)
class Claim:
    """A claims row as it was read or written.

    Attributes:
        job: the job's id. owner: who claimed it (None while queued).
        generation: the claimer's fencing token (its lease generation).
        state: ``"queued"``, ``"claimed"`` or ``"done"``.
        progress: units finished and checkpointed (the next unit to do).
        updated_at: the authority's time of the last change.
        version: bumped by every change; the sweeper's "unchanged" test.
    """

    job: str
    owner: str | None
    generation: int
    state: str
    progress: int
    updated_at: float
    version: int


def operation_key(job: str, unit: Any) -> str:
    """The operation id of one unit of a job, e.g. ``"invoice-run/c2"``: the same on every retry."""
    return f"{check_name(job, 'job')}/{unit}"


class Claims:
    """The durable claims of jobs, on one database, with time from ``clock``.

    Example:
        >>> from labkit import connect, VirtualClock
        >>> clock = VirtualClock(); claims = Claims(connect(), clock)
        >>> _ = claims.enqueue("run-1"); b = claims.claim("run-1", "B", 8)
        >>> _ = clock.advance(30); [c.owner for c in claims.sweep(older_than=10)]
        ['B']
        >>> claims.get("run-1").state
        'queued'
    """

    def __init__(self, db, clock: Clock) -> None:
        self.db, self.clock = db, check_clock(clock)
        ensure_schema(db, "claims", _SCHEMA)

    def _one(self, tx: Tx | None, sql: str, params: dict) -> Claim | None:
        params = {**params, "now": read_clock(self.clock)}
        if tx is not None:
            rows = check_tx(tx, self.db, None, fenced=False).execute(sql, params)
        else:
            with transaction(self.db):
                rows = execute(self.db, sql, params)
        return Claim(*rows[0]) if rows else None

    def enqueue(self, job: str) -> Claim:
        """Create ``job``'s claim row as queued (no-op if it exists); return the row."""
        job = check_name(job, "job")
        self._one(
            None,
            "INSERT INTO claims(job, state, updated_at) VALUES (:job, 'queued', :now) "
            "ON CONFLICT(job) DO NOTHING RETURNING " + _COLUMNS,
            {"job": job},
        )
        return self.get(job)

    def claim(self, job: str, owner: str, generation: int) -> Claim | None:
        """Claim ``job`` for ``owner`` if it is queued; return the claim or None. Progress is kept."""
        job, owner = check_name(job, "job"), check_name(owner, "owner")
        generation = check_number(generation, "generation", integer=True, high=MAX_INT)
        return self._one(
            None,
            f"""
            UPDATE claims SET owner = :owner, generation = :generation, state = 'claimed',
                updated_at = :now, version = version + 1
            WHERE job = :job AND state = 'queued' RETURNING {_COLUMNS}""",
            {"job": job, "owner": owner, "generation": generation},
        )

    def checkpoint(self, claim: Claim, progress: int, *, tx: Tx | None = None) -> Claim:
        """Record ``progress`` for a claim its owner still holds (pass ``tx`` to join a fenced one).

        Raises:
            LeaseLost: the claim was requeued, finished or taken by someone else.
            BadArgument: ``tx``'s block has ended, or it runs on another connection.
        """
        return self._mine(
            claim,
            "progress = :progress",
            {"progress": check_number(progress, "progress", integer=True, high=MAX_INT)},
            tx,
        )

    def finish(self, claim: Claim, *, tx: Tx | None = None) -> Claim:
        """Mark the job done, if ``claim``'s owner still holds it.

        Raises:
            LeaseLost: the claim is no longer this owner's.
        """
        return self._mine(claim, "state = 'done'", {}, tx)

    def _mine(self, claim: Claim, assignment: str, params: dict, tx) -> Claim:
        if not isinstance(claim, Claim):
            raise BadArgumentType("claim", f"must be a Claim, got {type(claim).__name__}")
        row = self._one(
            tx,
            f"""
            UPDATE claims SET {assignment}, updated_at = :now, version = version + 1
            WHERE job = :job AND owner = :owner AND generation = :generation AND state = 'claimed'
            RETURNING {_COLUMNS}""",
            {**params, "job": claim.job, "owner": claim.owner, "generation": claim.generation},
        )
        if row is None:
            raise LeaseLost(claim.job, claim.owner or "<nobody>", claim.generation)
        return row

    def get(self, job: str) -> Claim | None:
        """Read ``job``'s claim, or None."""
        rows = execute(
            self.db, f"SELECT {_COLUMNS} FROM claims WHERE job = ?", (check_name(job, "job"),)
        )
        return Claim(*rows[0]) if rows else None

    def stale(self, older_than: float) -> list[Claim]:
        """Unfinished claims not changed for at least ``older_than`` seconds (a read)."""
        cutoff = read_clock(self.clock) - check_number(older_than, "older_than")
        rows = execute(
            self.db,
            f"SELECT {_COLUMNS} FROM claims WHERE state = 'claimed' "
            "AND updated_at <= ? ORDER BY job",
            (cutoff,),
        )
        return [Claim(*r) for r in rows]

    def requeue(self, seen: Claim) -> bool:
        """Requeue ``seen``'s job only if it is still claimed AND unchanged since it was read.

        One conditional ``UPDATE ... WHERE state = 'claimed' AND version = :seen``:
        True if it requeued, False if the claim moved on meanwhile (progress,
        finished, requeued by another sweeper).
        """
        if not isinstance(seen, Claim):
            raise BadArgumentType("seen", f"must be a Claim, got {type(seen).__name__}")
        return (
            self._one(
                None,
                f"""
            UPDATE claims SET owner = NULL, state = 'queued', updated_at = :now, version = version + 1
            WHERE job = :job AND state = 'claimed' AND version = :version RETURNING {_COLUMNS}""",
                {"job": seen.job, "version": seen.version},
            )
            is not None
        )

    def sweep(self, older_than: float) -> list[Claim]:
        """Requeue every stale claim that is still unchanged; return those requeued (as seen)."""
        return [seen for seen in self.stale(older_than) if self.requeue(seen)]

    def __repr__(self) -> str:
        return f"Claims(clock={self.clock!r})"


def produce(
    fence: Fence,
    claim: Claim,
    unit: str,
    amount: int,
    *,
    claims: Claims | None = None,
    progress: int | None = None,
) -> bool:
    """Produce the invoice of ``unit`` for ``claim`` once: fenced, keyed, optionally checkpointed.

    Opens ``fence.guard(claim.generation)``; inside it, :func:`~labkit.run_once`
    with :func:`operation_key` ``(claim.job, unit)`` inserts the invoice
    ``f"{unit}@{claim.generation}"`` (so a repeat by another generation would
    be a second row: only the key prevents it). With ``claims`` and ``progress``,
    the checkpoint commits in the same transaction.

    Returns:
        True if this call produced the invoice, False if the key had it already.

    Raises:
        StaleGeneration: a newer generation raised the fence; nothing written.
        LeaseLost: the checkpoint found the claim moved on; nothing written.
        BadArgument, BadArgumentType: a bad argument, named (nothing written).
    """
    if not isinstance(fence, Fence):
        raise BadArgumentType("fence", f"must be a Fence, got {type(fence).__name__}")
    if not isinstance(claim, Claim):
        raise BadArgumentType("claim", f"must be a Claim, got {type(claim).__name__}")
    unit, amount = (
        check_name(unit, "unit"),
        check_number(amount, "amount", integer=True, high=MAX_INT),
    )
    if claims is not None and not isinstance(claims, Claims):
        raise BadArgumentType("claims", f"must be Claims or None, got {type(claims).__name__}")
    if progress is not None:
        progress = check_number(progress, "progress", integer=True, high=MAX_INT)
    produced = []

    def effect(tx: Tx) -> str:
        invoice = f"{unit}@{claim.generation}"
        tx.execute(
            "INSERT INTO invoices(job_id, invoice_id, amount, generation) VALUES (?, ?, ?, ?)",
            (fence.job, invoice, amount, claim.generation),
        )
        produced.append(invoice)
        return invoice

    with fence.guard(claim.generation) as tx:
        run_once(
            tx, operation_key(claim.job, unit), effect, payload={"unit": unit, "amount": amount}
        )
        if claims is not None and progress is not None:
            claims.checkpoint(claim, progress, tx=tx)
    return bool(produced)
