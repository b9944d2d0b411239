"""A real "disk full" for the fenced writers' checks (02.1, 02.2, 03.1): SQLite's own SQLITE_FULL.

A simulated crash (a trigger that RAISEs) leaves the transaction open, so an answer that always
sends ``ROLLBACK`` after an error passes. A real full disk does not: after SQLITE_FULL (or an
I/O error) in a statement without a statement journal, such as a one-row ``INSERT``, SQLite rolls
the whole transaction back by itself, the answer's ``ROLLBACK`` then fails with "cannot rollback
- no transaction is active", and that second error replaces the real one. So the check makes the
disk really full: :func:`disk_full` sets ``PRAGMA max_page_count`` of the answer's connection to
the file's current size, and the crash invoice gets a :func:`long_id` whose row and key need new
(overflow) pages, more than the free list holds. No library offers this; it is two pragmas.
"""

from __future__ import annotations

import contextlib

from labkit.db import execute

#: what SQLite says, and what the propagated error must say
FULL = "database or disk is full"


def long_id(db, name: str) -> str:
    """``name`` made long enough that writing it needs more new pages than ``db``'s free list has."""
    (size,), (free,) = execute(db, "PRAGMA page_size")[0], execute(db, "PRAGMA freelist_count")[0]
    return f"{name}/" + "0" * (size * (free + 2))


def short(name: str) -> str:
    """An invoice id as a message shows it (a :func:`long_id` is cut)."""
    return name if len(name) <= 40 else f"{name.split('/')[0]}/0...0 ({len(name)} characters)"


@contextlib.contextmanager
def disk_full(db, tracer=None):
    """While the block runs, ``db``'s file cannot grow by a page (its trace is paused meanwhile,
    so the pragmas are not counted as the answer's SQL)."""

    def pragma(sql: str):
        db.conn.set_trace_callback(None)
        try:
            return execute(db, sql)
        finally:
            db.conn.set_trace_callback(tracer)

    (limit,) = pragma("PRAGMA max_page_count")[0]
    (pages,) = pragma("PRAGMA page_count")[0]
    pragma(f"PRAGMA max_page_count = {int(pages)}")  # an int read from SQLite, not a value bound
    try:
        yield
    finally:
        pragma(f"PRAGMA max_page_count = {int(limit)}")


def is_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` is the full disk itself, or raised ``from`` it: not an error that merely
    happened while handling it (a failed ``ROLLBACK``, whose ``__context__`` is the real one)."""
    while exc is not None:
        if FULL in str(exc):
            return True
        exc = exc.__cause__
    return False
