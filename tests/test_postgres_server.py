"""The throwaway PostgreSQL server: it answers on 127.0.0.1 only, and is gone on every exit path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engines import require_postgres
from labkit.engines import postgres, servers
from labkit.engines.postgres import PostgresServer
from polling import wait_for

PARENT = """
import sys, time
from labkit.engines.postgres import PostgresServer
with PostgresServer() as server:
    print(server.process.pid, server.folder, server.port, flush=True)
    time.sleep(600)
"""


@pytest.fixture
def _postgres():
    require_postgres()


needs_postgres = pytest.mark.usefixtures("_postgres")


def gone(pid: int) -> bool:
    """True once ``pid`` is no process (or only a zombie, dead and waiting for its reaper)."""
    return servers.proc_state(pid) in ("gone", "Z")


def listening(port: int) -> list[str]:
    """The local addresses of every TCP socket listening on ``port`` (IPv4 and IPv6)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:
                found.append(address)
    return found


@needs_postgres
def test_it_starts_answers_on_loopback_only_and_is_gone_after_the_with_block():
    """The server answers as labkit with its password, listens on 127.0.0.1 alone, runs as
    postgres, allows 30+ clients; after the block it and its backends are gone with its folder."""
    import psycopg

    with PostgresServer() as server:
        with psycopg.connect(server.url) as conn:
            row = conn.execute("SELECT current_user, current_setting('max_connections')::int")
            assert row.fetchone()[0] == "labkit"
            assert conn.execute("SHOW max_connections").fetchone()[0] == "100"
        assert listening(server.port) == ["0100007F"]  # 127.0.0.1, and no IPv6 socket
        status = Path(f"/proc/{server.process.pid}/status").read_text()
        uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
        assert int(uid) == __import__("pwd").getpwnam("postgres").pw_uid
        pid, folder = server.process.pid, server.folder
        below = servers.descendants(pid)
        assert below  # the background processes of a running postgres
    assert gone(pid) and all(map(gone, below))
    assert not folder.exists()
    assert listening(server.port) == []


@needs_postgres
def test_a_wrong_password_is_refused():
    """The generated password is the only one that opens it (scram-sha-256)."""
    import psycopg

    with PostgresServer() as server:
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(server.url_for(password="guessed"))


def start_parent() -> tuple[subprocess.Popen, int, Path, list[int]]:
    """A Python process that starts a server and sleeps: its pid, the server's pid and folder."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    pid, folder, _port = parent.stdout.readline().split()
    wait_for(lambda: servers.descendants(int(pid)), "the server's background processes")
    return parent, int(pid), Path(folder), servers.descendants(int(pid))


@needs_postgres
def test_a_sigkilled_parent_takes_its_server_along():
    """SIGKILL the parent: PR_SET_PDEATHSIG stops the server and its backends; the next start
    sweeps the folder the dead parent left."""
    parent, pid, folder, below = start_parent()
    parent.kill()
    parent.wait()
    wait_for(lambda: gone(pid) and all(map(gone, below)), "the orphaned server to stop")
    assert folder.exists()  # nobody was left to remove it
    assert str(folder) in servers.sweep()
    assert not folder.exists()


@needs_postgres
def test_an_interrupted_parent_stops_its_server_and_removes_its_folder():
    """Ctrl-C in the parent (KeyboardInterrupt inside the with block) stops the server on the way out."""
    parent, pid, folder, below = start_parent()
    parent.send_signal(signal.SIGINT)
    assert parent.wait(30) != 0
    assert gone(pid) and all(map(gone, below))
    assert not folder.exists()


def test_a_missing_binary_names_the_debian_package(monkeypatch, tmp_path):
    """Without initdb, start() says which package to install and leaves no folder behind."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no pg_config
    monkeypatch.setattr(postgres, "SEARCHED", str(tmp_path / "nowhere" / "*" / "bin"))
    postgres.bindir.cache_clear()
    before = set(Path("/tmp").glob(servers.PREFIX + f"{os.getpid()}-*"))
    server = PostgresServer()
    with pytest.raises(servers.MissingBinary, match=r"apt-get install -y postgresql") as caught:
        server.start()
    assert (caught.value.name, caught.value.package) == ("initdb", "postgresql")
    assert not server.folder.exists()
    assert set(Path("/tmp").glob(servers.PREFIX + f"{os.getpid()}-*")) == before
    postgres.bindir.cache_clear()


def test_the_server_is_found_by_pg_config_or_by_searching_every_version(monkeypatch, tmp_path):
    """No version is named: pg_config --bindir first, else the newest /usr/lib/postgresql/*/bin."""
    for version in ("9.6", "13", "17"):
        folder = tmp_path / version / "bin"
        folder.mkdir(parents=True)
        (folder / "initdb").write_text("#!/bin/sh\n")
        (folder / "initdb").chmod(0o755)
    (tmp_path / "18" / "bin").mkdir(parents=True)  # a client-only folder: no initdb
    monkeypatch.setattr(postgres, "SEARCHED", str(tmp_path / "*" / "bin"))
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    postgres.bindir.cache_clear()
    try:
        assert postgres.bindir() == tmp_path / "17" / "bin"
        tool = tmp_path / "tools"
        tool.mkdir()
        (tool / "pg_config").write_text(f"#!/bin/sh\necho {tmp_path / '13' / 'bin'}\n")
        (tool / "pg_config").chmod(0o755)
        monkeypatch.setenv("PATH", str(tool))
        postgres.bindir.cache_clear()
        assert postgres.bindir() == tmp_path / "13" / "bin"
    finally:
        postgres.bindir.cache_clear()
