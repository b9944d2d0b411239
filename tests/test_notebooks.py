"""Solutions are the single source: exercises are generated from them and kept current."""

import json

from labkit.grading import notebooks


def test_exercises_are_current():
    """Every exercise equals what `make exercises` would generate from its solution."""
    assert notebooks.stale() == []


def test_every_solution_has_an_exercise():
    """Each solution has a generated exercise and vice versa."""
    sols = sorted(p.name for p in (notebooks.ROOT / "solutions").glob("*.ipynb"))
    exs = sorted(p.name for p in (notebooks.ROOT / "exercises").glob("*.ipynb"))
    assert sols == exs


def test_answer_blocks_are_stubbed_at_their_indentation():
    """A solution block becomes one NotImplementedError line; the rest is untouched."""
    src = "def f(x):\n    '''doc'''\n    ### BEGIN SOLUTION\n    y = x\n    return y\n    ### END SOLUTION\n\nz = 1\n"
    assert notebooks.strip_answer(src) == (
        "def f(x):\n    '''doc'''\n    raise NotImplementedError(\"your answer goes here\")\n\nz = 1\n")


def test_no_exercise_contains_an_answer():
    """No generated exercise still holds a solution block or a solution's outputs."""
    for path in (notebooks.ROOT / "exercises").glob("*.ipynb"):
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            assert "BEGIN SOLUTION" not in src, path.name
            if cell["cell_type"] == "code" and not notebooks.is_check(cell):
                assert cell["outputs"] == [], path.name


def test_check_cells_keep_their_pass_line():
    """Check cells keep the stored pass line nbval compares against."""
    for path in (notebooks.ROOT / "exercises").glob("*.ipynb"):
        for cell in json.loads(path.read_text())["cells"]:
            if notebooks.is_check(cell):
                text = "".join(o.get("text", "") for o in cell["outputs"])
                assert text.startswith("PASS "), (path.name, text)
