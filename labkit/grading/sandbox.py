"""The answer's prison: bubblewrap, resource limits and a pids cgroup around the worker.

:class:`Jail` starts :mod:`labkit.grading.worker` under bubblewrap: no network, no capabilities,
nothing of the host but what Python needs (read-only: ``/usr``, a few files of ``/etc``, Python,
the venv, ``labkit/`` without its checks), one small writable ``/tmp``; CPU, memory, file-size
and process limits. Without bubblewrap it runs
the worker out of process with the same limits in a private folder, and says on stderr that it
is unsandboxed. As root RLIMIT_NPROC is ignored, so processes are limited by a pids cgroup.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from labkit.engines.servers import kill_tree
from labkit.grading import wire

__all__ = ["Jail", "LIMITS", "bwrap", "sandboxed"]

WIRE = pathlib.Path(wire.__file__)
WORKER, LABKIT = WIRE.with_name("worker.py"), WIRE.parents[1]
#: per worker: CPU seconds, address space, largest file, open files, processes, /tmp size
LIMITS = {"cpu": 60, "memory": 2 << 30, "file": 16 << 20, "files": 256, "procs": 32}
TMP_BYTES = 64 << 20
PIDS = pathlib.Path("/sys/fs/cgroup/pids")


def bwrap() -> str | None:
    """The bubblewrap binary, or None (``LABKIT_NO_SANDBOX=1`` pretends it is missing)."""
    return None if os.environ.get("LABKIT_NO_SANDBOX") == "1" else shutil.which("bwrap")


def sandboxed() -> bool:
    """Whether answers run under bubblewrap here."""
    return bwrap() is not None


#: the few files of /etc a Python process reads (the dynamic loader, the time zone, user names)
ETC = ("ld.so.cache", "ld.so.conf", "localtime", "passwd", "group", "nsswitch.conf")


def _argv(tool: str, hide) -> list[str]:
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
    for name in ETC:
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    argv += ["--dev", "/dev", "--proc", "/proc", "--size", str(TMP_BYTES), "--tmpfs", "/tmp"]
    for place in sorted({sys.base_prefix, sys.prefix, str(LABKIT)}, key=len):
        argv += ["--ro-bind", place, place]
    shown = (sys.base_prefix, sys.prefix, str(LABKIT))
    for place in sorted({str(pathlib.Path(p).resolve()) for p in hide}):
        if any(place == s or place.startswith(s + "/") for s in shown) and os.path.isdir(place):
            argv += ["--tmpfs", place, "--remount-ro", place]
    argv += ["--tmpfs", str(LABKIT / "grading"), "--ro-bind", str(WORKER), "/tmp/.labkit/worker.py"]
    argv += ["--ro-bind", str(WIRE), "/tmp/.labkit/wire.py"]
    for place in (str(LABKIT / "grading"), "/dev", "/"):  # no tmpfs but /tmp can be written
        argv += ["--remount-ro", place]
    argv += ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    argv += ["--chdir", "/tmp", "--setenv", "HOME", "/tmp"]
    return argv + [os.path.abspath(sys.executable), "-I", "/tmp/.labkit/worker.py"]


def _pids_group() -> pathlib.Path | None:
    """A pids cgroup for one worker (as root RLIMIT_NPROC is ignored), or None if none can be made.
    Groups left by a judge that died are emptied and removed first."""
    for group in PIDS.glob("labkit-judge-*"):
        if not os.path.exists(f"/proc/{group.name.split('-')[2]}"):
            _remove(group)
    with contextlib.suppress(OSError):
        group = PIDS / f"labkit-judge-{os.getpid()}-{id(object())}"
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
        elif os.getuid() != 0:
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
    """The worker process; ``rfd``/``wfd`` are the judge's ends of its channel."""

    def __init__(self, *, hide=(), warn=None) -> None:
        self.group, self.folder = _pids_group(), None
        if self.group is None and os.getuid() == 0:  # RLIMIT_NPROC does not bind root
            print(
                "labkit.grading: no pids cgroup: answers have no process limit",
                file=warn or sys.stderr,
            )
        self.rfd, wj = os.pipe()  # worker -> judge
        rw, self.wfd = os.pipe()  # judge -> worker
        tool = bwrap()
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "MPLBACKEND": "Agg", "HOME": "/tmp"}
        env["OPENBLAS_NUM_THREADS"] = "1"
        if tool:
            argv, cwd = _argv(tool, hide), "/"
        else:
            print(
                "labkit.grading: bubblewrap is missing: answers run UNSANDBOXED",
                file=warn or sys.stderr,
            )
            self.folder = tempfile.mkdtemp(prefix="labkit-answer-")
            argv, cwd = [sys.executable, "-I", str(WORKER)], self.folder
        self.process = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, pass_fds=(3, 4),
            preexec_fn=_both(_limits(self.group), {rw: 3, wj: 4}),
        )  # fmt: skip
        os.close(rw), os.close(wj)

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
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
