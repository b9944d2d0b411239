"""A throwaway PostgreSQL server (whichever version :func:`bindir` finds): initdb and
``postgres`` run as the ``postgres`` user.

``initdb`` refuses root, and ``pg_ctl`` detaches (so nothing would stop the server if we died),
so both are run directly, as ``postgres``. The server listens on 127.0.0.1 only, on a free port,
with its unix socket in its temp folder, and accepts one user, ``labkit``, with a generated
password (scram-sha-256).

>>> with PostgresServer() as server:  # doctest: +SKIP
...     db = labkit.connect(server.url)
"""

from __future__ import annotations

import functools
import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
from pathlib import Path
from urllib.parse import quote as urlquote

from labkit.engines.servers import ServerFailed, Throwaway, binary, free_port, kill_tree

__all__ = ["PostgresServer", "bindir", "require"]

PACKAGE = "postgresql"
SEARCHED = "/usr/lib/postgresql/*/bin"
SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "max_connections": "100",  # a room of 30 workers, each with a connection or two
    "dynamic_shared_memory_type": "mmap",  # in the data folder: removed with it
    "logging_collector": "off",
    "log_min_messages": "warning",
    "log_connections": "off",
}


@functools.lru_cache(maxsize=1)
def bindir() -> Path:
    """Where the server's programs are: ``pg_config --bindir`` if it has ``initdb``, else the
    newest ``/usr/lib/postgresql/*/bin`` that has it (Debian and Ubuntu put the client's
    ``pg_config`` on the PATH, and each server version in its own folder)."""
    found = []
    if pg_config := shutil.which("pg_config"):
        answer = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        found.append(answer.stdout.strip())
    versions = sorted(glob.glob(SEARCHED), key=lambda p: int(p.split("/")[-2].split(".")[0]))
    found += reversed(versions)
    for folder in filter(None, found):
        if os.access(Path(folder) / "initdb", os.X_OK):
            return Path(folder)
    return Path(found[0] if found else SEARCHED)


def require() -> None:
    """Raise MissingBinary (naming the Debian package) unless initdb and postgres are installed."""
    for name in ("initdb", "postgres"):
        binary(name, bindir(), PACKAGE)


class PostgresServer(Throwaway):
    """One PostgreSQL server in a temp folder; ``url`` connects as ``labkit`` to ``postgres``.

    ``kill()`` crashes it (SIGKILL to the server and its backends), ``restart()`` starts it again
    on the same data and port, and ``stop()`` shuts it down fast and removes everything.
    """

    kind = "postgres"
    user = "postgres"
    stop_signal = signal.SIGINT  # "fast" shutdown: roll back open transactions, then exit
    death_signal = signal.SIGQUIT  # "immediate" shutdown, when we are gone

    def __init__(self, *, user: str = "labkit", settings: dict | None = None) -> None:
        super().__init__()
        self.role, self.password = user, secrets.token_urlsafe(18)
        self.settings = {**SETTINGS, **(settings or {})}

    @property
    def url(self) -> str:
        """``postgresql://labkit:PASSWORD@127.0.0.1:PORT/postgres``."""
        return self.url_for()

    def url_for(self, dbname: str = "postgres", *, password: str | None = None, **options) -> str:
        """A URL for ``dbname``, with another ``password`` or query ``options`` if given."""
        secret = urlquote(self.password if password is None else password, safe="")
        query = "&".join(f"{k}={urlquote(str(v), safe='')}" for k, v in options.items())
        url = f"postgresql://{urlquote(self.role)}:{secret}@127.0.0.1:{self.port}/{dbname}"
        return url + (f"?{query}" if query else "")

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def log(self) -> Path:
        return self.folder / "server.log"

    def _start(self) -> None:
        require()
        pwfile = self.folder / "pwfile"
        pwfile.write_text(self.password + "\n")
        ids = pwd.getpwnam(self.user)
        os.chown(pwfile, ids.pw_uid, ids.pw_gid)
        pwfile.chmod(0o600)
        try:
            login = ["-U", self.role, f"--pwfile={pwfile}", "--auth=scram-sha-256"]
            setup = ["-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"]
            self.run(bindir() / "initdb", "-D", self.data, *login, *setup)
        finally:
            pwfile.unlink()
        for attempt in range(3):  # a free port may be taken before the server binds it
            self.port = free_port()
            try:
                return self._launch()
            except ServerFailed as exc:
                if "could not bind" not in exc.log or attempt == 2:
                    raise

    def _launch(self) -> None:
        """Start ``postgres`` on the data folder and wait until it accepts connections."""
        start = self.log.stat().st_size if self.log.exists() else 0
        options = [f"-c{k}={v}" for k, v in self.settings.items()]
        where = ["-D", self.data, "-p", self.port, "-k", self.folder]  # data, port, socket folder
        self.spawn(bindir() / "postgres", *where, *options, log=self.log)

        def ready() -> bool:
            with open(self.log, "rb") as log:
                log.seek(start)
                return b"ready to accept connections" in log.read()

        self.wait_until(ready, f"port {self.port}", self.log)

    def kill(self) -> None:
        """Crash the server: SIGKILL it and its backends. Its data stays for :meth:`restart`."""
        if self.process is not None:
            kill_tree(self.process)
            self.process = None

    def restart(self) -> PostgresServer:
        """Start the server again on the same data folder and port (after ``kill`` or ``stop``)."""
        if self.running:
            raise ServerFailed("restart() needs a stopped server: kill() it first", "")
        if self.folder is None or not self.data.exists():
            raise ServerFailed("restart() needs the data folder of a started server", "")
        self._launch()
        return self
