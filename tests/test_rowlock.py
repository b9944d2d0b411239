"""Lesson 02 on a real row lock: on PostgreSQL, B's guard waits on A's fence row, and only there.

Each run starts a throwaway server (skipped loudly without PostgreSQL, failed under
``LABKIT_REQUIRE_POSTGRES=1``) and must leave no server, no folder and no thread behind.
"""

import os
import tempfile
import threading
from pathlib import Path

import pytest

from engines import require_postgres
from labkit.engines.servers import PREFIX, MissingBinary, descendants
from labkit.errors import LabkitError, StaleGeneration


def leftovers() -> tuple[set, set, set]:
    """Our child processes, our servers' temp folders, and B's thread, if any."""
    folders = set(Path(tempfile.gettempdir()).glob(f"{PREFIX}{os.getpid()}-*"))
    threads = {t.name for t in threading.enumerate() if t.name == "labkit-rowlock-B"}
    return set(descendants(os.getpid())), folders, threads


@pytest.fixture(scope="module")
def seen():
    """One run of the story, and what was left running before and after it."""
    require_postgres()
    from labkit.engines import rowlock

    before = leftovers()
    result = rowlock.run(hold=0.0, timeout=5.0)
    return result, before, leftovers()


def test_b_is_blocked_by_a_alone(seen):
    """While A's fenced transaction is open, pg_blocking_pids(B) is exactly {A}: a lock wait."""
    run, _, _ = seen
    assert run.a != run.b
    assert run.blocking == {run.a}
    assert run.wait_event == "Lock/transactionid"


def test_b_holds_the_fence_rows_tuple_lock_and_waits_for_as_transaction(seen):
    """B took the tuple lock on job_fence's row and waits (ShareLock) on A's transaction id."""
    run, _, _ = seen
    rows = [
        (kind, table, mode, granted, holder) for kind, table, mode, granted, _, holder in run.locks
    ]
    assert rows == [
        ("tuple", "job_fence", "ExclusiveLock", True, 0),
        ("transactionid", "-", "ShareLock", False, run.a),
    ]


def test_a_writer_on_another_jobs_fence_row_commits_while_a_is_open(seen):
    """C's guard on job Y commits, seen by another connection, before A's transaction ends."""
    assert seen[0].committed_beside is True


def test_as_stale_write_is_refused_once_b_has_committed(seen):
    """A commits 7, B then commits 8, and A's same write with 7 is StaleGeneration."""
    run, _, _ = seen
    assert isinstance(run.refusal, StaleGeneration)
    assert (run.refusal.offered, run.refusal.current, run.refusal.job) == (7, 8, "invoice-run")
    assert run.waited >= 0
    assert run.text.splitlines()[-1] == "✓ stale write refused"
    assert "✗" not in run.text


def test_no_server_is_left_running(seen):
    """After the run, the server's process, its folder and B's thread are all gone."""
    run, before, after = seen
    assert run.server_pid not in after[0]
    assert not os.path.exists(f"/proc/{run.server_pid}")
    assert after == before


def test_an_error_while_b_waits_still_stops_everything(monkeypatch):
    """A failure with B blocked rolls A back, lets B finish, and stops the server."""
    require_postgres()
    from labkit.engines import rowlock

    before = leftovers()
    monkeypatch.setattr(rowlock, "LOCKS", "SELECT no_such_column FROM pg_locks WHERE pid = $1")
    with pytest.raises(LabkitError, match="no_such_column"):
        rowlock.run(hold=0.0, timeout=5.0)
    assert leftovers() == before


def test_without_postgresql_the_button_says_what_to_install(monkeypatch, capsys):
    """No binaries: the demo prints the Debian package to install, and raises nothing."""
    from labkit.engines import postgres
    from labkit.engines import rowlock

    def missing():
        raise MissingBinary("initdb", "postgresql", postgres.bindir() / "initdb")

    monkeypatch.setattr(postgres, "require", missing)
    assert rowlock.demo() is None
    printed = capsys.readouterr().out
    assert "apt-get install -y postgresql" in printed and "Traceback" not in printed
