"""Waiting for real processes: poll a condition, with a bound against hanging (never a speed assertion)."""

from __future__ import annotations

import time

WAIT = 15.0   # a bound against hanging, never an assertion about speed


def wait_for(condition, what: str, timeout: float = WAIT, every: float = 0.005):
    """Poll ``condition()`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(every)
    return value
