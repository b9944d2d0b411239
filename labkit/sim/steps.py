"""Steps several scenarios share: seeded amounts and work times, and the token-carrying moves
(from lesson 04 on, a token may be an ``(epoch, n)`` pair)."""

from labkit.db import execute
from labkit.errors import LeaseLost
from labkit.sim.worker import LEASE


def amount(w, base: int) -> int:
    """An invoice amount drawn from the seeded rng: ``base`` plus 0, 5, ... or 45."""
    return base + 5 * w.sim.rng.randrange(0, 10)


def work(w) -> float:
    """How long one invoice takes to prepare: 1, 1.5 or 2 s, from the seeded rng."""
    return w.sim.rng.choice((1.0, 1.5, 2.0))


def with_tokens(sim) -> None:
    """Let invoices carry ``(epoch, n)`` tokens, checked as ``(epoch, n)`` per invoice and file."""
    db = sim.database("resource")
    if "epoch" not in [r[1] for r in execute(db, "PRAGMA table_info(invoices)")]:
        execute(db, "ALTER TABLE invoices ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0")

    def final(tables: dict) -> dict:
        state = {r["invoice_id"]: (r["epoch"], r["generation"]) for r in tables.get("invoices", [])}
        state.update({r["name"]: (r["epoch"], r["generation"]) for r in tables.get("files", [])})
        return state

    sim.final, sim.epochs = final, True


def acquire_token(w, ttl: float, *, issue=None, owner=None, authority=None, poll=None):
    """Poll ``authority`` (default the sim's) until granted, with no message travelling; return
    ``(lease, token)``, the token being ``issue()`` (called in the grant's step) or the generation.
    """
    authority = authority or w.sim.authority

    def attempt():
        yield from ()  # no message travels: no virtual time passes
        lease = authority.try_acquire(LEASE, owner or w.name, ttl)
        if lease is None:
            w.heard(authority, None)
        return lease

    lease = yield from w.acquire_when_free(ttl, poll, attempt=attempt, clock=authority.clock)
    token = issue() if issue else lease.generation
    w.heard(authority, lease, token)
    return lease, token


def release_with_token(w, lease, token, *, authority=None) -> bool:
    """labkit's release (owner AND generation), recorded with the token the worker acted with."""
    try:
        (authority or w.sim.authority).release(lease)
    except LeaseLost:
        w.record("release", "lost", generation=token, target=LEASE)
        return False
    w.record("release", "ok", generation=token, target=LEASE)
    return True


def write_each(w, invoices, token, *, fenced: bool, base: int = 200, every: float = 1.0):
    """Read ``invoices``, then write each ``every`` s apart with ``token``; False at a refusal."""
    w.read(invoices)
    for invoice in invoices:
        yield w.env.timeout(every)
        if (yield from w.write(invoice, amount(w, base), token, fenced=fenced)) != "ok":
            return False
    return True
