"""labkit.processes.live: a real process frozen for real, its successor, its stale write, and no process left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from polling import wait_for

from labkit.processes.live import Demo, png, proc_state, run_demo
from labkit.processes.workers import WORKING



def stat_state(pid: int) -> str | None:
    """The state letter in /proc/PID/stat, read here independently of labkit."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def gone(pid: int) -> bool:
    """True when ``pid`` no longer runs (no /proc entry, or a zombie nobody reaped yet)."""
    return stat_state(pid) in (None, "Z", "X")


def worker_children() -> list[int]:
    """Pids of live ``labkit.processes.workers`` processes whose parent is this test process."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    command = f.read()
            except (OSError, ValueError, IndexError):
                continue
            if ppid == os.getpid() and b"labkit.processes.workers" in command and not gone(int(entry)):
                found.append(int(entry))
    return found


def write_of(demo: Demo, worker: str, generation: int):
    """The answered write of ``worker`` with ``generation``, once it exists."""
    return lambda: next((e for e in demo.history() if e.worker == worker and e.action == "write"
                         and e.generation == generation and e.outcome in ("ok", "rejected")), None)


def test_a_frozen_worker_is_stopped_its_successor_commits_and_its_stale_write_bounces(tmp_path):
    """SIGSTOP really stops A (state T); B takes over and commits; resumed, A's write is refused by the fence."""
    with Demo(workers=2, ttl=0.6, protected=True, root=tmp_path) as demo:
        demo.start("A")
        name, held = wait_for(demo.holder, "A's lease")
        assert name == "A"
        demo.start("B")
        wait_for(lambda: demo.phase("A") == WORKING, "A to work")
        assert demo.pause("A", 60) == WORKING
        assert stat_state(demo.pid("A")) == "T"
        wait_for(lambda: any(e.worker == "B" and e.action == "write" and e.outcome == "ok"
                             and e.generation > held.generation for e in demo.history()), "B's commit")
        assert demo.resume("A") is True                        # A outlived its lease while frozen
        assert stat_state(demo.pid("A")) != "T"
        stale = wait_for(write_of(demo, "A", held.generation), "A's stale write")
        pids = [p.pid for p in demo.procs.values()]
    assert stale.outcome == "rejected"
    assert demo.check() == [] and demo.ledger() == []
    ax = demo.draw()
    assert [t.get_text() for t in ax.get_yticklabels()] == ["A", "B", "fence"]
    assert png(ax).startswith(b"\x89PNG")
    assert all(gone(pid) for pid in pids) and worker_children() == []


@pytest.mark.parametrize("protected", [True, False], ids=["protected", "unprotected"])
def test_run_demo_tells_the_story_and_stops_its_processes(protected, tmp_path):
    """The scripted story: the stale write bounces (protected) or lands and is flagged (unprotected)."""
    demo = run_demo(2.5, protected=protected, show=False, root=tmp_path)
    generation = demo.story["generation"]
    stale = write_of(demo, "A", generation)()
    kinds = {v.kind for v in demo.check()}
    if protected:
        assert (demo.story["outcome"], stale.outcome, kinds) == ("rejected", "rejected", set())
    else:
        assert (demo.story["outcome"], stale.outcome) == ("ok", "ok")
        assert {"stale_accepted", "lost_update"} <= kinds
    assert demo.counts["freezes_past_lease"] == 1
    assert all(gone(p.pid) for p in demo.procs.values()) and worker_children() == []


def test_an_interrupt_stops_every_process_and_a_second_demo_starts_right_after(tmp_path):
    """A KeyboardInterrupt in the middle of run_demo stops every worker; the next demo runs normally."""
    seen = []

    def interrupt():
        seen.extend(wait_for(lambda: len(worker_children()) == 2 and worker_children(), "two workers"))
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run_demo(30, show=False, root=tmp_path)
    assert len(seen) == 2 and all(gone(pid) for pid in seen) and worker_children() == []
    with Demo(workers=2, ttl=0.5, root=tmp_path) as again:
        again.start()
        wait_for(lambda: any(e.action == "write" and e.outcome == "ok" for e in again.history()),
                 "a commit in the second demo")
    assert worker_children() == []


KERNEL = """
import sys, time
from labkit.processes.live import Demo
demo = Demo(workers=2, ttl=0.5, root=sys.argv[1]).start()
print(*[p.pid for p in demo.procs.values()], flush=True)
time.sleep(60)
"""


def test_workers_die_with_their_parent_like_on_a_kernel_restart(tmp_path):
    """When the process that started the workers is SIGKILLed, Linux kills them too (PR_SET_PDEATHSIG)."""
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL, str(tmp_path)], stdout=subprocess.PIPE,
                              text=True)
    try:
        pids = [int(p) for p in kernel.stdout.readline().split()]
        assert len(pids) == 2 and not any(gone(pid) for pid in pids)
        kernel.kill()
        kernel.wait()
        wait_for(lambda: all(gone(pid) for pid in pids), "the orphaned workers to die")
    finally:
        kernel.kill()
        kernel.wait()


def test_pause_thaws_by_itself_and_kill_reports_the_process_dead(tmp_path):
    """demo.pause(worker, seconds) thaws after the given time; demo.kill leaves no process."""
    with Demo(workers=1, ttl=0.5, root=tmp_path) as demo:
        demo.start()
        wait_for(lambda: demo.phase("A") != 0 or demo.holder(), "A to start working")
        demo.pause("A", 0.2)
        assert proc_state(demo.pid("A")) == "T"
        wait_for(lambda: proc_state(demo.pid("A")) not in ("T", "t"), "A to be thawed")
        pid = demo.pid("A")
        demo.kill("A")
        assert gone(pid) and not demo.alive("A")
    events = [(e.worker, e.action) for e in demo.history() if e.action in ("pause", "resume", "crash")]
    assert events == [("A", "pause"), ("A", "resume"), ("A", "crash")]
