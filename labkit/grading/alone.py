"""A worker's world of its own: what each of a schedule's processes is given in the sandbox.

:mod:`labkit.grading.worker` forks a process per worker of a schedule from the notebook's state.
Before it serves the judge, that process keeps only its own channel (closing every other
descriptor), makes every shared mapping a private copy, and enters user, pid, mount, IPC and
network namespaces of its own: its child is pid 1 there, with a fresh /tmp (what the cells left,
the sandbox's read-only places bound again), an empty /proc and /dev/shm, and no capability. So
workers share only the database, and no schedule can be counted from inside.

Hand-written on ctypes: Python 3.11 has no ``os.unshare`` and no mount, and no library for
them would be in the sandbox. Like :mod:`labkit.grading.wire`, this module imports nothing of
labkit's: the sandbox sees it and no check.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import os
import shutil
import signal
import stat
import sys

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.mmap.restype, LIBC.mmap.argtypes = (
    ctypes.c_void_p,
    [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_long],
)
NAMESPACES = 0x20000 | 0x10000000 | 0x20000000 | 0x8000000 | 0x40000000  # mount user pid ipc net
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, MS_BIND_REC = 1, 24, 4096 | 16384
PRIVATE_FIXED = 0x02 | 0x20 | 0x10  # MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED
RAW = ctypes.PyDLL(None, use_errno=True)  # libc's fork and kill, with the GIL held (as os's)
RAW.kill.argtypes = [ctypes.c_int, ctypes.c_int]


def sqlite_utils():
    """sqlite-utils without numpy (unless loaded already): it maps numpy's scalars, which no
    trial inserts, and would cost each judge and worker 0.1 s and OpenBLAS's spinning threads."""
    if "numpy" in sys.modules:
        return importlib.import_module("sqlite_utils")
    sys.modules["numpy"] = None  # an import of it raises ImportError, as where it is missing
    try:
        return importlib.import_module("sqlite_utils")
    finally:
        if sys.modules.get("numpy", False) is None:
            del sys.modules["numpy"]


class Hooks:
    """The interpreter's pointers to the hooks a cell may add that would run in a forked worker
    before its world is its own: its three at-fork hook lists (before, after in the parent,
    after in the child) and its audit hooks. :meth:`mute` empties them, :meth:`unmute` puts
    back what it emptied. Python 3.11 gives no way to them, so they are looked for in the
    interpreter's state before any cell runs (:meth:`find`): the at-fork lists by three
    sentinel hooks, the audit list as the one pointer that a first audit hook sets."""

    def __init__(self, forks, child: list, audit) -> None:
        self.forks, self.child, self.audit, self.saved = forks, child, audit, None

    @classmethod
    def find(cls) -> Hooks | None:
        marks = (lambda: None, lambda: None, lambda: None)
        os.register_at_fork(before=marks[0], after_in_parent=marks[1], after_in_child=marks[2])
        lists = [next(r for r in gc.get_referrers(m) if type(r) is list) for m in marks]
        get = ctypes.pythonapi.PyInterpreterState_Get
        get.restype = ctypes.c_void_p
        base, word, size = get(), ctypes.sizeof(ctypes.c_void_p), 1024  # 3.11.7: words 435 and 444
        words, want = (ctypes.c_void_p * size).from_address(base), [id(x) for x in lists]
        at = next((i for i in range(size - 2) if words[i : i + 3] == want), None)
        before, mark = words[:], lambda event, args: None
        sys.addaudithook(mark)  # the first: it makes the audit list (a list, with ``mark`` in it)
        made = [i for i in range(size) if before[i] is None and words[i] is not None]
        made = [i for i in made if _is_list_of(words[i], mark)]
        if at is None or len(made) != 1:
            return None
        forks = (ctypes.c_void_p * 3).from_address(base + at * word)
        return cls(forks, lists[2], (ctypes.c_void_p * 1).from_address(base + made[0] * word))

    def mute(self) -> None:
        self.saved = (self.forks[:], self.audit[:])
        self.forks[:], self.audit[:] = (None, None, None), (None,)

    def unmute(self) -> None:
        self.forks[:], self.audit[:] = self.saved


def _is_list_of(address: int, item) -> bool:
    """Whether the object at ``address`` (a pointer the interpreter just set) is a list holding
    ``item``: its type is read first, so only a list is taken for one."""
    if (ctypes.c_void_p * 2).from_address(address)[1] != id(list):
        return False
    return item in ctypes.cast(address, ctypes.py_object).value


def fork(hooks, *, _fork=RAW.fork, _child=ctypes.pythonapi.PyOS_AfterFork_Child) -> int:
    """``os.fork`` without the at-fork hooks and the audit event, which a cell could count
    workers with: ``hooks`` (:class:`Hooks`) are muted around the fork, and in the child stay
    muted until :func:`settle`, once its world is its own; it gets Python's setting up."""
    if hooks:
        hooks.mute()
    pid = _fork()
    if pid == 0:
        _child()
        return 0
    if hooks:
        hooks.unmute()
    if pid < 0:
        raise OSError(ctypes.get_errno(), "fork a worker")
    return pid


def settle(hooks, *, _gc=gc) -> None:
    """What a forked worker does once its world is its own: the hooks back, gc on from zeroed
    counts (its callbacks may be a cell's), then the child's at-fork hooks, the cells' and the
    standard library's (threading's, random's), as after ``os.fork``."""
    if hooks:
        hooks.unmute()
    _gc.collect(0)  # the youngest generation: a full one walks the whole heap (20 ms)
    _gc.enable()  # the root stills it between cells; every worker starts from the same counts
    for hook in list(hooks.child) if hooks else ():
        with contextlib.suppress(Exception):  # as after os.fork: a hook's error is ignored
            hook()


def kill(pid: int, *, _kill=RAW.kill, _wait=os.waitpid, _quiet=contextlib.suppress) -> None:
    """SIGKILL ``pid`` (libc's kill: no audit event) and reap it (what it calls taken early)."""
    if _kill(pid, 9) == 0:  # SIGKILL
        with _quiet(ChildProcessError):
            _wait(pid, 0)


def keep_only(fd: int) -> None:
    """Close every file descriptor but ``fd``: the root's channel and door, and whatever the
    cells left open (a pipe, a socket, a file), which would join the workers."""
    os.closerange(3, fd)  # 0-2 are /dev/null: the answer may print
    os.closerange(fd + 1, os.sysconf("SC_OPEN_MAX"))


def private_memory() -> None:
    """Make each shared mapping (``mmap``, ``multiprocessing.Value``, a WAL's -shm; read-only
    ones too, which ``mprotect`` could make writable) a private, writable copy of it."""
    with open("/proc/self/maps") as f:
        spans = [(span, perms) for span, perms, *_ in map(str.split, f) if perms[3] == "s"]
    for span, perms in spans:
        start, end = (int(x, 16) for x in span.split("-"))
        data = ctypes.string_at(start, end - start) if perms[0] == "r" else b""
        prot = 3 | (perms[2] == "x") << 2  # readable and writable, so that it can be filled
        if LIBC.mmap(start, end - start, prot, PRIVATE_FIXED, -1, 0) != start:
            raise OSError(ctypes.get_errno(), "make a shared mapping private")
        ctypes.memmove(start, data, len(data))


def alone() -> bool:
    """Enter namespaces of its own, map its uid, and give it its /tmp, /proc and /dev/shm;
    False where no user namespace can be had (as root: mapping uid 0 takes a capability the
    sandbox dropped). Its next child is pid 1 of the new numbering."""
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0 or LIBC.unshare(NAMESPACES) != 0:
        return False
    maps = (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1"))
    for name, line in maps:
        with open(f"/proc/self/{name}", "w") as f:
            f.write(line)
    _own_tmp()
    for place in ("/proc", "/dev/shm"):
        if os.path.isdir(place):
            _mount(place, "size=4k,mode=555")
    return True


def _own_tmp() -> None:
    """A fresh /tmp with what the cells left there (plain files, folders and links), and each
    of the sandbox's read-only places under /tmp (a checkout kept there) bound again; the
    working folder is then the new one of its name (the old one, in the root's /tmp, is shared)."""
    kept, size = os.open("/tmp", os.O_RDONLY | os.O_DIRECTORY), os.statvfs("/tmp")
    try:
        here = os.getcwd()
    except OSError:  # a cell removed it
        here = "/tmp"
    old = f"/proc/self/fd/{kept}"
    with open("/proc/self/mountinfo") as f:
        points = {line.split()[4] for line in f} - {"/tmp"}
    under = sorted(p for p in points if p.startswith("/tmp/"))
    bound = [p for p in under if not any(p.startswith(q + "/") for q in under)]

    def skip(folder: str, names: list) -> list:
        here = "/tmp" + folder[len(old) :]
        kinds = {n: os.lstat(f"{folder}/{n}").st_mode for n in names}
        plain = (stat.S_ISREG, stat.S_ISDIR, stat.S_ISLNK)
        return [
            n for n, m in kinds.items() if f"{here}/{n}" in points or not any(k(m) for k in plain)
        ]

    _mount("/tmp", f"size={size.f_blocks * size.f_frsize},mode=1777")
    shutil.copytree(old, "/tmp", symlinks=True, dirs_exist_ok=True, ignore=skip)
    for place in bound:
        source = old + place[len("/tmp") :]
        os.makedirs(os.path.dirname(place), exist_ok=True)
        os.mkdir(place) if os.path.isdir(source) else open(place, "x").close()
        if LIBC.mount(source.encode(), place.encode(), None, MS_BIND_REC, None) != 0:
            raise OSError(ctypes.get_errno(), f"bind {place} again")
    os.close(kept)
    os.chdir(here if os.path.isdir(here) else "/tmp")  # by name: the new one where it is /tmp's


def powerless() -> None:
    """Drop every capability the new user namespace gave (the bounding set too), so that the
    answer cannot undo its world: no unmounting /tmp or /proc's cover, no mounts of its own."""
    LIBC.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))  # and it dies with its parent
    for cap in range(64):
        if LIBC.prctl(PR_CAPBSET_DROP, cap) != 0:
            break  # past the last capability this kernel knows
    header, nothing = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
    if LIBC.capset(header, nothing) != 0:
        raise OSError(ctypes.get_errno(), "drop the capabilities")


def works() -> bool:
    """Whether a worker's process can have a world of its own here, tried once in a throwaway
    child before any cell runs. Where the kernel grants user namespaces but not their mounts
    (some distributions' AppArmor), workers are plain forked processes instead."""
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if alone() and powerless() is None else 1)
        except BaseException:  # noqa: BLE001 -- any failure means: not here
            os._exit(1)
    return os.waitpid(pid, 0)[1] == 0


def _mount(place: str, options: str) -> None:
    if LIBC.mount(b"tmpfs", place.encode(), b"tmpfs", 0, options.encode()) != 0:
        raise OSError(ctypes.get_errno(), f"mount a tmpfs on {place}")
