"""Knobs: the numbers a scenario, a worker or a slider is given, checked in one place.

Every scenario in :mod:`labkit.scenarios` takes its knobs as keyword-only
numbers (``pause=30.0``, ``ttl=10.0``...), and every fault a
:class:`~labkit.worker.Worker` plans is a number too. :func:`check_knob`
refuses a bad one before anything runs, naming the knob.
"""

from __future__ import annotations

import math
from typing import Any

from .errors import BadArgument, BadArgumentType

__all__ = ["check_knob"]


def check_knob(value: Any, name: str, *, positive: bool = False, integer: bool = False,
               low: float | None = None, high: float | None = None) -> Any:
    """Return a validated knob value, or raise naming the knob.

    Args:
        value: what the caller passed.
        name: the knob's name, used in the error.
        positive: require > 0 (else >= 0).
        integer: require an int (bools refused).
        low, high: optional inclusive bounds.

    Returns:
        The value as a float (as an int when ``integer``).

    Raises:
        BadArgumentType: not a number (or not an int when ``integer``).
        BadArgument: NaN, infinite, negative, zero when ``positive``, or out of bounds.

    Example:
        >>> check_knob(30, "pause")
        30.0
        >>> check_knob(-1, "pause")
        Traceback (most recent call last):
        ...
        labkit.errors.BadArgument: pause: must be >= 0, got -1
    """
    if isinstance(value, bool) or not isinstance(value, (int,) if integer else (int, float)):
        kind = "an int" if integer else "a number"
        raise BadArgumentType(name, f"must be {kind}, got {type(value).__name__}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
        raise BadArgument(name, f"is too large, got an int of {value.bit_length()} bits") from None
    if not finite:
        raise BadArgument(name, f"must be finite, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise BadArgument(name, f"must be {'> 0' if positive else '>= 0'}, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise BadArgument(name, f"must be in {low} .. {high}, got {value!r}")
    return value if integer else float(value)
