"""What an answer may do with what the judge lends it: use it, never change it or read its insides.

The answer's requests run in the judge's process, on the judge's own objects, so the judge
decides what may be lent (:func:`lendable`: no frame, module, path or builtin ever crosses),
which requests each lent object answers (:func:`allow`), and what the answer's SQL may touch
in the trial's file (:func:`guard`, an SQLite authorizer while that SQL runs).
"""

from __future__ import annotations

import contextlib
import random
import re
import sqlite3
import types

import sqlite_utils

__all__ = ["allow", "guard", "lendable", "SQL"]

#: what an answer may do with a connection the judge lends it
SQL = ("execute", "executemany", "executescript")
CONN_USES = (*SQL, "commit", "rollback", "close", "enter", "exit")
CONN_READS = ("in_transaction", "total_changes", "isolation_level")
#: statements' leading comments and blanks (the trial's tracer skips a statement that is one)
COMMENTS = re.compile(r"\A(?:\s+|--[^\n]*(?:\n|\Z)|/\*.*?\*/)+", re.S)
#: the judge's own tables in a trial's file (``writers.py``'s crash plan, 07.2's issued log)
PRIVATE = ("crash_plan", "issued")
TOUCH = (sqlite3.SQLITE_READ, sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE,
         sqlite3.SQLITE_DROP_TABLE)  # fmt: skip
DENIED = {
    getattr(sqlite3, f"SQLITE_{n}")
    for n in (
        "ATTACH",
        "DETACH",
        "CREATE_TEMP_TABLE",
        "CREATE_TEMP_VIEW",
        "CREATE_TEMP_TRIGGER",
        "CREATE_TEMP_INDEX",
        "DROP_TRIGGER",
        "DROP_TEMP_TRIGGER",
        "CREATE_TRIGGER",
        "RECURSIVE",
    )
}  # fmt: skip (RECURSIVE: no endless CTE)


def allow(target, what: str, args: list) -> None:
    """An answer may use what the judge lends it, never change it or read its insides: a
    connection only runs SQL (leading comments cut, which the trial's tracer would skip), a
    trial's helper (a clock, a mailer) shows its methods and the data its class declares."""
    name = args[0] if what in ("getattr", "method") else None
    if (what, *args[:2]) == ("setattr", "isolation_level", None):  # what labkit's own is
        return
    if what == "setattr" or not lendable(target):
        raise PermissionError("the judge's objects can be used, not changed")
    if isinstance(target, sqlite3.Connection):
        if what in ("execute", "executemany") and isinstance(args[0], str):
            args[0] = COMMENTS.sub("", args[0])
        elif what == "executescript" and ("--" in str(args[0]) or "/*" in str(args[0])):
            raise PermissionError("a script lent to the judge has no comments")
        if what in CONN_USES or name in CONN_READS and what == "getattr":
            return
        raise AttributeError(f"a connection lent to an answer runs SQL only, not {name or what}")
    if isinstance(target, sqlite_utils.Database) and (what, name) != ("getattr", "conn"):
        raise AttributeError("a database lent to an answer is reached through its connection")
    if isinstance(target, contextlib._GeneratorContextManager) and what not in (
        "enter",
        "exit",
    ):
        raise AttributeError("a context manager lent to an answer is only entered and left")
    if callable(target) and not isinstance(target, type) and what == "call":
        return
    if type(target).__module__.startswith("labkit.grading"):
        if what in ("list", "len", "getitem"):
            raise PermissionError(f"a trial's helper does not answer {what}")
        data = getattr(type(target), "public", ())
        if (
            what == "getattr"
            and name not in data
            and not callable(getattr(target, str(name), None))
        ):
            raise AttributeError(f"a trial's helper shows its methods only, not {name!r}")


def lendable(value) -> bool:
    """What the judge lends an answer: its connections and databases, an RNG, labkit's objects
    (the trial's helpers among them), their bound methods, and a context manager to enter."""
    if isinstance(value, (sqlite3.Connection, sqlite_utils.Database, random.Random)):
        return True
    if isinstance(value, (types.MethodType, types.BuiltinMethodType)):
        return lendable(value.__self__)
    if isinstance(value, contextlib._GeneratorContextManager):
        return True
    if isinstance(value, types.FunctionType):  # a trial's callback, or one of labkit's
        return (value.__module__ or "").startswith("labkit.")
    return not isinstance(value, type) and (type(value).__module__ or "").startswith("labkit.")


def guard(action: int, first, second, database, trigger) -> int:
    """The authorizer on a lent connection while an answer's SQL runs: no ATTACH, no TEMP
    object (it would shadow a table the trial reads), no dropped trigger, no writable schema,
    and none of the judge's own tables (the crash plan, the issued log) but through a trigger."""
    if action in DENIED or action == sqlite3.SQLITE_PRAGMA and first == "writable_schema":
        return sqlite3.SQLITE_DENY
    if first in PRIVATE and trigger is None and action in TOUCH:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK
