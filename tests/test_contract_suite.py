"""The contract suite's own bookkeeping: what stays SQLite-only is listed, by a real test's name."""

import importlib

from engines import CONTRACT, SQLITE_ONLY


def test_every_sqlite_only_test_exists_and_gives_its_reason():
    """Each name in SQLITE_ONLY is a test of a contract module, with a reason of its own."""
    tests = set()
    for module in CONTRACT:
        tests |= {name for name in vars(importlib.import_module(module)) if name.startswith("test_")}
    assert set(SQLITE_ONLY) <= tests, set(SQLITE_ONLY) - tests
    assert all(reason.strip() for reason in SQLITE_ONLY.values())
