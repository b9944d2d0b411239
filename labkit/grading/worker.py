"""The answer's side of grading: a small harness that runs in the sandbox and holds no check.

The judge (:mod:`labkit.grading.judge`) starts ``python worker.py`` inside bubblewrap and talks
to it over fds 3 (in) and 4 (out) with :mod:`labkit.grading.wire`. The worker runs the
notebook's cells. Then, for each worker of a schedule (A, its rival B, a successor), it forks
a process of its own from the notebook's state: the judge passes that process's channel (one
end of a socket pair) over fd 5, and the process closes fds 3-5, so it speaks only on its own
channel and shares nothing with the others but the database. A crash is a real SIGKILL.
Every object the judge hands the answer stays in the judge: the answer gets a proxy, and each
use of it (an SQL statement, a clock read, a callback, an RNG draw) is a request.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import shutil
import signal
import socket
import sqlite3
import sys

if __package__:
    from labkit.grading.wire import Channel, Peer, Remote, describe, find_class
else:  # run as a script in the sandbox, beside wire.py
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import wire
    from wire import Channel, Peer, Remote, describe, find_class


class _Worker(Peer):
    """The answer's process: the notebook's namespace, proxies of the judge's objects."""

    def __init__(self, channel: Channel) -> None:
        super().__init__(channel)
        self.ns, self.methods = {"__name__": "__main__"}, {}

    def proxy(self, tagged):
        if tagged[2] == "conn":
            return _connection(self, tagged[1])
        if tagged[2] == "db":
            import sqlite_utils

            conn = self.resolve(["H", tagged[3], "conn"])
            return sqlite_utils.Database(conn, recursive_triggers=False)
        if len(tagged) != 6:
            return Remote(self, tagged[1])
        if isinstance(tagged[5], list):  # the judge names a class's methods once
            self.methods[tuple(tagged[3:5])] = frozenset(tagged[5])
        cls = find_class(*tagged[3:5])
        methods = self.methods.get(tuple(tagged[3:5]), frozenset())
        return Remote(self, tagged[1], cls if isinstance(cls, type) else None, methods)

    def run_cell(self, source: str, number: int) -> str | None:
        me = os.getpid()
        try:
            exec(compile(source, f"<cell {number}>", "exec"), self.ns)
        except BaseException as exc:  # a cell's error is the notebook's, as in a kernel
            return f"{type(exc).__name__}: {exc}"[:500]
        finally:
            if os.getpid() != me:  # a copy the cell forked: it must not read the channel
                os._exit(0)
            _reap()
        return None

    def main(self) -> None:
        door, workers = socket.socket(fileno=5), {}  # the schedule's processes, by number
        self.alone = _isolation_works()
        while True:
            message = self.channel.recv()
            op = message["op"]
            if op == "cell":
                error = self.run_cell(message["source"], message["number"])
                self.channel.send({"op": "ran", "error": error})
            elif op == "fork":
                _, (fd,), _, _ = socket.recv_fds(door, 1, 1)
                workers[message["worker"]] = self.fork(fd, message.get("seed"))
            elif op == "kill":  # a crash: the process dies at once, whatever it was doing
                _kill(workers.pop(message["worker"]))
                self.channel.send({"op": "killed"})
            elif op == "end":  # the schedule is over: its processes go
                for pid in workers.values():
                    _kill(pid)
                workers.clear()
                self.channel.send({"op": "done"})
            elif op == "quit":
                return

    def fork(self, fd: int, seed) -> int:
        """A process for one worker of a schedule, speaking on ``fd`` only, its ``random``
        seeded with ``seed`` (the schedule's and the worker's)."""
        pid = os.fork()
        if pid:
            os.close(fd)  # a later worker must not inherit this one's channel
            return pid
        try:
            for mine in (3, 4, 5):
                os.close(mine)
            if self.alone and _alone():  # the new numbering's parent: it lives as long as its
                inner = os.fork()  # child (pid 1), which dies with it (the judge's kill)
                if inner:
                    os.close(fd)
                    os.waitpid(inner, 0)
                    os._exit(0)
                _LIBC.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
                _powerless()
            random.seed(seed)
            self.channel = Channel(fd, fd)
            while (message := self.channel.recv())["op"] in ("answer", "req"):
                if message["op"] == "req":
                    self.serve(message)
                    continue
                found = self.ns.get(message["name"])
                value = self.out(found) if callable(found) else None
                self.channel.send({"op": "answer", "value": value})
        finally:
            os._exit(0)


_LIBC = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x20000, 0x10000000, 0x20000000
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, MS_BIND_REC = 1, 24, 4096 | 16384


def _alone() -> bool:
    """Give this worker's process a world of its own, so that no schedule can be counted or told
    apart from inside: user, pid and mount namespaces (its child is pid 1 in its own numbering),
    a fresh /tmp holding what the cells left there, and nothing in /proc or /dev/shm. False
    where no user namespace can be had (as root: mapping uid 0 takes a capability the sandbox
    dropped). Hand-written on ctypes: Python 3.11 has no os.unshare and no mount."""
    uid, gid = os.geteuid(), os.getegid()
    if uid == 0 or _LIBC.unshare(CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS) != 0:
        return False
    for name, line in (
        ("setgroups", "deny"),
        ("uid_map", f"{uid} {uid} 1"),
        ("gid_map", f"{gid} {gid} 1"),
    ):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(line)
    _own_tmp()
    for place in ("/proc", "/dev/shm"):
        if os.path.isdir(place):
            _mount(place, "size=4k,mode=555")
    return True


def _own_tmp() -> None:
    """A fresh /tmp with what the cells left there, and the sandbox's read-only places under
    /tmp (a checkout kept there) bound again as they were."""
    kept, size = os.open("/tmp", os.O_RDONLY | os.O_DIRECTORY), os.statvfs("/tmp")
    old = f"/proc/self/fd/{kept}"
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    bound = {p.split("/")[2] for p in points if p.startswith("/tmp/")}
    _mount("/tmp", f"size={size.f_blocks * size.f_frsize},mode=1777")
    skip = lambda folder, _: bound if folder == old else ()  # noqa: E731
    shutil.copytree(old, "/tmp", symlinks=True, dirs_exist_ok=True, ignore=skip)
    for name in bound:
        if os.path.isdir(f"{old}/{name}"):
            os.mkdir(f"/tmp/{name}")
        else:
            open(f"/tmp/{name}", "x").close()
        if _LIBC.mount(f"{old}/{name}".encode(), f"/tmp/{name}".encode(), None, MS_BIND_REC, None):
            raise OSError(ctypes.get_errno(), f"bind /tmp/{name} again")
    os.close(kept)


def _isolation_works() -> bool:
    """Whether a worker's process can have a world of its own here, tried once in a throwaway
    child before any cell runs. Where the kernel grants user namespaces but not their mounts
    (some distributions' AppArmor), workers are plain forked processes instead."""
    pid = os.fork()
    if pid == 0:
        try:
            works = _alone() and os.waitpid(_fork(_powerless), 0)[1] == 0
        except BaseException:  # noqa: BLE001 -- any failure means: not here
            works = False
        os._exit(0 if works else 1)
    return os.waitpid(pid, 0)[1] == 0


def _fork(then) -> int:
    """Fork a child that runs ``then()`` and exits (0 unless it raised)."""
    pid = os.fork()
    if pid == 0:
        try:
            then()
        except BaseException:  # noqa: BLE001 -- the exit status says it
            os._exit(1)
        os._exit(0)
    return pid


def _powerless() -> None:
    """Drop every capability the new user namespace gave (the bounding set too), so that the
    answer cannot undo its world: no unmounting /tmp or /proc's cover, no mounts of its own."""
    for cap in range(64):
        if _LIBC.prctl(PR_CAPBSET_DROP, cap) != 0:
            break  # past the last capability this kernel knows
    header, nothing = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()
    if _LIBC.capset(header, nothing) != 0:
        raise OSError(ctypes.get_errno(), "drop the capabilities")


def _mount(place: str, options: str) -> None:
    if _LIBC.mount(b"tmpfs", place.encode(), b"tmpfs", 0, options.encode()) != 0:
        raise OSError(ctypes.get_errno(), f"mount a tmpfs on {place}")


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


class ProxyConnection(sqlite3.Connection):
    """A ``sqlite3.Connection`` (for isinstance and sqlite-utils) whose statements run in the
    judge. Its own database is an empty ``:memory:`` one: what bypasses the proxy lands nowhere."""

    def _ask(self, what: str, *args):
        return self._labkit_peer.request(self._labkit_id, what, *args)

    def cursor(self, factory=None):
        return ProxyCursor(self)

    def execute(self, sql, parameters=()):
        return ProxyCursor(self).execute(sql, parameters)

    def executemany(self, sql, seq):
        return ProxyCursor(self).executemany(sql, seq)

    def executescript(self, script):
        return ProxyCursor(self).executescript(script)

    def commit(self):
        self._ask("commit")

    def rollback(self):
        self._ask("rollback")

    def close(self):
        self._ask("close")

    def __enter__(self):
        self._ask("enter")
        return self

    def __exit__(self, kind, exc, tb):
        return self._ask("exit", None if exc is None else describe(exc))

    @property
    def in_transaction(self):
        return self._ask("getattr", "in_transaction")

    @property
    def total_changes(self):
        return self._ask("getattr", "total_changes")

    @property
    def isolation_level(self):
        return self._ask("getattr", "isolation_level")

    @isolation_level.setter
    def isolation_level(self, value):
        self._ask("setattr", "isolation_level", value)


def _reap() -> None:
    """Collect the children a cell left (they would count against the process limit)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _connection(peer: Peer, ident) -> ProxyConnection:
    conn = sqlite3.connect(":memory:", factory=ProxyConnection, check_same_thread=False)
    conn._labkit_peer, conn._labkit_id = peer, ident
    return conn


class ProxyCursor:
    """A cursor whose statement ran in the judge, every row fetched there at once."""

    arraysize = 1

    def __init__(self, connection: ProxyConnection) -> None:
        self.connection, self.rows = connection, []
        self.rowcount, self.lastrowid, self.description = -1, None, None

    def _run(self, what: str, *args) -> ProxyCursor:
        got = self.connection._ask(what, *args)
        self.rows = list(got["rows"])
        self.rowcount, self.lastrowid = got["rowcount"], got["lastrowid"]
        names = got["description"]
        self.description = None if names is None else tuple((n,) + (None,) * 6 for n in names)
        return self

    def execute(self, sql, parameters=()):
        return self._run("execute", sql, parameters)

    def executemany(self, sql, seq):
        return self._run("executemany", sql, [p for p in seq])

    def executescript(self, script):
        return self._run("executescript", script)

    def fetchone(self):
        return self.rows.pop(0) if self.rows else None

    def fetchmany(self, size=None):
        size = self.arraysize if size is None else size
        out, self.rows = self.rows[:size], self.rows[size:]
        return out

    def fetchall(self):
        out, self.rows = self.rows, []
        return out

    def __iter__(self):
        return self

    def __next__(self):
        if not self.rows:
            raise StopIteration
        return self.rows.pop(0)

    def close(self):
        self.rows = []


if __name__ == "__main__":
    wire.SANDBOX = True
    try:  # sqlite-utils looks for its plugins once here, not in each schedule's child (20-200 ms)
        from sqlite_utils.plugins import ensure_plugins_loaded
    except ImportError:  # a Python without sqlite-utils: the answer is lent no Database
        pass
    else:
        ensure_plugins_loaded()

    _Worker(Channel(3, 4)).main()
