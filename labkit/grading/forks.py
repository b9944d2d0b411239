"""The answer's processes in one schedule: A, its rival B and any successor, a process each.

A trial calls the answer as one function (:class:`RemoteAnswer`); each call goes to the
process of the worker that makes it. A worker is known by the connections its call is given,
directly or as an attribute of an object it is given (a ``Claims`` holds its database): the
first call on a connection forks a process from the notebook's state (:class:`Workers`), and
later calls on it go back there. A call given no connection goes to a process of its own
for its depth (the outermost calls share one; a rival, made while another call is running,
gets another). The processes share nothing but the database (:mod:`labkit.grading.alone`):
B cannot see that A is in the middle of a call.

When a worker dies at a statement (:func:`labkit.grading.lab.process`), the judge kills its
process for real (SIGKILL) and the trial's call raises :class:`Killed`. What the process held
in memory dies with it, and the successor, on a connection of its own, is a fresh process.
"""

from __future__ import annotations

import functools
import random
import socket
import sqlite3

from labkit.grading import lab, wire
from labkit.grading.policy import lendable
from labkit.grading.verdicts import Refused

__all__ = ["Killed", "Dead", "Workers", "RemoteAnswer", "OwnLuck", "seed_of"]


class Killed(Exception):
    """The worker's process was killed at a statement, a crash its schedule chose: its call
    never returned, and nothing it held survives but what it committed."""


class Dead(BaseException):
    """A dying worker's statement ended (raised in the judge): unwinds to that worker's call,
    which kills its process. A BaseException, so that no ``except`` of the trial's eats it."""


class Process(wire.Peer):
    """One worker's process and its channel: what the judge lent it, the proxies of its objects."""

    def __init__(self, workers: Workers, number: int) -> None:
        self.socket, theirs = socket.socketpair()
        workers.box.fork(number, workers.seed(number), theirs)
        theirs.close()
        fd, now = self.socket.fileno(), workers.box.channel.now
        super().__init__(wire.Channel(fd, fd, now))
        self.box, self.number, self.told, self.function = workers.box, number, set(), None
        self.unexpected, self.allow = self.box.unexpected, self.box.allow  # the sandbox's rules
        self.conns: frozenset = frozenset()  # id() of the connections its worker is known by
        self.lent: dict = {}  # id() -> each connection lent to this process

    def wait(self) -> dict:
        return self.box.wait(self.channel)

    def send(self, message: dict) -> None:
        """Send, with whether each connection lent to this process is in a transaction: the
        worker runs only between a message of the judge's and its next one, so that holds
        until it asks again, and it reads ``in_transaction`` without a round trip."""
        message["txn"] = [[k, c.in_transaction] for k, c in self.lent.items() if _open(c)]
        self.box.send(message, self.channel)

    def perform(self, target, what: str, args: list):
        """Do the request; Dead if the worker died meanwhile (at a statement of its own, or of
        the judge's object it called): its process is then killed, and gets no reply."""
        try:
            done = self.box.perform(target, what, args)
        except Exception:
            if not self.died():
                raise
        if self.died():
            raise Dead
        return done

    def died(self) -> bool:
        """Whether a connection of this worker's has died (see :func:`labkit.grading.lab.process`)."""
        return any(lab.DYING.get(conn, bool)() for conn in self.conns)

    def handle(self, value):
        """Lend ``value`` (see :func:`~labkit.grading.policy.lendable`), or refuse: a frame, a path, a module stays here."""
        if id(value) not in self.ids and not lendable(value):
            raise PermissionError(f"a {type(value).__name__} of the judge's cannot be lent")
        return super().handle(value)

    def kind(self, value) -> list:
        import sqlite_utils

        if isinstance(value, sqlite3.Connection):
            self.box.lent.add(value)
            self.lent[id(value)] = value
            return ["conn", value.isolation_level]  # None (labkit's), and an answer sets only None
        if isinstance(value, sqlite_utils.Database):
            return ["db", self.handle(value.conn)]
        kind = type(value)
        methods = None if kind in self.told else _methods(kind)  # once per class and process
        self.told.add(kind)
        return ["object", kind.__module__, kind.__qualname__, methods]

    def find(self, name: str):
        """The handle of the notebook's function ``name`` in this process (None: no such one)."""
        self.send({"op": "answer", "name": name})
        found = self.wait().get("value")
        return found[1] if isinstance(found, list) and found[0] == "H" else None


def _open(conn: sqlite3.Connection) -> bool:
    try:
        return conn.total_changes >= 0
    except sqlite3.ProgrammingError:  # closed
        return False


class Workers:
    """The processes of one schedule, each forked when its worker first calls the answer."""

    def __init__(self, box, name: str, seed: int | None) -> None:
        self.box, self.name, self.luck = box, name, seed
        self.processes: list[Process] = []  # the live ones (``started`` counts them all)
        self.started = 0
        self.of_key: dict = {}  # a worker's connections (or, with none, its nesting) -> process
        self.running: list[Process] = []  # the processes with a call in flight, outermost first

    def seed(self, number: int):
        """The ``random`` seed of the schedule's ``number``-th process."""
        return seed_of(self.luck, number)

    def start(self) -> Process | None:
        """A new process, if the notebook defines the answer's function (else None)."""
        process = Process(self, self.started)
        self.started += 1
        self.processes.append(process)
        process.function = process.find(self.name)
        return process if process.function is not None else None

    def of(self, args: list) -> Process:
        """The process of the worker whose call is given ``args``."""
        key = _connections(args) or ("none", len(self.running))
        if key not in self.of_key:
            unused = [p for p in self.processes if p not in self.of_key.values()]
            process = unused[0] if unused else self.start()
            if process is None:
                raise Refused(f"the notebook's process lost its function {self.name!r}")
            process.conns = key if isinstance(key, frozenset) else frozenset()
            self.of_key[key] = process
        return self.of_key[key]

    def kill(self, process: Process) -> None:
        """Kill ``process`` for real (once); a later call of its worker gets a fresh one, and a
        proxy of its objects speaks to no one (not on a reused descriptor's new process)."""
        if process in self.processes:
            self.of_key = {k: p for k, p in self.of_key.items() if p is not process}
            self.processes.remove(process)
            process.channel = wire.Channel(-1, -1)
            self.box.kill(process.number)
            process.socket.close()

    def close(self) -> None:
        for process in self.processes:
            process.socket.close()


def _connections(values: list) -> frozenset:
    """The connections in ``values``, or held by one of them (``.conn``, or an attribute's)."""
    found = set()
    for value in values:
        if isinstance(value, wire.Remote):
            continue
        for v in (value, *getattr(value, "__dict__", {}).values()):
            if isinstance(v, wire.Remote):  # an answer's object: never asked, while routing
                continue
            v = v if isinstance(v, sqlite3.Connection) else getattr(v, "conn", None)
            if isinstance(v, sqlite3.Connection):
                found.add(id(v))
    return frozenset(found)


def _a(kind: type) -> str:
    """A type in words: "a dict", "an int", "None"."""
    name = kind.__name__
    return "None" if kind is type(None) else ("an " if name[0] in "aeiou" else "a ") + name


@functools.cache
def _methods(kind: type) -> list[str]:
    """The public methods of a class: a proxy calls them in one request, not two."""
    found = {n: getattr(kind, n, None) for n in dir(kind) if not n.startswith("_")}
    return [n for n, v in found.items() if callable(v) and not isinstance(v, type)]


class RemoteAnswer:
    """The answer, as the trial calls it: each call is a request to the process of the worker
    that makes it, whose result must be plain values of the task's declared types."""

    def __init__(self, workers: Workers, name: str, returns: tuple) -> None:
        self.workers, self.__name__, self.returns = workers, name, returns

    def __call__(self, *args, **kwargs):
        workers = self.workers
        process = workers.of([*args, *kwargs.values()])
        workers.running.append(process)
        try:
            data = process.request(process.function, "call", list(args), kwargs, raw=True)
        except Dead:
            workers.kill(process)
            raise Killed(f"the process of {self.__name__}'s call was killed") from None
        except (Exception, Refused):  # the answer's exception, rebuilt as a class we know
            raise
        except BaseException as exc:  # SystemExit, KeyboardInterrupt: not the judge's to obey
            raise Refused(f"the answer raised {type(exc).__name__}: {exc}") from None
        finally:
            workers.running.pop()
        try:
            value = wire.decode(data, functools.partial(_ours, process))
        except wire.NotCrossable as exc:
            raise Refused(f"the answer returned {exc}: only plain values cross") from None
        if self.returns and type(value) not in self.returns:
            names = " or ".join(map(_a, self.returns))
            raise Refused(f"the answer returns {names}; it returned {_a(type(value))}")
        return value


def _ours(process: Process, tagged):
    if tagged[0] != "Y":
        raise wire.NotCrossable("an object of its own")
    return process.resolve(tagged)


def seed_of(luck, number: int):
    """The ``random`` seed of a schedule's ``number``-th process, when the schedule's is ``luck``."""
    return luck if number == 0 or luck is None else f"{luck}/{number}"


class OwnLuck:
    """The answer called in this process (a replay) as :class:`RemoteAnswer` calls it in the
    sandbox: each worker, known as :class:`Workers` knows it and numbered in the same order (a
    dead one's next call a new number), draws ``random`` from a stream of its own, seeded as its
    process would be. So a replay draws what the grade's processes drew."""

    def __init__(self, answer, luck) -> None:
        self.answer, self.luck, self.__name__ = answer, luck, getattr(answer, "__name__", "answer")
        self.states: list = []  # per worker number: its random's state between calls
        self.of_key: dict = {}
        self.running: list[int] = []

    def __call__(self, *args, **kwargs):
        key = _connections([*args, *kwargs.values()]) or ("none", len(self.running))
        if key not in self.of_key:
            self.of_key[key] = len(self.states)
            self.states.append(random.Random(seed_of(self.luck, len(self.states))).getstate())
        number, outer = self.of_key[key], self.running[-1] if self.running else None
        caller = random.getstate()  # the judge's own, or the outer worker's
        if outer is not None:
            self.states[outer] = caller
        random.setstate(self.states[number])
        self.running.append(number)
        try:
            return self.answer(*args, **kwargs)
        finally:
            self.running.pop()
            self.states[number] = random.getstate()
            random.setstate(self.states[outer] if outer is not None else caller)
            if isinstance(key, frozenset) and any(lab.DYING.get(c, bool)() for c in key):
                self.of_key.pop(key, None)  # killed: its worker's next call is a fresh process
