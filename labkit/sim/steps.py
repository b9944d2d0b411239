"""Steps the scenarios share: seeded amounts and work times, and the token-carrying moves.

The scenarios in :mod:`labkit.scenarios` are built from a
:class:`~labkit.sim.worker.Worker`'s own moves (``acquire``, ``write``,
``raise_fence``...) and from the few here that several lessons need:

* :func:`amount` and :func:`work` draw from the sim's seeded rng, so the seed
  changes the tables and the timing, and nothing else does.
* From lesson 04 on, a token may be an ``(epoch, n)`` pair, not only a lease's
  generation. :func:`with_tokens` lets a run's invoices and fenced files carry
  one; :func:`acquire_token`, :func:`write_with_token` and
  :func:`release_with_token` ask the authority, write and release at once,
  recording the token the worker acts with.
"""

from __future__ import annotations

from labkit.db import execute, transaction
from labkit.errors import LeaseLost, StaleGeneration
from labkit.sim.worker import JOB, LEASE

__all__ = [
    "amount",
    "work",
    "with_tokens",
    "acquire_token",
    "write_with_token",
    "release_with_token",
]


def amount(w, base: int) -> int:
    """An invoice amount drawn from the seeded rng: ``base`` plus 0, 5, ... or 45."""
    return base + 5 * w.sim.rng.randrange(0, 10)


def work(w) -> float:
    """How long one invoice takes to prepare: 1, 1.5 or 2 s, from the seeded rng."""
    return w.sim.rng.choice((1.0, 1.5, 2.0))


def with_tokens(sim) -> None:
    """Let invoices carry ``(epoch, n)`` tokens and count the ``files`` table in the final state.

    The engine's final state is ``invoice_id -> generation``; these scenarios
    also write epochs and fenced files, so the run's result reads them too.
    """
    db = sim.database("resource")
    if "epoch" not in [r[1] for r in execute(db, "PRAGMA table_info(invoices)")]:
        execute(db, "ALTER TABLE invoices ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0")

    def final(tables: dict) -> dict:
        state = {r["invoice_id"]: (r["epoch"], r["generation"]) for r in tables.get("invoices", [])}
        state.update({r["name"]: (r["epoch"], r["generation"]) for r in tables.get("files", [])})
        return state

    sim.final = final


def write_with_token(w, invoice: str, amount: int, token, *, fenced: bool, key: str | None = None):
    """Upsert ``invoice`` with ``token`` (an int or ``(epoch, n)``), through the fence when ``fenced``.

    Needs :func:`with_tokens` (the ``epoch`` column). Returns the recorded
    outcome, ``"ok"`` or ``"rejected"``.
    """
    epoch, n = token if isinstance(token, tuple) else (0, token)
    yield from w.wait_for_lock(target=invoice)
    sql = """INSERT INTO invoices(job_id, invoice_id, amount, generation, epoch) VALUES (?, ?, ?, ?, ?)
             ON CONFLICT(job_id, invoice_id) DO UPDATE SET amount = excluded.amount,
                 generation = excluded.generation, epoch = excluded.epoch"""
    try:
        if fenced:
            with w.fence().guard(token) as tx:
                tx.execute(sql, (JOB, invoice, amount, n, epoch))
        else:
            with transaction(w.db) as conn:
                execute(conn, sql, (JOB, invoice, amount, n, epoch))
    except StaleGeneration:
        return w.record("write", "rejected", generation=token, key=key, target=invoice).outcome
    if fenced:
        w.record("raise", "ok", generation=token, target=JOB)
    return w.record("write", "ok", generation=token, key=key, target=invoice).outcome


def acquire_token(w, ttl: float, *, issue=None, owner=None, authority=None, poll=None):
    """Poll the authority until granted; the token comes from ``issue()`` in the same step as the grant.

    Without ``issue`` the token is the lease's generation. Between attempts it
    waits ``poll`` s, or until the holder's reported expiry. Returns ``(lease, token)``.
    """
    authority = authority or w.sim.authority
    owner = owner or w.name
    while True:
        lease = authority.try_acquire(LEASE, owner, ttl)
        if lease is not None:
            token = issue() if issue else lease.generation
            w.record("acquire", "ok", generation=token, target=LEASE, until=lease.expires_at)
            return lease, token
        held = authority.current(LEASE)
        w.record(
            "acquire",
            "held",
            generation=held.generation if held else None,
            target=LEASE,
            until=held and held.expires_at,
        )
        wait = poll if poll is not None or held is None else held.expires_at - authority.clock.now()
        yield w.env.timeout(max(wait or 0.0, w.sim.tick))


def release_with_token(w, lease, token, *, authority=None) -> bool:
    """labkit's release (owner AND generation), recorded with the token the worker acted with."""
    try:
        (authority or w.sim.authority).release(lease)
    except LeaseLost:
        w.record("release", "lost", generation=token, target=LEASE)
        return False
    w.record("release", "ok", generation=token, target=LEASE)
    return True
