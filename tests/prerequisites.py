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


def require_sandbox() -> None:
    """Go on only if answers run under bubblewrap (``LABKIT_REQUIRE_SANDBOX=1``: else fail)."""
    from labkit.grading import judge

    missing = None if judge.sandboxed() else "bubblewrap (bwrap) is missing or LABKIT_NO_SANDBOX=1"
    require("the sandbox test", missing, "LABKIT_REQUIRE_SANDBOX")
