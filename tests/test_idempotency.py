"""run_once: an operation key recorded in the same transaction as its effect."""

import pytest

import labkit
from labkit import Fence, KeyReused, run_once
from labkit.db import execute, transaction


def keys(db):
    """Every recorded key with its payload and result."""
    return execute(db, "SELECT key, payload, result FROM idempotency_keys ORDER BY key")


def charge(calls, amount=120):
    """An effect that inserts a charge row and counts its calls."""
    def effect(tx):
        calls.append(amount)
        tx.execute("INSERT INTO invoices VALUES ('job', $1, $2, 8)", (f"INV-{len(calls)}", amount))
        return {"charged": amount}
    return effect


def test_a_repeat_returns_the_stored_result_without_calling_the_effect(db):
    """The second call with the same key returns the first result; the effect ran once, one row exists."""
    calls = []
    first = run_once(db, "charge-1", charge(calls), payload={"amount": 120})
    second = run_once(db, "charge-1", charge(calls), payload={"amount": 120})
    assert first == second == {"charged": 120}
    assert calls == [120]
    assert execute(db, "SELECT invoice_id, amount FROM invoices") == [("INV-1", 120)]
    assert keys(db) == [("charge-1", '{"amount":120}', '{"charged":120}')]


def test_payloads_compare_as_canonical_json(db):
    """Key order and whitespace do not matter: {'a','b'} equals {'b','a'}."""
    calls = []
    run_once(db, "k", charge(calls), payload={"a": 1, "b": [1, 2]})
    assert run_once(db, "k", charge(calls), payload={"b": [1, 2], "a": 1}) == {"charged": 120}
    assert calls == [120]


def test_the_same_key_with_another_payload_raises_key_reused_and_writes_nothing(db, dump):
    """A different payload under a used key raises KeyReused (with both payloads) and changes nothing."""
    calls = []
    run_once(db, "k", charge(calls), payload={"amount": 120})
    before = dump()
    with pytest.raises(KeyReused) as caught:
        run_once(db, "k", charge(calls), payload={"amount": 100})
    assert (caught.value.key, caught.value.stored, caught.value.offered) == (
        "k", '{"amount":120}', '{"amount":100}')
    assert calls == [120]
    assert dump() == before


def test_an_effect_that_raises_records_nothing_and_may_be_retried(db, dump):
    """The effect's writes and the key roll back together; a retry then runs the effect."""
    before = dump()

    def failing(tx):
        tx.execute("INSERT INTO invoices VALUES ('job', 'INV-1', 1, 8)")
        raise ConnectionError("the provider hung up")
    with pytest.raises(ConnectionError):
        run_once(db, "k", failing)
    assert dump() == before
    calls = []
    assert run_once(db, "k", charge(calls)) == {"charged": 120}
    assert calls == [120]


def test_a_result_that_is_not_json_is_refused_and_its_writes_undone(db, dump):
    """An effect returning a non-JSON value raises BadArgument; nothing is recorded."""
    before = dump()

    def returns_an_object(tx):
        tx.execute("INSERT INTO invoices VALUES ('j', 'I', 1, 1)")
        return object()
    with pytest.raises(labkit.BadArgument, match="effect"):
        run_once(db, "k", returns_an_object)
    assert dump() == before


def test_the_first_call_and_a_repeat_return_the_same_value(db):
    """A tuple result comes back as the same list both times (JSON round trip)."""
    assert run_once(db, "k", lambda tx: (1, "two")) == [1, "two"]
    assert run_once(db, "k", lambda tx: "never called") == [1, "two"]


def test_given_a_database_it_opens_its_own_immediate_transaction(db):
    """The effect runs inside a transaction that run_once opened and then committed."""
    seen = []
    run_once(db, "k", lambda tx: seen.append(tx.conn.in_transaction))
    assert seen == [True] and not db.conn.in_transaction


def test_it_joins_a_guards_transaction(db, dump):
    """Inside guard, the key and the effect commit with the fence, or roll back with it."""
    fence = Fence(db, "job")
    before = dump()
    calls = []
    with pytest.raises(RuntimeError):
        with fence.guard(8) as tx:
            run_once(tx, "k", charge(calls))
            raise RuntimeError("crash after the effect, before COMMIT")
    assert dump() == before and fence.current() == 0
    with fence.guard(8) as tx:
        assert run_once(tx, "k", charge(calls)) == {"charged": 120}
    assert calls == [120, 120]
    assert fence.current() == 8 and [k[0] for k in keys(db)] == ["k"]
    assert execute(db, "SELECT invoice_id FROM invoices") == [("INV-2",)]


def test_inside_a_guard_a_failing_effect_caught_by_the_caller_leaves_no_key(db):
    """The caller catches the effect's error and commits the guard: its other writes stay, the key does not."""
    fence = Fence(db, "job")

    def failing(tx):
        tx.execute("INSERT INTO invoices VALUES ('job', 'INV-X', 1, 8)")
        raise ConnectionError("declined")
    with fence.guard(8) as tx:
        tx.execute("INSERT INTO invoices VALUES ('job', 'INV-1', 5, 8)")
        with pytest.raises(ConnectionError):
            run_once(tx, "charge", failing)
    assert keys(db) == []
    assert execute(db, "SELECT invoice_id FROM invoices") == [("INV-1",)]
    assert fence.current() == 8


def test_a_tx_whose_block_ended_is_refused(db, dump):
    """run_once with a tx after its guard ended would write unfenced: BadArgument, nothing written."""
    with Fence(db, "job").guard(1) as tx:
        pass
    before = dump()
    with pytest.raises(labkit.BadArgument, match="db_or_tx"):
        run_once(tx, "k", lambda t: 1)
    assert dump() == before


def test_given_a_database_the_effect_gets_an_unfenced_tx_that_dies_with_the_call(db, dump):
    """run_once(db) hands the effect a tx with no job; kept past the call it can write nothing."""
    kept = []
    run_once(db, "k", lambda tx: kept.append(tx) or tx.job)
    [tx] = kept
    assert (tx.job, tx.live) == (None, False)
    before = dump()
    with transaction(db):
        with pytest.raises(labkit.BadArgument):
            tx.execute("INSERT INTO invoices VALUES ('job', 'INV-9', 1, 0)")
    assert dump() == before


def test_sql_looking_keys_are_stored_as_given(db):
    """A key that looks like SQL is just a key."""
    key = "x'); DROP TABLE invoices;--"
    assert run_once(db, key, lambda tx: 1, payload=key) == 1
    assert keys(db) == [(key, '"x\'); DROP TABLE invoices;--"', "1")]
    assert execute(db, "SELECT count(*) FROM invoices") == [(0,)]


def test_an_effect_whose_statement_fails_leaves_the_guard_usable_and_no_key(db):
    """A statement of the effect fails (a duplicate invoice): that error reaches the caller, who
    catches it and commits the guard; the guard's other writes stay, the key does not."""
    fence = Fence(db, "job")
    with fence.guard(8) as tx:
        tx.execute("INSERT INTO invoices VALUES ('job', 'INV-1', 5, 8)")
        with pytest.raises(labkit.LabkitError, match="(?i)unique|duplicate"):
            run_once(tx, "charge", lambda t: t.execute("INSERT INTO invoices VALUES ('job', 'INV-1', 6, 8)"))
        tx.execute("INSERT INTO invoices VALUES ('job', 'INV-2', 7, 8)")
    assert keys(db) == []
    assert execute(db, "SELECT invoice_id, amount FROM invoices ORDER BY 1") == [("INV-1", 5), ("INV-2", 7)]
    assert run_once(db, "charge", lambda tx: "charged") == "charged"
