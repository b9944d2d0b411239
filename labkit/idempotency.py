"""Idempotency: the current owner must not repeat an effect.

A fence lets every write of the current generation through, so a retried
insert or a repeated charge within one generation is not the fence's problem.
:func:`run_once` records an operation key in the same transaction as the
effect: the key and the effect commit together or not at all.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Callable

from labkit.db import check_db, check_name, execute, rowcount
from labkit.errors import BadArgument, BadArgumentType, KeyReused, LabkitError
from labkit.fence import Tx, unfenced

__all__ = ["run_once"]


def canonical(value: Any, argument: str) -> str:
    """``value`` as canonical JSON (sorted keys, no spaces, no NaN): how payloads are compared.

    Raises:
        BadArgument: ``value`` is not JSON-serialisable, naming ``argument``.

    Example:
        >>> canonical({"b": 1, "a": [1, 2]}, "payload")
        '{"a":[1,2],"b":1}'
    """
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise BadArgument(argument, f"must be JSON-serialisable: {exc}") from None


def run_once(db_or_tx, key: str, effect: Callable[[Tx], Any], *, payload: Any = None) -> Any:
    """Call ``effect(tx)`` once per ``key`` and remember its JSON result.

    The key and the effect's writes commit in one transaction. A repeat with the
    same key returns the stored result without calling ``effect``. Given a
    database, it opens its own ``BEGIN IMMEDIATE``; given a ``tx`` from
    :meth:`Fence.guard`, it joins that transaction (inside a savepoint, so a
    failing effect leaves no key behind).

    Args:
        db_or_tx: a labkit database or an open :class:`Tx`.
        key: the operation's unique key, e.g. ``"invoice-run-8/INV-1"``.
        effect: called with a :class:`Tx`; its return value must be JSON-serialisable.
            Given a database, that ``Tx`` is unfenced (``tx.job`` is None), so a
            fenced store refuses it: to fence the effect, pass a guard's ``tx``.
        payload: what the operation is about; reusing ``key`` with a different
            payload (compared as canonical JSON) is an error.

    Returns:
        The effect's result as JSON gives it back (a tuple comes back as a list),
        the same value on the first call and on every repeat.

    Raises:
        KeyReused: same key, different payload. Nothing was written.
        BadArgument, BadArgumentType: a bad key, effect, payload or ``db_or_tx``,
            or an effect whose result is not JSON (its writes are undone).
        Any exception from ``effect``: nothing was recorded.

    Example:
        >>> from labkit import connect
        >>> db = connect()
        >>> run_once(db, "k1", lambda tx: 42), run_once(db, "k1", lambda tx: 0)
        (42, 42)
    """
    key = check_name(key, "key")
    if not callable(effect):
        raise BadArgumentType("effect", f"must be callable, got {type(effect).__name__}")
    offered = canonical(payload, "payload")
    if isinstance(db_or_tx, Tx):
        if not db_or_tx.live:
            raise BadArgument(
                "db_or_tx", "this tx's transaction has ended; call run_once inside the with block"
            )
        return _in_savepoint(db_or_tx, key, effect, offered)
    check_db(db_or_tx, "db_or_tx")
    with unfenced(db_or_tx) as tx:  # no fence: tx.job is None, fenced stores refuse it
        return _in_savepoint(tx, key, effect, offered)


def _in_savepoint(tx: Tx, key: str, effect, offered: str) -> Any:
    execute(tx.conn, "SAVEPOINT run_once")
    try:
        won = rowcount(
            tx.conn,
            "INSERT INTO idempotency_keys(key, payload, result) "
            "VALUES (?, ?, NULL) ON CONFLICT(key) DO NOTHING",
            (key, offered),
        )
        if won == 1:
            result_json = canonical(effect(tx), "effect")
            execute(
                tx.conn, "UPDATE idempotency_keys SET result = ? WHERE key = ?", (result_json, key)
            )
            result = json.loads(result_json)  # the same value a repeat will return
        else:
            stored, result_json = execute(
                tx.conn, "SELECT payload, result FROM idempotency_keys WHERE key = ?", (key,)
            )[0]
            if stored != offered:
                raise KeyReused(key, stored, offered)
            result = json.loads(result_json)
    except BaseException:
        with contextlib.suppress(LabkitError):  # if this fails, the caller's ROLLBACK undoes all
            execute(tx.conn, "ROLLBACK TO run_once")
            execute(tx.conn, "RELEASE run_once")
        raise
    execute(tx.conn, "RELEASE run_once")
    return result
