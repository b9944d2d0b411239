"""The slider round trip: rerun a scenario and redraw the panel's timeline, per scenario.

For every scenario in ``labkit.scenarios.SCENARIOS`` this builds the panel of
``labkit.views.widgets.explore`` (outside a kernel: the widgets work, their messages
go nowhere) and moves its first slider 50 times across its range, timing each
change from the new value to the replaced PNG. It prints p50 / p95 / max per
scenario, then the cost of the two ways to show the PNG (an inline PNG in a
``widgets.Output`` vs a ``widgets.Image``) and of a freshly made matplotlib
figure, and the time of ``herd(contenders=1000)``.

Targets on a 2-core machine: p95 <= 50 ms per slider change; herd(1000) < 1 s.

Run: ``.venv/bin/python benchmarks/slider.py [--changes 50] [--only NAME ...]``
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time

import matplotlib

matplotlib.use("Agg")

from labkit.views.plot import timeline  # noqa: E402
from labkit.scenarios import SCENARIOS  # noqa: E402
from labkit.views.screen import png_output  # noqa: E402
from labkit.views.widgets import TimelineRenderer, explore  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def sweep_values(control, n: int) -> list:
    """``n`` values that walk the control's range up and down (each one differs from the last)."""
    if hasattr(control, "options"):
        options = list(control.options)
        return [options[i % len(options)] for i in range(1, n + 1)]
    low, high, step = control.min, control.max, control.step
    steps = max(1, int(round((high - low) / step)))
    path = [low + step * i for i in range(steps + 1)]
    walk = path + path[-2:0:-1]
    start = walk.index(min(walk, key=lambda v: abs(v - control.value)))
    values = [walk[(start + 1 + i) % len(walk)] for i in range(n)]
    return [type(control.value)(v) for v in values]


def slider_round_trips(name: str, changes: int) -> tuple[str, list[float], list[float]]:
    """Time ``changes`` moves of the panel's first slider: rerun + redraw; wall and CPU ms."""
    panel = explore(SCENARIOS[name])
    knob = next(k for k in panel.controls if k not in ("seed", "protected"))
    control = panel.controls[knob]
    times, cpu = [], []
    for value in sweep_values(control, changes):
        start, start_cpu = time.perf_counter(), time.process_time()
        control.value = value
        times.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
        assert panel.result is not None and panel.result.params[knob] == value
    return knob, times, cpu


def display_costs(name: str = "expired_but_alive", n: int = 30) -> dict[str, float]:
    """Median ms of: PNG into an Output, PNG into an Image, and a new figure + savefig."""
    import ipywidgets as widgets
    result = SCENARIOS[name]()
    renderer, out, image = TimelineRenderer(), widgets.Output(), widgets.Image(format="png")
    costs = {}

    def median(fn, n=n):
        fn()
        runs = []
        for _ in range(n):
            start = time.perf_counter()
            fn()
            runs.append((time.perf_counter() - start) * 1000)
        return statistics.median(runs)

    costs["reused renderer -> inline PNG in widgets.Output"] = median(
        lambda: setattr(out, "outputs", png_output(renderer.png(result))))
    costs["reused renderer -> widgets.Image"] = median(lambda: setattr(image, "value", renderer.png(result)))

    def fresh():
        ax = timeline(result)
        ax.figure.savefig(io.BytesIO(), format="png", dpi=80)
        matplotlib.pyplot.close(ax.figure)
    costs["new matplotlib figure + savefig (for comparison)"] = median(fresh, n=10)
    return costs


def herd_times(contenders: int = 1000, runs: int = 3) -> dict[str, list[float]] | None:
    """Seconds for ``herd(contenders=...)``: no backoff, jittered backoff, predecessor watch."""
    herd = SCENARIOS.get("herd")
    if herd is None:
        return None
    variants = {"no backoff (protected=False)": dict(protected=False),
                "jittered backoff": dict(strategy="jitter"), "predecessor watch": dict(strategy="watch")}
    out = {}
    for label, kwargs in variants.items():
        out[label] = []
        for _ in range(runs):
            start = time.perf_counter()
            herd(contenders=contenders, **kwargs)
            out[label].append(time.perf_counter() - start)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=50)
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args(argv)
    names = args.only or list(SCENARIOS)
    print(f"slider round trip (rerun + redraw), {args.changes} changes each; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'':47} {'wall clock':^26}  {'CPU of this process':^17}")
    print(f"{'scenario':28} {'slider':18} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}  {'p50 ms':>8} {'p95 ms':>8}"
          "  target: p95 <= 50 ms")
    worst = worst_cpu = 0.0
    for name in names:
        knob, times, cpu = slider_round_trips(name, args.changes)
        p95, cpu95 = percentile(times, 95), percentile(cpu, 95)
        worst, worst_cpu = max(worst, p95), max(worst_cpu, cpu95)
        flag = "ok" if p95 <= 50 else "OVER"
        print(f"{name:28} {knob:18} {percentile(times, 50):8.1f} {p95:8.1f} {max(times):8.1f}  "
              f"{percentile(cpu, 50):8.1f} {cpu95:8.1f}  {flag}")
    print(f"worst p95: {worst:.1f} ms wall, {worst_cpu:.1f} ms CPU "
          f"(wall above CPU is time this process waited for a core)")
    print()
    print("showing the PNG (median ms, expired_but_alive):")
    for label, ms in display_costs().items():
        print(f"  {label:52} {ms:7.1f}")
    print()
    herd = herd_times()
    if herd is None:
        print("herd: not available")
    else:
        for label, runs in herd.items():
            print(f"herd(contenders=1000), {label:28}: best {min(runs):.3f} s, median "
                  f"{statistics.median(runs):.3f} s over {len(runs)} runs  "
                  f"(target < 1 s: {'ok' if statistics.median(runs) < 1 else 'OVER'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
