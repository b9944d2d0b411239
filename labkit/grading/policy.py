"""What an answer may do with what the judge lends it: use it, never change it or read its insides.

The answer's requests run in the judge's process, on the judge's own objects, so the judge
decides what may be lent (:func:`lendable`: no frame, module, path or builtin ever crosses),
which requests each lent object answers (:func:`allow`), and what the answer's SQL may touch
in the trial's file (:func:`authorizer`, an allow-list, while that SQL runs).
"""

from __future__ import annotations

import contextlib
import random
import re
import sqlite3
import types

from labkit.grading import alone

sqlite_utils = alone.sqlite_utils()

__all__ = ["allow", "authorizer", "lendable", "SQL", "FUNCTIONS", "PRAGMAS", "TABLES"]

#: what an answer may do with a connection the judge lends it
SQL = ("execute", "executemany", "executescript")
CONN_USES = (*SQL, "commit", "rollback", "close", "enter", "exit")
CONN_READS = ("in_transaction", "total_changes", "isolation_level")
#: statements' leading comments and blanks (the trial's tracer skips a statement that is one)
COMMENTS = re.compile(r"\A(?:\s+|--[^\n]*(?:\n|\Z)|/\*.*?\*/)+", re.S)
#: the tables an answer's SQL may read and write: labkit's own (the trials' and those labkit's
#: code creates when an answer calls it), SQLite's sequence, and sqlite-utils' throwaway probes
TABLES = frozenset(
    "charges claims done_units epoch_counter epochs files idempotency_keys invoice_lines invoices "
    "job_fence lease_counter leases objects outbox payouts repl_applied repl_log version_leases "
    "sqlite_sequence".split()
)
PROBE = re.compile(r"t[0-9a-f]{32}")  # sqlite-utils' supports_strict / supports_on_conflict
#: the pragmas an answer may run: the shape of one of :data:`TABLES`, a probe or their own
#: indexes (sqlite-utils reads it), and busy_timeout read
PRAGMAS = frozenset(
    "table_info table_xinfo index_list index_info index_xinfo foreign_key_list".split()
)
SHAPED = re.compile(rf"(?:sqlite_autoindex_)?(?:{'|'.join(TABLES)}|{PROBE.pattern})(?:_\d+)?")
#: the SQL functions an answer may call: plain arithmetic, text and aggregates (no clock, no
#: randomness, no blobs of any size, no printf widths, no extensions, JSON or full-text search)
FUNCTIONS = frozenset(
    "abs avg changes coalesce count group_concat ifnull iif instr last_insert_rowid length like "
    "glob lower ltrim max min nullif replace round rtrim substr substring sum total total_changes "
    "trim typeof upper".split()
)
_A = sqlite3
ROWS = {_A.SQLITE_READ, _A.SQLITE_INSERT, _A.SQLITE_UPDATE, _A.SQLITE_DELETE}
PLAIN = {_A.SQLITE_SELECT, _A.SQLITE_TRANSACTION, _A.SQLITE_SAVEPOINT}
#: the statement kinds an answer may run, beside those: the authorizer's action codes by name
_KIND_NAMES = (
    "CREATE_INDEX CREATE_TABLE CREATE_TEMP_INDEX CREATE_TEMP_TABLE CREATE_TEMP_TRIGGER "
    "CREATE_TEMP_VIEW CREATE_TRIGGER CREATE_VIEW DELETE DROP_INDEX DROP_TABLE DROP_TEMP_INDEX "
    "DROP_TEMP_TABLE DROP_TEMP_TRIGGER DROP_TEMP_VIEW DROP_TRIGGER DROP_VIEW INSERT PRAGMA READ "
    "SELECT TRANSACTION UPDATE ATTACH DETACH ALTER_TABLE REINDEX ANALYZE CREATE_VTABLE "
    "DROP_VTABLE FUNCTION SAVEPOINT RECURSIVE"
).split()
KINDS = {v: k[7:] for k, v in vars(_A).items() if k.startswith("SQLITE_") and k[7:] in _KIND_NAMES}
# A trial's connections run ``PRAGMA trusted_schema = OFF`` (lab.Scratch.open); SQLite's
# defensive mode needs Connection.setconfig, which arrives in Python 3.12 (this is 3.11).


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
    if isinstance(target, contextlib._GeneratorContextManager) and what not in ("enter", "exit"):
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


def authorizer(refused: list, triggers: frozenset = frozenset()):
    """The authorizer on a lent connection while an answer's SQL runs, an allow-list: row reads
    and writes of :data:`TABLES` in ``main``, SELECT, transactions and savepoints, the
    :data:`PRAGMAS` (busy_timeout only read), the :data:`FUNCTIONS`, and a CREATE TABLE of
    labkit's own tables (its code creates them when an answer calls it). Everything else (ATTACH,
    VACUUM, views, triggers, TEMP objects, virtual tables, renames, drops, ANALYZE and statistics
    tables, recursive queries, any other table) is refused: ``refused`` gets what, in words (the
    judge keeps no records in a trial's file). Where a task asks for triggers (03.3:
    ``Fence.protect``), ``triggers`` names the tables the answer may create them on, in ``main``;
    with them it may read ``pragma_table_info`` and call ``row_number``, as ``protect`` does."""

    def guard(action: int, first, second, database, trigger) -> int:
        table = first if action in ROWS or action == _A.SQLITE_CREATE_TABLE else None
        name = (second if action == _A.SQLITE_FUNCTION else first) or ""
        main = database == "main"
        pragma = action == _A.SQLITE_PRAGMA and database in (None, "main")
        index = action == _A.SQLITE_CREATE_INDEX and main
        drop = action == _A.SQLITE_DROP_TABLE and main
        ok = (
            action in PLAIN
            or (action == _A.SQLITE_READ and database is None)  # a CTE
            or (action == _A.SQLITE_FUNCTION and name.lower() in FUNCTIONS)
            or (pragma and name.lower() in PRAGMAS and SHAPED.fullmatch(second or ""))
            or (pragma and name.lower() == "busy_timeout" and second is None)
            or (table is not None and main and (table in TABLES or PROBE.fullmatch(table)))
            # SQLite's own rows of a CREATE TABLE: it refuses a statement's own writes there
            # while writable_schema is off, as it stays
            or (table == "sqlite_master" and main)
            or (index and first.startswith("sqlite_autoindex_") and second in TABLES)
            or (drop and PROBE.fullmatch(name))
            or (action == _A.SQLITE_CREATE_TRIGGER and main and second in triggers)
            or (triggers and table == "pragma_table_info" and main)
            or (triggers and action == _A.SQLITE_FUNCTION and name.lower() == "row_number")
        )
        if ok:
            return _A.SQLITE_OK
        what = KINDS.get(action, str(action)).replace("_", " ").lower()
        refused.append(f"{what} {' '.join(str(x) for x in (first, second) if x)}".strip())
        return _A.SQLITE_DENY

    return guard
