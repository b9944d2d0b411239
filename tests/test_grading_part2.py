"""The failures behind the checks of lessons 05-09 really happen: races, late writers, lost work.

The corpus-wide tests (right answers pass, wrong ones fail, tampering, the
exercises) are in tests/test_grading.py; here each trial is run directly to
show that what a check guards against really occurs in its schedules.
"""

from __future__ import annotations

import contextlib
import random

import pytest

import labkit.grading
from answers import define, hostile_only
from corpus_part2 import CORPUS


def _trial(task_id: str, source: str, name: str, schedule_name: str):
    """Run one schedule of a task's trial directly; return (broken property or None, history)."""
    task = labkit.grading.TASKS[task_id]
    schedule = next(s for s in task.schedules if s.name == schedule_name)
    history: list = []
    try:
        task.trial(define(source, name), schedule, history)
    except labkit.grading.Broken as broken:
        return broken.prop, history
    return None, history


def test_a_late_release_really_deletes_the_successors_lease_when_it_reads_first():
    """06.1 race: B's acquire lands between the read and the DELETE; the naive release then removes B's lease."""
    wrong = CORPUS["06.1"]["wrong"]["read, compare in Python, then delete by name"][0]
    broken, history = _trial("06.1", wrong, "release", "B takes over just before the release's 2nd statement")
    assert broken == "race"
    assert [(e.worker, e.action, e.outcome) for e in history][-2:] == [("B", "acquire", "ok"), ("A", "release", "ok")]
    right = CORPUS["06.1"]["right"]["sqlite-utils cursor, named parameters"]
    broken, history = _trial("06.1", right, "release", "B takes over just before the release's 1st statement")
    assert broken is None and [e.outcome for e in history if e.action == "release" and e.worker == "A"] == ["lost"]


def test_a_release_that_deleted_before_the_takeover_is_drawn_before_it():
    """06.1 race: when A's DELETE ran before B took over, the timeline shows A's release first,
    and the release is not blamed for B's lease (only for the counter it also deleted)."""
    wrong = CORPUS["06.1"]["wrong"]["deletes the generation counter too"][0]
    broken, history = _trial("06.1", wrong, "release", "B takes over just before the release's 2nd statement")
    assert broken == "counter"
    assert [(e.worker, e.action, e.outcome) for e in history][-2:] == [("A", "release", "ok"), ("B", "acquire", "ok")]


def _after_claim(history) -> list:
    """What A did after B's claim: its heartbeats that B's claim refused show two holders."""
    claimed = next(i for i, e in enumerate(history) if (e.worker, e.action, e.outcome) == ("B", "acquire", "ok"))
    return [(e.worker, e.action, e.outcome) for e in history[claimed + 1:] if e.worker == "A"]


def test_claiming_right_after_a_dropped_wait_really_takes_a_live_lease():
    """06.3 reconnect: B's wait drops before A's next heartbeat; claiming at once takes the record
    while A is alive (A's next heartbeat is refused). Reading again and waiting a whole duration
    sees A's heartbeat: the first call claims nothing, and after A stops a second call claims."""
    row = "B's wait drops; A is alive, its next heartbeat still to come"
    wrong = CORPUS["06.3"]["wrong"]["ignores a dropped wait"][0]
    broken, history = _trial("06.3", wrong, "claim_quiet_lease", row)
    assert broken == "reconnect" and _after_claim(history) == [("A", "renew", "lost")], history
    right = CORPUS["06.3"]["right"]["waits in quarters, starting over from a fresh read after a drop"]
    broken, history = _trial("06.3", right, "claim_quiet_lease", row)
    first = [(e.action, e.outcome) for e in history if e.worker == "B" and e.action in ("response", "acquire")]
    assert broken is None and first == [("response", "lost"), ("acquire", "held"), ("acquire", "ok")], history
    assert ("A", "renew", "ok") in [(e.worker, e.action, e.outcome) for e in history] and not _after_claim(history)


def test_a_heartbeat_between_the_read_and_the_write_really_loses_to_a_python_compare():
    """06.3 race: A's heartbeat lands between B's second read and its UPDATE by name; B takes
    the record at the instant A renewed it. A conditional UPDATE refuses, and claims in a later call."""
    row = "A heartbeats just before the claim's 3rd statement, and each later one"
    wrong = CORPUS["06.3"]["wrong"]["reads again, compares in Python, then writes by name"][0]
    broken, history = _trial("06.3", wrong, "claim_quiet_lease", row)
    renewed = [e.time for e in history if (e.worker, e.action, e.outcome) == ("A", "renew", "ok")]
    claimed = [e.time for e in history if (e.worker, e.action, e.outcome) == ("B", "acquire", "ok")]
    assert broken == "race" and claimed and claimed[0] == renewed[-1], history
    right = CORPUS["06.3"]["right"]["rowcount, owner and generation checked too"]  # its 2nd: the UPDATE
    broken, history = _trial("06.3", right, "claim_quiet_lease", "A heartbeats just before the claim's 2nd statement")
    outcomes = [e.outcome for e in history if e.worker == "B" and e.action == "acquire"]
    assert broken is None and outcomes == ["held", "ok"], history  # refused, then claimed after A stopped


def test_the_holder_counting_from_arrival_really_acts_after_b_took_over():
    """05.2: with 6-8 s answers, the arrival-counting holder writes while B holds the lease; the right one never does."""
    wrong = CORPUS["05.2"]["wrong"]["deadline counted from the response's arrival"][0]
    broken, history = _trial("05.2", wrong, "keep_working", "slow responses: each renewal's answer spends 6-8 s in the network")
    assert broken == "deadline"
    b_at = next(e.time for e in history if e.worker == "B" and e.action == "acquire")
    assert any(e.worker == "A" and e.action == "write" and e.time > b_at for e in history)
    right = CORPUS["05.2"]["right"]["renew before every unit, keep the later deadline"]
    broken, history = _trial("05.2", right, "keep_working", "slow responses: each renewal's answer spends 6-8 s in the network")
    b_at = next((e.time for e in history if e.worker == "B" and e.action == "acquire"), float("inf"))
    assert broken is None and not any(e.worker == "A" and e.action == "write" and e.time >= b_at for e in history)


def test_every_05_2_trouble_row_tells_its_story_under_every_seed():
    """05.2: a hostile row's trouble is the renewals', whatever the run's seed draws (CI once drew
    an acquisition slow enough that the holder never worked, and a wrong holder scored 10/10):
    under 100 seeds each row's acquisition leaves most of the lease (but in the row whose grant
    comes late, past its end), and "confirmed too late" catches the holder that checks its
    deadline only when renewing, every time."""
    from labkit.grading.checks05b import GRANTED_LATE, _HolderWorld

    task, rng = labkit.grading.TASKS["05.2"], random.Random(5_2)
    wrong = define(CORPUS["05.2"]["wrong"]["checks the deadline only when renewing"][0], "keep_working")
    late = "confirmed too late: each answer spends 9-11 s in the network"
    for run in (rng.randrange(2**32) for _ in range(100)):
        for schedule in (s for s in task.rows(run) if s.name != "random"):
            with labkit.grading.lab.scratch() as tmp:
                world = _HolderWorld(tmp.open(), schedule, [])
                sent = world.start("job")
            ttl, local = schedule.knobs["ttl"], world.offset + world.rate * world.true.now()
            if schedule.name == GRANTED_LATE:  # the one row whose trouble is the acquisition
                assert local - sent > ttl, (run, local - sent)
            else:
                assert local - sent < 0.1 * ttl, (run, schedule.name, local - sent)
        row = next(s for s in task.rows(run) if s.name == late)
        with pytest.raises(labkit.grading.Broken) as broken:
            task.trial(wrong, row, [])
        assert broken.value.prop == "deadline", (run, broken.value)


def test_the_stale_workers_email_really_goes_out_unless_it_is_an_intent():
    """08.2: A (7) sends directly and its email reaches the provider; as an outbox intent it is fenced out."""
    story = "B (8) has raised the fence; stale A (7) wakes up and publishes before B does"
    wrong = CORPUS["08.2"]["wrong"]["email sent before the fenced commit"][0]
    broken, history = _trial("08.2", wrong, "publish_report", story)
    assert broken == "via outbox"
    assert any(e.worker == "A" and e.action == "email" and e.generation == 7 for e in history)
    right = CORPUS["08.2"]["right"]["catches the stale error and answers False"]
    broken, history = _trial("08.2", right, "publish_report", story)
    assert broken is None
    assert [(e.worker, e.outcome) for e in history if e.action == "write"] == [("A", "rejected"), ("B", "ok")]
    assert [e.target for e in history if e.action == "email"] == [history[-1].target] and "stale" not in history[-1].target


def test_a_crashed_worker_really_leaves_invoices_the_checkpoint_does_not_know():
    """07.2: B dies after 4 invoices with progress 3; without ids C issues c4 again, with ids it does not."""
    story = "B dies just after its 4th invoice commits, before the checkpoint catches up"
    wrong = CORPUS["07.2"]["wrong"]["no operation id"][0]
    broken, history = _trial("07.2", wrong, "run_job", story)
    assert broken == "no repeat"
    c4 = [e.worker for e in history if e.action == "write" and "(c4)" in e.target]
    assert c4 == ["B", "C"]
    right = CORPUS["07.2"]["right"]["labkit.mechanisms.recovery.produce per unit, checkpoint on the batch's last unit"]
    broken, history = _trial("07.2", right, "run_job", story)
    assert broken is None and [e.worker for e in history if e.action == "crash"] == ["B"]
    assert sorted(e.target.split()[1] for e in history if e.action == "write") == \
        [f"(c{i})" for i in range(1, 7)]


def test_a_stale_worker_without_a_fence_really_invoices_after_the_takeover():
    """07.2: while B (7) is paused, C (8) takes the job over; unfenced, B still commits c2 as
    generation 7; fenced, B's next step is refused and C issues every invoice after it."""
    story = "B pauses after its 1st invoice; C (8) takes the job over; stale B wakes up"
    wrong = CORPUS["07.2"]["wrong"]["no fence at all: an unfenced transaction per unit"][0]
    broken, history = _trial("07.2", wrong, "run_job", story)
    assert broken == "stale refused"
    b = [(e.action, e.outcome, e.target) for e in history if e.worker == "B"]
    assert b[1:] == [("write", "ok", "INV-1 (c1)"), ("write", "ok", "INV-2 (c2)"), ("write", "rejected", "LeaseLost")]
    right = CORPUS["07.2"]["right"]["own key table with INSERT ... ON CONFLICT DO NOTHING, replaying from the first unit"]
    broken, history = _trial("07.2", right, "run_job", story)
    assert broken is None
    assert [(e.worker, e.outcome, e.generation) for e in history if e.action == "write"] == \
        [("B", "ok", 7), ("B", "rejected", 7)] + [("C", "ok", 8)] * 5


_BACKOFF = "def backoff(attempt, *, base, cap, rng):\n    return {}\n"
_HOLDER = ("from labkit.mechanisms.timing import conservative_deadline\n\n"
           "def keep_working(clock, renew, work, *, acquired_at, ttl, margin, max_drift):\n{}")
GAMING = {  # answers that once scored points for doing (almost) nothing: (source, points before, now)
    "06.1 sends a SELECT, then answers False": ("06.1", '''
def release(db, name, owner, generation):
    db.execute("SELECT 1")
    return False
''', 5.0, 0.0),
    "06.2 a huge constant": ("06.2", _BACKOFF.format("1e9"), 2.5, 0.0),
    "06.2 infinity": ("06.2", _BACKOFF.format("float('inf')"), 2.5, 0.0),
    "06.2 always the cap": ("06.2", _BACKOFF.format("cap"), 2.5, 0.0),
    "06.2 a tiny constant": ("06.2", _BACKOFF.format("1e-300"), 2.5, 0.0),
    "06.2 tiny random delays, whatever attempt, base and cap": (
        "06.2", _BACKOFF.format("rng.random() * 1e-9"), 7.5, 0.0),
    "06.2 random up to the cap, whatever the attempt (it keeps full jitter and rng)": (
        "06.2", _BACKOFF.format("rng.random() * cap"), 7.5, 5.0),
    "05.2 one unit of work before the deadline, then returns": ("05.2", _HOLDER.format(
        "    if clock.now() < conservative_deadline(acquired_at, ttl, margin, max_drift):\n"
        "        work()\n"), 20 / 3, 10 / 3),
    "05.2 one unit of work, then returns": ("05.2", _HOLDER.format("    work()\n"), 10 / 3, 0.0),
}


@pytest.mark.parametrize("rows", ["every row", "hostile rows only"])
@pytest.mark.parametrize("label", GAMING)
def test_an_answer_that_does_almost_nothing_scores_less_than_before(label, rows, monkeypatch):
    """06.1: evidence only from a release that deleted a row (or, in the race, released B's
    lease for B); 06.2: range and rng only where the delays vary and reach a quarter of the
    ceiling, growth where they vary in range, full jitter against the ceiling; 05.2: the holder
    returns only when the job is done, its deadline passed or its last renewal failed, and a
    grant that comes after the deadline allows no work. With the random rows too, and without
    them: the rows that tell the story catch it under every seed (CI drew one where a 05.2
    holder that works once without looking scored a third, with a hostile row that caught it
    before acquiring quickly)."""
    task_id, source, before, now = GAMING[label]
    if rows == "hostile rows only":
        hostile_only(monkeypatch, task_id)
    answer = define(source, CORPUS[task_id]["name"])
    report = labkit.grading.verdict(task_id, lambda: contextlib.nullcontext(answer), "answer")
    points = report.total()[0]
    assert points < before and abs(points - now) < 1e-9, report.text()
