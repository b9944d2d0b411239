"""Lesson 04: who issues the numbers; a new epoch from a durable authority protects both.

>>> naive = issuer_failover(protected=False)
>>> sorted(naive.kinds), [w.kind for w in naive.warnings], issuer_failover().violations
(['lost_update'], ['acted_after_expiry'], ())
"""

from labkit.db import execute, transaction
from labkit.errors import check_number
from labkit.mechanisms.issuers import EpochAuthority, EpochIssuer, ReplicatedIssuer, backup, restore
from labkit.sim.engine import scenario
from labkit.sim.steps import acquire_token, amount, release_with_token, with_tokens, write_each
from labkit.sim.history import describe
from labkit.sim.worker import LEASE

__all__ = ["issuer_failover", "backup_restore"]


def _reissued(history, violations, tables) -> str | None:
    """Name a token granted to two workers, then the worst violation (or what stopped it)."""
    owners: dict = {}
    for e in history:
        if e.action == "acquire" and e.outcome == "ok":
            owners.setdefault(e.generation, []).append(e.worker)
    twice = [f"{g} went to {' and '.join(ws)}" for g, ws in owners.items() if len(ws) > 1]
    grants = [e for e in history if e.action == "acquire" and e.outcome == "ok"]
    both = [  # a grant while another worker's lease still ran: mutual exclusion lost
        f"Two holders at once: {b.worker} from t={b.time:g}, {a.worker}'s lease to t={a.until:g}. "
        for a, b in zip(grants, grants[1:])
        if a.worker != b.worker and a.until is not None and b.time < a.until
    ]
    locked_out = [e for e in history if e.action == "raise" and e.outcome == "rejected"]
    head = (
        (f"token {'; '.join(twice)}. " if twice else "")
        + "".join(both)
        + (
            f"{locked_out[0].worker} was locked out by an older, higher token. "
            if locked_out
            else ""
        )
    )
    return head + describe(history, violations) if head else None


def _holder(w, ttl, take):
    """A takes a token, writes INV-1, stops at ``after-write``, then writes INV-2 (late)."""
    lease, token = yield from acquire_token(w, ttl, issue=take)
    w.read(["INV-1", "INV-2"])
    yield w.env.timeout(1.0)
    yield from w.write("INV-1", amount(w, 100), token, fenced=True)
    yield from w.point("after-write")
    yield from w.write("INV-2", amount(w, 100), token, fenced=True)
    release_with_token(w, lease, token)


def _successor(w, ttl, take, poll=None):
    """B takes a token when A's lease lapses, raises the fence, then writes both invoices."""
    lease, token = yield from acquire_token(w, ttl, issue=take, poll=poll)
    if not (yield from w.raise_fence(token)):
        return  # the legitimate holder is locked out by an old, higher token
    yield from write_each(w, ("INV-1", "INV-2"), token, fenced=True)
    release_with_token(w, lease, token)


@scenario
def issuer_failover(sim, *, protected, lag=5.0, failover_at=2.0, pause=30.0, ttl=10.0):
    """Lesson 04: a token counter fails over to a lagging replica and repeats; an epoch stops it.

    The lease record replicates with the same ``lag`` (Redis's ``SET NX PX`` does): a failover
    before A's grant reached the replica loses A's lease too, and B acquires at once while A is
    alive. Two holders act at the same time; only the fence at the resource stops A's write."""
    with_tokens(sim)
    primary, replica = sim.database("primary"), sim.database("replica")
    warm = ReplicatedIssuer(primary, replica, sim.clock, LEASE, lag=0)
    for _ in range(6):  # six earlier tokens, long since replicated
        warm.issue()
    warm.replicate()
    issuer = ReplicatedIssuer(primary, replica, sim.clock, LEASE, lag=lag)
    durable = EpochAuthority(sim.database("durable"))
    sim.layout.update({"epoch_counter": "replica", "epochs": "durable"})

    def ops():
        yield sim.env.timeout(failover_at)
        lost = issuer.failover()
        sim.record("ops", "failover", target=f"primary lost, {lost} token(s) in flight")
        if lag > failover_at:  # A's grant at t=0 had not reached the replica either
            with transaction(sim.authority.db):
                execute(sim.authority.db, "DELETE FROM leases WHERE name = $1", (LEASE,))
            sim.record("ops", "failover", target="A's lease lost with the primary")
        if protected:
            epoch = issuer.issuer().start_epoch(durable)
            sim.record("ops", "failover", generation=(epoch, 0), target="new epoch")

    sim.env.process(ops())
    sim.start(sim.worker("A", pauses={"after-write": pause}), _holder, ttl, issuer.issue)
    sim.start(sim.worker("B"), _successor, ttl, issuer.issue, poll=0.5)
    return _reissued


@scenario
def backup_restore(
    sim, *, protected, issued_after_backup=1, bump=0, restore_at=3.0, pause=30.0, ttl=10.0
):
    """Lesson 04: a restored backup moves the token counter back; a new epoch stops it."""
    n = check_number(issued_after_backup, "issued_after_backup", integer=True, low=1, high=1000)
    bump = check_number(bump, "bump", integer=True, high=10**6)
    with_tokens(sim)
    store = sim.database("authority")
    issuer, durable = EpochIssuer(store, LEASE), EpochAuthority(sim.database("durable"))
    for _ in range(6):
        issuer.issue()
    backup(store, sim.path("nightly"))
    for _ in range(n - 1):  # holders that came and went after the backup
        issuer.issue()
    sim.layout.update({"epoch_counter": "authority", "epochs": "durable"})

    def ops():
        yield sim.env.timeout(restore_at)
        restore(store, sim.path("nightly"))
        restored = issuer.current()
        sim.record("ops", "restore", generation=restored, target="authority from nightly backup")
        if protected:
            epoch = issuer.start_epoch(durable)
            sim.record("ops", "restore", generation=(epoch, 0), target="new epoch")
        elif bump:
            sim.record("ops", "restore", generation=issuer.bump(bump), target=f"counter + {bump}")

    sim.env.process(ops())
    sim.start(sim.worker("A", pauses={"after-write": pause}), _holder, ttl, issuer.issue)
    sim.start(sim.worker("B"), _successor, ttl, issuer.issue, poll=2.0, at=0.5)
    return _reissued
