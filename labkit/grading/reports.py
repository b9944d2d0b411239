"""What the grader writes: the scorecard, the CSV and JUnit files, and the feedback pages.

Every output gives each task's points, each property that did not score with its seed and
replay call, and each student's total; each row of a notebook graded without the sandbox
(``--unsandboxed``) says UNSANDBOXED. A feedback page (``labkit.grade --feedback DIR``) is
one self-contained HTML page per student. It lists the student's notebooks and tasks with their points, every property that did
not score in plain words (the rule, what the judge saw, the seed and the replay call), and the
timeline of the failing schedule, drawn by the lessons' own :func:`labkit.views.plot.timeline`
from the events the judge logged and embedded as a PNG, so the page needs no other file.
The standard library's ``html`` escapes every text; a template engine would add a dependency
for one page layout.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import pathlib
import re
import xml.etree.ElementTree as ET

from labkit.errors import LabkitError
from labkit.grading.scores import Failure, Report, shown_points

__all__ = ["scorecard", "totals", "failures", "write_junit", "write_csv", "write_feedback"]
__all__ += ["picture", "page", "write_pages"]


UNSANDBOXED = "UNSANDBOXED"


def plain(text) -> str:
    """``text`` with each character that is not printable (controls, bidirectional overrides,
    line separators) written as its escape: no name or answer's value forges or reorders a line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in str(text))


def _cell(text) -> str:
    """A CSV cell: :func:`plain`, and a leading ``= + - @`` quoted so no spreadsheet runs it."""
    text = plain(text)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def _lines(text: str) -> str:
    return "\n".join(map(plain, text.split("\n")))


def _sandbox(sub) -> str:
    return UNSANDBOXED if sub.unsandboxed else "bubblewrap"


def totals(subs: list, points=None) -> dict[str, tuple[float, float]]:
    """Points scored and possible per student, over all of their notebooks."""
    out: dict[str, tuple[float, float]] = {}
    for s in subs:
        got, possible = out.get(s.student, (0.0, 0.0))
        for tid, r in s.results.items():
            g, p = r.total((points or {}).get(tid))
            got, possible = got + g, possible + p
        out[s.student] = (got, possible)
    return out


def _pts(pair: tuple[float, float]) -> str:
    return f"{shown_points(pair[0])}/{shown_points(pair[1])}"


def failures(report) -> list[str]:
    """One line per property that did not score: its name and words, the seed and the replay call."""
    out = []
    for f in report.failed():
        name = f.words if f is report.problem else f"[{f.prop}] {f.words}"
        if f.broken is None:
            out.append(f"never checked: {name}")
        elif f.broken.seed is None:
            out.append(f"{name}: {f.broken.detail}")
        else:
            replay = f.broken.replay(report.task, report.answer)
            out.append(f"{name} (seed {f.broken.seed}): {replay}")
    return out


def scorecard(subs: list, points=None) -> str:
    """The scorecard: a row per notebook with each task's points and the student's total, then
    a line per property that did not score."""
    tasks, total = sorted({t for s in subs for t in s.results}), totals(subs, points)
    width = max([len("student")] + [len(plain(s.student)) for s in subs])
    head = "student".ljust(width) + "  " + "  ".join(t.ljust(7) for t in tasks)
    lines, broken = [head + "  total    notebook"], []
    for s in subs:
        row = [s.results.get(t) for t in tasks]
        cells = "  ".join(
            (_pts(r.total((points or {}).get(r.task))) if r else "-").ljust(7) for r in row
        )
        note = plain(s.exercise or s.path.name) + (f"  ({plain(s.problem)})" if s.problem else "")
        note += f"  {UNSANDBOXED}" if s.unsandboxed else ""
        who = plain(s.student).ljust(width)
        lines.append(f"{who}  {cells}  {_pts(total[s.student]):<7}  {note}")
        for tid, r in s.results.items():
            mark = f" {UNSANDBOXED}" if s.unsandboxed else ""
            broken += [f"  {plain(s.student)} {tid}{mark}: {plain(line)}" for line in failures(r)]
    return "\n".join(lines + (["", "what did not score:"] + broken if broken else []))


def write_junit(subs: list, path: pathlib.Path, points=None) -> None:
    """One testcase per (notebook, task) with its points; a failure names that task's broken
    properties, and its text is the task's scorecard."""
    suite = ET.Element("testsuite", name="labkit-grade")
    for s in subs:
        for tid, r in s.results.items():
            given = (points or {}).get(tid)
            case = ET.SubElement(
                suite, "testcase", classname=plain(f"{s.student}.{s.exercise}"), name=f"task {tid}"
            )
            props = ET.SubElement(case, "properties")
            ET.SubElement(props, "property", name="points", value=_pts(r.total(given)))
            ET.SubElement(props, "property", name="sandbox", value=_sandbox(s))
            if not r.passed:
                message = f"task {tid}: {_pts(r.total(given))} points; " + "; ".join(failures(r))
                ET.SubElement(case, "failure", message=plain(message)).text = _lines(r.text(given))
        if not s.results:
            name = plain(s.path.name)
            case = ET.SubElement(suite, "testcase", classname=plain(s.student), name=name)
            ET.SubElement(
                ET.SubElement(case, "properties"), "property", name="sandbox", value=_sandbox(s)
            )
            ET.SubElement(case, "failure", message=plain(s.problem or "not graded"))
    suite.set("tests", str(len(suite)))
    suite.set("failures", str(sum(1 for c in suite if c.find("failure") is not None)))
    ET.ElementTree(suite).write(path, encoding="unicode", xml_declaration=True)


CSV_COLUMNS = ["student", "notebook", "task", "points", "possible", "outcome", "failed", "note"]
CSV_COLUMNS += ["sandbox", "seed"]  # seed: the run's (``--seed`` grades that notebook the same)


def write_csv(subs: list, path: pathlib.Path, points=None) -> None:
    """A row per (notebook, task): its points, what did not score (each with its seed and replay
    call), the note of that task alone, and the student's total points and possible."""
    total = totals(subs, points)
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(CSV_COLUMNS + ["total", "total_possible"])
        for s in subs:
            for tid, r in s.results.items():
                got, possible = r.total((points or {}).get(tid))
                note = r.problem.broken.detail if r.problem else ""
                row = [_cell(s.student), _cell(s.exercise), tid, shown_points(got)]
                row += [shown_points(possible), "pass" if r.passed else "fail"]
                row += [_cell(" | ".join(failures(r))), _cell(note), _sandbox(s), r.run]
                out.writerow(row + [shown_points(x) for x in total[s.student]])
            if not s.results:  # it matched no exercise: the student still has a row, and why
                row = [_cell(s.student), _cell(s.exercise or s.path.name), "", "0", "0", "fail", ""]
                row.append(_cell(s.problem))
                row += [_sandbox(s), ""]
                out.writerow(row + [shown_points(x) for x in total[s.student]])


def write_feedback(subs: list, folder: pathlib.Path, points=None, jobs: int = 1) -> list:
    """``folder/<student>.html`` for each student, ``jobs`` pages drawn at once."""
    by_student: dict = {}
    for s in subs:
        name = (s.exercise or s.path.name) + (f" (graded {UNSANDBOXED})" if s.unsandboxed else "")
        by_student.setdefault(s.student, []).append((name, list(s.results.values()), s.problem))
    return write_pages(by_student, folder, points, jobs)


STYLE = """body{font:16px/1.45 system-ui,sans-serif;max-width:70em;margin:2em auto;color:#222}
h2{border-bottom:1px solid #ccc}.held{color:#007a55}.broken{color:#b3261e}.never{color:#8a6d00}
pre{background:#f6f6f6;padding:.6em;white-space:pre-wrap}img{max-width:100%;border:1px solid #ddd}
td,th{padding:.2em .8em;text-align:left}"""


def picture(task: str, words: str, failure: Failure) -> str:
    """The timeline of ``failure``'s schedule as a ``data:`` PNG URI ('' if it logged nothing)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from labkit.sim.engine import Result
    from labkit.sim.history import Event, check
    from labkit.views.plot import fit_figure, timeline
    from labkit.views.scene import lanes_of

    try:  # the judge logged these events; an answer's odd value (a time of inf) draws nothing
        history = tuple(Event(**e) for e in failure.events)
        found = tuple(check(history))
    except (LabkitError, TypeError, ValueError):
        return ""
    if not lanes_of(history):
        return ""
    title = f"task {task}: broken: {words} (seed {failure.seed})"
    params = dict(failure.knobs or {}, seed=failure.seed)
    result = Result(params, history, {}, found, title)
    fig = Figure()
    FigureCanvasAgg(fig)
    fit_figure(fig, len(lanes_of(history)))
    timeline(result, ax=fig.add_subplot())
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=96)
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def _h(text) -> str:
    return html.escape(plain(text))


def _task(report: Report, given) -> list[str]:
    got, possible = map(shown_points, report.total(given))
    out = [f"<h3>task {_h(report.task)}: {_h(report.title)}: {got}/{possible} points</h3>"]
    points = report.points(given)
    for f in (*([report.problem] if report.problem else []), *report.findings):
        scored, worth = points.get(f.prop, (0.0, 0.0))
        kind = "held" if f.scored and not report.problem else ("broken" if f.broken else "never")
        label = {"held": "held", "broken": "broken", "never": "never checked"}[kind]
        label = "not scored" if report.problem and kind == "never" else label
        if f is report.problem:
            label, kind, pts = "no points until", "broken", ""
        else:
            pts = f" ({shown_points(scored)}/{shown_points(worth)})"
        key = "" if f is report.problem else f" [{_h(f.prop)}]"
        out.append(f'<p class="{kind}"><b>{label}</b>{key}: {_h(f.words)}{pts}</p>')
        if f.broken and (f is report.problem or not report.problem):
            lines = f.broken.lines(report.task, report.answer)
            out.append("<pre>" + html.escape(_lines("\n".join(lines))) + "</pre>")
            try:
                image = picture(report.task, f.words, f.broken)
            except Exception as exc:  # noqa: BLE001 -- a drawing that fails costs its picture
                image = ""
                why = f"{type(exc).__name__}: {exc}"
                out.append(f'<p class="never">the timeline could not be drawn ({_h(why)})</p>')
            if image:
                alt = html.escape(f"the timeline of seed {f.broken.seed}")
                out.append(f'<img alt="{alt}" src="{image}">')
    return out


def page(student: str, notebooks: list[tuple[str, list[Report]]], given=None) -> str:
    """One student's page: ``notebooks`` are (notebook name, its reports, why it could not be
    graded or None); ``given`` the points."""
    reports = [r for _, rs, _ in notebooks for r in rs]
    got = sum(r.total((given or {}).get(r.task))[0] for r in reports)
    possible = sum(r.total((given or {}).get(r.task))[1] for r in reports)
    name = _h(student)
    body = [f"<h1>{name}: {shown_points(got)}/{shown_points(possible)} points</h1>"]
    for notebook, rs, problem in notebooks:
        body.append(f"<h2>{_h(notebook)}</h2>")
        if problem:
            body.append(f'<p class="broken"><b>not graded</b>: {_h(problem)}</p>')
        for r in rs:
            body += _task(r, (given or {}).get(r.task))
    head = f'<meta charset="utf-8"><title>{name}: feedback</title><style>{STYLE}</style>'
    return (
        f"<!doctype html>\n<html><head>{head}</head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def _plain_page(student: str, notebooks: list, given, exc: Exception) -> str:
    """The page in words alone, for when drawing it failed (``exc`` says how)."""
    texts = [r.text((given or {}).get(r.task)) for _, rs, _ in notebooks for r in rs]
    why = f"this page could not be drawn ({type(exc).__name__}: {exc}); the scorecard:"
    body = f"<h1>{_h(student)}</h1><p>{_h(why)}</p><pre>{html.escape(_lines(chr(10).join(texts)))}</pre>"
    return f'<!doctype html>\n<html><head><meta charset="utf-8"></head><body>{body}</body></html>\n'


def _render(job: tuple) -> str:
    student, notebooks, given = job
    try:
        return page(student, notebooks, given)
    except Exception as exc:  # noqa: BLE001 -- one page that fails stops no other
        return _plain_page(student, notebooks, given, exc)


def write_pages(by_student: dict, folder: pathlib.Path, given=None, jobs: int = 1) -> list:
    """Write ``folder/<student>.html`` for each student of ``by_student`` (student -> notebooks),
    drawing ``jobs`` pages at once (forked processes: a timeline takes about a second)."""
    import concurrent.futures
    import multiprocessing

    folder.mkdir(parents=True, exist_ok=True)
    written: list[pathlib.Path] = []
    work = [(student, notebooks, given) for student, notebooks in by_student.items()]
    if jobs > 1 and len(work) > 1:
        fork = multiprocessing.get_context("fork")
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=fork) as pool:
            texts = list(pool.map(_render, work, chunksize=4))
    else:
        texts = list(map(_render, work))
    for (student, _, _), text in zip(work, texts):
        safe = re.sub(r"[^\w.-]", "_", student).strip(".") or "student"
        path, n = folder / f"{safe}.html", 1
        while path in written:  # "a b" and "a_b" get a page each
            n += 1
            path = folder / f"{safe}-{n}.html"
        path.write_text(text)
        written.append(path)
    return written
