"""labkit.processes.team cleans up after itself: a member's scratch, the team's files, a stuck stop."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from polling import wait_for

import labkit.processes.team
from labkit.engines import servers
from labkit.processes.team import Team

SHM = Path("/dev/shm")

# Started in every worker process of the test below: a member that ran a simulation leaves
# the scratch folders of labkit.sim.files behind (a template and a Sim's folder), and says where.
SITECUSTOMIZE = """
import os
if os.environ.get("LABKIT_PROBE"):
    from labkit.sim import files
    made = [files.new_folder(0)]  # a run the member never finishes
    said = os.path.join(os.environ["LABKIT_PROBE"], str(os.getpid()))
    with open(said + ".part", "w") as f:
        f.write("\\n".join(map(str, made)))
    os.rename(said + ".part", said)  # whole, or not there yet
"""


def open_paths() -> list[str]:
    """What this process has open or mapped: the targets of /proc/self/fd and /proc/self/maps."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    with open("/proc/self/maps") as maps:
        found += [line.split(maxsplit=5)[-1].strip() for line in maps if "/" in line]
    return found


def probing(tmp_path, monkeypatch) -> Path:
    """Make every Python started from here on run SITECUSTOMIZE; return where it reports."""
    site, probe = tmp_path / "site", tmp_path / "probe"
    site.mkdir()
    probe.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("LABKIT_PROBE", str(probe))
    return probe


def in_shm(folders) -> list[str]:
    """Those of ``folders`` that still exist in /dev/shm."""
    return [folder for folder in folders if folder.startswith(str(SHM)) and Path(folder).exists()]


@pytest.mark.skipif(not os.access(SHM, os.W_OK), reason="no writable /dev/shm")
def test_a_killed_member_leaves_no_folder_in_dev_shm(tmp_path, monkeypatch):
    """SIGKILL a member: its labkit folders go with it; after stop, no member's is left."""
    probe = probing(tmp_path, monkeypatch)
    with Team(2, ttl=0.5, root=tmp_path) as team:
        team.start()
        pids = {name: team.pid(name) for name in team.names}
        wait_for(
            lambda: all((probe / str(pid)).exists() for pid in pids.values()),
            "both members' folders",
        )
        made = {name: (probe / str(pid)).read_text().split("\n") for name, pid in pids.items()}
        assert all(Path(folder).is_dir() for folders in made.values() for folder in folders)
        team.kill("A")
        left = [folder for folder in made["A"] if Path(folder).exists()]
        assert all(Path(folder).is_dir() for folder in made["B"])  # B still runs
    left += [folder for folder in made["B"] if Path(folder).exists()]
    for folder in left:  # what the old code leaked: clean it up, then fail
        shutil.rmtree(folder, ignore_errors=True)
    assert left == []
    assert [entry.name for entry in SHM.iterdir() if team.run in entry.name] == []


KERNEL = """
import sys, time
from labkit.processes.team import Team
team = Team(2, ttl=0.5, root=sys.argv[1]).start()
print(*[p.pid for p in team.procs.values()], flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not os.access(SHM, os.W_OK), reason="no writable /dev/shm")
def test_members_of_a_killed_parent_leave_no_folder_in_dev_shm(tmp_path, monkeypatch):
    """SIGKILL the process that started a team (a kernel restart): Linux kills its members, and
    no labkit folder of theirs is left in /dev/shm (where nobody would ever remove it)."""
    probe = probing(tmp_path, monkeypatch)
    kernel = subprocess.Popen(
        [sys.executable, "-c", KERNEL, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        pids = [int(p) for p in kernel.stdout.readline().split()]
        wait_for(lambda: all((probe / str(pid)).exists() for pid in pids), "both members' folders")
    finally:
        kernel.kill()
        kernel.wait()
        wait_for(lambda: (probe / str(kernel.pid)).exists(), "the kernel's own folders")
        for folder in (probe / str(kernel.pid)).read_text().split("\n"):  # not the team's to remove
            shutil.rmtree(folder, ignore_errors=True)
    wait_for(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in pids), "the members to die")
    made = [folder for pid in pids for folder in (probe / str(pid)).read_text().split("\n")]
    left = in_shm(made)
    for folder in left:  # what the old code leaked: clean it up, then fail
        shutil.rmtree(folder, ignore_errors=True)
    assert left == []


def test_stop_closes_the_teams_connections_board_and_journal(tmp_path):
    """After stop, no file of the run (the database, its WAL, the board, the journal) is open or mapped;
    the history is still readable."""
    with Team(2, ttl=0.5, root=tmp_path) as team:
        team.start()
        wait_for(
            lambda: any(e.action == "write" and e.outcome == "ok" for e in team.history()),
            "a commit",
        )
        assert any(path.startswith(team.run_dir) for path in open_paths())
    assert [path for path in open_paths() if path.startswith(team.run_dir)] == []
    assert any(e.action == "write" for e in team.history()) and team.check() == []
    assert [path for path in open_paths() if path.startswith(team.run_dir)] == []


def test_a_process_that_never_shows_stopped_is_killed_after_a_timeout(tmp_path, monkeypatch):
    """If the kernel never reports a SIGSTOPped worker stopped, freeze gives up after a timeout and
    SIGKILLs it, instead of waiting forever."""
    with Team(1, ttl=0.5, root=tmp_path) as team:
        team.start()
        pid = team.pid("A")
        monkeypatch.setattr(labkit.processes.team, "proc_state", lambda pid: "S")
        answer = []
        freezer = threading.Thread(target=lambda: answer.append(team.freeze("A")), daemon=True)
        freezer.start()
        freezer.join(30)
        assert not freezer.is_alive(), "freeze still waits for the process to stop"
        assert answer == [None] and not team.alive("A")
        monkeypatch.undo()
        assert not os.path.exists(f"/proc/{pid}")


def test_a_team_without_a_root_leaves_no_folder_once_its_process_is_gone(tmp_path, monkeypatch):
    """A team in the temp dir (a live demo's) keeps its folder while its process lives; the
    next team, started after that process is gone, removes it."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    code = "import tempfile; from labkit.processes.team import Team; t = Team(1); print(t.run_dir)"
    made = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ}, capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    assert Path(made).parent == tmp_path and Path(made).is_dir()
    monkeypatch.setattr("tempfile.tempdir", None)  # this process reads TMPDIR anew
    with Team(1) as team:
        assert not Path(made).exists()
        assert Path(team.run_dir).is_dir()  # its own folder stays while this process lives


@contextlib.contextmanager
def interrupted_inside_poll(procs):
    """Leave each Popen as a Ctrl-C inside ``Popen.poll()`` leaves it: CPython takes the Popen's
    private waitpid lock just before its ``try``, so an interrupt between the two keeps it held,
    and ``Popen.wait()`` then blocks forever (what hung interrupted chaos runs). On the way out
    the locks are let go, so that a failing test still cleans up."""
    held = [proc._waitpid_lock for proc in procs]
    assert all(lock.acquire(False) for lock in held)
    try:
        yield
    finally:
        for lock in held:
            lock.release()


def finishes(call, what: str) -> None:
    done = threading.Thread(target=call, daemon=True)
    done.start()
    done.join(30)  # a bound on a hang, not a timing claim: it finishes at once or never
    assert not done.is_alive(), f"{what} blocks on the lock an interrupt left held"


def test_stop_ends_every_worker_even_after_an_interrupt_inside_poll(tmp_path):
    """A team whose workers' Popen locks an interrupt left held still stops: every process is
    reaped and gone."""
    with Team(2, ttl=0.5, root=tmp_path) as team:
        team.start()
        pids = [team.pid(name) for name in team.names]
        with interrupted_inside_poll(team.procs.values()):
            finishes(team.stop, "Team.stop")
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)


def test_a_server_stops_even_after_an_interrupt_inside_poll():
    """The same for a throwaway server: stop() reaps its process and removes its folder."""

    class Sleeper(servers.Throwaway):
        kind = "sleeper"

        def _start(self) -> None:
            self.spawn("sleep", "60", log=self.folder / "log")

    with Sleeper() as server:
        pid, folder = server.process.pid, server.folder
        with interrupted_inside_poll([server.process]):
            finishes(server.stop, "Throwaway.stop")
    assert not os.path.exists(f"/proc/{pid}") and not folder.exists()


@contextlib.contextmanager
def interrupted_right_after_popen(monkeypatch):
    """Every ``Popen`` of the block is followed at once by a Ctrl-C (SIGINT to this process),
    before its caller can record what it started; yields the pids started."""
    started, real = [], subprocess.Popen

    def popen(*args, **kwargs):
        proc = real(*args, **kwargs)
        started.append(proc.pid)
        os.kill(os.getpid(), signal.SIGINT)  # Python raises it at the next instruction
        return proc

    monkeypatch.setattr(subprocess, "Popen", popen)
    yield started
    monkeypatch.setattr(subprocess, "Popen", real)


def test_an_interrupt_as_a_worker_starts_leaves_no_worker(tmp_path, monkeypatch):
    """A Ctrl-C that lands between a worker's Popen and the team's record of it (live.py's
    run_demo once left such a B running): the team knows it, and stop() ends it."""
    with Team(2, ttl=0.5, root=tmp_path) as team:
        with interrupted_right_after_popen(monkeypatch) as started, pytest.raises(KeyboardInterrupt):
            team.start("A")
        assert started and team.pid("A") == started[0]
    assert servers.proc_state(started[0]) == "gone"


def test_an_interrupt_as_a_server_starts_leaves_no_server(monkeypatch):
    """The same for a throwaway server's process: its start() stops it on the way out."""

    class Sleeper(servers.Throwaway):
        kind = "sleeper"

        def _start(self) -> None:
            self.spawn("sleep", "60", log=self.folder / "log")

    server = Sleeper()
    with interrupted_right_after_popen(monkeypatch) as started, pytest.raises(KeyboardInterrupt):
        server.start()
    assert started and servers.proc_state(started[0]) == "gone" and server.process is None
