"""One clock protocol. Library code takes ``clock=`` and calls ``clock.now()``.

:class:`VirtualClock` is moved by hand (tests, lessons); :class:`RealClock`
reads the machine's monotonic clock and is the only place labkit does so.
"""

from __future__ import annotations

import math
import time
from typing import Protocol, runtime_checkable

from labkit.errors import BadArgument, BadArgumentType
from labkit.errors import check_number

__all__ = ["Clock", "VirtualClock", "RealClock", "check_clock", "read_clock"]


@runtime_checkable
class Clock(Protocol):
    """Anything with ``now() -> float`` seconds on a monotonic scale.

    Example:
        >>> isinstance(VirtualClock(), Clock)
        True
    """

    def now(self) -> float:
        """Return the current time in seconds; it never decreases."""
        ...


def check_clock(clock, argument: str = "clock") -> Clock:
    """Return ``clock`` if it has a callable ``now()``, else raise naming ``argument``.

    Raises:
        BadArgumentType: ``clock`` has no ``now()`` method (None, a str, the
            unbound ``VirtualClock.now``, ...).

    Example:
        >>> check_clock(VirtualClock())
        VirtualClock(now=0)
    """
    if not callable(getattr(clock, "now", None)) or isinstance(clock, type):
        raise BadArgumentType(argument, f"must have now(), got {type(clock).__name__}")
    return clock


def read_clock(clock, argument: str = "clock") -> float:
    """Return ``clock.now()``, refusing a clock without ``now()`` or a reading that is not a finite number.

    A clock that answers NaN or None would make every expiry comparison false,
    so a held lease would look free; labkit stops before writing anything.

    Raises:
        BadArgumentType: ``clock`` has no ``now()``. BadArgument: the reading
            is not a finite number. Both name ``argument``.

    Example:
        >>> read_clock(VirtualClock(3))
        3.0
    """
    value = check_clock(clock, argument).now()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadArgument(argument, f"now() must return a finite number, got {value!r}")
    return float(value)


class VirtualClock:
    """A clock that moves only when told to, and never backwards.

    Example:
        >>> clock = VirtualClock()
        >>> clock.advance(10)
        10.0
        >>> clock.now(), clock
        (10.0, VirtualClock(now=10))
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = check_number(start, "start")

    def now(self) -> float:
        """Return the current virtual time in seconds."""
        return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (>= 0) and return the new time.

        Raises:
            BadArgument: for a negative, NaN or infinite step, or one that would
                carry the clock past the largest finite time (the clock is unchanged).
        """
        now = self._now + check_number(seconds, "seconds")
        if not math.isfinite(now):
            raise BadArgument(
                "seconds", f"would move the clock past the largest finite time: {seconds!r}"
            )
        self._now = now
        return self._now

    def __repr__(self) -> str:
        return f"VirtualClock(now={self._now:g})"


class RealClock:
    """The machine's monotonic clock (``time.monotonic()``), in seconds.

    It is one clock for every process on one machine, and means nothing on another.
    """

    def now(self) -> float:
        """Return ``time.monotonic()``."""
        return time.monotonic()

    def __repr__(self) -> str:
        return "RealClock()"
