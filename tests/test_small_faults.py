"""What a timeline shows of the steps that are not writes: every refused lease step and every
granted renewal has its mark, every ring circles a mark, and a lane's labels tell its different
steps apart. Checked in every scenario (both modes, its own knobs) and in every timeline a
lesson draws."""

import itertools

import matplotlib
import pytest

matplotlib.use("Agg")

from labkit.scenarios import SCENARIOS, backup_restore, issuer_failover  # noqa: E402
from labkit.sim.history import EFFECTS  # noqa: E402
from labkit.views.scene import OTHERS, _mark_of, end_of, lanes_of, scene, x_range  # noqa: E402
from test_timeline_readable import TIMELINES  # noqa: E402

RUNS = [(f"{name}-{'P' if p else 'U'}", SCENARIOS[name](protected=p))
        for name in sorted(SCENARIOS) for p in (False, True)]
RUNS += [(f"{name[:2]}:{run.params}", run) for name, run in TIMELINES]
IDS = [name for name, _ in RUNS]


def scene_of(run):
    lanes = lanes_of(run.history)
    return lanes, scene(run, lanes, x_range(end_of(run.history)))


def on_lane(points, lanes, worker) -> list:
    return [x for x, y in points if lanes[y] == worker]


@pytest.mark.parametrize("name, run", RUNS, ids=IDS)
def test_every_refused_lease_step_has_a_mark(name, run):
    """Each acquire, renew or release the authority refused is drawn on its worker's lane, as many
    marks as refusals ("B's renewal is refused at t=32" is there to be seen)."""
    lanes, sc = scene_of(run)
    for worker in (w for w in lanes if w != OTHERS):
        refused = [e for e in run.history if e.worker == worker and e.outcome != "ok"
                   and e.action in ("acquire", "renew", "release")]
        assert len(on_lane(sc.points.get("held", []), lanes, worker)) == len(refused), worker


@pytest.mark.parametrize("name, run", RUNS, ids=IDS)
def test_every_granted_renewal_has_a_mark(name, run):
    """Each renewal the authority granted is drawn on its worker's lane, one mark each: lesson 05
    is about a renewal, and its picture once showed only a longer bar."""
    lanes, sc = scene_of(run)
    for worker in (w for w in lanes if w != OTHERS):
        granted = [e.time for e in run.history if e.worker == worker and e.outcome == "ok"
                   and e.action == "renew"]
        marks = on_lane(sc.points.get("renewed", []), lanes, worker)
        assert len(marks) == len(granted) and all(abs(m - t) < 0.5 for m, t in zip(marks, granted)), worker


@pytest.mark.parametrize("name, run", RUNS, ids=IDS)
def test_every_ring_circles_a_mark(name, run):
    """A violation's ring and a warning's diamond sit on a drawn mark of their lane (the naive
    late_release once drew an empty ring at t=14: its release had no mark)."""
    lanes, sc = scene_of(run)
    marks = {(x, y) for style, points in sc.points.items() if style not in ("violation", "warning")
             for x, y in points}
    for style in ("violation", "warning"):
        for x, y in sc.points.get(style, []):
            assert (x, y) in marks, f"{style} at t={x:g} on {lanes[y]} circles nothing"


def labelled(run, worker) -> list:
    """The steps of ``worker`` that its lane labels, in the order drawn: neither an effect nor a
    step drawn as a span or a dot (the marks with a word beside them), at most six."""
    flagged = {id(f.event) for f in (*run.violations, *run.warnings)}
    return [e for e in run.history if e.worker == worker and e.action not in EFFECTS
            and (_mark_of(e) == "other" or id(e) in flagged and not _mark_of(e))][:6]


@pytest.mark.parametrize("name, run", RUNS, ids=IDS)
def test_a_lanes_labels_tell_its_steps_apart(name, run):
    """Two labelled steps of one lane that did different things (another action, or the same
    action on another target) never carry the same label: lesson 04's ops lane once read
    "restore / restore"."""
    lanes, sc = scene_of(run)
    for worker in lanes:
        texts = [text for text, x, y, kind in sc.labels if kind == "other" and lanes[y] == worker]
        steps = labelled(run, worker)
        assert len(texts) == len(steps), worker
        for (a, e), (b, f) in itertools.combinations(zip(texts, steps), 2):
            assert a != b or (e.action, e.target) == (f.action, f.target), (worker, texts)


def ops_labels(run) -> list:
    lanes, sc = scene_of(run)
    return [text for text, x, y, kind in sc.labels if kind == "other" and lanes[y] == "ops"]


def test_lesson_04s_ops_lane_says_what_ops_did():
    """The restore, then the new epoch or the counter + 2; the failover, then the new epoch."""
    assert ops_labels(backup_restore(protected=True)) == ["restore", "new epoch"]
    bumped = backup_restore(protected=False, issued_after_backup=3, bump=2)
    assert ops_labels(bumped) == ["restore", "counter + 2"]
    failover = ops_labels(issuer_failover(protected=True, lag=5, failover_at=2))
    assert failover[0] == "failover" and failover[-1] == "new epoch" and len(set(failover)) == 3
