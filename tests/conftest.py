"""Tiny shared fixtures: a virtual clock, labkit databases on temp files, a lease authority."""

from __future__ import annotations

import sqlite3

import pytest

import labkit


@pytest.fixture
def clock() -> labkit.VirtualClock:
    """A VirtualClock at t=0."""
    return labkit.VirtualClock()


@pytest.fixture
def db_path(tmp_path):
    """The path of a fresh SQLite file (not created yet)."""
    return str(tmp_path / "lab.db")


@pytest.fixture
def db(db_path):
    """``labkit.connect`` on a temp file (WAL, labkit's schema); closed afterwards."""
    database = labkit.connect(db_path, busy_timeout_ms=2000)
    yield database
    database.conn.close()


@pytest.fixture
def files(tmp_path):
    """Open labkit databases on fresh files under tmp_path by short name; all closed afterwards."""
    opened = []

    def open_(name):
        db = labkit.connect(str(tmp_path / f"{name}.db"))
        opened.append(db)
        return db
    yield open_
    for db in opened:
        db.conn.close()


@pytest.fixture
def leases(db, clock) -> labkit.LeaseAuthority:
    """A LeaseAuthority on ``db`` reading ``clock``."""
    return labkit.LeaseAuthority(db, clock)


def dump(path: str) -> list[str]:
    """The whole database at ``path`` as SQL, read through a separate plain connection."""
    conn = sqlite3.connect(path)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


@pytest.fixture(name="dump")
def dump_fixture(db_path):
    """A function returning the dump of ``db_path`` now: compare before and after."""
    return lambda: dump(db_path)
