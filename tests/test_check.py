"""labkit.check: violations come only from answers and attempts, each with the right kind."""

import dataclasses

import pytest

from labkit import BadArgument, BadArgumentType, LeaseAuthority
from labkit.db import execute, transaction
from labkit.sim.history import VIOLATION_KINDS, Event, TimingWarning, Violation, check, warnings
from labkit.scenarios import SCENARIOS
from labkit.sim import LEASE, Sim

E = Event


def kinds(history, final=None):
    return [v.kind for v in check(history, final)]


HANDOVER = [  # A holds 7, writes, releases; B acquires 8, raises, reads, writes.
    E(0, "A", "acquire", "ok", 7, target=LEASE, until=10),
    E(1, "A", "read", "ok", target="INV-1"),
    E(2, "A", "write", "ok", 7, target="INV-1"),
    E(3, "A", "release", "ok", 7, target=LEASE),
    E(4, "B", "acquire", "ok", 8, target=LEASE, until=14),
    E(4, "B", "raise", "ok", 8, target="invoice-run"),
    E(4, "B", "read", "ok", 7, target="INV-1"),
    E(5, "B", "write", "ok", 8, target="INV-1"),
    E(6, "B", "write", "ok", 8, target="INV-2"),
]

BAD = {
    "stale_accepted": [
        E(0, "A", "acquire", "ok", 7, target=LEASE, until=10),
        E(1, "B", "write", "ok", 8, target="INV-1"),
        E(2, "A", "write", "ok", 7, target="INV-2"),
    ],
    "lost_update": [  # B overwrote A's committed write without having seen it
        E(0, "B", "read", "ok", target="INV-1"),
        E(1, "A", "write", "ok", 7, target="INV-1"),
        E(2, "B", "write", "ok", 8, target="INV-1"),
    ],
    "duplicate_effect": [
        E(1, "B", "write", "ok", 8, key="bill/42", target="INV-2"),
        E(5, "B", "write", "ok", 8, key="bill/42", target="INV-3"),
    ],
    "interleaved": [  # a failover handed 7 to both: A, then B, then A again, each its own invoice
        E(0, "A", "write", "ok", 7, target="INV-1"),
        E(1, "B", "write", "ok", 7, target="INV-2"),
        E(2, "A", "write", "ok", 7, target="INV-3"),
    ],
    "foreign_release": [
        E(0, "A", "acquire", "ok", 7, target=LEASE, until=10),
        E(10, "B", "acquire", "ok", 8, target=LEASE, until=20),
        E(12, "A", "release", "ok", 7, target=LEASE),
    ],
}


@pytest.mark.parametrize("kind", VIOLATION_KINDS)
def test_each_bad_history_is_flagged_with_its_kind(kind):
    """Every hand-built bad history yields exactly the violation it was built to show."""
    found = check(BAD[kind])
    assert [v.kind for v in found] == [kind]
    assert isinstance(found[0], Violation) and found[0].message


def test_bad_history_with_the_bad_answer_changed_is_clean():
    """The same attempts with the offending answer changed to a refusal are clean: only answers count."""
    for kind, history in BAD.items():
        offending = check(history)[0].event
        refused = [E(e.time, e.worker, e.action, "rejected", e.generation, e.key, e.target, e.until)
                   if e == offending else e for e in history]
        assert check(refused) == [], kind


def test_foreign_renew_is_flagged():
    """A renewal that succeeded for a worker not holding the lease is a foreign_release."""
    history = BAD["foreign_release"][:2] + [E(12, "A", "renew", "ok", 7, target=LEASE, until=22)]
    assert kinds(history) == ["foreign_release"]


def test_lower_token_overwriting_a_higher_one_is_stale_and_lost():
    """A write with 7 over a committed 8 is both accepted stale and a lost update."""
    history = [E(1, "B", "write", "ok", 8, target="INV-1"), E(2, "A", "write", "ok", 7, target="INV-1")]
    assert kinds(history) == ["stale_accepted", "lost_update"]


def test_overwrite_after_reading_it_or_blind_is_not_lost():
    """Reading the other's write first, or writing without any read (blind), is not an unseen overwrite."""
    history = BAD["lost_update"]
    seen = history[1:2] + [E(1.5, "B", "read", "ok", 7, target="INV-1"), history[2]]
    assert kinds(seen) == []
    assert kinds(history[1:]) == []


def test_final_state_missing_a_committed_write_is_a_lost_update():
    """A committed write that the final table does not hold was lost."""
    assert kinds(HANDOVER, final={"INV-1": 8, "INV-2": 8}) == []
    assert kinds(HANDOVER, final={"INV-1": 7, "INV-2": 8}) == ["lost_update"]
    assert kinds(HANDOVER, final={"INV-1": 8}) == ["lost_update"]


@pytest.mark.parametrize("history", [
    HANDOVER,
    [E(1, "B", "write", "ok", 8, target="INV-1"), E(2, "B", "write", "ok", 8, target="INV-1")],
    [E(1, "B", "write", "ok", 8, key="k", target="INV-2"),
     E(5, "B", "write", "duplicate", 8, key="k", target="INV-2")],
    HANDOVER + [E(30, "A", "write", "rejected", 7, target="INV-1")],
    HANDOVER + [E(7, "B", "release", "ok", 8, target=LEASE)],
    [],
], ids=["handover", "equal-generations", "key-stopped-repeat", "stale-rejected", "own-release", "empty"])
def test_clean_histories_come_back_empty(history):
    """Handovers, equal generations, refused stale writes and recognised repeats are not violations."""
    assert check(history) == []


def test_a_commit_the_successor_waited_for_is_not_acted_after_expiry():
    """A's transaction began at 2, in its lease, and commits at 30 while B waited on the lock: the
    fence serialises it. The same commit from a transaction begun after t=10 is flagged."""
    history = [
        E(0, "A", "acquire", "ok", 7, target=LEASE, until=10),
        E(2, "A", "read", "ok", target="INV-1"),
        E(10, "B", "acquire", "ok", 8, target=LEASE, until=40),
        *[E(10 + 0.5 * i, "B", "wait", "busy", target="INV-1") for i in range(40)],
        E(30, "A", "raise", "ok", 7, target="invoice-run"),
        E(30, "A", "write", "ok", 7, target="INV-1", began=2),
        E(30, "B", "read", "ok", 7, target="INV-1"),
        E(30, "B", "raise", "ok", 8, target="invoice-run"),
        E(30, "B", "write", "ok", 8, target="INV-1"),
        E(31, "A", "write", "rejected", 7, target="INV-2"),
    ]
    assert check(history) == [] and warnings(history) == []
    late = [dataclasses.replace(e, began=None) for e in history]
    assert check(late) == []  # nothing newer had committed: no harm, only a lapse of discipline
    assert [(w.kind, w.event.time, w.event.worker) for w in warnings(late)] == [
        ("acted_after_expiry", 30, "A")]


def test_acting_after_ones_own_lease_ended_is_flagged_even_with_no_successor():
    """B's lease ends at 20 while it waits; its writes at 32 are flagged though nobody took over.
    A renewal in time, a re-acquire, or acting at the very instant of expiry is not flagged."""
    history = [E(10, "B", "acquire", "ok", 8, target=LEASE, until=20),
               E(32, "B", "write", "ok", 8, target="INV-1"),
               E(33, "B", "write", "ok", 8, target="INV-2")]
    assert check(history) == []
    assert [(w.kind, w.event.time) for w in warnings(history)] == [
        ("acted_after_expiry", 32), ("acted_after_expiry", 33)]
    renewed = history[:1] + [E(19, "B", "renew", "ok", 8, target=LEASE, until=40)] + history[1:]
    again = history[:1] + [E(31, "B", "acquire", "ok", 9, target=LEASE, until=41)] + history[1:]
    at_expiry = history[:1] + [E(20, "B", "write", "ok", 8, target="INV-1")]
    assert warnings(renewed) == warnings(again) == warnings(at_expiry) == []
    released = history[:1] + [E(15, "B", "release", "ok", 8, target=LEASE), history[1]]
    assert [w.message for w in warnings(released)] == [
        "B committed a write at t=32, after its lease was released at t=15"]


def test_a_write_after_ones_lease_with_no_successor_is_one_warning_and_no_violation():
    """A's lease ends at 10 and nobody takes over; A writes at 30: the data shows no harm (no
    violation), and the lapse of timing discipline is one warning, drawn apart in the verdict."""
    from labkit.sim.history import describe

    history = [E(0, "A", "acquire", "ok", 7, target=LEASE, until=10),
               E(1, "A", "read", "ok", target="INV-1"),
               E(30, "A", "raise", "ok", 7, target="invoice-run"),
               E(30, "A", "write", "ok", 7, target="INV-1")]
    assert check(history) == [] and check(history, final={"INV-1": 7}) == []
    (warning,) = warnings(history)
    assert isinstance(warning, TimingWarning) and warning.kind == "acted_after_expiry"
    assert warning.event == history[-1]
    assert describe(history, []).startswith("no violation") and "1 warning" in describe(history, [])


def test_the_unseen_overwrite_is_pinned_on_the_stale_write_in_the_gap():
    """B (the rightful holder) read INV-1, A wrote it after its own lease had ended, B wrote from its
    read: the lost update names A's late write, not B's."""
    history = [E(0, "A", "acquire", "ok", 7, target=LEASE, until=10),
               E(10, "B", "acquire", "ok", 8, target=LEASE, until=20),
               E(10, "B", "read", "ok", target="INV-1"),
               E(12, "A", "write", "ok", 7, target="INV-1"),
               E(15, "B", "write", "ok", 8, target="INV-1")]
    (v,) = check(history)
    assert v.kind == "lost_update" and v.event == history[3] and "landed between B's read" in v.message


def test_naive_release_by_name_is_flagged():
    """A release that deletes by lease name only removes the successor's lease: foreign_release."""
    with Sim() as sim:
        db, clock = sim.database("authority"), sim.clock
        authority = LeaseAuthority(db, clock)
        a = authority.acquire("job", "A", 10)
        sim.env.run(until=10)
        b = authority.acquire("job", "B", 10)
        with transaction(db):
            deleted = len(execute(db, "DELETE FROM leases WHERE name = ? RETURNING name", ("job",)))
        history = [E(0, "A", "acquire", "ok", a.generation, target="job", until=a.expires_at),
                   E(10, "B", "acquire", "ok", b.generation, target="job", until=b.expires_at),
                   E(12, "A", "release", "ok" if deleted else "lost", a.generation, target="job")]
        assert authority.current("job") is None        # B's lease really is gone
        assert kinds(history) == ["foreign_release"]


EXPECTED = {  # what each naive variant must show at its default knobs
    "expired_but_alive": {"lost_update", "stale_accepted"},
    "raise_then_read": {"lost_update"},
    "check_then_act": {"stale_accepted", "lost_update"},
    "split_databases": {"stale_accepted", "lost_update"},
    "bypass_writer": {"stale_accepted", "lost_update"},
    "lock_wait": {"stale_accepted"},
    "same_generation_duplicate": {"duplicate_effect"},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_naive_implementations_are_flagged_and_protected_ones_are_clean(name):
    """Every naive variant's real history is flagged with its kind; the protected history is clean."""
    naive, protected = SCENARIOS[name](protected=False), SCENARIOS[name](protected=True)
    assert EXPECTED[name] <= {v.kind for v in check(naive.history)}
    assert check(protected.history) == []
    assert check(protected.history, final={r["invoice_id"]: r["generation"]
                                           for r in protected.tables["invoices"]}) == []


def test_checker_sorts_by_time_and_keeps_order_of_ties():
    """Events given out of time order are checked in time order (ties keep their given order)."""
    shuffled = list(reversed(BAD["stale_accepted"]))
    assert kinds(shuffled) == ["stale_accepted"]


@pytest.mark.parametrize("history, error", [
    ([E(None, "A", "write", "ok", 7, target="INV-1")], BadArgument),
    ([E(float("nan"), "A", "write", "ok", 7, target="INV-1")], BadArgument),
    ([E("1", "A", "write", "ok", 7, target="INV-1")], BadArgument),
    ([E(1, "A", "write", "ok", (7,), target="INV-1")], BadArgument),
    ([E(1, "A", "write", "ok", (1, 2, 3), target="INV-1")], BadArgument),
    ([E(1, "A", "write", "ok", "7", target="INV-1")], BadArgument),
    ([E(1, "A", "write", "ok", 7.5, target="INV-1")], BadArgument),
    ([E(1, "A", "acquire", "ok", True, target=LEASE)], BadArgument),
    ([("A", "write")], BadArgumentType),
    (E(1, "A", "write", "ok", 7), BadArgumentType),
], ids=["time-None", "time-NaN", "time-str", "pair-of-1", "triple", "str", "float", "bool",
        "not-an-event", "one-event"])
def test_a_malformed_history_is_refused_naming_history(history, error):
    """An event with no finite time or a generation that is not a token is refused as BadArgument(history)."""
    with pytest.raises(error) as caught:
        check(history)
    assert caught.value.argument == "history"


@pytest.mark.parametrize("final", [{"INV-1": "8"}, {"INV-1": (8,)}, {"INV-1": 8.0}, [("INV-1", 8)]])
def test_final_values_that_are_not_tokens_are_refused_naming_final(final):
    """The final table must map targets to tokens (or None for a missing row)."""
    with pytest.raises((BadArgument, BadArgumentType)) as caught:
        check(HANDOVER, final=final)
    assert caught.value.argument == "final"


def test_an_epoch_pair_and_a_missing_final_row_are_judged_not_refused():
    """(epoch, counter) tokens and lists from JSON journals order as pairs; a None final row is a lost update."""
    history = [E(1, "B", "write", "ok", [1, 1], target="INV-1"), E(2, "A", "write", "ok", 9, target="INV-1")]
    assert kinds(history) == ["stale_accepted", "lost_update"]
    assert kinds(history[:1], final={"INV-1": (1, 1)}) == []
    assert kinds(history[:1], final={"INV-1": None}) == ["lost_update"]
