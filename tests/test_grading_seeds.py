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
from answers import against_bare, define, hostile_only, judged
from labkit.engines.servers import proc_state
from labkit.grading import Broken, Report, tasks_loaded, verdicts
from polling import wait_for

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
        against_bare("a table of memorised inputs, built from the check module's own code",
                     "the right result for every input the fixed seeds drew", task, bare, wrapped)
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


def _solution_cells(task: str, notebook: str) -> list[str]:
    import json

    from labkit.grading import notebooks

    nb = json.loads((notebooks.ROOT / "solutions" / notebook).read_text())
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    last = next(i for i, c in enumerate(cells) if f"task:{task}" in c["metadata"].get("tags", []))
    return ["".join(c["source"]) for c in cells[: last + 1]]


def _children(pid: int) -> set[int]:
    """The processes ``pid`` started that are still alive, and theirs, from /proc."""
    import pathlib

    found, todo = set(), [pid]
    while todo:
        for task in pathlib.Path(f"/proc/{todo.pop()}/task").glob("*/children"):
            kids = {int(k) for k in task.read_text().split()}
            todo += kids - found
            found |= kids
    return found


def test_a_judge_started_ahead_grades_as_the_check_cells_judge_does():
    """A check cell's judge started before the check (``--ready``): once it says ready, its
    sandbox runs (a process of its own); handed the same cells and seed, its Report is the one
    the judge started at the check gives."""
    import json
    import subprocess
    import sys

    sources = _solution_cells("05.1", "05-late-renewal.ipynb")
    argv = ["05.1", "conservative_deadline", "4242"]
    cold = subprocess.run([sys.executable, "-m", "labkit.grading.judge", *argv],
                          input=json.dumps(sources), capture_output=True, text=True, timeout=120)
    pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with subprocess.Popen([sys.executable, "-m", "labkit.grading.judge", "--ready"], **pipes) as ahead:
        assert ahead.stdout.readline() == "ready\n"
        assert _children(ahead.pid), "no sandbox runs before the check"
        request = json.dumps({"argv": argv, "cells": sources}) + "\n"
        out, err = ahead.communicate(request, timeout=120)
    warm = json.loads(out.strip().splitlines()[-1])
    assert warm == json.loads(cold.stdout.strip().splitlines()[-1]) and warm["run"] == 4242, err
    assert Report.from_json(warm).passed, warm


def test_a_judge_started_ahead_ends_with_its_sandbox_when_its_kernel_goes():
    """A judge nobody hands a check (the kernel stopped: its stdin closes) exits at once, and
    its sandbox's processes with it."""
    import subprocess
    import sys

    pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with subprocess.Popen([sys.executable, "-m", "labkit.grading.judge", "--ready"], **pipes) as ahead:
        assert ahead.stdout.readline() == "ready\n"
        sandbox = _children(ahead.pid)
        assert sandbox
        ahead.stdin.close()
        assert ahead.wait(timeout=30) == 0, ahead.stderr.read()
    # its sandbox's processes end with it (a moment later: reparented, they are reaped by init)
    wait_for(lambda: all(proc_state(pid) in ("gone", "Z") for pid in sandbox), "the sandbox's end")


HOOK = """import sys
starts = []
def _judges_started(event, args):
    if event == "subprocess.Popen" and "labkit.grading.judge" in list(args[1] or ()):
        starts.append(list(args[1])[3:])
sys.addaudithook(_judges_started)
import labkit.grading"""

COUNTS = """import json, os, labkit.grading
after_one = list(starts)
os.environ["LABKIT_PROBE"] = "another environment"
{check}
print(json.dumps({{"first": after_one, "then": starts[len(after_one):],
                  "waiting": [j.poll() is None for j in labkit.grading._judges]}}))"""


def test_a_check_cell_uses_the_judge_started_ahead_and_starts_the_next():
    """In a kernel: importing the grader starts a judge ahead; the check cell is judged by it
    and starts the next one. A judge made for another environment is not used: that check
    starts its own, then the next."""
    import json

    import nbformat
    from kernels import Client as NotebookClient

    from labkit.grading import notebooks

    sources = _solution_cells("05.1", "05-late-renewal.ipynb")
    cells = [HOOK, *sources, COUNTS.format(check=sources[-1])]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in cells])
    folder = {"metadata": {"path": str(notebooks.ROOT / "solutions")}}
    NotebookClient(nb, timeout=120, kernel_name="python3", resources=folder).execute()
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("name") == "stdout")
    seen = json.loads(text.strip().splitlines()[-1])
    assert seen["first"] == [["--ready"], ["--ready"]], seen  # at the import; the next check's
    assert seen["then"] == [["--ready"], ["--ready"]], seen  # this check's own; the next's
    assert seen["waiting"] == [True], seen


DIES = """import subprocess, sys, labkit.grading
for judge in labkit.grading._judges:
    judge.kill()
dies = "import sys; print('ready', flush=True); sys.stdin.readline(); sys.exit(1)"
pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
fake = subprocess.Popen([sys.executable, "-c", dies], **pipes)
fake.made_for = labkit.grading._made_for()
labkit.grading._judges[:] = [fake]"""


def test_a_judge_that_dies_after_saying_ready_is_a_named_refusal():
    """A judge started ahead that says ready, takes the check and dies without a Report: the
    check cell fails with the grader's refusal, not a traceback of the judge's output."""
    import nbformat
    from kernels import Client as NotebookClient

    from labkit.grading import notebooks

    sources = _solution_cells("05.1", "05-late-renewal.ipynb")
    cells = [*sources[:-1], DIES, sources[-1]]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in cells])
    folder = {"metadata": {"path": str(notebooks.ROOT / "solutions")}}
    NotebookClient(nb, timeout=120, kernel_name="python3", resources=folder, allow_errors=True).execute()
    (error,) = [o for o in nb.cells[-1].outputs if o.get("output_type") == "error"]
    assert error["ename"] == "CheckFailed", error
    assert "the judge failed" in "".join(error["traceback"]), error


@pytest.mark.parametrize("task", sorted(CORPUS))
def test_every_known_wrong_answer_is_caught_by_the_hostile_rows_alone(monkeypatch, task):
    """The random schedules add cases; they must not be what catches a known fault. With them
    left out, each wrong answer still breaks every property the corpus names (a constant still
    scores nothing), under a seed the OS draws: a fault only some seeds find passes now and then
    (a 05.2 holder once scored 10/10 in CI, a 02.1 writer that writes before its fence 1 run in 100).
    ``benchmarks/luck.py`` grades the corpus with every row under many seeds."""
    t, kept = hostile_only(monkeypatch, task)
    run = verdicts.draw_seed()
    rows = kept.rows(run)
    left_out = [s.seed for s in t.rows(run) if s not in rows]  # random rows: seeds from 1000 on
    assert rows and left_out == [s.seed for s in t.rows(run) if s.seed >= 1000]
    assert left_out or task in ("03.2", "09.1")  # those two have no random rows
    for label, (source, _, named) in CORPUS[task]["wrong"].items():
        answer = define(source, CORPUS[task]["name"])
        report = verdicts.verdict(task, lambda: contextlib.nullcontext(answer), label, run=run)
        want = {named} if isinstance(named, str) else set(named or ())
        got = _broken(report)
        assert want <= got and (want or report.total()[0] == 0), f"{label}, run {run}:\n{report.text()}"
