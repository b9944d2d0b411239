"""The answer's prison: bubblewrap, resource limits and a pids cgroup around the worker.

:class:`Jail` starts :mod:`labkit.grading.worker` under bubblewrap: no network, no capabilities,
nothing of the host but what Python needs (read-only: ``/usr``, a few files of ``/etc``, Python,
the venv, ``labkit/`` without its checks), one small writable ``/tmp``; CPU, memory, file-size
and process limits. Without bubblewrap it runs the worker out of process with the same limits
in a private folder, and says on stderr that it is unsandboxed (a check cell on a student's
laptop); the grader refuses that unless told ``--unsandboxed`` (:func:`missing`).

The process limit (:func:`process_limit`): RLIMIT_NPROC, which root ignores, so as root a pids
cgroup (the v1 controller, or on cgroup v2 a child of our own cgroup when its subtree delegates
``pids``), else a user of its own: bwrap starts the worker through ``setpriv`` as an unused uid,
which RLIMIT_NPROC binds and which owns nothing of the host.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from labkit.engines.servers import kill_tree
from labkit.grading import wire

__all__ = ["Jail", "LIMITS", "bwrap", "sandboxed", "missing", "process_limit"]

WIRE = pathlib.Path(wire.__file__)
WORKER, LABKIT = WIRE.with_name("worker.py"), WIRE.parents[1]
#: per worker: CPU seconds, address space, largest file, open files, processes, /tmp size
LIMITS = {"cpu": 60, "memory": 2 << 30, "file": 16 << 20, "files": 256, "procs": 32}
TMP_BYTES = 64 << 20
PIDS = pathlib.Path("/sys/fs/cgroup/pids")
#: the first of the uids a worker runs as when no pids cgroup can be had as root (one per worker)
UIDS = 3_000_000_000
INSTALL = (
    "install it with `apt-get install bubblewrap` (Debian, Ubuntu) or `dnf install bubblewrap`"
)


def bwrap() -> str | None:
    """The bubblewrap binary, or None (``LABKIT_NO_SANDBOX=1`` pretends it is missing)."""
    return None if os.environ.get("LABKIT_NO_SANDBOX") == "1" else shutil.which("bwrap")


def sandboxed() -> bool:
    """Whether answers run under bubblewrap here."""
    return bwrap() is not None


#: the few files of /etc a Python process reads (the dynamic loader, the time zone, user names)
ETC = ("ld.so.cache", "ld.so.conf", "localtime", "passwd", "group", "nsswitch.conf")


def _argv(tool: str, hide, uid: int | None = None) -> list[str]:
    """bwrap's options. Nothing of the host is there unless named: ``/usr`` (and the links into
    it), a few files of ``/etc``, Python, the venv and ``labkit/`` without its checks, all
    read-only; a 64 MB ``/tmp``; a fresh ``/dev`` and ``/proc``. ``hide`` covers what of the
    named places must not be seen (a submission kept inside the checkout, say)."""
    argv = [tool, "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib32", "lib64", "sbin"):
        if os.path.islink(f"/{name}"):
            argv += ["--symlink", os.readlink(f"/{name}"), f"/{name}"]
        elif os.path.isdir(f"/{name}"):
            argv += ["--ro-bind", f"/{name}", f"/{name}"]
    argv += [
        "--perms",
        "0755",
        "--dir",
        "/etc",
    ]  # bwrap would make it 0700: the worker's uid reads it
    for name in ETC:
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    argv += ["--dev", "/dev", "--proc", "/proc", "--size", str(TMP_BYTES)]
    argv += ["--tmpfs", "/tmp"] if uid is None else ["--perms", "1777", "--tmpfs", "/tmp"]
    argv += ["--perms", "0755", "--dir", "/tmp/.labkit"]  # the worker's uid reads it
    places = {sys.base_prefix, sys.prefix, str(LABKIT)}
    # the folders above them, which bwrap would make 0700: the worker's own uid must pass them
    for above in sorted({str(a) for p in places for a in pathlib.Path(p).parents} - {"/"}, key=len):
        argv += ["--perms", "0755", "--dir", above]
    for place in sorted(places, key=len):
        argv += ["--ro-bind", place, place]
    shown = (sys.base_prefix, sys.prefix, str(LABKIT))
    for place in sorted({str(pathlib.Path(p).resolve()) for p in hide}):
        if any(place == s or place.startswith(s + "/") for s in shown) and os.path.isdir(place):
            argv += ["--tmpfs", place, "--remount-ro", place]
    argv += ["--tmpfs", str(LABKIT / "grading"), "--ro-bind", str(WORKER), "/tmp/.labkit/worker.py"]
    argv += ["--ro-bind", str(WIRE), "/tmp/.labkit/wire.py"]
    for name in ("alone.py", "channel.py"):
        argv += ["--ro-bind", str(WIRE.with_name(name)), f"/tmp/.labkit/{name}"]
    for place in (str(LABKIT / "grading"), "/dev", "/"):  # no tmpfs but /tmp can be written
        argv += ["--remount-ro", place]
    if uid is None:
        argv += ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    else:  # no user namespace (it would map root alone): setpriv drops to ``uid`` and every cap
        argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        argv += ["--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    argv += ["--chdir", "/tmp", "--setenv", "HOME", "/tmp"]
    drop = [] if uid is None else [shutil.which("setpriv"), f"--reuid={uid}", f"--regid={uid}"]
    drop += ["--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--"] if drop else []
    return argv + drop + [os.path.abspath(sys.executable), "-I", "/tmp/.labkit/worker.py"]


def _pids_root() -> pathlib.Path | None:
    """Where pids cgroups are made: the v1 controller's mount, or a cgroup2 mount whose
    ``cgroup.subtree_control`` delegates ``pids`` to its children (v2 keeps processes out of a
    cgroup that delegates, so a mount's top, the whole tree or a subtree given to the grader)."""
    if (PIDS / "cgroup.procs").is_file():
        return PIDS
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            if "-" in fields and fields[fields.index("-") + 1] == "cgroup2":
                with contextlib.suppress(OSError):  # covered by another mount, say
                    top = pathlib.Path(fields[4])
                    if "pids" in (top / "cgroup.subtree_control").read_text().split():
                        return top
    return None


def _pids_group() -> pathlib.Path | None:
    """A pids cgroup for one worker (as root RLIMIT_NPROC is ignored), or None if none can be made.
    Groups left by a judge that died are emptied and removed first."""
    root = _pids_root()
    if root is None:
        return None
    for group in root.glob("labkit-judge-*"):
        if not os.path.exists(f"/proc/{group.name.split('-')[2]}"):
            _remove(group)
    with contextlib.suppress(OSError):
        group = root / f"labkit-judge-{os.getpid()}-{id(object())}"
        group.mkdir()
        (group / "pids.max").write_text(str(LIMITS["procs"]))
        return group
    return None


def _remove(group: pathlib.Path) -> None:
    """Kill what is left in a pids cgroup, wait until it is empty, and remove it."""
    for _ in range(200):
        with contextlib.suppress(OSError, ValueError):
            pids = (group / "cgroup.procs").read_text().split()
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(int(pid), 9)
            if not pids:
                group.rmdir()
                return
        if not group.exists():
            return
        time.sleep(0.01)


def process_limit(group: pathlib.Path | None = None) -> str | None:
    """How a worker's processes are limited here: "cgroup" (``group``), "rlimit" (not root),
    "uid" (root, bubblewrap and setpriv: a user of its own), or None: no limit can be had."""
    if group is not None:
        return "cgroup"
    if os.getuid() != 0:
        return "rlimit"
    return "uid" if bwrap() and shutil.which("setpriv") else None


def _works(tool: str, uid: int | None) -> str | None:
    """Why bubblewrap cannot start a sandbox here (no user namespaces, say), or None."""
    argv = [*_argv(tool, (), uid)[:-2], "-c", "pass"]  # its Python, which runs nothing
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


def _runs_as() -> int | None:
    """The uid a sandboxed worker runs as, when the grader is root: a user of its own (through
    ``setpriv``), which RLIMIT_NPROC binds where no cgroup limits processes, and which each
    worker's process can map into a user namespace of its own (its own /tmp and pids); None:
    the grader's own (not root, or no setpriv)."""
    return _uid() if os.getuid() == 0 and shutil.which("setpriv") else None


def missing() -> list[str]:
    """What the grader lacks to run answers sandboxed, in words ([] if nothing): bubblewrap,
    a bubblewrap that works here, a process limit."""
    tool = bwrap()
    if tool is None:
        return [f"bubblewrap (bwrap) is not on PATH: {INSTALL}"]
    group = _pids_group()
    kind = process_limit(group)
    if group is not None:
        _remove(group)
    if kind is None:
        return [
            "no process limit: no pids cgroup (v1, or v2 delegated) and no setpriv to run "
            "answers as a user of their own (`apt-get install util-linux`)"
        ]
    why = _works(tool, _runs_as())
    return [f"bubblewrap cannot start a sandbox here: {why}"] if why else []


_SERIAL = iter(range(1 << 30))


def _uid() -> int:
    """A uid no other live worker has: one per judge process and worker."""
    return UIDS + (os.getpid() << 4) + next(_SERIAL) % 16


def _limits(group: pathlib.Path | None):
    def preexec() -> None:
        cpu, memory = LIMITS["cpu"], LIMITS["memory"]
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMITS["file"], LIMITS["file"]))
        resource.setrlimit(resource.RLIMIT_NOFILE, (LIMITS["files"], LIMITS["files"]))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if group is not None:
            (group / "cgroup.procs").write_text(str(os.getpid()))
        else:  # binds any user but root: the worker runs as one (see process_limit)
            resource.setrlimit(resource.RLIMIT_NPROC, (LIMITS["procs"], LIMITS["procs"]))

    return preexec


def _both(preexec, fds: dict):
    def run() -> None:
        high = {os.dup(source): target for source, target in fds.items()}  # 3 or 4 may be taken
        for source, target in high.items():
            os.dup2(source, target)
        preexec()

    return run


class Jail:
    """The worker process; ``rfd``/``wfd`` are the judge's ends of its channel, ``door`` the
    socket on which the judge passes it each schedule's channels (the worker's fd 5)."""

    def __init__(self, *, hide=(), warn=None) -> None:
        self.group, self.folder = _pids_group(), None
        tool, self.limit = bwrap(), process_limit(self.group)
        uid = _runs_as() if tool else None
        if self.limit is None:  # root, no pids cgroup, no bubblewrap: RLIMIT_NPROC does not bind
            print("labkit.grading: answers have no process limit", file=warn or sys.stderr)
        self.rfd, wj = os.pipe()  # worker -> judge
        rw, self.wfd = os.pipe()  # judge -> worker
        self.door, door = socket.socketpair()
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "MPLBACKEND": "Agg", "HOME": "/tmp"}
        env["OPENBLAS_NUM_THREADS"] = "1"
        if tool:
            argv, cwd = _argv(tool, hide, uid), "/"
        else:
            print(
                "labkit.grading: bubblewrap is missing: answers run UNSANDBOXED",
                file=warn or sys.stderr,
            )
            self.folder = tempfile.mkdtemp(prefix="labkit-answer-")
            argv, cwd = [sys.executable, "-I", str(WORKER)], self.folder
        self.process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(3, 4, 5),
            preexec_fn=_both(_limits(self.group), {rw: 3, wj: 4, door.fileno(): 5}),
        )
        os.close(rw), os.close(wj), door.close()

    def close(self) -> None:
        """Stop the worker and everything it started; remove its cgroup and folder."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=1)
        kill_tree(self.process)
        if self.group is not None:
            _remove(self.group)
        for fd in (self.rfd, self.wfd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.door.close()
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
