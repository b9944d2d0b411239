"""One rule for tests that need something this machine may lack (a browser, a server)."""

import os
import warnings

import pytest


def require(what: str, reason: str | None, variable: str) -> None:
    """Go on if ``reason`` is None; else skip loudly, or fail when ``$variable`` is 1."""
    if reason is None:
        return
    if os.environ.get(variable) == "1":
        pytest.fail(f"{what} FAILED: {reason} ({variable}=1)")
    message = f"{what} SKIPPED: {reason}; or set {variable}=1 to make this a failure"
    print(f"\n*** {message} ***")
    warnings.warn(message, pytest.PytestWarning, stacklevel=2)
    pytest.skip(message)
