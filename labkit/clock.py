"""One clock protocol: code takes ``clock=``, calls ``clock.now()``; only RealClock reads time."""

import math
import time
from typing import Protocol, runtime_checkable

from labkit.errors import BadArgument, BadArgumentType, check_number

__all__ = ["Clock", "VirtualClock", "RealClock", "check_clock", "read_clock"]


@runtime_checkable
class Clock(Protocol):
    """Anything with ``now() -> float``: seconds on a scale that never goes back."""

    def now(self) -> float:
        """Return the current time in seconds; it never decreases."""


def check_clock(clock) -> Clock:
    """Return ``clock`` if it has a callable ``now()``, else raise BadArgumentType."""
    if not callable(getattr(clock, "now", None)) or isinstance(clock, type):
        raise BadArgumentType("clock", f"must have now(), got {type(clock).__name__}")
    return clock


def read_clock(clock) -> float:
    """Return ``clock.now()``, refusing NaN (a held lease would look free) and non-numbers."""
    value = check_clock(clock).now()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadArgument("clock", f"now() must return a finite number, got {value!r}")
    return float(value)


class VirtualClock:
    """A clock that moves only when told to, and never backwards.

    >>> clock = VirtualClock()
    >>> clock.advance(10), clock.now(), clock
    (10.0, 10.0, VirtualClock(now=10))
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = check_number(start, "start")

    def now(self) -> float:
        """Return the current virtual time in seconds."""
        return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (finite, >= 0) and return the new time."""
        now = self._now + check_number(seconds, "seconds")
        if not math.isfinite(now):
            raise BadArgument("seconds", f"would move the clock past the largest time: {seconds!r}")
        self._now = now
        return now

    def __repr__(self) -> str:
        return f"VirtualClock(now={self._now:g})"


class RealClock:
    """The machine's deadline clock: ``CLOCK_BOOTTIME`` on Linux, which is never set back.

    It counts suspend (``time.monotonic()`` stops while the machine sleeps); NTP slews its rate,
    and it restarts at boot."""

    def now(self) -> float:
        """Return the clock's reading in seconds since boot."""
        return time.clock_gettime(getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC))
