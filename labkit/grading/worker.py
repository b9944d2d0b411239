"""The answer's side of grading: a small harness that runs in the sandbox and holds no check.

The judge (:mod:`labkit.grading.judge`) starts ``python worker.py`` inside bubblewrap and talks
to it over fds 3 (in) and 4 (out) with :mod:`labkit.grading.wire`. The worker runs the
notebook's cells. Then, for each worker of a schedule (A, its rival B, a successor), a template
forked after the cells ran forks a process of its own: the judge passes its channel (one end of
a socket pair) over fd 5. That process keeps no other descriptor and no shared memory, and has
namespaces of its own (:mod:`labkit.grading.alone`), so it speaks only on its own channel and
shares nothing with the others but the database. A crash is a real SIGKILL.
Every object the judge hands the answer stays in the judge: the answer gets a proxy, and each
use of it (an SQL statement, a clock read, a callback, an RNG draw) is a request.
"""

from __future__ import annotations

import contextlib
import json
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
            with contextlib.suppress(ChildProcessError):  # the children it left (they would
                while os.waitpid(-1, os.WNOHANG)[0]:  # count against the process limit)
                    pass
        return None

    def main(self) -> int | None:
        """Run the cells; pass each schedule's fork, kill and end to the template its workers are
        forked from (after the cells ran, by os's fork and alone's kill as they were before any
        cell ran: a cell may rebind names). None at quit; in the template, its socket."""
        door, fork, self.kill, template = socket.socket(fileno=5), os.fork, alone.kill, None
        while True:
            message = self.channel.recv()
            op = message["op"]
            if op == "cell":
                if template:  # forked from the state before this cell: it and its workers go
                    template[1].close(), self.kill(template[0])
                template = None
                error = self.run_cell(message["source"], message["number"])
                self.channel.send({"op": "ran", "error": error})
            elif op == "fork":
                _, (fd,), _, _ = socket.recv_fds(door, 1, 1)
                if template is None:
                    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                    if (pid := fork()) == 0:
                        return theirs.detach()
                    template = pid, ours
                    theirs.close()
                told = json.dumps([message["worker"], message.get("seed")]).encode()
                with contextlib.suppress(OSError):  # a template that died: the judge sees it
                    socket.send_fds(template[1], [told], [fd])
                os.close(fd)  # a later worker must not inherit this one's channel
            elif op in ("kill", "end"):  # a crash (a real SIGKILL), or the schedule is over
                with contextlib.suppress(OSError, TypeError):
                    template[1].send(json.dumps([message.get("worker")]).encode())
                    template[1].recv(1)  # done
                self.channel.send({"op": "killed" if op == "kill" else "done"})
            elif op == "quit":
                return None

    def template(self, hand: int) -> tuple[int, object]:
        """Fork, kill (once) and end workers as the root tells on ``hand``, in a world made once
        per state of the cells (:func:`alone.template`); returns in a worker its channel and seed."""
        alone.keep_only(hand)
        alone.private_memory()
        self.numbering = alone.template()
        root, workers = socket.socket(fileno=hand), {}
        while True:
            data, fds, _, _ = socket.recv_fds(root, 1 << 10, 1)
            if not data:  # the root went, or forked a new template
                os._exit(0)
            number, *seed = json.loads(data)
            if fds:
                if (pid := alone.fork(self.numbering)) == 0:
                    return fds[0], seed[0]
                os.close(fds[0])
                workers[number] = pid
            else:  # a crash (once, if ever: the process dies at once) or the end (all go)
                for number in [number] if number is not None else list(workers):
                    if pid := workers.pop(number, None):
                        self.kill(pid)
                root.send(b".")

    def child(self, fd: int, seed) -> None:
        """Serve the judge as one worker of a schedule, on ``fd`` only, in a world of its own
        (:mod:`labkit.grading.alone`), its ``random`` seeded with ``seed``."""
        try:
            alone.keep_only(fd)
            if self.numbering is not None:  # pid 1 of its own numbering
                alone.world()
                alone.powerless()
            random.seed(seed)
            del seed
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
    with contextlib.suppress(ImportError):  # sqlite-utils' plugins, looked for once (20-200 ms)
        from sqlite_utils.plugins import ensure_plugins_loaded

        ensure_plugins_loaded()

    worker = _Worker(Channel(3, 4))
    if (hand := worker.main()) is not None:  # the template: it returns in a worker
        worker.child(*worker.template(hand))
