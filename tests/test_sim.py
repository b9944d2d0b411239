"""The scenario engine: virtual time on simpy, real SQLite locks, planned faults."""

import os
import pathlib
import tempfile

import pytest
import simpy

from labkit import BadArgument, BadArgumentType
from labkit.sim.history import Event
from labkit.sim import JOB, LEASE, Crashed, NoResponse, Sim, play
from labkit.scenarios import expired_but_alive, lock_wait


@pytest.fixture
def sim():
    with Sim(seed=0) as s:
        yield s


def rows(s):
    return [(r["invoice_id"], r["generation"]) for r in s.tables()["invoices"]]


def test_same_seed_same_history():
    """Two runs with one seed give equal whole histories and tables; the seed is the only randomness."""
    first, second = expired_but_alive(seed=3, protected=False), expired_but_alive(seed=3, protected=False)
    assert first.history == second.history
    assert first.tables == second.tables
    assert first.verdict == second.verdict


def test_different_seeds_draw_differently():
    """The seed reaches the scenario (amounts and work times differ between seeds)."""
    tables = {str(expired_but_alive(seed=s).tables["invoices"]) for s in range(5)}
    assert len(tables) > 1


def test_pause_inside_transaction_makes_the_other_wait_exactly_until_commit(sim):
    """A pauses 30 s inside BEGIN IMMEDIATE; B, arriving at 10, waits at 0.5 s ticks and commits at 30."""
    a, b = sim.worker("A", pauses={"inside-write": 30}), sim.worker("B")
    sim.start(a, lambda w: (yield from w.write("INV-1", 100, 7)))
    sim.start(b, lambda w: (yield from w.write("INV-2", 200, 8)), at=10)
    sim.run()
    waits = [Event(10 + 0.5 * i, "B", "wait", "busy", target="INV-2") for i in range(40)]
    assert sim.history == [
        Event(0.0, "A", "pause", "ok", target="inside-write", until=30.0),
        *waits,
        Event(30.0, "A", "resume", "ok", target="inside-write"),
        Event(30.0, "A", "raise", "ok", generation=7, target=JOB),
        Event(30.0, "A", "write", "ok", generation=7, target="INV-1", began=0.0),
        Event(30.0, "B", "raise", "ok", generation=8, target=JOB),
        Event(30.0, "B", "write", "ok", generation=8, target="INV-2"),
    ]
    assert rows(sim) == [("INV-1", 7), ("INV-2", 8)]


def test_crash_at_a_point_rolls_back_the_open_transaction(sim):
    """A crash inside the fenced transaction leaves no row, the fence unmoved, and frees the lock at once."""
    a, b = sim.worker("A", crash_at="inside-write"), sim.worker("B")
    sim.start(a, lambda w: (yield from w.write("INV-1", 100, 7)))
    sim.start(b, lambda w: (yield from w.write("INV-2", 200, 6)), at=1)
    sim.run()
    assert sim.history == [
        Event(0.0, "A", "crash", "ok", target="inside-write"),
        Event(0.0, "A", "write", "crashed", generation=7, target="INV-1"),
        Event(1.0, "B", "raise", "ok", generation=6, target=JOB),
        Event(1.0, "B", "write", "ok", generation=6, target="INV-2"),
    ]
    assert rows(sim) == [("INV-2", 6)]
    assert sim.tables()["job_fence"][0]["generation"] == 6


def test_crashed_is_an_exception_the_worker_can_see(sim):
    """A planned crash reaches the worker's code as Crashed, not as silence."""
    seen = []

    def body(w):
        try:
            yield from w.point("here")
        except Crashed as exc:
            seen.append(exc.point)
            raise
    sim.start(sim.worker("A", crash_at="here"), body)
    sim.run()
    assert seen == ["here"]


def test_latency_delays_request_and_response(sim):
    """The authority acts after the request latency; the worker hears after the response latency too."""
    heard = []

    def body(w):
        lease = yield from w.acquire(10)
        heard.append((w.env.now, lease.expires_at))
    sim.start(sim.worker("A", request_latency=2, response_latency=3), body)
    sim.run()
    assert sim.history == [Event(2.0, "A", "acquire", "ok", generation=1, target=LEASE, until=12.0)]
    assert heard == [(5.0, 12.0)]


def test_lost_response_raises_after_timeout_although_the_authority_acted(sim):
    """A lost answer becomes NoResponse after the timeout; the lease was granted all the same."""
    caught = []

    def body(w):
        try:
            yield from w.acquire(10)
        except NoResponse as exc:
            caught.append((w.env.now, exc.action))
    sim.start(sim.worker("A", lose=["acquire"], timeout=4), body)
    sim.run()
    assert caught == [(4.0, "acquire")]
    assert [(e.time, e.action, e.outcome) for e in sim.history] == [
        (0.0, "acquire", "ok"), (4.0, "response", "lost")]
    assert sim.authority.current(LEASE).owner == "A"


def test_clock_offset_and_drift_skew_only_that_worker(sim):
    """Offset and drift change one worker's local clock; the authority keeps virtual time."""
    a, b = sim.worker("A", offset=2.0, drift=0.1), sim.worker("B")
    sim.env.run(until=10)
    assert (a.clock.now(), b.clock.now(), sim.clock.now()) == (pytest.approx(13.0), 10.0, 10.0)


def test_files_are_real_and_removed_on_close():
    """Workers share one real SQLite file in a temp folder that close() deletes."""
    s = Sim()
    path = s.path("resource")
    s.worker("A")
    assert os.path.getsize(path) > 0
    s.close()
    assert not os.path.exists(os.path.dirname(path))


def test_knobs_are_validated_by_name():
    """Bad knobs raise BadArgument/BadArgumentType naming the knob, before anything runs."""
    with pytest.raises(BadArgument) as bad:
        expired_but_alive(pause=-1)
    assert bad.value.argument == "pause"
    with pytest.raises(BadArgumentType) as wrong:
        expired_but_alive(ttl="10")
    assert wrong.value.argument == "ttl"
    with pytest.raises(BadArgument) as unknown:
        expired_but_alive(pasue=3)
    assert unknown.value.argument == "pasue"
    with pytest.raises(BadArgumentType) as flag:
        expired_but_alive(protected="no")
    assert flag.value.argument == "protected"
    with pytest.raises(BadArgument) as zero:
        expired_but_alive(ttl=0)
    assert zero.value.argument == "ttl"


def test_scenario_signature_lists_its_knobs():
    """@scenario exposes keyword-only knobs with the source's defaults."""
    assert expired_but_alive.knobs == {"pause": 30.0, "ttl": 10.0}
    params = __import__("inspect").signature(expired_but_alive).parameters
    assert list(params) == ["protected", "seed", "pause", "ttl"]
    assert all(p.kind is p.KEYWORD_ONLY for p in params.values())


def test_result_is_frozen():
    """A Result cannot be changed after the run."""
    result = expired_but_alive()
    with pytest.raises(AttributeError):
        result.verdict = "fine"


def test_paced_run_equals_virtual_run_and_reports_progress():
    """A realtime-paced run (tiny factor) gives the same history, and step() sees it grow."""
    seen = []
    paced = play(lock_wait, factor=0.0005, every=5.0, step=lambda s: seen.append(len(s.history)))
    assert paced.history == lock_wait().history
    assert seen == sorted(seen) and seen[0] < seen[-1] == len(paced.history)


def test_generator_processes_are_plain_simpy(sim):
    """The engine runs on simpy: processes are simpy Processes in a simpy Environment."""
    process = sim.start(sim.worker("A"), lambda w: (yield w.env.timeout(1)))
    assert isinstance(sim.env, simpy.Environment) and isinstance(process, simpy.Process)


@pytest.mark.parametrize("module", ["sim.engine", "sim.worker", "sim.history", "scenarios", "scenarios.fencing"])
def test_docstring_examples_hold(module):
    """Every example in the engine's and lessons 01-03's docstrings runs and prints what it shows."""
    import doctest
    import importlib
    result = doctest.testmod(importlib.import_module(f"labkit.{module}"))
    assert result.attempted > 0 and result.failed == 0


def test_the_worked_example_in_the_sim_docstring_runs():
    """The scenario written out in labkit.sim's docstring runs as shown: A's late write is lost unprotected."""
    import textwrap
    import labkit.sim.engine
    from labkit.sim import SCENARIOS
    code = labkit.sim.engine.__doc__.split("has)::\n")[1].split("\n:func:")[0]
    namespace = {}
    try:
        exec(textwrap.dedent(code), namespace)
    finally:
        SCENARIOS.pop("stale_writer", None)
    assert namespace["stale_writer"].knobs == {"pause": 30.0, "ttl": 10.0}
    result = namespace["result"]
    assert [(e.worker, e.action, e.outcome, e.generation) for e in result.history if e.action == "write"] == [
        ("B", "write", "ok", 8), ("A", "write", "ok", 7)]
    assert {"lost_update", "stale_accepted"} <= result.kinds


def test_a_knob_too_large_for_a_float_is_a_named_error():
    """An int knob beyond float range is refused with BadArgument naming the knob, not OverflowError."""
    from labkit import BadArgument
    from labkit.scenarios import expired_but_alive
    with pytest.raises(BadArgument, match="pause"):
        expired_but_alive(pause=10 ** 400)


UNFINISHED = {  # a process that leaves a folder of files unfinished, printing its path
    "sim": "from labkit.scenarios import expired_but_alive; from labkit.sim import files; "
    "expired_but_alive(); print(files.new_folder(6), flush=True); input()",
    "check": "from labkit.grading import lab; trial = lab.scratch(); print(trial.__enter__().folder, flush=True); "
    "input()",
}


@pytest.mark.parametrize("kind", UNFINISHED)
def test_folders_of_a_killed_process_are_removed_by_the_next_one(kind):
    """A finished run leaves no folder (templates live in memory); a SIGKILLed process cannot
    clean up its unfinished run (a simulation's, a check's trial), so the next process that
    makes files of that kind removes its folder. They are in memory where /dev/shm is writable."""
    import signal
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", UNFINISHED[kind]], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        unfinished = pathlib.Path(child.stdout.readline().decode().strip())
        shm = os.environ.get("LABKIT_SCRATCH") or "/dev/shm"
        root = pathlib.Path(shm if os.access(shm, os.W_OK | os.X_OK) else tempfile.gettempdir())
        assert list(root.glob(f"labkit-{kind}-{child.pid}-*")) == [unfinished]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert unfinished.exists()  # SIGKILL ran no clean-up
    first = f"from labkit.sim import files; import shutil; shutil.rmtree(files.scratch_folder({kind!r}))"
    subprocess.run([sys.executable, "-c", first], check=True)  # the next process's first folder
    assert not unfinished.exists()
