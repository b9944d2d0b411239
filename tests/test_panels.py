"""The lessons' panels start where their prose says, and the toggle says its state in words."""

import json
import pathlib
import re

import pytest

import labkit.scenarios
from labkit.views.widgets import explore

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def explore_cells():
    """(notebook, the nearest markdown before the cell, the explore(...) call) for every panel."""
    for path in NOTEBOOKS:
        prose = ""
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] == "markdown":
                prose = source
            elif "explore(" in source:
                yield path.name, prose, source[source.index("explore(") :]


CELLS = list(explore_cells())


def test_every_lesson_with_sliders_has_a_panel():
    """There are panels to check: at least one in each of lessons 00 to 09."""
    assert {name[:2] for name, _, _ in CELLS} == {f"{n:02}" for n in range(10)}


@pytest.mark.parametrize("name, before, call", CELLS, ids=[f"{n}:{c[8:30]}" for n, _, c in CELLS])
def test_a_panel_starts_in_the_mode_its_prose_names(name, before, call):
    """The cell names protected=; the markdown before it says the same mode; the panel built by the
    cell's own call starts there, with the sliders the cell names first and at their defaults (or
    at the value an unprotected run uses, which it shows: herd's strategy "none")."""
    named = re.search(r"protected=(True|False)", call)
    assert named, f"{name}: {call!r} does not name protected="
    said = re.search(r"The panel starts with protection (ON|OFF)", before)
    assert said, f"{name}: the markdown before the panel does not say how it starts"
    protected = named.group(1) == "True"
    assert said.group(1) == ("ON" if protected else "OFF")
    panel = eval(call, {"explore": explore, **vars(labkit.scenarios)})  # the cell's own call
    toggle = panel.controls["protected"]
    assert toggle.value is protected and panel.result.params["protected"] is protected
    assert toggle.description == f"protection: {said.group(1)}"
    sliders = re.findall(r"(\w+)=[(\[]", call)
    assert list(panel.controls)[: len(sliders)] == sliders
    naive = {} if protected else getattr(panel.scenario, "naive", {})  # what it runs without
    for knob in sliders:
        assert panel.controls[knob].value == naive.get(knob, panel.scenario.knobs[knob])


def test_the_toggle_follows_a_click():
    """Switching the toggle reruns the other mode and its words change with it."""
    panel = explore(labkit.scenarios.expired_but_alive, protected=False)
    assert panel.result.kinds
    panel.controls["protected"].value = True
    assert panel.controls["protected"].description == "protection: ON"
    assert panel.result.params["protected"] is True and not panel.result.kinds


def test_panel_tables_are_spaced():
    """Each table's name stands on its own line and every cell has padding ('invoice_idamount' no more)."""
    import re

    from labkit.views.widgets import tables_html

    page = tables_html(labkit.scenarios.expired_but_alive().tables)
    cells = re.findall(r"<t[dh][ >]", page)
    assert cells and all("style='padding" in c or c.endswith(" ") for c in cells)
    assert "<t" + "d>" not in page and "<th>" not in page
    assert "<div><b>leases</b></div><i>empty</i>" in page
