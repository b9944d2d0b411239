"""The failures behind the checks of lessons 01-04 really happen: races, late writers, lost work.

The corpus-wide tests (right answers pass, wrong ones fail, tampering, the
exercises) are in tests/test_grading.py; here each trial is run directly to
show that what a check guards against really occurs in its schedules.
"""

from __future__ import annotations

import pytest

import labkit.grading
from answers import define, hostile_only
from corpus_part1 import CORPUS


def test_the_race_really_interleaves_two_connections():
    """In the race schedule, B's write really lands between A's check and A's write (check-then-act)."""
    entry = CORPUS["02.1"]
    wrong = define(entry["wrong"]["check-then-act: read, compare in Python, write unconditionally"][0], entry["name"])
    schedule = next(s for s in labkit.grading.TASKS["02.1"].schedules if s.knobs.get("at") == 2)
    history: list = []
    with pytest.raises(labkit.grading.Broken, match="refused \\(returns False\\) and writes nothing") as broken:
        labkit.grading.TASKS["02.1"].trial(wrong, schedule, history)
    assert broken.value.prop == "stale"
    writes = [(e.worker, e.outcome, e.generation) for e in history if e.action == "write"]
    assert writes == [("B", "ok", 8), ("A", "ok", 7)]


def test_the_lock_really_keeps_b_out_while_a_is_inside():
    """With a correct answer, B's attempt inside A's transaction is refused by SQLite, then succeeds."""
    entry = CORPUS["02.1"]
    right = define(entry["right"]["labkit's Fence.guard"], entry["name"])
    schedule = next(s for s in labkit.grading.TASKS["02.1"].schedules if s.knobs.get("at") == 3)
    history: list = []
    labkit.grading.TASKS["02.1"].trial(right, schedule, history)
    assert [(e.worker, e.action, e.outcome) for e in history] == [
        ("A", "pause", "ok"), ("B", "wait", "busy"), ("A", "resume", "ok"), ("A", "write", "ok"),
        ("B", "write", "ok"), ("B", "raise", "ok"), ("A", "write", "rejected"), ("A", "write", "rejected")]


def test_a_crash_replays_as_the_crashed_write():
    """02.1 that keeps the fence raised after a real full disk: the replay of the crash schedule draws
    A's refused stale write, B's crashed write, then the raise it kept, not an empty timeline."""
    from labkit.views.scene import lanes_of

    entry = CORPUS["02.1"]
    wrong = define(entry["wrong"]["on an error, keeps the fence raised (commits the raise alone), then re-raises"][0],
                   entry["name"])
    result = labkit.grading.replayed("02.1", wrong, seed=6)
    assert [(e.worker, e.action, e.outcome) for e in result.history][:3] == [
        ("A", "write", "rejected"),  # the row's stale write first: refused, it never meets the full disk
        ("B", "write", "crashed"),
        ("B", "raise", "ok"),
    ]
    assert lanes_of(result.history, 14) and "a crash leaves neither" in result.verdict
    from matplotlib.figure import Figure

    ax = Figure().add_subplot()  # the drawing the failure's replay line makes, which returns None
    assert labkit.grading.replay("02.1", wrong, seed=6, ax=ax) is None
    assert [t.get_text() for t in ax.get_yticklabels()] == ["A", "B", "fence"] and ax.collections
    ax.figure.clf()


@pytest.mark.parametrize("task_id,args,value", [
    (t, a, v) for t, a, values in [
        ("02.1", "conn, job, invoice_id, amount, generation", ["True", "False", "None", "0"]),
        ("03.1", "conn, job, generation, invoices", ["True", "False", "None", "1"]),
        ("02.2", "conn, job, key, invoice_id, amount, generation", ["None", "0", "1", "2"]),
    ] for v in values])
@pytest.mark.parametrize("first", ["", 'conn.execute("SELECT 1").fetchall()\n    ',
                                   'conn.execute("SELECT 1").fetchall()\n    raise RuntimeError("no")\n    '])
@pytest.mark.parametrize("rows", ["every row", "hostile rows only"])
def test_a_writer_that_sends_no_sql_scores_nothing(task_id, args, value, first, rows, monkeypatch):
    """A constant writer, with or without a SELECT to look busy, or one that always raises,
    never does the task: it may break rules, but no rule holds for it (0 points), with the random
    rows and without them (they must not be what stops it scoring)."""
    import contextlib

    if rows == "hostile rows only":
        hostile_only(monkeypatch, task_id)

    answer = define(f"def answer({args}):\n    {first}return {value}\n", "answer")
    report = labkit.grading.verdict(task_id, lambda: contextlib.nullcontext(answer), "answer")
    assert report.total()[0] == 0 and not any(f.held for f in report.findings), report.text()


def _cleanup_trial(label: str, kind: str, race: str, at: int):
    """Run one 04.2 race schedule directly; return (the broken rule or None, the target holder's events)."""
    entry = CORPUS["04.2"]
    source = entry[kind][label] if kind == "right" else entry[kind][label][0]
    task = labkit.grading.TASKS["04.2"]
    schedule = next(s for s in task.schedules if s.knobs.get("race") == race and s.knobs.get("at") == at)
    history: list = []
    try:
        task.trial(define(source, entry["name"]), schedule, history)
        broken = None
    except labkit.grading.Broken as b:
        broken = b.rule
    target = next(e.target for e in history if e.action in ("renew", "acquire") and e.worker != "I"
                  and e.target.startswith("edge" if race == "renew" else "boundary"))
    holder = next(e.worker for e in history if e.target == target)
    return broken, [("holder" if e.worker == holder else e.worker, e.action, e.outcome)
                    for e in history if e.target == target], history


def test_a_reacquire_between_read_and_delete_really_loses_the_new_lease():
    """04.2: the expired holder acquires again between the cleanup's read and its DELETE; deleting by name
    and owner removes the new, unexpired lease."""
    broken, events, history = _cleanup_trial("read, then delete by name and owner (a re-acquire lands in between)",
                                             "wrong", "reacquire", 2)
    assert broken and "never deletes a lease that is unexpired" in broken
    assert events == [("holder", "acquire", "ok"), ("holder", "acquire", "ok"), ("holder", "release", "ok"),
                      ("I", "acquire", "ok")]
    again = [e for e in history if e.action == "acquire" and e.worker != "I"][-1]
    assert again.until > next(e.time for e in history if e.action == "cleanup")


def test_the_cleanups_write_lock_keeps_the_renewal_out_or_after():
    """04.2: with one conditional DELETE, a renewal before the cleanup is kept; one during it waits, and
    by then (on the same clock as the cleanup's) the quarter second left is gone: it is refused."""
    label = "BEGIN IMMEDIATE by hand, DELETE ... RETURNING fetched before COMMIT"
    broken, events, _ = _cleanup_trial(label, "right", "renew", 1)
    assert broken is None and events == [("holder", "acquire", "ok"), ("holder", "renew", "ok"), ("I", "acquire", "ok")]
    broken, events, _ = _cleanup_trial(label, "right", "renew", 2)
    assert broken is None
    assert events == [("holder", "acquire", "ok"), ("holder", "renew", "lost"), ("I", "acquire", "ok")]


def test_a_cleanup_that_drops_the_counter_really_reissues_old_generations():
    """04.2: after the naive cleanup, LeaseAuthority hands generation 1 to the next holder of an 8-times-used name."""
    entry = CORPUS["04.2"]
    naive = define(entry["wrong"]["deletes the counter with the lease (the lesson's naive cleanup)"][0], "cleanup")
    history: list = []
    with pytest.raises(labkit.grading.Broken, match="above every generation ever issued"):
        labkit.grading.TASKS["04.2"].trial(naive, labkit.grading.TASKS["04.2"].schedules[0], history)
    assert [e.generation for e in history if e.worker == "I" and e.target.startswith("expired")] == [1]



def test_the_lost_writes_in_history_order_are_neither_grouped_nor_in_overwrite_order():
    """01.1: in the three-workers story the victims' history order differs from grouping them by
    invoice and from the order in which they were overwritten, so each answer is told apart."""
    from labkit.grading.checks01 import _story

    entry = CORPUS["01.1"]
    schedule = next(s for s in labkit.grading.TASKS["01.1"].schedules if s.knobs["story"] == "several")
    events = _story(schedule.rng, "several")
    told = {label: [(e.worker, e.target) for e in define(source, entry["name"])(events)]
            for label, source in [("right", entry["right"]["per invoice, the committed writes in order, then pairs"]),
                                  *[(label, entry["wrong"][label][0]) for label in (
                                      "the victims grouped by invoice", "the victims in the order they were overwritten")]]}
    assert told == {"right": [("B", "INV-1"), ("B", "INV-3"), ("C", "INV-2")],
                    "the victims grouped by invoice": [("B", "INV-1"), ("C", "INV-2"), ("B", "INV-3")],
                    "the victims in the order they were overwritten": [("B", "INV-1"), ("C", "INV-2"), ("B", "INV-3")]}


def test_every_prediction_property_sees_overwrites_and_safe_runs():
    """01.2: each property's schedules include runs where A overwrites B and runs where it does
    not, so always answering True or always False breaks every property."""
    from labkit.grading.checks01 import EDGES

    seen: dict = {}
    for s in labkit.grading.TASKS["01.2"].schedules:
        pause, ttl = s.knobs["pause"], s.knobs["ttl"]
        prop = "edges" if EDGES[0] <= pause - ttl <= EDGES[1] else "far"
        seen.setdefault(prop, set()).add(pause > ttl + 1.5)
    assert seen == {"far": {True, False}, "edges": {True, False}}


@pytest.mark.parametrize("task_id,head,body", [
    ("01.1", "find_lost_updates(history)", "return list(history)"),
    ("01.1", "find_lost_updates(history)", "return history[:2]"),
    ("01.1", "find_lost_updates(history)", "return history[-1:]"),
    ("04.1", "issue(store, authority, name, recovered)",
     'store.execute("UPDATE epoch_counter SET counter = counter")\n    return (0, 1)'),
    ("04.1", "issue(store, authority, name, recovered)",
     'store.execute("UPDATE epoch_counter SET counter = counter + 1")\n    return (0, 1)'),
    ("04.2", "cleanup(conn, now)", 'conn.execute("UPDATE leases SET ttl = ttl")\n    return 0'),
    ("04.2", "cleanup(conn, now)", 'conn.execute("UPDATE leases SET ttl = ttl + 1")\n    return 0'),
])
@pytest.mark.parametrize("rows", ["every row", "hostile rows only"])
def test_an_answer_that_only_looks_busy_scores_nothing(task_id, head, body, rows, monkeypatch):
    """01.1 handing back the history (or its ends), 04.1 touching the counter row and issuing a
    constant, 04.2 updating leases and deleting none: no property scores (0 points), though an
    UPDATE counts as a change for SQLite and the history's events come in order; in every one of
    a few runs with seeds the OS drew (a slice of a history once found a lost write by luck), with
    the random rows and without them."""
    import contextlib

    if rows == "hostile rows only":
        hostile_only(monkeypatch, task_id)

    name = head.split("(")[0]
    answer = define(f"def {head}:\n    {body}\n", name)
    for _ in range(4):
        report = labkit.grading.verdict(task_id, lambda: contextlib.nullcontext(answer), name)
        scored = report.total()[0] or any(f.scored for f in report.findings)
        assert not scored, f"run {report.run}: {report.text()}"


@pytest.mark.parametrize("label, drawn", [
    ("Fence.protect on the token column", [("A", "rejected"), ("B", "ok")]),
    ("refuses the token the fence already holds", [("A", "rejected"), ("B", "ok")]),
    ("protects the invoices instead", [("A", "ok")]),
])
def test_03_3_draws_each_bypassing_write_as_the_table_shows_it(label, drawn):
    """03.3's stale story: A's raw stale INSERT and B's newer one are drawn as what the payouts
    table shows afterwards, accepted ("ok") or refused, after the answer's protect call and the
    helper's writes; with the wrong table protected, A's stale payout lands and the run stops there."""
    import contextlib

    entry, t = CORPUS["03.3"], labkit.grading.TASKS["03.3"]
    kind = "right" if label in entry["right"] else "wrong"
    answer = define(entry[kind][label] if kind == "right" else entry[kind][label][0], entry["name"])
    schedule = next(s for s in t.schedules if s.knobs["story"] == "stale")
    history = []
    with contextlib.suppress(labkit.grading.Broken):
        t.trial(answer, schedule, history)
    raw = [i for i, e in enumerate(history) if e.action == "write" and e.target.startswith("P-")]
    protect = next(i for i, e in enumerate(history) if e.action == "protect")
    assert [(history[i].worker, history[i].outcome) for i in raw] == drawn, history
    assert all(e.target.endswith("via Fence.guard") for e in history[:protect] if e.action == "write")
    assert protect < raw[0], history
