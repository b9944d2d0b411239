"""The clocks: a virtual one moved by hand, and the machine's monotonic one."""

import math

import pytest

import labkit
from labkit.clock import read_clock
from labkit.errors import check_number


def test_virtual_clock_starts_where_told_and_moves_only_when_advanced():
    """now() stays put until advance(); advance returns the new time."""
    clock = labkit.VirtualClock(start=5)
    assert [clock.now(), clock.now()] == [5.0, 5.0]
    assert clock.advance(2.5) == 7.5
    assert clock.advance(0) == 7.5
    assert clock.now() == 7.5
    assert repr(clock) == "VirtualClock(now=7.5)"


def test_virtual_clock_refuses_to_go_backwards_and_stays_put():
    """A negative step raises BadArgument naming seconds, and the time is unchanged."""
    clock = labkit.VirtualClock(start=10)
    with pytest.raises(labkit.BadArgument, match="seconds"):
        clock.advance(-1)
    assert clock.now() == 10.0


@pytest.mark.parametrize("step", [math.nan, math.inf, -math.inf, 10 ** 400])
def test_virtual_clock_refuses_non_finite_steps(step):
    """NaN, infinite and unrepresentable steps are refused; the clock does not move."""
    clock = labkit.VirtualClock()
    with pytest.raises(labkit.BadArgument, match="seconds"):
        clock.advance(step)
    assert clock.now() == 0.0


def test_virtual_clock_refuses_a_step_that_would_overflow():
    """Two huge finite steps would reach infinity: the second is refused, time unchanged."""
    clock = labkit.VirtualClock(start=1e308)
    with pytest.raises(labkit.BadArgument, match="seconds"):
        clock.advance(1e308)
    assert clock.now() == 1e308


def test_real_clock_is_monotonic():
    """RealClock.now() never decreases between readings."""
    clock = labkit.RealClock()
    readings = [clock.now() for _ in range(1000)]
    assert readings == sorted(readings)
    assert isinstance(clock, labkit.Clock) and isinstance(labkit.VirtualClock(), labkit.Clock)


def test_check_seconds_accepts_ints_and_floats_as_floats():
    """Ints and floats become floats; zero is allowed unless refused."""
    assert check_number(3, "ttl") == 3.0 and isinstance(check_number(3, "ttl"), float)
    assert check_number(0, "ttl") == 0.0
    with pytest.raises(labkit.BadArgument, match="ttl"):
        check_number(0, "ttl", positive=True)


def test_read_clock_refuses_a_clock_that_answers_nonsense():
    """A clock whose now() is NaN, None or a bool is refused, naming the clock."""
    class Broken:
        def __init__(self, value):
            self.value = value

        def now(self):
            return self.value

    assert read_clock(Broken(3)) == 3.0
    for value in (math.nan, math.inf, None, True, "1"):
        with pytest.raises(labkit.BadArgument, match="clock"):
            read_clock(Broken(value))
