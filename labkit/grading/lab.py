"""The laboratory every grading check runs in: scratch SQLite files, a second worker, a dying process.

The check modules (:mod:`labkit.grading.checks01` ... :mod:`labkit.grading.checks09`) build
each trial's world from these pieces, so that they all mean the same thing:

* :func:`scratch` gives a trial a temporary folder of real SQLite files and
  closes every connection and deletes the folder afterwards. Its connections
  never wait for the write lock (busy timeout 0) and skip fsync.
* :class:`Tracer` watches the SQL one connection sends (SQLite's trace
  callback) and runs another worker's action just before the answer's n-th
  statement: real concurrency between statements, at a point the schedule
  picks. :func:`between_statements` is the same, as a context manager.
* :func:`process` lets a worker's process die at a chosen statement.
* :func:`call`, :func:`shown`, :func:`busy`, :func:`is_bool` judge one call.

Reloading :mod:`labkit.grading` reloads this module first, then the lesson
modules, so a patch an answer cell made to any of them is undone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

from labkit.db import connect, execute
from labkit.errors import Busy


def connect_quick(path: str):
    """A labkit connection that never waits for the lock, without fsync (a check needs no durability)."""
    db = connect(path, busy_timeout_ms=0)
    execute(db, "PRAGMA synchronous = OFF")
    return db


class Scratch:
    """A trial's temporary folder of SQLite files.

    Attributes:
        folder: the folder's path.
        opened: every connection :meth:`open` returned (closed by :func:`scratch`).
    """

    def __init__(self, folder: str) -> None:
        self.folder, self.opened = folder, []

    def path(self, name: str = "check.db") -> str:
        """The path of file ``name`` in the folder."""
        return os.path.join(self.folder, name)

    def open(self, name: str = "check.db"):
        """A new quick connection (see :func:`connect_quick`) to file ``name`` in the folder."""
        self.opened.append(connect_quick(self.path(name)))
        return self.opened[-1]


@contextlib.contextmanager
def scratch():
    """Yield a fresh :class:`Scratch`; afterwards close its connections and delete its folder.

    Example:
        >>> with scratch() as lab:
        ...     db, other = lab.open(), lab.open()      # two connections to one file
    """
    lab = Scratch(tempfile.mkdtemp(prefix="labkit-check-"))
    try:
        yield lab
    finally:
        for db in lab.opened:
            db.conn.close()
        shutil.rmtree(lab.folder, ignore_errors=True)


class Tracer:
    """Records the SQL one connection sends; runs ``action`` just before its ``at``-th statement.

    Trigger echoes (lines starting with ``--``) and re-prepares of the same
    statement are not counted as new statements. Whatever ``action()``
    returns is kept in ``result``; an exception inside it is swallowed by
    SQLite's trace callback, so actions catch their own (see :func:`call`).

    Attributes:
        sql: the statements sent so far, values expanded.
    """

    def __init__(self, db) -> None:
        self.sql: list[str] = []
        self.at, self.action, self.result = 0, None, None
        db.conn.set_trace_callback(self)

    def __call__(self, sql) -> None:
        if not isinstance(sql, str) or sql.startswith("--") or (self.sql and self.sql[-1] == sql):
            return
        self.sql.append(sql)
        if self.action is not None and len(self.sql) == self.at:
            action, self.action = self.action, None
            self.result = action()

    def before(self, n: int, action) -> None:
        """Run ``action()`` just before the ``n``-th statement from now (1 = the next one)."""
        self.at, self.action, self.result = len(self.sql) + n, action, None


@contextlib.contextmanager
def between_statements(db, at: int, action):
    """Run ``action()`` on another connection just before the ``at``-th statement sent on ``db``.

    It models a concurrent worker acting between the answer's statements.
    Yields a dict whose ``"done"`` says whether ``action()`` ran and returned
    something true; it is False when the action raised (e.g. the answer holds
    the write lock) or never came (``at`` is 0 or beyond the last statement),
    and the caller then runs it afterwards.
    """
    seen = {"done": False}

    def attempt() -> None:
        try:
            seen["done"] = bool(action())
        except Exception:  # busy: the answer's transaction keeps the world still
            seen["done"] = False

    tracer = Tracer(db)
    if at:
        tracer.before(at, attempt)
    try:
        yield seen
    finally:
        db.conn.set_trace_callback(None)


@contextlib.contextmanager
def process(db, dies):
    """Run a worker on ``db`` whose process dies when ``dies(sql)`` first says so.

    ``dies`` is asked before every SQL statement. From that statement on,
    every statement on ``db`` is interrupted, so nothing more commits; the
    caller closes the connection afterwards, which rolls back what was open.
    Yields a dict whose ``"dead"`` says whether it died.
    """
    seen = {"dead": False}

    def trace(sql: str) -> None:
        if not seen["dead"] and dies(sql):
            seen["dead"] = True

    db.conn.set_trace_callback(trace)
    db.conn.set_progress_handler(lambda: 1 if seen["dead"] else 0, 1)
    try:
        yield seen
    finally:
        db.conn.set_trace_callback(None)
        db.conn.set_progress_handler(None, 1)


def call(fn, *args):
    """``("returned", value)`` or ``("raised", exception)``; NotImplementedError passes through."""
    try:
        return "returned", fn(*args)
    except NotImplementedError:
        raise
    except Exception as exc:  # judged by the caller
        return "raised", exc


def busy(out) -> bool:
    """Whether the outcome ``out`` of :func:`call` is SQLite refusing the write lock."""
    exc = out[1]
    return out[0] == "raised" and (
        isinstance(exc, Busy) or "locked" in str(exc) or "busy" in str(exc).lower()
    )


def shown(out) -> str:
    """The outcome ``out`` of :func:`call` in words, e.g. ``"returned True"``."""
    kind, value = out
    return (
        f"returned {value!r}" if kind == "returned" else f"raised {type(value).__name__}: {value}"
    )


def is_bool(out, value: bool) -> bool:
    """Whether the call returned ``value`` (as a bool, or as the int 0 or 1)."""
    got = out[1]
    return (
        out[0] == "returned"
        and isinstance(got, (bool, int))
        and got in (0, 1)
        and bool(got) is value
    )
