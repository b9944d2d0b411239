"""A rival the answer cannot dodge (issue 22): wrong answers, wrapped, score no more than bare.

Each wrapper leaves a corpus wrong answer's logic as it is and adds what a student would try to
dodge the race: harmless statements first (a fixed count, a random one, one that depends on the
call's arguments), spotting a nested call (the rival) or a crash and acting differently, or
reading the sandbox for a sign of which schedule it is in (a counter in /tmp, pids, the time,
the environment). The rival is put before every statement boundary the call reaches, so no
padding hides the race; whatever a wrapper does, it scores no more than the bare answer.
"""

import concurrent.futures
import multiprocessing

import pytest

import corpus_part1
import corpus_part2
from answers import against_bare, judged
from labkit.grading import verdicts

CORPUS = {**corpus_part1.CORPUS, **corpus_part2.CORPUS}

PAD = '''
import random as _random
_bare = {name}
def {name}(*args, **kwargs):
    conn = getattr(args[0], "conn", args[0])
    for i in range({count}):  # each one a statement of its own (the tracer skips a repeat)
        conn.execute(f"SELECT {i}").fetchall()
    return _bare(*args, **kwargs)
'''
DETECT = '''
import sqlite3 as _sqlite3
_bare, _depth = {name}, [0]
def {name}(*args, **kwargs):
    nested = _depth[0] > 0          # another call of mine is still running: I am the rival
    _depth[0] += 1
    try:
        {body}
    finally:
        _depth[0] -= 1
'''
SIGN = '''
import os as _os, time as _time
_bare = {name}
def {name}(*args, **kwargs):
    try:
        with open("/tmp/.seen", "a+") as f:
            f.seek(0)
            seen = f.read().split()
            f.write(f"{_os.getpid()} ")
    except OSError:
        seen = []
    sign = {sign}
    if sign:
        return _bare(*args, **kwargs)
    return _bare(*args, **kwargs) if {fallback} else _bare(*args, **kwargs)
'''
WRAPPERS = {
    "pads 12 statements first": PAD.replace("{count}", "12"),
    "pads a random count (0-20) first": PAD.replace("{count}", "_random.randint(0, 20)"),
    "pads a count that depends on the arguments": PAD.replace("{count}", "len(repr(args)) % 11 + 3"),
    "the rival raises 'database is locked'": DETECT.replace("{body}", (
        'if nested:\n            raise _sqlite3.OperationalError("database is locked")\n'
        '        return _bare(*args, **kwargs)')),
    "the outer call retries after a rival came": DETECT.replace("{body}", (
        "before = _depth[0]\n        out = _bare(*args, **kwargs)\n"
        "        return _bare(*args, **kwargs) if nested is False and _depth[0] != before else out")),
    "a crash is retried once": DETECT.replace("{body}", (
        "try:\n            return _bare(*args, **kwargs)\n        except Exception as exc:\n"
        "            if 'disk is full' not in str(exc):\n                raise\n"
        "            return _bare(*args, **kwargs)")),
    "counts the calls of every schedule in /tmp": SIGN.replace("{sign}", "len(seen) % 3 == 0")
                                                      .replace("{fallback}", "len(seen) > 5"),
    "tells schedules apart by pid": SIGN.replace("{sign}", "str(_os.getpid()) not in seen")
                                        .replace("{fallback}", "_os.getpid() % 2"),
    "reads the time and the environment": SIGN.replace("{sign}", "int(_time.time() * 10) % 2")
                                              .replace("{fallback}", "'LABKIT' in str(_os.environ)"),
}
def kind_of(how: str) -> str:
    """The attack class of issue 22 that the wrapper ``how`` belongs to."""
    if how.startswith("pads"):
        return "pad the call with harmless statements"
    if how in ("counts the calls of every schedule in /tmp", "tells schedules apart by pid", "reads the time and the environment"):
        return "count schedules, or read the sandbox for a sign of which one it is"
    return "detect a nested or concurrent call, or a crash, and behave differently"


RACY = {  # a wrong answer per task that loses a race the judge puts at a statement boundary
    "02.1": "check-then-act: read, compare in Python, write unconditionally",
    "04.2": "read, then delete by name and owner (a re-acquire lands in between)",
    "06.3": "reads again, compares in Python, then writes by name",  # a heartbeat lands in between
}


@pytest.fixture(scope="module")
def scored():
    """Each task's bare and wrapped answers in one sandbox, the tasks side by side (2 cores)."""
    jobs = []
    for task, label in RACY.items():
        name, bare = CORPUS[task]["name"], CORPUS[task]["wrong"][label][0]
        sources = {"bare": bare} | {how: bare + w.replace("{name}", name) for how, w in WRAPPERS.items()}
        jobs.append((task, name, sources))
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        return dict(zip(RACY, pool.map(judged, *zip(*jobs))))


@pytest.mark.parametrize("task", sorted(RACY))
@pytest.mark.parametrize("how", sorted(WRAPPERS))
def test_a_wrapped_wrong_answer_scores_no_more_than_the_bare_one(scored, task, how):
    """Padding, spotting the rival or a crash, or reading the sandbox gains nothing."""
    bare, wrapped = scored[task]["bare"], scored[task][how]
    against_bare(kind_of(how), how, task, bare, wrapped)
    assert bare.problem is None and 0 < bare.total()[0] < 10, bare.text()
    assert wrapped.total()[0] <= bare.total()[0], f"{how}:\n{wrapped.text()}\nbare:\n{bare.text()}"


@pytest.mark.parametrize("task", sorted(RACY))
def test_padding_moves_the_race_but_not_the_verdict(scored, task):
    """However many statements come first, the bare answer's broken properties stay broken, and
    each is reported at the boundary where it broke (a seed that replays that boundary)."""
    bare = scored[task]["bare"]
    lost = {f.prop for f in bare.findings if f.broken}
    for how in [h for h in WRAPPERS if h.startswith("pads")]:
        wrapped = scored[task][how]
        assert {f.prop for f in wrapped.findings if f.broken} >= lost, (how, wrapped.text())


def test_a_call_past_the_bound_fails_with_a_clear_message(monkeypatch):
    """An answer that keeps sending SQL past the bound of boundaries (here 20, not 200, to keep
    the test short) scores nothing, and says so."""
    monkeypatch.setattr(verdicts, "BOUNDARIES", 20)
    monkeypatch.setitem(verdicts.PROBLEMS, "bounded", "the answer sends at most 20 SQL statements in one call")
    name, bare = CORPUS["02.1"]["name"], CORPUS["02.1"]["wrong"][RACY["02.1"]][0]
    report = judged("02.1", name, {"x": bare + PAD.replace("{name}", name).replace("{count}", "30")})["x"]
    assert report.total()[0] == 0 and "at most 20 SQL statements" in report.text(), report.text()
    assert "past 20 statements, where the judge stops" in report.text(), report.text()


def test_the_shortest_failing_boundary_is_reported_and_replays(scored):
    """Padded with 12 statements, the check-then-act writer loses the race at a boundary the
    enumeration found (named by its statement); replay re-runs exactly that boundary, the break
    included, and draws B's write landing inside A's call."""
    import labkit.grading
    from answers import define

    report = scored["02.1"]["pads 12 statements first"]
    stale = next(f for f in report.findings if f.prop == "stale").broken
    assert stale.seed >= verdicts.SPREAD and "#" in stale.knobs["at"], stale
    name, bare = CORPUS["02.1"]["name"], CORPUS["02.1"]["wrong"][RACY["02.1"]][0]
    answer = define(bare + PAD.replace("{name}", name).replace("{count}", "12"), name)
    result = labkit.grading.replayed("02.1", answer, seed=stale.seed)
    assert "broken: a write with a generation below the fence" in result.verdict, result.verdict
    assert result.params["at"] == stale.knobs["at"]
    writes = [(e.worker, e.generation) for e in result.history if e.action == "write"]
    assert ("B", 8) in writes and writes.index(("B", 8)) < writes.index(("A", 7)), writes


def test_a_call_whose_statements_vary_by_schedule_is_raced_where_its_own_rival_came():
    """The padding count comes from the answer's own random, seeded per schedule, so the race
    rows before an ``each`` row met other statements than it does. Under run 2449547475 the old
    enumeration took the row's first boundaries as raced by those rows and skipped the one that
    mattered (12 of 100 padded gradings escaped with 10/10); each boundary is now tried where a
    rival of the call's own schedule came."""
    name, bare = CORPUS["04.2"]["name"], CORPUS["04.2"]["wrong"][RACY["04.2"]][0]
    padded = bare + WRAPPERS["pads a random count (0-20) first"].replace("{name}", name)
    got = judged("04.2", name, {"bare": bare, "padded": padded}, run=2449547475)
    assert got["bare"].total()[0] == 8.0 and got["padded"].total()[0] <= 8.0, got["padded"].text()
    assert "live kept" in {f.prop for f in got["padded"].findings if f.broken}, got["padded"].text()


COIN = '''
import random as _random
_wrong = {name}
def {name}(*args, **kwargs):  # each call tosses a coin: the right answer or the wrong one
    return (_right if _random.random() < 0.5 else _wrong)(*args, **kwargs)
'''


@pytest.mark.parametrize("task", [*sorted(RACY), "07.2", "08.1"])  # and two with a crash
def test_a_replay_draws_what_each_workers_process_drew(task):
    """An answer that tosses a coin at each call (``random``: the right answer or the wrong one)
    breaks a property in some schedules. The replay of each schedule the report names breaks it
    again: each worker draws ``random`` as its own process did in the sandbox (A, its rival B and a
    successor a stream each), not all of them from one stream in turn."""
    import labkit.grading
    from answers import define

    wrongs = CORPUS[task]["wrong"]
    name, wrong = CORPUS[task]["name"], wrongs[RACY.get(task, next(iter(wrongs)))][0]
    right = next(iter(CORPUS[task]["right"].values()))
    coin = right + f"\n_right = {name}\n" + wrong + COIN.replace("{name}", name)
    report = judged(task, name, {"coin": coin}, run=20261204)["coin"]
    broken = [f for f in report.findings if f.broken]
    assert broken, report.text()
    answer = define(coin, name)
    for finding in broken:
        replayed = labkit.grading.replayed(task, answer, seed=finding.broken.seed, run=finding.broken.run)
        assert "broken: " in replayed.verdict and finding.words in replayed.verdict, (
            finding.prop, finding.broken.schedule, replayed.verdict
        )
