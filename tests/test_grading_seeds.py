"""A rival the answer cannot predict (issue 22): each grading run draws its seed from the OS.

The random schedules' knobs and every input a trial draws derive from the run's seed (see
``labkit.grading.lab.derived``), which the report records, so one seed grades the same every
time. An answer cannot know the seed ahead, so a table of the inputs it memorised from the
check modules' own code (which ship with the student's copy) buys it nothing.
"""

import concurrent.futures
import contextlib
import multiprocessing

import pytest

import corpus_part1
import corpus_part2
from answers import define, judged
from labkit.grading import Broken, tasks_loaded, verdicts

CORPUS = {**corpus_part1.CORPUS, **corpus_part2.CORPUS}
#: a few answers per kind of input: pure numbers (01.2, 05.1), an rng passed in (06.2), a race (02.1),
#: a callback that waits on the judge's clock (06.3)
PICKED = {
    "01.2": ["thinks a longer lease is safe", "the tie goes the wrong way (>=)"],
    "05.1": ["ignores drift", "drift taken as seconds, not a fraction"],
    "06.2": ["no jitter", "equal jitter (half fixed, half random)"],
    "02.1": ["check-then-act: read, compare in Python, write unconditionally"],
    "06.3": ["ignores a dropped wait", "reads again, compares in Python, then writes by name"],
}
SEEDS = 3  # OS-drawn seeds per answer


def _sources(task: str) -> dict:
    entry = CORPUS[task]
    return {"right": next(iter(entry["right"].values()))} | {w: entry["wrong"][w][0] for w in PICKED[task]}


def _runs(task: str) -> list:
    """``SEEDS`` runs of the task's picked answers, each with a seed the OS drew."""
    return [judged(task, CORPUS[task]["name"], _sources(task), run=verdicts.draw_seed()) for _ in range(SEEDS)]


@pytest.fixture(scope="module")
def graded():
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        return dict(zip(PICKED, pool.map(_runs, PICKED)))


def _broken(report) -> set:
    return {f.prop for f in report.findings if f.broken} | ({report.problem.prop} if report.problem else set())


@pytest.mark.parametrize("task", sorted(PICKED))
def test_every_seed_gives_the_same_scores(graded, task):
    """Under any seed the right answer scores 10/10 and each wrong answer breaks the same
    properties (among them the one the corpus names) and scores the same points."""
    runs = graded[task]
    assert len({r["right"].run for r in runs}) == SEEDS, [r["right"].run for r in runs]
    for label in ["right", *PICKED[task]]:
        reports = [r[label] for r in runs]
        assert all(r.run is not None for r in reports)
        totals, broken = {r.total() for r in reports}, {frozenset(_broken(r)) for r in reports}
        assert len(totals) == 1 and len(broken) == 1, (label, [(r.run, r.text()) for r in reports])
        if label == "right":
            assert reports[0].passed and totals == {(10.0, 10.0)}, reports[0].text()
        else:
            named = CORPUS[task]["wrong"][label][2]
            named = set(named) if isinstance(named, tuple) else {named}
            assert named <= next(iter(broken)), reports[0].text()


def test_the_same_seed_grades_the_same_every_time():
    """Determinism: twice with one explicit seed, every finding, seed and event is the same
    (a race enumerated at every boundary, and answers whose inputs the seed draws)."""
    for task in ("02.1", "05.1", "06.2"):
        seed = verdicts.draw_seed()
        first, again = (judged(task, CORPUS[task]["name"], _sources(task), run=seed) for _ in range(2))
        for label in first:
            assert first[label].run == seed and first[label].to_json() == again[label].to_json(), label


def test_another_seed_draws_other_inputs():
    """The seed is not decoration: two runs' random schedules differ in their knobs."""
    t = tasks_loaded()["05.1"]
    a, b = (t.rows(verdicts.draw_seed()) for _ in range(2))
    random_rows = [i for i, s in enumerate(a) if s.name == "random"]
    assert random_rows and all(a[i].knobs != b[i].knobs for i in random_rows)
    assert [s.knobs for s in t.rows(7)] == [s.knobs for s in t.rows(7)]


# ------------------------------------------------------------------ a table of memorised inputs

TABLE = '''
_bare, _TABLE = {name}, {table!r}
def {name}(*args):  # the right result for every input the check modules draw, else the logic
    return _TABLE[args] if args in _TABLE else _bare(*args)
'''
#: tasks whose inputs are plain numbers, called as answer(*args)
MEMORISED = {"01.2": PICKED["01.2"], "05.1": PICKED["05.1"] + ["no margin", "the margin subtracted twice"]}


def _memorised(task: str, rows) -> dict:
    """The table a student builds from the check module's own code: run its trial under
    ``rows`` (the schedules of the previous, fixed seeds), recording what the right answer
    returns for every input it is called with."""
    t, name = tasks_loaded()[task], CORPUS[task]["name"]
    right, table = define(next(iter(CORPUS[task]["right"].values())), name), {}

    def recorder(*args):
        table[args] = right(*args)
        return table[args]

    for schedule in rows:
        t.trial(recorder, schedule, [])
    return table


def _holds_everywhere(task: str, answer, rows) -> bool:
    t = tasks_loaded()[task]
    try:
        for schedule in rows:
            t.trial(answer, schedule, [])
    except Broken:
        return False
    return True


@pytest.mark.parametrize("task", sorted(MEMORISED))
def test_a_table_of_memorised_inputs_scores_no_more_than_the_bare_answer(task):
    """Each wrong answer wrapped with the table of every input the fixed seeds drew: at those
    seeds it passes every trial (the attack is real), under a fresh seed it scores no more."""
    t, name = tasks_loaded()[task], CORPUS[task]["name"]
    table = _memorised(task, t.schedules)
    assert table
    sources = {}
    for label in MEMORISED[task]:
        bare = CORPUS[task]["wrong"][label][0]
        wrapped = bare + TABLE.format(name=name, table=table)
        assert not _holds_everywhere(task, define(bare, name), t.schedules), label
        assert _holds_everywhere(task, define(wrapped, name), t.schedules), label
        sources |= {label: bare, f"{label}, with the table": wrapped}
    got = judged(task, name, sources, run=verdicts.draw_seed())
    for label in MEMORISED[task]:
        bare, wrapped = got[label], got[f"{label}, with the table"]
        assert bare.problem is None and bare.total()[0] < 10, bare.text()
        assert wrapped.total()[0] <= bare.total()[0], f"{label}:\n{wrapped.text()}\nbare:\n{bare.text()}"


def test_the_check_cells_judge_takes_a_seed_or_draws_one():
    """The check cell's path (``python -m labkit.grading.judge TASK NAME [SEED]``): a given seed
    is recorded and grades the same twice; without one, the judge draws its own."""
    import json
    import subprocess
    import sys

    from labkit.grading import notebooks

    nb = json.loads((notebooks.ROOT / "solutions" / "05-late-renewal.ipynb").read_text())
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    last = next(i for i, c in enumerate(cells) if "task:05.1" in c["metadata"].get("tags", []))
    sources = json.dumps(["".join(c["source"]) for c in cells[: last + 1]])
    argv = [sys.executable, "-m", "labkit.grading.judge", "05.1", "conservative_deadline"]
    reports = []
    for seed in (["4242"], ["4242"], [], []):
        out = subprocess.run(argv + seed, input=sources, capture_output=True, text=True, timeout=120)
        reports.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert reports[0]["run"] == 4242 and reports[0] == reports[1], reports[:2]
    drawn = [r["run"] for r in reports[2:]]
    assert all(isinstance(r, int) for r in drawn) and drawn[0] != drawn[1], drawn
