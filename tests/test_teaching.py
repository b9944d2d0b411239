"""What the lessons claim, asserted: nobody acts on a lease that has ended, across every slider."""

import ast
import dataclasses
import glob
import json
import math
import os

import pytest

import labkit
from labkit.mechanisms.issuers import EpochAuthority, EpochIssuer, backup, cleanup_expired, restore
from labkit.scenarios import SCENARIOS, late_renewal, lock_wait
from labkit.sim.history import EFFECTS, Event, check, warnings
from labkit.views.widgets import SLIDER_KNOBS, _default_spec

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def late_effects(history) -> list:
    """Committed effects whose transaction began after the worker's own lease had ended (its last
    acquire or renew's ``until``, or its release), with no acquire since: read off the history."""
    ended, late = {}, []
    for e in sorted(history, key=lambda e: e.time):
        if e.outcome != "ok":
            continue
        if e.action == "acquire":
            ended.pop(e.worker, None)
        if e.action in ("acquire", "renew") and e.until is not None:
            ended[e.worker] = e.until
        elif e.action == "release":
            ended[e.worker] = e.time
        elif e.action in EFFECTS and (e.time if e.began is None else e.began) > ended.get(e.worker, math.inf):
            late.append(e)
    return late


def lesson_sliders() -> dict:
    """scenario name -> {knob: (low, high, step)} from every explore(...) cell of the lessons."""
    found: dict = {}
    for path in sorted(glob.glob(os.path.join(HERE, "notebooks", "*.ipynb"))):
        for cell in json.load(open(path, encoding="utf-8"))["cells"]:
            if cell["cell_type"] != "code" or "explore(" not in cell["source"]:
                continue
            for node in ast.walk(ast.parse(cell["source"])):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "explore":
                    for kw in node.keywords:
                        value = ast.literal_eval(kw.value)
                        if isinstance(value, tuple):
                            found.setdefault(node.args[0].id, {})[kw.arg] = value
    return found


def slider_points():
    """(scenario, knobs) for each slider of each scenario: its ends, its default and its middle."""
    lessons = lesson_sliders()
    for name, f in sorted(SCENARIOS.items()):
        specs = {k: _default_spec(k, d) for k, d in f.knobs.items() if k in SLIDER_KNOBS}
        specs = {k: v for k, v in specs.items() if v} | lessons.get(name, {})
        for knob, (low, high, _) in sorted(specs.items()):
            points = {low, high, (low + high) / 2, f.knobs[knob]}
            if isinstance(f.knobs[knob], int):
                points = {int(p) for p in points}
            for value in sorted(points):
                if value > 0 or knob not in ("ttl", "duration"):
                    yield name, {knob: value}


POINTS = list(slider_points())


def test_the_sweep_covers_every_scenario_and_the_lessons_sliders():
    """Every registered scenario is swept, including lock_wait's hold up to 60 and ttl down to 1."""
    assert {name for name, _ in POINTS} == set(SCENARIOS)
    assert ("lock_wait", {"hold": 60}) in POINTS and ("lock_wait", {"ttl": 1}) in POINTS


def test_no_protected_run_breaks_the_data_and_every_late_commit_is_a_warning():
    """Across every slider's range, a protected run has no violation; where a lease shorter than
    the work (ttl 0.5) makes a worker commit after its own lease ended, the fence let it through
    because no successor had raised it, and the checker says so as a warning, never hides it."""
    for name, knobs in POINTS:
        run = SCENARIOS[name](protected=True, **knobs)
        assert run.violations == (), (name, knobs, run.verdict)
        late = [w.event for w in run.warnings if w.kind == "acted_after_expiry"]
        assert late == late_effects(run.history), (name, knobs)
        if all(SCENARIOS[name].knobs[k] == v for k, v in knobs.items()):
            assert late == [], (name, "at the lesson's own settings")


def test_the_checker_flags_exactly_the_late_effects_of_naive_runs():
    """Unprotected, the checker's acted_after_expiry warnings are exactly the late effects read off the
    history, never a violation, and somewhere in the sliders' ranges there are some."""
    flagged_somewhere = False
    for name, knobs in POINTS[::2]:
        run = SCENARIOS[name](protected=False, **knobs)
        late = late_effects(run.history)
        assert [w.event for w in run.warnings if w.kind == "acted_after_expiry"] == late, (name, knobs)
        assert "acted_after_expiry" not in run.kinds
        flagged_somewhere |= bool(late)
    assert flagged_somewhere


def test_a_naive_lock_wait_b_writes_after_its_lease_and_is_flagged():
    """lock_wait unprotected, hold 30, ttl 10: B's lease ends at 20, its writes at 32 and 33 are flagged."""
    run = lock_wait(protected=False, hold=30, ttl=10)
    late = [(e.worker, e.time) for e in late_effects(run.history)]
    assert ("B", 32.0) in late and ("B", 33.0) in late
    flagged = [(w.event.worker, w.event.time) for w in run.warnings if w.kind == "acted_after_expiry"]
    assert flagged == late


def test_a_hand_built_late_write_is_flagged_and_one_begun_in_time_is_not():
    """B's lease ends at 20: a write begun at 32 is flagged; one begun at 15 and committed at 32 is not."""
    grant = Event(10, "B", "acquire", "ok", 8, target="invoice-run", until=20)
    late = Event(32, "B", "write", "ok", 8, target="INV-1")
    assert [w.kind for w in warnings([grant, late])] == ["acted_after_expiry"] and check([grant, late]) == []
    assert warnings([grant, dataclasses.replace(late, began=15)]) == []


def test_lock_wait_b_renews_after_the_wait_and_stops_if_refused():
    """hold 30, ttl 10: B's renew at 32 is refused and B does nothing more; A's in-flight INV-1 commits,
    and A's own renew is refused too. hold 15: B's renew succeeds, B writes both invoices and releases."""
    stopped = lock_wait(protected=True, hold=30, ttl=10)
    after = [(e.time, e.worker, e.action, e.outcome) for e in stopped.history if e.time >= 32 and e.action != "wait"]
    assert after == [(32.0, "A", "resume", "ok"), (32.0, "A", "raise", "ok"), (32.0, "A", "write", "ok"),
                     (32.0, "B", "renew", "lost"), (33.0, "A", "renew", "lost")]
    assert "its lease had ended, so it stopped" in stopped.verdict and stopped.violations == ()
    went_on = lock_wait(protected=True, hold=15, ttl=10)
    b = [(e.action, e.outcome, e.target) for e in went_on.history if e.worker == "B" and e.action in
         ("renew", "write", "release")]
    assert b == [("renew", "ok", "invoice-run"), ("write", "ok", "INV-1"), ("write", "ok", "INV-2"),
                 ("release", "ok", "invoice-run")]


def test_sqlite_begin_immediate_locks_the_whole_file_not_a_row(tmp_path):
    """While A's BEGIN IMMEDIATE is open, B cannot begin even to write a table A never touched."""
    path = str(tmp_path / "file.db")
    a, b = labkit.connect(path, busy_timeout_ms=0), labkit.connect(path, busy_timeout_ms=0)
    a.execute("CREATE TABLE other (x)")
    a.execute("BEGIN IMMEDIATE")
    with pytest.raises(Exception, match="locked"):
        b.execute("BEGIN IMMEDIATE")
    a.execute("ROLLBACK")


def test_late_renewal_naive_margin_helps_only_up_to_the_return_trip():
    """Naive A counts from the answer's arrival minus its margin: a margin of at least the return trip is
    safe, a smaller one is not, and a longer trip defeats the same margin again."""
    assert late_renewal(protected=False, margin=3.0, response_latency=3.0).violations == ()
    assert late_renewal(protected=False, margin=2.0, response_latency=3.0).violations != ()
    assert late_renewal(protected=False, margin=3.0, response_latency=6.0).violations != ()


def test_late_renewal_protected_a_waits_for_the_renewals_answer():
    """Protected, A's first deadline is 0 + 10 - 1 = 9; the renewal sent at 8 is answered at 13: no write
    starts in between, and writes resume at 13 until the new deadline 8 + 10 - 1 = 17."""
    run = late_renewal(protected=True)
    writes = [e.time for e in run.history if e.worker == "A" and e.action == "write"]
    assert writes == [5.0, 6.0, 7.0, 8.0, 13.0, 14.0, 15.0, 16.0]
    assert [(e.time, e.until) for e in run.history if e.action == "renew"] == [(10.0, 20.0)]


def test_a_late_renew_is_refused_by_owner_and_generation(tmp_path):
    """Lesson 06: A's lease lapses and B (same owner id) takes it; A's renew raises LeaseLost, B's works."""
    clock = labkit.VirtualClock()
    authority = labkit.LeaseAuthority(labkit.connect(str(tmp_path / "l.db")), clock)
    a = authority.acquire("invoice-run", "host-1", ttl=10)
    clock.advance(12)
    b = authority.acquire("invoice-run", "host-1", ttl=10)
    with pytest.raises(labkit.LeaseLost):
        authority.renew(a)
    assert authority.renew(b).expires_at == 22.0
    assert authority.current("invoice-run").generation == b.generation == a.generation + 1


def test_revisions_are_ordered_within_one_lifetime_and_repeat_after_a_rebuild(tmp_path):
    """Lesson 04: numbers from one store grow while it lives; rebuilt from a snapshot, it repeats them."""
    store, snap = labkit.connect(str(tmp_path / "store.db")), str(tmp_path / "snap.db")
    revisions = EpochIssuer(store, "invoice-run")
    first = [revisions.issue() for _ in range(3)]
    backup(store, snap)
    first += [revisions.issue() for _ in range(2)]
    restore(store, snap)
    assert first == [1, 2, 3, 4, 5]
    assert [revisions.issue() for _ in range(2)] == [4, 5]


def test_fencing_every_resource_through_the_durable_authority_refuses_old_tokens_everywhere():
    """Lesson 04: raising each resource's fence to (new epoch, 0) refuses an old 7 even where 7 was never seen."""
    durable = EpochAuthority(labkit.connect(":memory:"))
    fences = [labkit.Fence(labkit.connect(":memory:"), "invoice-run") for _ in range(2)]
    with fences[0].guard(5):
        pass
    epoch = durable.next_epoch("invoice-run")
    for fence in fences:
        with fence.guard((epoch, 0)):
            pass
    for fence in fences:
        with pytest.raises(labkit.StaleGeneration):
            with fence.guard(7):
                pass
        assert fence.current() == (1, 0)


def test_a_cleanup_ttl_is_not_an_ownership_deadline():
    """Lesson 04: at 12 A's expired row is still stored, yet nobody holds the lease and B gets the next
    generation; the later cleanup changes nobody's ownership and keeps the counter."""
    clock, db = labkit.VirtualClock(), labkit.connect(":memory:")
    authority = labkit.LeaseAuthority(db, clock)
    a = authority.acquire("invoice-run", "A", ttl=10)
    clock.advance(12)
    assert len(list(db["leases"].rows)) == 1 and authority.current("invoice-run") is None
    with pytest.raises(labkit.LeaseLost):
        authority.renew(a)
    clock.advance(3600)
    assert cleanup_expired(db, clock, "invoice-run") == 1
    assert authority.acquire("invoice-run", "B", ttl=10).generation == a.generation + 1
