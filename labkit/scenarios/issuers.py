"""Lesson 04: who issues the numbers. A token counter that fails over or is restored repeats a number.

:func:`issuer_failover` takes tokens from an asynchronously replicated
counter (:class:`~labkit.mechanisms.issuers.ReplicatedIssuer`) whose primary dies;
:func:`backup_restore` restores last night's backup of the authority. Both
are protected by a new epoch from a durable
:class:`~labkit.mechanisms.issuers.EpochAuthority`: tokens become ``(epoch, n)`` pairs
(see :mod:`labkit.sim.steps`). Import them from :mod:`labkit.scenarios`.

Example:
    >>> from labkit.scenarios import issuer_failover
    >>> sorted(issuer_failover(protected=False).kinds)
    ['acted_after_expiry', 'lost_update']
    >>> issuer_failover().violations
    ()
"""

from __future__ import annotations

from labkit.mechanisms.issuers import EpochAuthority, EpochIssuer, ReplicatedIssuer, backup, restore
from labkit.sim.engine import scenario
from labkit.sim.steps import (
    acquire_token,
    amount,
    release_with_token,
    with_tokens,
    write_with_token,
)
from labkit.sim.verdict import describe
from labkit.sim.worker import LEASE
from labkit.errors import check_number

__all__ = ["issuer_failover", "backup_restore"]


def _reissued(history, violations, tables) -> str | None:
    """Name a token that was granted to two workers, then the worst violation (or what stopped it)."""
    owners: dict = {}
    for e in history:
        if e.action == "acquire" and e.outcome == "ok":
            owners.setdefault(e.generation, []).append(e.worker)
    twice = [f"{g} went to {' and '.join(ws)}" for g, ws in owners.items() if len(ws) > 1]
    locked_out = [e for e in history if e.action == "raise" and e.outcome == "rejected"]
    head = (f"token {'; '.join(twice)}. " if twice else "") + (
        f"{locked_out[0].worker} was locked out by an older, higher token. " if locked_out else ""
    )
    return head + describe(history, violations) if head else None


def _stale_holder_and_successor(sim, ttl: float, take):
    """A takes a token, writes INV-1, pauses, writes INV-2 late; B takes over at A's expiry."""

    def run_a(w):
        lease, token = yield from acquire_token(w, ttl, issue=take)
        w.read(["INV-1", "INV-2"])
        yield w.env.timeout(1.0)
        yield from write_with_token(w, "INV-1", amount(w, 100), token, fenced=True)
        yield from w.point("after-write")
        yield from write_with_token(w, "INV-2", amount(w, 100), token, fenced=True)
        release_with_token(w, lease, token)

    def run_b(w, poll):
        lease, token = yield from acquire_token(w, ttl, issue=take, poll=poll)
        if not (yield from w.raise_fence(token)):
            return  # the legitimate holder is locked out by an old, higher token
        w.read(["INV-1", "INV-2"])
        for invoice in ("INV-1", "INV-2"):
            yield w.env.timeout(1.0)
            yield from write_with_token(w, invoice, amount(w, 200), token, fenced=True)
        release_with_token(w, lease, token)

    return run_a, run_b


@scenario
def issuer_failover(sim, *, protected, lag=5.0, failover_at=2.0, pause=30.0, ttl=10.0):
    """Lesson 04: a token counter on an asynchronously replicated store fails over and repeats a number.

    Tokens come from :class:`~labkit.mechanisms.issuers.ReplicatedIssuer` (two real SQLite
    files; the replica applies the primary's log ``lag`` s late). A gets 7,
    writes INV-1 through the fence and pauses ``pause`` s. At ``failover_at``
    the primary dies and the replica is promoted; if 7 had not arrived, B (at
    A's expiry) is handed 7 again. A wakes up and its INV-2 with 7 passes the
    fence, level with B's: B's invoice is lost. Protected: after the failover
    the issuer starts a new epoch from a durable :class:`~labkit.mechanisms.issuers.EpochAuthority`,
    B gets ``(1, 1)`` and A's 7 bounces.

    Knobs:
        lag: replication delay (s). failover_at: when the primary dies (s).
        pause: A's stop after its first write (s). ttl: the lease's length (s).
    """
    lag, failover_at, pause = (
        check_number(lag, "lag"),
        check_number(failover_at, "failover_at"),
        check_number(pause, "pause"),
    )
    ttl = check_number(ttl, "ttl", positive=True)
    with_tokens(sim)
    primary, replica = sim.database("primary"), sim.database("replica")
    warm = ReplicatedIssuer(primary, replica, sim.clock, LEASE, lag=0)
    for _ in range(6):  # six earlier tokens, long since replicated
        warm.issue()
    warm.replicate()
    issuer = ReplicatedIssuer(primary, replica, sim.clock, LEASE, lag=lag)
    durable = EpochAuthority(sim.database("durable"))
    sim.layout.update({"epoch_counter": "replica", "epochs": "durable"})
    run_a, run_b = _stale_holder_and_successor(sim, ttl, issuer.issue)

    def ops():
        yield sim.env.timeout(failover_at)
        lost = issuer.failover()
        sim.record("ops", "failover", target=f"primary lost, {lost} token(s) in flight")
        if protected:
            epoch = issuer.issuer().start_epoch(durable)
            sim.record("ops", "failover", generation=(epoch, 0), target="new epoch")

    sim.env.process(ops())
    sim.start(sim.worker("A", pauses={"after-write": pause}), run_a)
    sim.start(sim.worker("B"), run_b, None)
    return _reissued


@scenario
def backup_restore(
    sim, *, protected, issued_after_backup=1, bump=0, restore_at=3.0, pause=30.0, ttl=10.0
):
    """Lesson 04: restoring last night's backup moves the token counter backward.

    The authority's database (leases and the token counter, at 6) is backed up
    with SQLite's backup API. ``issued_after_backup`` tokens are issued after
    it; the last one is A's (7 by default). A writes INV-1 and pauses. At
    ``restore_at`` the database is restored: the counter is back at 6 and A's
    lease row is gone, so B gets in early and is handed A's number again.
    Unprotected, the restore may add ``bump`` to the counter (the "large
    constant"): safe only if ``bump >= issued_after_backup``. Protected, the
    restore is followed by a new epoch from a durable authority.

    Knobs:
        issued_after_backup: tokens issued between backup and restore (>= 1).
        bump: constant added to the counter after the restore (unprotected).
        restore_at: when the restore happens (s). pause: A's stop (s). ttl: lease length (s).
    """
    n = check_number(issued_after_backup, "issued_after_backup", integer=True, low=1, high=1000)
    bump = check_number(bump, "bump", integer=True, high=10**6)
    restore_at, pause = check_number(restore_at, "restore_at"), check_number(pause, "pause")
    ttl = check_number(ttl, "ttl", positive=True)
    with_tokens(sim)
    store = sim.database("authority")
    issuer, durable = EpochIssuer(store, LEASE), EpochAuthority(sim.database("durable"))
    for _ in range(6):
        issuer.issue()
    backup(store, sim.path("nightly"))
    for _ in range(n - 1):  # holders that came and went after the backup
        issuer.issue()
    sim.layout.update({"epoch_counter": "authority", "epochs": "durable"})
    run_a, run_b = _stale_holder_and_successor(sim, ttl, issuer.issue)

    def ops():
        yield sim.env.timeout(restore_at)
        restore(store, sim.path("nightly"))
        sim.record(
            "ops", "restore", generation=issuer.current(), target="authority from nightly backup"
        )
        if protected:
            epoch = issuer.start_epoch(durable)
            sim.record("ops", "restore", generation=(epoch, 0), target="new epoch")
        elif bump:
            sim.record("ops", "restore", generation=issuer.bump(bump), target=f"counter + {bump}")

    sim.env.process(ops())
    sim.start(sim.worker("A", pauses={"after-write": pause}), run_a)
    sim.start(sim.worker("B"), run_b, 2.0, at=0.5)
    return _reissued
