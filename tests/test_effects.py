"""Effects: the fenced file store, providers with idempotency keys, the outbox relay, ETags."""

import os

import pytest

import labkit
from labkit import BadArgument, BadArgumentType, Fence, KeyReused, LeaseAuthority, StaleGeneration
from labkit.db import execute
from labkit.mechanisms.effects import EmailProvider, ETagStore, FencedFileStore, Outbox, PaymentProvider


@pytest.fixture
def store(files, tmp_path):
    """A FencedFileStore for job invoice-run under tmp_path/files."""
    return FencedFileStore(files("resource"), tmp_path / "files", "invoice-run")


MAIL = {"to": "billing@example.com", "subject": "invoice run", "body": "3 invoices"}


def test_fenced_file_write_rejects_a_stale_generation(store):
    """After 8 wrote the report, 7's write is refused and the file keeps 8's bytes."""
    store.write("report.txt", b"run by 8", 8)
    with pytest.raises(StaleGeneration) as caught:
        store.write("report.txt", b"run by 7", 7)
    assert (caught.value.offered, caught.value.current) == (7, 8)
    assert (store.read("report.txt"), store.generation("report.txt")) == (b"run by 8", 8)
    assert store.path("report.txt").read_bytes() == b"run by 8"          # a real file on disk


def test_fenced_file_write_equal_generation_and_epochs(store):
    """The same owner may rewrite its file; an (epoch, counter) token beats every plain generation."""
    store.write("report.txt", b"first", 8)
    store.write("report.txt", b"second", 8)
    store.write("report.txt", b"new epoch", (1, 1))
    with pytest.raises(StaleGeneration):
        store.write("report.txt", b"old", 9)
    assert (store.read("report.txt"), store.generation("report.txt")) == (b"new epoch", (1, 1))


def test_file_and_outbox_commit_together_or_not_at_all(store, clock):
    """Inside one guard the file and the email intent commit together; a crash in the block leaves neither."""
    outbox = Outbox(store.db, clock)
    with store.fence.guard(8) as tx:
        store.write("report.txt", b"run by 8", 8, tx=tx)
        outbox.add(tx, "invoice-run/report-email", "email", MAIL)
    with pytest.raises(RuntimeError):
        with store.fence.guard(9) as tx:
            store.write("report.txt", b"run by 9", 9, tx=tx)
            outbox.add(tx, "invoice-run/report-email-9", "email", MAIL)
            raise RuntimeError("crash before commit")
    assert store.read("report.txt") == b"run by 8" and store.fence.current() == 8
    assert [p[0] for p in outbox.pending()] == ["invoice-run/report-email"]


def test_file_write_into_a_guard_of_another_generation_is_refused(store):
    """A tx opened with 9 cannot carry a write labelled 7: the mismatch is refused by name."""
    with store.fence.guard(9) as tx:
        with pytest.raises(BadArgument) as caught:
            store.write("report.txt", b"x", 7, tx=tx)
    assert caught.value.argument == "tx" and store.read("report.txt") is None


def test_a_stale_writer_in_another_jobs_guard_cannot_write_the_file(store):
    """B wrote at 8; stale A opens the guard of ANOTHER job at 3 (accepted there) and passes that tx: refused."""
    store.write("report.txt", b"run by 8", 8)
    with Fence(store.db, "other-job").guard(3) as tx:
        with pytest.raises(BadArgument, match="other-job") as caught:
            store.write("report.txt", b"stale A", 3, tx=tx)
    assert caught.value.argument == "tx"
    assert (store.read("report.txt"), store.generation("report.txt"), store.fence.current()) == (b"run by 8", 8, 8)


def test_the_unfenced_tx_of_run_once_cannot_write_the_file(store):
    """run_once(db, ...) opens no fence: its tx (token (0, 0)) is refused by the store, file unchanged."""
    store.write("report.txt", b"run by 8", 8)
    with pytest.raises(BadArgument) as caught:
        labkit.run_once(store.db, "k", lambda tx: store.write("report.txt", b"unfenced", 0, tx=tx))
    assert caught.value.argument == "tx"
    assert (store.read("report.txt"), store.generation("report.txt")) == (b"run by 8", 8)
    assert execute(store.db, "SELECT count(*) FROM idempotency_keys") == [(0,)]


def test_a_leaked_tx_cannot_write_the_file_or_the_outbox_later(store, clock):
    """A tx kept after its guard ended is refused by the store and the outbox, even inside a later transaction."""
    outbox = Outbox(store.db, clock)
    with store.fence.guard(8) as leaked:
        store.write("report.txt", b"run by 8", 8, tx=leaked)
    with labkit.db.transaction(store.db):
        for call in (lambda: store.write("report.txt", b"leaked 8", 8, tx=leaked),
                     lambda: outbox.add(leaked, "k", "email", MAIL)):
            with pytest.raises(BadArgument, match="ended") as caught:
                call()
            assert caught.value.argument == "tx"
    assert (store.read("report.txt"), outbox.pending()) == (b"run by 8", [])


def test_a_tx_on_another_connection_is_refused(store, files, tmp_path):
    """A guard opened on a second connection to another file cannot write through this store."""
    other = FencedFileStore(files("elsewhere"), tmp_path / "files", "invoice-run")
    with other.fence.guard(8) as tx:
        with pytest.raises(BadArgument, match="another database connection"):
            store.write("report.txt", b"x", 8, tx=tx)
    assert store.read("report.txt") is None


def test_a_separate_fence_of_the_same_job_may_carry_the_write(store, clock):
    """The ordinary path: a Fence(db, job) made by the caller for the store's job joins the write and the intent."""
    outbox = Outbox(store.db, clock, job="invoice-run")
    with Fence(store.db, "invoice-run").guard(8) as tx:
        store.write("report.txt", b"run by 8", 8, tx=tx)
        assert outbox.add(tx, "invoice-run/report-email", "email", MAIL) is True
    assert (store.read("report.txt"), [p[3] for p in outbox.pending()]) == (b"run by 8", [8])


def test_email_provider_honours_keys_but_not_generations(files, clock):
    """Same key: one email. No key: every call sends. A stale worker's call is sent all the same."""
    mail = EmailProvider(files("provider"), clock)
    first = mail.send(**MAIL, idempotency_key="run/report")
    again = mail.send(**MAIL, idempotency_key="run/report")
    stale = mail.send(**MAIL)              # from an obsolete worker: nothing to check it against
    stale_again = mail.send(**MAIL)
    assert (first.replayed, again.replayed, again.id == first.id) == (False, True, True)
    assert [r["idempotency_key"] for r in mail.records()] == ["run/report", None, None]
    assert stale.id != stale_again.id
    with pytest.raises(KeyReused):
        mail.send("ops@example.com", "other", "x", idempotency_key="run/report")
    assert len(mail.records()) == 3


def test_relay_sends_exactly_once_across_a_crash_between_send_and_mark(files, clock):
    """The relay sent but crashed before marking; the next relay resends with the same key: one email."""
    db, mail = files("resource"), EmailProvider(files("provider"), clock)
    outbox = Outbox(db, clock)
    with Fence(db, "invoice-run").guard(8) as tx:
        outbox.add(tx, "invoice-run/report-email", "email", MAIL)
    [(key, _kind, payload, generation)] = outbox.pending()
    mail.deliver(payload, idempotency_key=key)       # sent ... crash: never marked
    assert outbox.relay(mail) == ["invoice-run/report-email"]
    assert outbox.relay(mail) == []
    assert [(r["idempotency_key"], r["payload"]) for r in mail.records()] == [(key, MAIL)]
    assert execute(db, "SELECT key, state, provider_id, generation FROM outbox") == [(key, "sent", 1, 8)]


def test_outbox_add_is_once_per_key_and_only_inside_a_fenced_transaction(files, clock):
    """A second intent with the same key is ignored; outside a guard there is nothing to add to."""
    db = files("resource")
    outbox = Outbox(db, clock)
    with Fence(db, "run").guard(8) as tx:
        assert outbox.add(tx, "k", "email", MAIL) is True
        assert outbox.add(tx, "k", "email", MAIL) is False
    with pytest.raises(BadArgumentType) as caught:
        outbox.add(db, "k2", "email", MAIL)
    assert caught.value.argument == "tx" and len(outbox.pending()) == 1


def test_outbox_refuses_an_unfenced_or_foreign_tx(files, clock):
    """An intent from run_once(db)'s unfenced tx is refused; an outbox bound to a job refuses another job's tx."""
    db = files("resource")
    outbox, bound = Outbox(db, clock), Outbox(db, clock, job="invoice-run")
    with pytest.raises(BadArgument) as caught:
        labkit.run_once(db, "k", lambda tx: outbox.add(tx, "run/email", "email", MAIL))
    assert caught.value.argument == "tx" and "not fenced" in str(caught.value)
    with Fence(db, "other-job").guard(3) as tx:
        with pytest.raises(BadArgument, match="other-job"):
            bound.add(tx, "invoice-run/email", "email", MAIL)
        assert outbox.add(tx, "other-job/email", "email", MAIL) is True   # unbound: any fenced job
    assert [(p[0], p[3]) for p in outbox.pending()] == [("other-job/email", 3)]


def test_stale_intent_never_reaches_the_outbox(files, clock):
    """A's intent with 7 after B's 8 is refused with the fence: the relay has nothing of A's to send."""
    db, mail = files("resource"), EmailProvider(files("provider"), clock)
    outbox, fence = Outbox(db, clock), Fence(db, "invoice-run")
    with fence.guard(8) as tx:
        outbox.add(tx, "invoice-run/report-email@8", "email", MAIL)
    with pytest.raises(StaleGeneration):
        with fence.guard(7) as tx:
            outbox.add(tx, "invoice-run/report-email@7", "email", {**MAIL, "body": "stale"})
    outbox.relay(mail)
    assert [r["idempotency_key"] for r in mail.records()] == ["invoice-run/report-email@8"]


def test_reconcile_finds_unmarked_missing_and_unknown(files, clock):
    """Reconciliation marks a delivered-but-pending row, reports a row the provider lost, and a send around the outbox."""
    db, pdb = files("resource"), files("provider")
    mail, outbox = EmailProvider(pdb, clock), Outbox(db, clock)
    with Fence(db, "run").guard(8) as tx:
        for key in ("a", "b", "c"):
            outbox.add(tx, key, "email", {**MAIL, "body": key})
    outbox.relay(mail)                                          # a, b, c sent and marked
    with Fence(db, "run").guard(8) as tx:
        outbox.add(tx, "d", "email", MAIL)
    mail.deliver(MAIL, idempotency_key="d")                     # d delivered, crash before mark
    direct = mail.send(**MAIL)                                  # a stale worker, around the outbox
    execute(pdb, "DELETE FROM provider_keys WHERE key = 'b'")   # the provider lost b's record
    execute(pdb, "DELETE FROM provider_records WHERE idempotency_key = 'b'")
    report = outbox.reconcile(mail)
    assert (report["confirmed"], report["missing"], report["unknown"]) == (("d",), ("b",), (direct.id,))
    assert outbox.pending() == []


def test_payment_contract_replays_within_the_key_window_only(files, clock):
    """A retried charge within 24 h returns the first charge; after the window the same key charges again."""
    pay = PaymentProvider(files("provider"), clock, key_ttl=86400)
    first = pay.charge("acct-1", 12000, idempotency_key="inv-1")
    clock.advance(3600)
    retry = pay.charge("acct-1", 12000, idempotency_key="inv-1")
    with pytest.raises(KeyReused):
        pay.charge("acct-1", 9900, idempotency_key="inv-1")
    clock.advance(86400)
    late = pay.charge("acct-1", 12000, idempotency_key="inv-1")
    assert (retry.id, retry.replayed, late.replayed) == (first.id, True, False)
    assert [(r["payload"]["amount"], r["idempotency_key"]) for r in pay.records()] == [
        (12000, "inv-1"), (12000, "inv-1")]


def test_payment_outbox_and_reconciliation(files, clock):
    """Charges go through the same outbox: an unmarked charge is confirmed by reconciliation, not repeated."""
    db, pay = files("resource"), PaymentProvider(files("provider"), clock, key_ttl=86400)
    outbox = Outbox(db, clock)
    with Fence(db, "run").guard(8) as tx:
        outbox.add(tx, "run/charge/acct-1", "charge", {"account": "acct-1", "amount": 12000})
    pay.deliver({"account": "acct-1", "amount": 12000}, idempotency_key="run/charge/acct-1")  # crash before mark
    report = outbox.reconcile(pay)
    assert (report["confirmed"], outbox.relay(pay), len(pay.records())) == (("run/charge/acct-1",), [], 1)


def test_etag_rejects_a_stale_version(files):
    """Replace with the current ETag wins; replace with the old one is refused and changes nothing."""
    store = ETagStore(files("objects"))
    v1 = store.put("report", b"run 7")
    v2 = store.replace("report", b"run 8", if_match=v1)
    assert store.replace("report", b"stale 7", if_match=v1) is None
    assert store.get("report") == (b"run 8", v2)


def test_etag_is_not_a_numeric_epoch(files):
    """Content that comes back brings its old ETag back: a stale writer holding v1 wins again (ABA).
    A fence, which only moves up, would have refused it."""
    store = ETagStore(files("objects"))
    v1 = store.put("report", b"draft")
    v2 = store.replace("report", b"final", if_match=v1)
    assert store.replace("report", b"draft", if_match=v2) == v1       # someone reverts to the draft
    assert store.replace("report", b"stale edit", if_match=v1) is not None   # the stale writer's v1 passes
    assert store.get("report")[0] == b"stale edit"


def test_etag_is_not_an_authorization_check(files, clock, store):
    """A whose lease expired (B holds it now) re-reads the ETag and replaces the object: the store cannot
    tell. The fenced file store refuses the same write by A's generation."""
    files_store = store
    leases, store = LeaseAuthority(files("authority"), clock), ETagStore(files("objects"))
    a = leases.acquire("report", "A", ttl=10)
    clock.advance(11)
    b = leases.acquire("report", "B", ttl=10)
    store.put("report", b"B's report")
    body, etag = store.get("report")                        # A wakes up and reads the current version
    assert store.replace("report", b"A's stale report", if_match=etag) is not None
    assert (store.get("report")[0], a.generation < b.generation) == (b"A's stale report", True)
    files_store.write("report", b"B's report", b.generation)
    with pytest.raises(StaleGeneration):
        files_store.write("report", b"A's stale report", a.generation)


@pytest.mark.parametrize("call, argument", [
    (lambda s, f, c: s.write("", b"x", 1), "name"),
    (lambda s, f, c: s.write("r", "text", 1), "data"),
    (lambda s, f, c: s.write("r", b"x", -1), "generation"),
    (lambda s, f, c: EmailProvider(f("p"), c).send("", "s", "b"), "to"),
    (lambda s, f, c: PaymentProvider(f("p"), c).charge("acct", 0), "amount"),
    (lambda s, f, c: PaymentProvider(f("p"), c, key_ttl=0), "key_ttl"),
    (lambda s, f, c: EmailProvider(f("p"), c).deliver({"x": float("nan")}), "payload"),
    (lambda s, f, c: ETagStore(f("o")).replace("r", b"x", if_match=""), "if_match"),
    (lambda s, f, c: ETagStore(f("o")).put("r", "text"), "body"),
    (lambda s, f, c: Outbox(f("o"), object()), "clock"),
])
def test_bad_arguments_are_refused_by_name(store, files, clock, call, argument):
    """Bad input raises naming the argument."""
    with pytest.raises((BadArgument, BadArgumentType)) as caught:
        call(store, files, clock)
    assert caught.value.argument == argument
    assert execute(store.db, "SELECT count(*) FROM files") == [(0,)]
    assert os.listdir(store.directory / "blobs") == []
