"""What an expert checks against real systems (issue 24, errors 1-11): each claim as the lessons now
make it, and a reproduction where the error was in code (a real SQLITE_FULL, an ETag, a clock)."""

import contextlib
import json
import pathlib
import sqlite3
import time

import pytest

import labkit
import labkit.grading
from labkit.grading.diskfull import FULL, disk_full, is_full, long_id
from labkit.mechanisms.effects import EmailProvider, ETagStore
from labkit.scenarios import late_renewal

ROOT = pathlib.Path(__file__).resolve().parent.parent


def cells(folder: str, stem: str) -> dict:
    """cell id -> cell of notebook ``folder/stem*.ipynb``."""
    (path,) = (ROOT / folder).glob(f"{stem}*.ipynb")
    return {c["id"]: c for c in json.loads(path.read_text())["cells"]}


def prose(folder: str, stem: str) -> str:
    """All markdown of one notebook, its line breaks as spaces."""
    text = " ".join(c["source"] for c in cells(folder, stem).values() if c["cell_type"] == "markdown")
    return " ".join(text.split())


def output(cell) -> str:
    return "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in cell["outputs"])


# 1. compaction does not reissue numbers -------------------------------------------------------------
def test_compaction_is_not_the_restore_problem_and_belongs_with_the_recheck():
    """Lesson 04 no longer calls compaction the restore problem: the counter keeps rising, keys keep their
    create_revision, and reads or watches at old revisions fail with ErrCompacted; lesson 06 rechecks."""
    text = prose("notebooks", "04")
    assert "compaction can remove" not in text and "Compaction is not" in text
    assert "create_revision" in text and "ErrCompacted" in text
    assert "ErrCompacted" in prose("notebooks", "06")


# 2. an ETag is an opaque validator -------------------------------------------------------------------
def test_any_stale_worker_can_present_the_current_etag_of_either_kind():
    """With hash or version ETags, a stale worker that re-reads the object gets its write in; only the
    content hash also lets an old ETag come back (ABA)."""
    for kind in ("hash", "version"):
        store = ETagStore(labkit.connect(":memory:"), etags=kind)
        v7 = store.put("report", b"run 7")
        v8 = store.replace("report", b"run 8", if_match=v7)
        assert store.replace("report", b"stale", if_match=v7) is None
        _, current = store.get("report")
        assert store.replace("report", b"late write by the old worker", if_match=current) is not None
        back = store.replace("report", b"run 7", if_match=store.get("report")[1])
        assert (back == v7) is (kind == "hash") and v8 != v7
    text = prose("notebooks", "08")
    assert "opaque validator" in text and "a hash of the current content" not in text
    assert output(cells("notebooks", "08")["b7d2f4a6"]).strip() == "True"
    assert "opaque validator" in ETagStore.__doc__


# 3. a monotonic clock stops during suspend ---------------------------------------------------------
def test_real_clock_counts_suspended_time_and_the_lessons_say_why():
    """RealClock reads CLOCK_BOOTTIME where Linux has it; lessons 01 and 05 say that CLOCK_MONOTONIC stops
    during a suspend, that NTP slews it and that it restarts at boot."""
    if hasattr(time, "CLOCK_BOOTTIME"):
        a, b = time.clock_gettime(time.CLOCK_BOOTTIME), labkit.RealClock().now()
        assert 0 <= b - a < 1.0
    assert "suspend" in labkit.RealClock.__doc__ and "CLOCK_BOOTTIME" in labkit.RealClock.__doc__
    assert "CLOCK_MONOTONIC" in prose("notebooks", "01") and "suspended" in prose("notebooks", "01")
    five = prose("notebooks", "05")
    assert "CLOCK_BOOTTIME" in five and "slew" in five and "reboot" in five


# 4. a real disk full, and the reference solutions let it propagate ---------------------------------
UPSERT = """INSERT INTO invoices(job_id, invoice_id, amount, generation)
    VALUES (:job, :invoice, :amount, :generation)
    ON CONFLICT(job_id, invoice_id) DO UPDATE SET amount = excluded.amount, generation = excluded.generation"""
CHARGES = """CREATE TABLE IF NOT EXISTS charges (id INTEGER PRIMARY KEY, job_id TEXT NOT NULL,
    invoice_id TEXT NOT NULL, amount INTEGER NOT NULL, generation INTEGER NOT NULL)"""


def solution(stem: str, cell_id: str, name: str):
    namespace = {"UPSERT": UPSERT}
    exec(cells("solutions", stem)[cell_id]["source"], namespace)
    return namespace[name]


def naive(conn, job, invoice_id, amount, generation):
    """The reference pattern before: ROLLBACK whatever happened, then raise."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("UPDATE job_fence SET generation = ? WHERE job_id = ? AND generation <= ?",
                     (generation, job, generation)).fetchall()
        conn.execute(UPSERT, {"job": job, "invoice": invoice_id, "amount": amount, "generation": generation})
        conn.execute("COMMIT")
        return True
    except BaseException:
        conn.execute("ROLLBACK")
        raise


@pytest.fixture
def full_db(tmp_path):
    db = labkit.connect(str(tmp_path / "full.db"))
    db.execute(CHARGES)
    db.execute("INSERT INTO job_fence VALUES ('job', 0, 7)")
    return db


def test_sqlite_full_rolls_back_by_itself_and_a_second_rollback_replaces_the_error(full_db):
    """With max_page_count at the file's size, the row needs pages: SQLITE_FULL, the transaction is gone,
    and the old pattern's ROLLBACK raises 'no transaction is active' instead of the real error."""
    with disk_full(full_db), pytest.raises(sqlite3.OperationalError) as raised:
        naive(full_db, "job", long_id(full_db, "INV-1"), 100, 8)
    assert "no transaction is active" in str(raised.value) and not is_full(raised.value)
    assert FULL in str(raised.value.__context__)
    assert labkit.db.execute(full_db, "SELECT generation FROM job_fence")[0][0] == 7


@pytest.mark.parametrize("stem,cell_id,name", [("02", "fadfcc0a", "fenced_insert"),
                                               ("02", "d9bbcce7", "charge_once"),
                                               ("03", "f3468605", "record_batch")])
def test_the_reference_solutions_let_the_real_disk_full_propagate(full_db, stem, cell_id, name):
    """02.1, 02.2 and 03.1's solutions, on a really full disk: SQLITE_FULL itself reaches the caller,
    nothing is left behind, and the connection has no transaction open."""
    answer, invoice = solution(stem, cell_id, name), long_id(full_db, "INV-1")
    args = {"fenced_insert": ("job", invoice, 100, 8), "charge_once": ("job", "k", invoice, 100, 8),
            "record_batch": ("job", 8, {"INV-0": 5, invoice: 100})}[name]
    with disk_full(full_db), pytest.raises(Exception) as raised:
        answer(full_db, *args)
    assert is_full(raised.value), raised.value
    assert not full_db.conn.in_transaction
    assert labkit.db.execute(full_db, "SELECT generation FROM job_fence")[0][0] == 7
    assert labkit.db.execute(full_db, "SELECT count(*) FROM invoices")[0][0] == 0


def test_the_check_fails_an_answer_that_replaces_the_real_error():
    """02.1's check fills the disk for real: the unconditional ROLLBACK breaks 'propagates' there, and the
    solution passes."""
    wrong = labkit.grading.verdict("02.1", lambda: contextlib.nullcontext(naive), "fenced_insert")
    broken = {f.prop for f in wrong.findings if f.broken}
    assert "propagates" in broken and "no transaction is active" in wrong.text()
    right = solution("02", "fadfcc0a", "fenced_insert")
    assert labkit.grading.verdict("02.1", lambda: contextlib.nullcontext(right), "fenced_insert").passed


# 6. the serialization point, not "began in time" ----------------------------------------------------
def test_lesson_02_orders_writers_by_the_committed_raise_not_by_when_a_transaction_began():
    """Lesson 02 no longer says a write is safe because its transaction began in time."""
    text = prose("notebooks", "02")
    assert "began in time" not in text and "began while A held the lease" not in text
    assert "When A's transaction began does not matter" in text


# 7. Redis loses the lease too; WAIT's caveat --------------------------------------------------------
def test_lesson_04_says_the_lease_key_is_lost_too_and_what_wait_does_not_promise():
    text = prose("notebooks", "04")
    assert "Mutual exclusion is lost" in text and "SET ... NX PX" in text
    assert "does not make Redis strongly consistent" in text


# 8. fencing without epochs: a proven bound at every resource ----------------------------------------
def test_fencing_every_resource_without_epochs_raises_each_fence_to_a_proven_bound():
    """Lesson 04's cell uses no epoch: both resources' fences go to the bound, A's old 9 is refused at both
    (one had never seen a token), and the stored output says so."""
    cell = cells("notebooks", "04")["36c14c98"]
    assert "epoch" not in cell["source"].lower()
    namespace = {"labkit": labkit}
    with contextlib.redirect_stdout(None):
        exec(cell["source"], namespace)
    assert all(f.current() == 56 for f in namespace["fences"].values())
    assert output(cell).splitlines() == ["invoices: 9 refused, the fence is at 56",
                                         "reports: 9 refused, the fence is at 56", "the issuer goes on from 57"]
    assert "proven upper bound" in prose("notebooks", "04")


# 9. at-least-once plus deduplication, not exactly once ---------------------------------------------
def test_no_exactly_once_promise_and_a_keyless_provider_gets_the_email_twice():
    """Lessons, task texts and check properties promise no exactly-once delivery; without a key (SMTP)
    the relay's resend is a second email."""
    for folder in ("notebooks", "solutions"):
        for stem in ("07", "08", "09"):
            text = prose(folder, stem).lower().replace('not "exactly once"', "")
            assert "exactly once" not in text, (folder, stem)
    for t in ("08.1", "08.2", "09.1"):
        assert not any("exactly once" in w for w in labkit.grading.TASKS[t].properties.values()), t
    assert "at-least-once delivery" in prose("notebooks", "08") and "SMTP" in prose("notebooks", "08")
    smtp = EmailProvider(labkit.connect(":memory:"), labkit.VirtualClock())
    for _ in range(2):
        smtp.send("ops", "report", "8")
    assert len(smtp.records()) == 2 == int(output(cells("notebooks", "08")["a3c1e9d2"]))


# 10. a cleanup's clock is the authority's ----------------------------------------------------------
def test_the_cleanup_check_never_renews_a_lease_its_clock_says_has_expired():
    """04.2's holder renews on the clock the cleanup is given: in every schedule, a renewal succeeds only
    for a lease whose recorded expiry is still ahead, so 'expired at now' means expired for the authority."""
    from labkit.db import rowcount, transaction

    def cleanup(conn, now):
        with transaction(conn):
            return rowcount(conn, "DELETE FROM leases WHERE expires_at <= ?", (now,))

    renewals = 0
    for schedule in labkit.grading.TASKS["04.2"].schedules:
        history = labkit.grading.replayed("04.2", cleanup, seed=schedule.seed).history
        until = {}
        for e in history:
            if e.action == "acquire" and e.outcome == "ok":
                until[e.worker, e.target] = e.until
            if e.action == "renew" and e.outcome == "ok":
                assert until[e.worker, e.target] > e.time, (schedule.name, e)
                renewals += 1
    assert renewals
    assert "authority's** clock" in prose("solutions", "04") and "claims' own clock" in prose("solutions", "07")


# 11. the smaller errors ----------------------------------------------------------------------------
def test_the_smaller_claims_hold():
    """A fence refuses until the counter passes it (not for ever); SQLite's lock is the file's; a check
    prints a scorecard; pytest is not how the grader grades; margin 3 fails from a latency of 4."""
    assert "forever" not in prose("notebooks", "04")
    assert "fence row's lock" not in cells("notebooks", "09")["9bedc0f4"]["source"]
    assert "prints one line" not in prose("notebooks", "00") and "one `PASS` line" not in prose("solutions", "05")
    assert "as the grader will" not in prose("notebooks", "00")
    assert late_renewal(protected=False, margin=3.0, response_latency=3.5).violations == ()
    assert late_renewal(protected=False, margin=3.0, response_latency=4.0).violations != ()
    assert "3.5 is still safe" in prose("notebooks", "05") and "4 fails" in prose("notebooks", "05")


# the checker tells safety from discipline --------------------------------------------------------
def test_a_warning_is_drawn_apart_and_never_as_the_violation_ring():
    """A's write at 30 after its lease ended at 10, nobody else: the timeline draws one grey warning
    diamond on it, no red ring, and the title says no violation."""
    from types import SimpleNamespace

    from labkit.sim.history import Event, check, describe, warnings
    from labkit.views.plot import timeline
    from labkit.views.scene import COLOURS

    history = (Event(0, "A", "acquire", "ok", 7, target="run", until=10),
               Event(30, "A", "raise", "ok", 7, target="invoice-run"),
               Event(30, "A", "write", "ok", 7, target="INV-1"))
    run = SimpleNamespace(history=history, violations=check(history), warnings=warnings(history),
                          verdict=describe(history, []), params={"protected": True})
    ax = timeline(run)
    rings = [ln for ln in ax.get_lines() if ln.get_marker() == "o" and ln.get_markerfacecolor() == "none"]
    squares = [ln for ln in ax.get_lines() if ln.get_marker() == "D" and ln.get_markerfacecolor() == "none"
               and ln.get_markeredgecolor() == "#777777"]
    assert not [ln for ln in rings if ln.get_markeredgecolor() == COLOURS["crash"] and len(ln.get_xdata())]
    assert [list(ln.get_xdata()) for ln in squares] == [[30.0]]
    assert ax.get_title(loc="left").startswith("no violation")
    ax.figure.clf()


def test_the_protected_lock_wait_commits_late_without_harm_and_the_naive_rings_sit_on_the_stale_write():
    """lock_wait protected: A's late commit is neither a violation nor a warning (it began in its lease);
    raise_then_read naive: the lost update is pinned on A's write in B's gap, not on B."""
    from labkit.scenarios import lock_wait, raise_then_read

    held = lock_wait(protected=True, hold=30, ttl=10)
    assert held.violations == () and held.warnings == ()
    naive = raise_then_read(protected=False, gap=5, pause=12)
    assert [(v.kind, v.event.worker, v.event.time) for v in naive.violations] == [("lost_update", "A", 12.0)]
    assert naive.verdict.startswith("A's late write of INV-1")


# 5. a token is not a credential ------------------------------------------------------------------
def test_lesson_03_and_the_readme_say_a_token_is_not_a_credential():
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "A token is not a credential" in readme and "above the last generation issued" in readme
    assert "not a credential" in prose("notebooks", "03") and "epoch` column" in prose("notebooks", "03")


# lesson 00 opens with Kleppmann's split; lesson 09 asks it of every incident ----------------------
def test_lesson_00_opens_with_efficiency_or_correctness_and_lesson_09_asks_it_of_every_incident():
    first = " ".join(cells("notebooks", "00")["3f249bcb"]["source"].split())
    assert first.index("**efficiency**") < first.index("**correctness**") < first.index("family of bugs")
    assert "needs no fence" in first and "never go backwards" in first
    review = " ".join(cells("notebooks", "09")["7d09cdf6"]["source"].split())
    assert "efficiency or for correctness" in review
    from labkit.grading.checks09 import INCIDENTS
    assert all(f"`{name}`" in review for name in INCIDENTS)


# Chubby's two answers, as runs --------------------------------------------------------------------
def test_lock_delay_keeps_a_straggler_out_of_the_successors_term_at_the_cost_of_idle_time():
    """No delay: B sends at 10, A's straggler lands at 14 (two emails). Delay 20: it lands first and B
    sends none (one email), but nobody works from 10 to 30. A straggler slower than the delay still
    lands in B's term. A released lease is free at once; an expired one only after the delay."""
    from labkit.mechanisms.chubby import LockDelay, straggler

    assert straggler(0, 9) == {"emails": [(10.0, "B"), (14.0, "A")], "b_granted": 10.0, "idle": 0.0}
    assert straggler(20, 9) == {"emails": [(14.0, "A")], "b_granted": 30.0, "idle": 20.0}
    assert straggler(20, 40)["emails"] == [(30.0, "B"), (45.0, "A")]
    clock = labkit.VirtualClock()
    locks = LockDelay(labkit.LeaseAuthority(labkit.connect(":memory:"), clock), delay=20)
    locks.authority.release(locks.try_acquire("job", "A", 10))
    b = locks.try_acquire("job", "B", 10)
    assert b is not None
    clock.advance(12)
    assert locks.try_acquire("job", "C", 10) is None and locks.free_at("job") == 30.0
    clock.advance(18)
    assert locks.try_acquire("job", "C", 10).generation == b.generation + 1
    assert "nobody works for 20 s" in output(cells("notebooks", "08")["e5f9c2d8"])


def test_a_sequencer_check_refuses_a_stale_holder_but_not_one_that_goes_stale_after_the_answer():
    """The lesson's run: asked at 9.5 the lock service says A is current, B takes over at 10.5, and both
    emails go out; asked afterwards, it says no."""
    from labkit.mechanisms.chubby import is_current

    namespace = {"labkit": labkit, "EmailProvider": EmailProvider, "is_current": is_current}
    exec(cells("notebooks", "08")["a7b1e4f0"]["source"].replace("# NBVAL_CHECK_OUTPUT\n", ""), namespace)
    assert namespace["a_is_current"] is True and not is_current(namespace["authority"], namespace["a"])
    assert [r["payload"]["body"] for r in namespace["mail"].records()] == ["from B", "from A"]
    assert output(cells("notebooks", "08")["a7b1e4f0"]).strip() == "(True, False, ['from B', 'from A'])"
