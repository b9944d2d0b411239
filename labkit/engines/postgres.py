"""A throwaway PostgreSQL 15 server: initdb and ``postgres`` run as the ``postgres`` user.

``initdb`` refuses root, and ``pg_ctl`` detaches (so nothing would stop the server if we died),
so both are run directly, as ``postgres``. The server listens on 127.0.0.1 only, on a free port,
with its unix socket in its temp folder, and accepts one user, ``labkit``, with a generated
password (scram-sha-256).

>>> with PostgresServer() as server:  # doctest: +SKIP
...     db = labkit.connect(server.url)
"""

from __future__ import annotations

import os
import pwd
import secrets
import signal
from pathlib import Path
from urllib.parse import quote as urlquote

from labkit.engines.servers import ServerFailed, Throwaway, binary, free_port, kill_tree

__all__ = ["BIN", "PostgresServer", "require"]

BIN = Path("/usr/lib/postgresql/15/bin")
PACKAGE = "postgresql"
SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "max_connections": "100",  # a room of 30 workers, each with a connection or two
    "dynamic_shared_memory_type": "mmap",  # in the data folder: removed with it
    "logging_collector": "off",
    "log_min_messages": "warning",
    "log_connections": "off",
}


def require() -> None:
    """Raise MissingBinary (naming the Debian package) unless initdb and postgres are installed."""
    for name in ("initdb", "postgres"):
        binary(name, BIN, PACKAGE)


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
            self.run(
                BIN / "initdb", "-D", self.data, "-U", self.role, f"--pwfile={pwfile}",
                "--auth=scram-sha-256", "-E", "UTF8", "--locale=C", "--no-sync",
                "--no-instructions",
            )  # fmt: skip
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
        self.spawn(
            BIN / "postgres", "-D", self.data, "-p", self.port, "-k", self.folder, *options,
            log=self.log,
        )  # fmt: skip

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
