"""What each ▶ button of a lesson draws when its action is called directly: no widget on a page,
no browser, no kernel. The browser test holds each button's final picture against these.

The lesson's code cells run here in order (one that fails outside a kernel, a check cell, is
passed over unless it makes a button), with ``labkit.views.widgets.button`` recording its
action instead of drawing a button; then each action is called, and the last picture of every
output it created is its final picture (PNG bytes, at the renderer's own pixel size).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
from pathlib import Path

import ipywidgets
import matplotlib
import matplotlib.pyplot
import numpy as np
from PIL import Image


def ink(png: bytes) -> int:
    """The pixels of ``png`` that are not (nearly) white or transparent."""
    rgba = np.asarray(Image.open(io.BytesIO(png)).convert("RGBA")).astype(int)
    light = rgba[..., :3].min(axis=2) >= 250
    return int(((rgba[..., 3] > 16) & ~light).sum())


def direct_pictures(notebook: Path, env: dict[str, str]) -> list[list[bytes]]:
    """For each ▶ button of ``notebook``, in order: the final PNG of each picture its action
    draws when called directly (with ``env`` set, e.g. the live demos' length)."""
    import labkit.views.widgets as views

    matplotlib.use("Agg")
    actions, created = [], []
    real_button, real_init = views.button, ipywidgets.Output.__init__

    def record(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        created.append(self)

    cells = [c for c in json.loads(notebook.read_text())["cells"] if c["cell_type"] == "code"]
    saved = {k: os.environ.get(k) for k in env}
    here = Path.cwd()
    try:
        os.environ.update(env)
        os.chdir(notebook.parent)
        views.button = lambda label, action: actions.append(action)
        ipywidgets.Output.__init__ = record
        space: dict = {"__name__": "__lesson__"}
        with contextlib.redirect_stdout(io.StringIO()):
            for cell in cells:
                source = "".join(cell["source"])
                try:
                    exec(compile(source, str(notebook), "exec"), space)
                except Exception:  # a quiz or a check outside a kernel: a button cell must run
                    if "button(" in source:
                        raise
            drawn = []
            for action in actions:
                created.clear()
                action()
                drawn.append([png for out in created if (png := _last_png(out))])
    finally:
        views.button, ipywidgets.Output.__init__ = real_button, real_init
        os.chdir(here)
        matplotlib.pyplot.close("all")  # the lesson's own figures, drawn here for no one
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    return drawn


def _last_png(output) -> bytes | None:
    pngs = [o["data"]["image/png"] for o in output.outputs if "image/png" in o.get("data", {})]
    return base64.b64decode(pngs[-1]) if pngs else None
