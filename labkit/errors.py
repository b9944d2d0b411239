"""labkit's errors: one base class, a few subclasses; each carries its data and says what to do."""

import math

__all__ = ["LabkitError", "BadArgument", "BadArgumentType", "LeaseHeld", "LeaseLost"]
__all__ += ["StaleGeneration", "KeyReused", "KeyNotRecorded", "Busy"]

#: the largest integer SQLite stores: generations and counters stay in 0 .. MAX_INT
MAX_INT = 2**63 - 1


def check_number(
    value, argument: str, *, integer=False, positive=False, signed=False, low=None, high=None
):
    """``value`` as a float (an int if ``integer``), or raise naming ``argument``: BadArgumentType
    for bools and non-numbers; BadArgument for NaN, ±inf, < 0 unless ``signed``, 0 if ``positive``
    and values outside ``low`` .. ``high``."""
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        kind = "an int" if integer else "a number"
        raise BadArgumentType(argument, f"must be {kind}, got {type(value).__name__}")
    try:
        finite = integer or math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    shown = repr(value) if len(repr(value)) <= 40 else f"an int of {value.bit_length()} bits"
    if not finite:
        raise BadArgument(argument, f"must be finite, got {shown}")
    if (value < 0 and not signed) or (positive and value == 0):
        raise BadArgument(argument, f"must be {'> 0' if positive else '>= 0'}, got {shown}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise BadArgument(argument, f"must be in {low or 0} .. {high}, got {shown}")
    return value if integer else float(value)


class LabkitError(Exception):
    """Base class of every error labkit raises."""


class _Argument(LabkitError):
    def __init__(self, argument: str, message: str) -> None:
        self.argument = argument
        super().__init__(f"{argument}: {message}")


class BadArgument(_Argument, ValueError):
    """An argument (named by ``argument``) has an unusable value; nothing was written."""


class BadArgumentType(_Argument, TypeError):
    """An argument (named by ``argument``) has the wrong type; nothing was written."""


class LeaseHeld(LabkitError):
    """Someone holds an unexpired lease: ``name``, ``holder``, ``generation``, ``expires_at``."""

    def __init__(self, name: str, holder: str, generation: int, expires_at: float) -> None:
        self.name, self.holder = name, holder
        self.generation, self.expires_at = generation, expires_at
        super().__init__(
            f"lease {name!r} is held by {holder!r} (generation {generation}) "
            f"until t={expires_at:g}; wait and retry with backoff, or use try_acquire()"
        )


class LeaseLost(LabkitError):
    """Renew or release was refused: ``owner`` and ``generation`` no longer hold lease ``name``."""

    def __init__(self, name: str, owner: str, generation: int) -> None:
        self.name, self.owner, self.generation = name, owner, generation
        super().__init__(
            f"{owner!r} no longer holds lease {name!r} with generation {generation}; "
            "stop protected work and acquire again"
        )


class StaleGeneration(LabkitError):
    """The fence of ``job`` is at ``current``, above the ``offered`` token (None when unknown)."""

    def __init__(self, offered, current, job: str | None = None) -> None:
        self.offered, self.current, self.job = offered, current, job
        what = f"generation {offered}" if offered is not None else "a stale generation"
        where = f" of job {job!r}" if job is not None else ""
        at = f" (already at {current})" if current is not None else ""
        super().__init__(
            f"{what} is below the fence{where}{at}; "
            "this writer is obsolete, its write was rolled back"
        )


class KeyReused(LabkitError):
    """``key`` was first used with payload ``stored``, now with ``offered`` (canonical JSON)."""

    def __init__(self, key: str, stored: str | None, offered: str | None) -> None:
        self.key, self.stored, self.offered = key, stored, offered
        super().__init__(
            f"key {key!r} was first used with payload {stored} and now with {offered}; "
            "use a new key for a different operation"
        )


class KeyNotRecorded(LabkitError):
    """:func:`labkit.run_once` could not record ``key``; ``reason`` says why and what to do."""

    def __init__(self, key: str, reason: str) -> None:
        self.key, self.reason = key, reason
        super().__init__(f"key {key!r} was not recorded: {reason}")


class Busy(LabkitError):
    """The database stayed locked past the busy timeout ``timeout_ms``; nothing was written."""

    def __init__(self, timeout_ms: int) -> None:
        self.timeout_ms = timeout_ms
        super().__init__(f"database still locked after {timeout_ms} ms by another writer; retry")
