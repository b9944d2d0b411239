"""What any throwaway server needs: a free port, a temp folder, a child that dies with us.

A :class:`Throwaway` is a context manager. Its server process runs as a given user, in a temp
folder named for our pid, with ``PR_SET_PDEATHSIG``: if this process dies, even by SIGKILL, the
kernel signals the server. (The signal is tied to the thread that started it: start servers from
the main thread.) ``stop()`` runs on every other exit path, a KeyboardInterrupt included, and
at interpreter exit; a folder left by a killed parent is swept by the next start.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

from labkit.errors import LabkitError

__all__ = ["MissingBinary", "ServerFailed", "Throwaway", "binary", "free_port", "as_user"]
__all__ += ["Step", "descendants", "held_interrupts", "kill_tree", "proc_state", "reap", "sweep"]

PREFIX = "labkit-server-"


class Step(NamedTuple):
    """One step of a real-engine run, field for field a ``labkit.sim.history.Event`` (engines sit
    below the simulator, so the lesson makes the Event: ``Event(*step)``). ``time`` is seconds
    since the run's start on its monotonic clock; an acquire's ``until`` is its send time plus
    the TTL, a pause's its planned end."""

    time: float
    worker: str
    action: str
    outcome: str
    generation: object = None
    key: str | None = None
    target: str | None = None
    until: float | None = None
    began: float | None = None


class MissingBinary(LabkitError):
    """The program ``name`` is not installed; ``package`` is the Debian package that has it."""

    def __init__(self, name: str, package: str, where: Path) -> None:
        self.name, self.package = name, package
        super().__init__(
            f"{name} is not installed (looked for {where}): "
            f"install it with `apt-get install -y {package}`"
        )


class ServerFailed(LabkitError):
    """A throwaway server did not start; ``log`` is the tail of what it printed."""

    def __init__(self, what: str, log: str) -> None:
        self.log = log
        super().__init__(f"{what}; its log ends:\n{log}")


def binary(name: str, folder: str | Path, package: str) -> Path:
    """Return ``folder/name`` if it is executable, else raise MissingBinary naming ``package``."""
    path = Path(folder) / name
    if not os.access(path, os.X_OK):
        raise MissingBinary(name, package, path)
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the kernel picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def as_user(user: str | None, deathsig: int = signal.SIGKILL):
    """A ``preexec_fn``: become ``user`` (None: stay), then ask for ``deathsig`` when we die.

    PR_SET_PDEATHSIG is cleared by a change of uid, so it is set after; if the parent died before
    it was set, the child exits at once.
    """
    parent = os.getpid()
    ids = pwd.getpwnam(user) if user else None

    def preexec() -> None:
        if ids is not None:
            os.setgroups([])
            os.setgid(ids.pw_gid)
            os.setuid(ids.pw_uid)
        ctypes.CDLL(None, use_errno=True).prctl(1, int(deathsig), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's
        pass
    return True


def descendants(pid: int) -> list[int]:
    """The pids of every living process below ``pid`` (read from /proc)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        found += (children := parents.get(todo.pop(), []))
        todo += children
    return found


@contextlib.contextmanager
def held_interrupts():
    """Hold a Ctrl-C (SIGINT) that comes in the block until it ends, then raise it: a process
    started in it and not yet recorded (between ``Popen`` and the assignment of what it returns)
    would outlive every ``stop()``. Only the main thread receives a Python signal; elsewhere this
    holds nothing."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is None
    ):
        yield  # (None: a handler set outside Python, which signal.signal cannot put back)
        return
    held: list = []
    before = signal.signal(signal.SIGINT, lambda *got: held.append(got))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
        if held and callable(before):
            before(*held[0])
        elif held and before == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)


def reap(process: subprocess.Popen, timeout: float | None = None) -> int | None:
    """Wait until ``process`` has ended and return its exit code, as ``process.wait(timeout)``
    does (subprocess.TimeoutExpired after ``timeout`` seconds), but safe on an exit path.

    Why not ``Popen.wait``: ``Popen.poll`` takes a private lock just before its ``try``. An
    interrupt that lands between the two (a Ctrl-C while a loop polls its children, which is
    what a chaos run does every 10 ms) leaves that lock held for good, and every later
    ``wait()`` then blocks forever. This waits with ``os.waitpid`` and never takes the lock.
    """
    tries = None if timeout is None else max(1, round(timeout * 100))
    while tries is None or tries > 0:
        if process.returncode is not None:
            return process.returncode
        try:
            pid, status = os.waitpid(process.pid, os.WNOHANG if tries else 0)
        except ChildProcessError:  # another waiter took its status: Popen will set returncode
            pid = 0
            tries = 100 if tries is None else tries  # give it a second, then call it gone
        if pid == process.pid:
            process.returncode = os.waitstatus_to_exitcode(status)
            return process.returncode
        if tries is not None:
            tries -= 1
            time.sleep(0.01)
    if timeout is None:
        return process.returncode
    raise subprocess.TimeoutExpired(process.args, timeout)


def kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL ``process`` and everything below it, and wait until all of them are gone."""
    below = descendants(process.pid)
    for pid in [process.pid, *below]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    reap(process)
    for _ in range(1000):  # the children were reparented: they vanish once reaped by init
        if not any(_alive(pid) and proc_state(pid) != "Z" for pid in below):
            return
        time.sleep(0.01)


def proc_state(pid: int) -> str:
    """The state letter of ``pid`` in /proc (``T`` frozen, ``Z`` dead and unreaped), or "gone"."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def sweep(prefix: str = PREFIX, root: str | None = None) -> list[str]:
    """Remove the temp folders named ``{prefix}{pid}-...`` whose process ``pid`` is gone
    (throwaway servers, simulated runs, teams of real workers)."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(prefix + "*"):
        pid = folder.name[len(prefix) :].split("-")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed


class Throwaway:
    """One server process in its own temp folder, stopped on exit (``with`` or :meth:`stop`).

    Subclasses implement :meth:`_start` (run ``self.spawn(...)`` and wait until it answers).
    """

    kind = "server"
    #: the signal that asks the server to stop quickly and cleanly, and the one sent if we die
    stop_signal, death_signal = signal.SIGTERM, signal.SIGKILL
    user: str | None = None

    def __init__(self) -> None:
        self.folder: Path | None = None
        self.process: subprocess.Popen | None = None
        self.port: int | None = None

    def __enter__(self) -> Throwaway:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> Throwaway:
        """Make the temp folder, start the server and wait until it answers; stop it on failure."""
        if self.folder is not None:
            raise LabkitError(f"this {self.kind} was already started: make a new one")
        sweep()
        self.folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-{self.kind}-"))
        atexit.register(self.stop)
        try:
            if self.user:
                ids = pwd.getpwnam(self.user)
                os.chown(self.folder, ids.pw_uid, ids.pw_gid)
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        raise NotImplementedError

    def run(self, *argv, **options) -> subprocess.CompletedProcess:
        """Run a setup command as :attr:`user` to its end; a failure raises ServerFailed."""
        done = subprocess.run(
            [str(a) for a in argv],
            preexec_fn=as_user(self.user),
            cwd=self.folder,
            capture_output=True,
            text=True,
            **options,
        )
        if done.returncode != 0:
            raise ServerFailed(f"{Path(argv[0]).name} failed", (done.stdout + done.stderr)[-2000:])
        return done

    def spawn(self, *argv, log: Path) -> subprocess.Popen:
        """Start the server process as :attr:`user`, its output going to ``log``."""
        with open(log, "ab") as out, held_interrupts():
            self.process = subprocess.Popen(
                [str(a) for a in argv],
                preexec_fn=as_user(self.user, self.death_signal),
                cwd=self.folder,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self.process

    def wait_until(self, ready, what: str, log: Path, seconds: float = 30.0) -> None:
        """Poll ``ready()`` every 10 ms until true; raise ServerFailed if the server exits first."""
        for _ in range(int(seconds * 100)):
            if self.process is not None and self.process.poll() is not None:
                break
            if ready():
                return
            time.sleep(0.01)
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise ServerFailed(f"{self.kind} did not become ready ({what})", tail)

    @property
    def running(self) -> bool:
        """True while the server process is alive."""
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """Stop the server (its stop signal, then SIGKILL after 10 s) and remove its folder."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            try:
                process.send_signal(self.stop_signal)
                reap(process, 10)
            except subprocess.TimeoutExpired:
                kill_tree(process)
            except BaseException:  # an interrupt while waiting: never leave it running
                kill_tree(process)
                raise
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        atexit.unregister(self.stop)
