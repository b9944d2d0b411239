"""The answer's side of grading: a small harness that runs in the sandbox and holds no check.

The judge (:mod:`labkit.grading.judge`) starts ``python worker.py`` inside bubblewrap and talks
to it over fds 3 (in) and 4 (out) with :mod:`labkit.grading.wire`. The worker runs the
notebook's cells. Then, for each worker of a schedule (A, its rival B, a successor), it forks
a process of its own from the notebook's state: the judge passes that process's channel (one
end of a socket pair) over fd 5. That process keeps no other descriptor and no shared memory,
and has namespaces of its own (:mod:`labkit.grading.alone`), so it speaks only on its own
channel and shares nothing with the others but the database. A crash is a real SIGKILL.
Every object the judge hands the answer stays in the judge: the answer gets a proxy, and each
use of it (an SQL statement, a clock read, a callback, an RNG draw) is a request.
"""

from __future__ import annotations

import gc
import os
import random
import socket
import sqlite3
import sys

if __package__:
    from labkit.grading import alone
    from labkit.grading.wire import Channel, Peer, Remote, describe, find_class
else:  # run as a script in the sandbox, beside wire.py and alone.py
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import alone
    import wire
    from wire import Channel, Peer, Remote, describe, find_class


class _Worker(Peer):
    """The answer's process: the notebook's namespace, proxies of the judge's objects."""

    def __init__(self, channel: Channel) -> None:
        super().__init__(channel)
        self.ns, self.methods = {"__name__": "__main__"}, {}

    def wait(self) -> dict:
        """The next message; what it says of the lent connections' transactions is kept."""
        message = self.channel.recv()
        for ident, state in message.get("txn", ()):
            if isinstance(conn := self.theirs.get(ident), ProxyConnection):
                conn._labkit_txn = state
        return message

    def proxy(self, tagged):
        if tagged[2] == "conn":
            return _connection(self, tagged[1], tagged[3])
        if tagged[2] == "db":
            import sqlite_utils

            conn = self.resolve(tagged[3])
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
        # what forks and kills the workers, taken before any cell runs (a cell may rebind names)
        door, workers, fork, kill = socket.socket(fileno=5), {}, alone.fork, alone.kill
        self.alone, recv_fds, close = alone.works(), socket.recv_fds, os.close
        self.hooks, self.settle = alone.Hooks.find(), alone.settle
        stir, still, untraced = gc.enable, gc.disable, (sys.setprofile, sys.settrace)
        while True:
            message = self.channel.recv()
            op = message["op"]
            if op == "cell":
                stir()  # a cell runs as in a kernel, its cycles collected
                error = self.run_cell(message["source"], message["number"])
                self.channel.send({"op": "ran", "error": error})
                still()  # no collection in the root moves the gc's counts between workers
                for off in untraced:  # no profiler or tracer of a cell's sees the forks
                    off(None)
            elif op == "fork":
                _, (fd,), _, _ = recv_fds(door, 1, 1)
                pid = fork(self.hooks)
                if pid == 0:  # out of these frames: nothing of the root's is left to read
                    raise _Child(fd, message.get("seed"))
                close(fd)  # a later worker must not inherit this one's channel
                workers[message["worker"]] = pid
            elif op == "kill":  # a crash: the process dies at once, whatever it was doing
                if pid := workers.pop(message["worker"], None):  # once, if ever
                    kill(pid)
                self.channel.send({"op": "killed"})
            elif op == "end":  # the schedule is over: its processes go
                for pid in workers.values():
                    kill(pid)
                workers.clear()
                self.channel.send({"op": "done"})
            elif op == "quit":  # at once: no finalizing of the cells' modules, no atexit of theirs
                os._exit(0)

    def child(self, fd: int, seed) -> None:
        """Serve the judge as one worker of a schedule, on ``fd`` only, in a world of its own
        (:mod:`labkit.grading.alone`), its ``random`` seeded with ``seed``."""
        try:
            alone.keep_only(fd)
            alone.private_memory()
            if self.alone and alone.alone():  # the new numbering's parent: it lives as long
                if inner := os.fork():  # as its child (pid 1), which dies with it (the kill)
                    os.waitpid(inner, 0)
                    os._exit(0)
                alone.powerless()
            self.settle(self.hooks)  # the cells' at-fork hooks and gc callbacks run from here
            random.seed(seed)
            del seed
            self.channel = Channel(fd, fd)
            while (message := self.wait())["op"] in ("answer", "req"):
                if message["op"] == "req":
                    self.serve(message)
                    continue
                found = self.ns.get(message["name"])
                value = self.out(found) if callable(found) else None
                self.channel.send({"op": "answer", "value": value})
        finally:
            os._exit(0)


class _Child(BaseException):
    """Raised in a worker's new process, to leave the root's frames before it serves."""


class ProxyConnection(sqlite3.Connection):
    """A ``sqlite3.Connection`` (for isinstance and sqlite-utils) whose statements run in the
    judge. Its own database is an empty ``:memory:`` one: what bypasses the proxy lands nowhere.

    Two reads need no round trip: ``isolation_level``, sent when the connection was lent (the
    judge never changes it, the answer only through this proxy), and ``in_transaction``, which
    comes with every message of the judge's (``txn``: it holds until the worker's next one)."""

    _labkit_txn = None  # in_transaction, as the judge's last message said (None: not yet)

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
        if self._labkit_txn is None:
            return self._ask("getattr", "in_transaction")
        return self._labkit_txn

    @property
    def total_changes(self):
        return self._ask("getattr", "total_changes")

    @property
    def isolation_level(self):
        return self._labkit_level

    @isolation_level.setter
    def isolation_level(self, value):
        self._ask("setattr", "isolation_level", value)
        self._labkit_level = value


def _reap() -> None:
    """Collect the children a cell left (they would count against the process limit)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _connection(peer: Peer, ident, level) -> ProxyConnection:
    conn = sqlite3.connect(":memory:", factory=ProxyConnection, check_same_thread=False)
    conn._labkit_peer, conn._labkit_id, conn._labkit_level = peer, ident, level
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
        alone.sqlite_utils()  # without numpy (alone.sqlite_utils says why)
        from sqlite_utils.plugins import ensure_plugins_loaded
    except ImportError:  # a Python without sqlite-utils: the answer is lent no Database
        pass
    else:
        ensure_plugins_loaded()

    worker = _Worker(Channel(3, 4))
    try:
        worker.main()
    except _Child as child:
        fd, seed = child.args
        del child
        worker.child(fd, seed)
