"""Recovery is part of ownership: durable claims, progress, a careful sweeper, operation ids.

:class:`Claims` changes a job's row by conditional statements only, and the sweeper requeues
a stale claim only if it is unchanged. :func:`produce` keys each unit by its
:func:`operation_key`, so a retry never repeats one."""

from dataclasses import dataclass
from typing import Any

from labkit.clock import Clock, check_clock, read_clock
from labkit.db import check_name, ensure_schema, execute, transaction
from labkit.errors import MAX_INT, LeaseLost, check_number
from labkit.fence import Fence, Tx, check_tx
from labkit.idempotency import run_once
from labkit.mechanisms import check_type

__all__ = ["Claim", "Claims", "operation_key", "produce"]

_COLUMNS = "job, owner, generation, state, progress, updated_at, version"
_SCHEMA = """CREATE TABLE claims (job TEXT PRIMARY KEY, owner TEXT,
    generation INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL CHECK (state IN ('queued', 'claimed', 'done')),
    progress INTEGER NOT NULL DEFAULT 0, updated_at REAL NOT NULL,
    version INTEGER NOT NULL DEFAULT 0)"""


@dataclass(frozen=True, slots=True)
class Claim:
    """A claims row as it was read or written.

    Attributes: job, owner (None while queued), generation (the claimer's fencing token), state
    (``"queued"``, ``"claimed"`` or ``"done"``), progress (units checkpointed), updated_at (the
    authority's time of the last change), version (bumped by every change: "unchanged" test)."""

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

    def _change(self, assignment: str, condition: str, params: dict, tx: Tx | None = None):
        """One conditional UPDATE of a job's row that also stamps the time and bumps the version."""
        sql = (
            f"UPDATE claims SET {assignment}, updated_at = :now, version = version + 1 "
            f"WHERE job = :job AND {condition} RETURNING {_COLUMNS}"
        )
        params = {**params, "now": read_clock(self.clock)}
        if tx is not None:
            rows = check_tx(tx, self.db, None).execute(sql, params)
        else:
            with transaction(self.db):
                rows = execute(self.db, sql, params)
        return Claim(*rows[0]) if rows else None

    def enqueue(self, job: str) -> Claim:
        """Create ``job``'s claim row as queued (no-op if it exists); return the row."""
        job, now = check_name(job, "job"), read_clock(self.clock)
        sql = """INSERT INTO claims(job, state, updated_at) VALUES ($1, 'queued', $2)
            ON CONFLICT(job) DO NOTHING"""
        with transaction(self.db):
            execute(self.db, sql, (job, now))
        return self.get(job)

    def claim(self, job: str, owner: str, generation: int) -> Claim | None:
        """Claim ``job`` for ``owner`` if it is queued; return the claim or None."""
        job, owner = check_name(job, "job"), check_name(owner, "owner")
        generation = check_number(generation, "generation", integer=True, high=MAX_INT)
        return self._change(
            "owner = :owner, generation = :generation, state = 'claimed'",
            "state = 'queued'",
            {"job": job, "owner": owner, "generation": generation},
        )

    def checkpoint(self, claim: Claim, progress: int, *, tx: Tx | None = None) -> Claim:
        """Record ``progress`` for a claim its owner still holds (``tx``: join that transaction).
        Raises LeaseLost if the claim was requeued, finished or taken by someone else."""
        progress = check_number(progress, "progress", integer=True, high=MAX_INT)
        return self._mine(claim, "progress = :progress", {"progress": progress}, tx)

    def finish(self, claim: Claim) -> Claim:
        """Mark the job done if ``claim``'s owner still holds it; else raise LeaseLost."""
        return self._mine(claim, "state = 'done'", {})

    def _mine(self, claim: Claim, assignment: str, params: dict, tx: Tx | None = None) -> Claim:
        claim = check_type(claim, Claim, "claim")
        row = self._change(
            assignment,
            "owner = :owner AND generation = :generation AND state = 'claimed'",
            {**params, "job": claim.job, "owner": claim.owner, "generation": claim.generation},
            tx,
        )
        if row is None:
            raise LeaseLost(claim.job, claim.owner or "<nobody>", claim.generation)
        return row

    def get(self, job: str) -> Claim | None:
        """Read ``job``'s claim, or None."""
        job = check_name(job, "job")
        rows = execute(self.db, f"SELECT {_COLUMNS} FROM claims WHERE job = $1", (job,))
        return Claim(*rows[0]) if rows else None

    def stale(self, older_than: float) -> list[Claim]:
        """Unfinished claims not changed for at least ``older_than`` seconds (a read)."""
        cutoff = read_clock(self.clock) - check_number(older_than, "older_than")
        sql = f"""SELECT {_COLUMNS} FROM claims WHERE state = 'claimed' AND updated_at <= $1
            ORDER BY job"""
        rows = execute(self.db, sql, (cutoff,))
        return [Claim(*r) for r in rows]

    def requeue(self, seen: Claim) -> bool:
        """Requeue ``seen``'s job if it is still claimed AND unchanged (one conditional UPDATE)."""
        seen = check_type(seen, Claim, "seen")
        params = {"job": seen.job, "version": seen.version}
        condition = "state = 'claimed' AND version = :version"
        return self._change("owner = NULL, state = 'queued'", condition, params) is not None

    def sweep(self, older_than: float) -> list[Claim]:
        """Requeue every stale claim that is still unchanged; return those requeued (as seen)."""
        return [seen for seen in self.stale(older_than) if self.requeue(seen)]


def produce(
    fence: Fence, claim: Claim, unit: str, amount: int, *, claims=None, progress=None
) -> bool:
    """Insert the invoice ``unit@generation`` once, fenced and keyed; True if this call did.

    With :class:`Claims` ``claims`` and an int ``progress``, the checkpoint commits in the
    same transaction. StaleGeneration or LeaseLost (the checkpoint's) leave nothing written."""
    fence, claim = check_type(fence, Fence, "fence"), check_type(claim, Claim, "claim")
    unit = check_name(unit, "unit")
    amount = check_number(amount, "amount", integer=True, high=MAX_INT)
    if claims is not None:
        check_type(claims, Claims, "claims")
    invoice, produced = f"{unit}@{claim.generation}", []

    def effect(tx: Tx) -> str:
        sql = "INSERT INTO invoices(job_id, invoice_id, amount, generation) VALUES ($1, $2, $3, $4)"
        tx.execute(sql, (fence.job, invoice, amount, claim.generation))
        produced.append(invoice)
        return invoice

    with fence.guard(claim.generation) as tx:
        payload = {"unit": unit, "amount": amount}
        run_once(tx, operation_key(claim.job, unit), effect, payload=payload)
        if claims is not None and progress is not None:
            claims.checkpoint(claim, progress, tx=tx)
    return bool(produced)
