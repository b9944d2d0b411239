"""Lessons 04-08's mechanisms: issuers (04), timing (05-06), recovery (07), effects (08)."""

from labkit.errors import BadArgumentType


def check_type(value, kind: type, argument: str):
    """Return ``value`` if it is a ``kind``; else raise BadArgumentType naming ``argument``."""
    if not isinstance(value, kind):
        raise BadArgumentType(argument, f"must be a {kind.__name__}, got {type(value).__name__}")
    return value
