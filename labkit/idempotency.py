"""Idempotency: the current owner must not repeat an effect, and the fence lets every write of
the current generation through. :func:`run_once` records an operation key in the same
transaction as the effect: the key and the effect commit together or not at all.
"""

import contextlib
import json
from typing import Any, Callable

from labkit.db import check_db, check_name, execute, in_transaction, rowcount
from labkit.errors import BadArgument, BadArgumentType, KeyNotRecorded, KeyReused, LabkitError
from labkit.fence import Tx, unfenced

__all__ = ["run_once", "canonical"]

IN_PROGRESS = (
    "it has no result: run_once met it again in its own effect (use another key), or an earlier "
    "effect committed on its own: outcome unknown, check it, then delete the key's row"
)
ENDED = (
    "the effect ended run_once's transaction (COMMIT or ROLLBACK); a committed key stays, so no "
    "retry repeats it: check the effect's writes, then delete its row in idempotency_keys"
)
UNDONE = "the effect rolled back run_once's savepoint (ROLLBACK TO run_once); raise to undo one"


def canonical(value: Any, argument: str) -> str:
    """``value`` as sorted, compact JSON without NaN, or raise BadArgument naming ``argument``."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise BadArgument(argument, f"must be JSON-serialisable: {exc}") from None


def run_once(db_or_tx, key: str, effect: Callable[[Tx], Any], *, payload: Any = None) -> Any:
    """Call ``effect(tx)`` once per ``key`` and return its result, as JSON gives it back.

    Key and effect commit together; a repeat returns the stored result without calling ``effect``
    (KeyReused if ``payload`` differs). Given a guard's ``tx`` it joins it in a savepoint. Nothing
    is recorded if ``effect`` raises; KeyNotRecorded if it ends the transaction or meets its key.

    >>> from labkit import connect
    >>> db = connect()
    >>> run_once(db, "k1", lambda tx: 42), run_once(db, "k1", lambda tx: 0)
    (42, 42)
    """
    key = check_name(key, "key")
    if not callable(effect):
        raise BadArgumentType("effect", f"must be callable, got {type(effect).__name__}")
    offered = canonical(payload, "payload")
    if not isinstance(db_or_tx, Tx):
        check_db(db_or_tx, "db_or_tx")
        with unfenced(db_or_tx) as tx:  # no fence: tx.job is None, fenced stores refuse it
            return run_once(tx, key, effect, payload=payload)
    if not db_or_tx.live:
        raise BadArgument("db_or_tx", "its transaction has ended; call run_once inside the block")
    tx, conn = db_or_tx, db_or_tx.conn
    execute(conn, "SAVEPOINT run_once")
    try:
        sql = "INSERT INTO idempotency_keys VALUES ($1, $2, NULL) ON CONFLICT(key) DO NOTHING"
        if rowcount(conn, sql, (key, offered)) == 1:  # the key is ours: run the effect
            try:
                result = effect(tx)
            except BaseException as exc:
                if broken := _broken(conn, key):
                    raise broken from exc
                raise
            if broken := _broken(conn, key):
                raise broken
            result_json = canonical(result, "effect")
            sql = "UPDATE idempotency_keys SET result = $1 WHERE key = $2"
            execute(conn, sql, (result_json, key))
        else:  # seen before: return what was stored
            sql = "SELECT payload, result FROM idempotency_keys WHERE key = $1"
            [(stored, result_json)] = execute(conn, sql, (key,))
            if stored != offered:
                raise KeyReused(key, stored, offered)
            if result_json is None:
                raise KeyNotRecorded(key, IN_PROGRESS)
    except BaseException:
        with contextlib.suppress(LabkitError):  # if this fails, the caller's ROLLBACK undoes all
            execute(conn, "ROLLBACK TO run_once")
            execute(conn, "RELEASE run_once")
        raise
    try:
        execute(conn, "RELEASE run_once")
    except LabkitError:  # the savepoint is gone: the effect ran COMMIT, then BEGIN
        raise _abandon(conn, key) from None
    return json.loads(result_json)  # the same value a repeat will return


def _broken(conn, key: str) -> KeyNotRecorded | None:
    """After the effect: None if run_once's transaction and key row are intact, else the error."""
    if not in_transaction(conn):
        return _abandon(conn, key)
    sql = "SELECT 1 FROM idempotency_keys WHERE key = $1 AND result IS NULL"
    return None if execute(conn, sql, (key,)) else KeyNotRecorded(key, UNDONE)


def _abandon(conn, key: str) -> KeyNotRecorded:
    """The effect ended our transaction: roll back any it began; a key its COMMIT took stays."""
    with contextlib.suppress(LabkitError):
        if in_transaction(conn):
            execute(conn, "ROLLBACK")
    return KeyNotRecorded(key, ENDED)
