"""Answer cells that patch the kernel pass under nbval, and the grader still fails them: it judges
the notebook file out of process, and a PASS printed in a notebook counts for nothing."""

import json
import subprocess
import sys

import pytest

from labkit.grading import grader, notebooks

EXERCISE = notebooks.ROOT / "exercises" / "02-fencing-tokens.ipynb"

PATCH_RELOAD = '''
import importlib, types
_real_reload = importlib.reload
def _fake_reload(module):
    fake = types.SimpleNamespace(check=lambda task, answer: print(
        next(l for l in CHECK_LINES if l.startswith(f"PASS {task}:"))))
    return fake
importlib.reload = _fake_reload
'''

CUSTOM_EXC = '''
def _pretend(shell, etype, value, tb, tb_offset=None):
    task = str(value).split()[1].rstrip(":")
    print(next(l for l in CHECK_LINES if l.startswith(f"PASS {task}:")))
get_ipython().set_custom_exc((Exception,), _pretend)
'''


def _tampered(prefix: str) -> dict:
    """The unsolved exercise with ``prefix`` pasted into its first answer cell."""
    nb = json.loads(EXERCISE.read_text())
    lines = ["".join(o["text"]).strip() for c in nb["cells"] if notebooks.is_check(c) for o in c["outputs"]]
    first = next(c for c in nb["cells"]
                 if c["cell_type"] == "code" and "NotImplementedError" in "".join(c["source"]))
    first["source"] = f"CHECK_LINES = {lines!r}\n{prefix}\n" + "".join(first["source"])
    return nb


@pytest.fixture(scope="module")
def submissions(tmp_path_factory):
    """Two cheating students' notebooks."""
    root = tmp_path_factory.mktemp("cheats")
    for student, prefix in (("reload", PATCH_RELOAD), ("custom-exc", CUSTOM_EXC)):
        (root / student).mkdir()
        (root / student / EXERCISE.name).write_text(json.dumps(_tampered(prefix)))
    return root


@pytest.mark.parametrize("student", ["reload", "custom-exc"])
def test_the_cheat_fools_nbval_alone(submissions, student):
    """Run directly under nbval, the cheat passes every check cell: the threat is real."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                          "no:hypothesispytest", "--nbval-lax", "--nbval-current-env",
                          str(submissions / student / EXERCISE.name)],
                         capture_output=True, text=True, cwd=submissions, timeout=300)
    assert out.returncode == 0 and " passed" in out.stdout and "failed" not in out.stdout, out.stdout[-800:]


def test_the_grader_fails_every_cheat(submissions):
    """The grader judges the file, not the kernel: both cheats fail every task, for the real reason."""
    results = {s.student: s for s in grader.grade([str(submissions)], cell_timeout=60)}
    for student in ("reload", "custom-exc"):
        assert results[student].results and set(results[student].outcomes.values()) == {"fail"}, results[student]
        notes = results[student].notes  # the stub raises, or the cheat's own cell broke first (named)
        assert all("NotImplementedError" in notes[t] or "the cell that begins" in notes[t] and " raised " in notes[t]
                   for t in ("02.1", "02.2")), notes
