"""A student's side of classroom mode: register a name, then a worker that takes the room's lease.

:func:`join` registers ``name`` through the room's URL, keeps the login and secret it gets back,
and starts a worker thread with its own connection as that login. The worker loops: try to
acquire; if it won, sleep when the instructor paused it, write, renew, write again, release,
rest. Every call is a ``SECURITY DEFINER`` function on the server (see
:mod:`labkit.engines.classroom`), which logs its answer and decides whether a write is fenced.
A call the server gave up on (a lock wait past its ``lock_timeout``, because another student
held the room up) is tried again; any other error ends the worker and is kept in ``error``.
"""

from __future__ import annotations

import random
import threading

from labkit.engines.classroom import RoomRefused, bad_name
from labkit.engines.postgres_db import driver
from labkit.errors import BadArgument, LabkitError

__all__ = ["Joined", "Student", "join", "register", "work"]


def _refused(exc) -> LabkitError:
    """A server's refusal as a labkit error (a bad name names ``name``)."""
    code = getattr(exc, "sqlstate", None)
    text = str(exc).split("\n")[0]
    return BadArgument("name", text) if code == "22023" else RoomRefused(text, code)


class Student:
    """One student's connection as their own login role; the calls check ``name`` and ``secret``."""

    def __init__(self, url: str, name: str, login: str, password: str, secret: str) -> None:
        psycopg = driver()
        params = psycopg.conninfo.conninfo_to_dict(url) | {"user": login, "password": password}
        self.url = psycopg.conninfo.make_conninfo(**params)
        self.name, self.login, self.password, self.secret = name, login, password, secret
        self.conn = psycopg.connect(
            self.url, autocommit=True, connect_timeout=10, cursor_factory=psycopg.RawCursor
        )

    def call(self, function: str, *args):
        """Call ``labkit.<function>(name, secret, *args)``; return its rows."""
        psycopg = driver()
        marks = ", ".join(f"${n}" for n in range(1, len(args) + 3))
        try:
            return self.conn.execute(
                f"SELECT * FROM labkit.{function}({marks})", [self.name, self.secret, *args]
            ).fetchall()
        except psycopg.Error as exc:
            raise _refused(exc) from None

    def acquire(self) -> tuple | None:
        """``(generation, ttl, pause)`` if this student won the lease, else None."""
        rows = self.call("acquire")
        return rows[0] if rows else None

    def renew(self, generation: int) -> bool:
        return self.call("renew", generation)[0][0]

    def release(self, generation: int) -> bool:
        return self.call("release", generation)[0][0]

    def write(self, generation: int) -> bool:
        """True if the write committed; False if the fence refused it (in a protected room)."""
        return self.call("write", generation)[0][0]

    def close(self) -> None:
        self.conn.close()


def register(url: str, name: str) -> Student:
    """Register ``name`` through the room's ``url``; return the student, logged in as theirs."""
    psycopg = driver()
    name = bad_name(name)
    if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
        raise BadArgument("url", f"{url!r} is not the room's postgresql:// URL: ask for it again")
    try:
        with psycopg.connect(
            url, autocommit=True, connect_timeout=10, cursor_factory=psycopg.RawCursor
        ) as conn:
            login, password, secret = conn.execute(
                "SELECT * FROM labkit.register($1)", [name]
            ).fetchone()
    except psycopg.Error as exc:
        raise _refused(exc) from None
    return Student(url, name, login, password, secret)


#: SQLSTATEs of a call the server gave up on, with nothing done: a lock wait timed out, a
#: statement was cancelled, a deadlock was broken
GAVE_UP = {"55P03", "57014", "40P01"}


def work(
    student: Student,
    stop: threading.Event,
    *,
    rng=None,
    work=(0.01, 0.05),
    rest=(0.02, 0.1),
    clock=None,
    timings=None,
) -> None:
    """Loop until ``stop`` is set: acquire, (pause), write, renew, write, release, rest.

    ``work`` and ``rest`` are (low, high) seconds drawn from ``rng``; waiting is ``stop.wait``.
    With ``clock`` (a function returning seconds), each write's round trip is appended to
    ``timings``."""
    rng = rng or random.Random(student.name)
    while not stop.is_set():
        try:
            _turn(student, stop, rng, work, rest, clock, timings)
        except RoomRefused as exc:
            if exc.code not in GAVE_UP:
                raise
            stop.wait(rng.uniform(*rest))


def _turn(student, stop, rng, work, rest, clock, timings) -> None:
    """One turn of :func:`work`."""
    won = student.acquire()
    if won is None:
        stop.wait(rng.uniform(*rest))
        return
    generation, _, pause = won
    if pause and stop.wait(pause):
        return  # stopped while paused: the lease runs out on its own
    for step in range(2):
        if stop.wait(rng.uniform(*work)):
            break
        began = clock() if clock else None
        student.write(generation)
        if clock:
            timings.append(clock() - began)
        if step == 0 and not student.renew(generation):
            break
    student.release(generation)
    stop.wait(rng.uniform(*rest))


class Joined:
    """A student's running worker: ``student``, ``thread``; :meth:`stop` ends it."""

    def __init__(self, student: Student) -> None:
        self.student, self.stopping = student, threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            work(self.student, self.stopping)
        except Exception as exc:  # the server went away or reset the room: keep it to show
            self.error = exc

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)
        self.student.close()

    def __repr__(self) -> str:
        state = "running" if self.thread.is_alive() else f"stopped ({self.error or 'asked'})"
        return f"<{self.student.name}'s worker: {state}>"


def join(url: str, name: str) -> Joined:
    """Register ``name`` in the room at ``url`` and start that student's worker (a thread).
    Whether its writes are fenced is the room's, not the student's, choice."""
    return Joined(register(url, name))
