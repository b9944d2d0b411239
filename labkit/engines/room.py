"""The instructor's side of a classroom: :class:`Room` (pause, protect, reset, the event log),
:class:`Watchdog` (time bounded from outside the students' sessions), and :func:`serve`.

A student may change their own session's timeouts, so nothing a student's session sets bounds
it. The watchdog is a thread with its own superuser connection that runs ``labkit.tick`` (see
:data:`labkit.engines.classroom.TICK`) every ``every`` seconds: a student's backend holding a
transaction, or blocking another, for more than ``bound`` seconds is ended, so one student holds
the room up for at most ``bound + every`` (0.9 s by default).
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import threading
from pathlib import Path

from labkit.engines.classroom import LIMITS, bad_name, install
from labkit.engines.postgres_db import driver
from labkit.errors import BadArgument, BadArgumentType, check_number

__all__ = ["LAN_RULE", "Room", "Watchdog", "lan_warning", "main", "serve"]

#: the room's backends: registrations and students (the instructor's and the watchdog's are not)
OTHERS = """pid <> pg_backend_pid() AND backend_type = 'client backend'
    AND (usename = 'labkit_room' OR usesysid IN (SELECT member FROM pg_auth_members
        WHERE roleid = 'labkit_student'::regrole))"""
EVENTS = """SELECT id, extract(epoch FROM at)::float8, extract(epoch FROM began)::float8,
    student, action, outcome, generation, extract(epoch FROM until)::float8 FROM labkit.events"""
TALLY = """SELECT student, count(*) FILTER (WHERE action = 'write' AND outcome = 'ok'),
    count(*) FILTER (WHERE action = 'write' AND outcome = 'rejected'),
    count(*) FILTER (WHERE action = 'pause'), max(id)
    FROM labkit.events WHERE id > $1 AND id <= $2 GROUP BY student"""


class Room:
    """The instructor's handle on a classroom: ``url`` is the superuser's (or a file holding it,
    as :func:`serve` writes it)."""

    def __repr__(self) -> str:
        return "<labkit classroom Room>"  # not the URL: it holds the superuser's password

    def __init__(self, url: str | os.PathLike) -> None:
        if isinstance(url, os.PathLike) or (isinstance(url, str) and os.path.isfile(url)):
            url = Path(url).read_text().strip()
        if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
            raise BadArgument("url", "must be the instructor's postgresql:// URL or its file")
        self.url, self.conn = (
            url,
            driver().connect(url, autocommit=True, cursor_factory=driver().RawCursor),
        )
        self.conn.execute("SET lock_timeout = '2s'")

    def close(self) -> None:
        self.conn.close()

    def students(self) -> list[str]:
        """The names registered, in alphabetical order."""
        return [n for (n,) in self.conn.execute("SELECT name FROM labkit.students ORDER BY 1")]

    @property
    def protected(self) -> bool:
        """Whether the server fences every write (only the instructor can change it)."""
        sql = "SELECT value = 'on' FROM labkit.room WHERE key = 'protected'"
        return self.conn.execute(sql).fetchone()[0]

    def protect(self, on: bool = True) -> None:
        """Fence every student's write (``on``), or let them all land (the unprotected run)."""
        if not isinstance(on, bool):
            raise BadArgumentType("on", f"must be True or False, got {type(on).__name__}")
        sql = "UPDATE labkit.room SET value = $1 WHERE key = 'protected'"
        self.conn.execute(sql, ["on" if on else "off"])

    def pause(self, names, seconds: float) -> None:
        """Queue a pause of ``seconds`` for each of ``names``: each time that student next wins the
        lease, it sleeps one queued pause while holding it. An unknown name raises, naming it."""
        seconds = check_number(seconds, "seconds", positive=True, high=3600)
        if isinstance(names, str):
            names = [names]
        if not hasattr(names, "__iter__"):
            raise BadArgumentType("names", f"must be a name or a list, got {type(names).__name__}")
        names = [bad_name(n, "names") for n in names]
        known = set(self.students())
        if unknown := [n for n in names if n not in known]:
            raise BadArgument(
                "names",
                f"no student named {', '.join(map(repr, unknown))} in this room "
                f"(registered: {', '.join(sorted(known)) or 'nobody yet'})",
            )
        with self.conn.transaction():
            for name in names:
                sql = "INSERT INTO labkit.pauses (student, seconds) VALUES ($1, $2)"
                self.conn.execute(sql, [name, seconds])

    def reset(self) -> None:
        """Empty the room whatever a student left open: logins closed, their backends ended, then
        every student's role, the events, pauses, lease and fence."""
        from psycopg import sql

        roles = [r for (r,) in self.conn.execute("SELECT role FROM labkit.students")]
        try:
            with self.conn.transaction():  # nobody logs in again meanwhile
                for role in map(sql.Identifier, [*roles, "labkit_room"]):
                    self.conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(role))
            ended = f"SELECT pg_terminate_backend(pid, 1000) FROM pg_stat_activity WHERE {OTHERS}"
            self.conn.execute(ended)
            with self.conn.transaction():
                for role in map(sql.Identifier, roles):  # DROP OWNED: its grants too
                    self.conn.execute(sql.SQL("DROP OWNED BY {0}; DROP ROLE {0}").format(role))
                self.conn.execute(
                    "TRUNCATE labkit.students, labkit.grants, labkit.writes, labkit.events, "
                    "labkit.pauses RESTART IDENTITY"
                )
                self.conn.execute(
                    "UPDATE labkit.lease SET holder = NULL, generation = 0, expires = NULL, "
                    "granted = NULL"
                )
                self.conn.execute("UPDATE labkit.job_fence SET generation = 0")
                self.conn.execute("SELECT lo_unlink(oid) FROM pg_largeobject_metadata")
                self.conn.execute("SELECT labkit.tick(1e9)")  # ends nobody; restores the login
        finally:
            self.conn.execute("ALTER ROLE labkit_room LOGIN")

    def events(self, since: int = 0) -> list[tuple]:
        """Rows ``(id, at, began, student, action, outcome, generation, until)`` after id
        ``since``; the times are seconds since the epoch, from the server's clock."""
        return self.conn.execute(f"{EVENTS} WHERE id > $1 ORDER BY id", [since]).fetchall()

    def window(self, since: int, seconds: float) -> list[tuple]:
        """The rows of :meth:`events` after id ``since`` and in the last ``seconds`` of the log:
        what a live view needs, read through the index on ``at`` (never the whole log)."""
        sql = f"""{EVENTS} WHERE id > $1 AND at >= (SELECT max(at) FROM labkit.events)
            - make_interval(secs => $2) ORDER BY id"""
        return self.conn.execute(sql, [since, seconds]).fetchall()

    def tally(self, since: int = 0, upto: int | None = None) -> list[tuple]:
        """Per student, counted by the server over the events after id ``since`` up to ``upto``
        (default: all): ``(student, writes committed, stale writes refused, pauses, last id)``."""
        upto = 2**63 - 1 if upto is None else upto
        return self.conn.execute(TALLY, [since, upto]).fetchall()

    def fence(self) -> int:
        """The generation the fence holds now."""
        return self.conn.execute("SELECT generation FROM labkit.job_fence").fetchone()[0]


class Watchdog:
    """Ends student backends that hold the room up: ``with Watchdog(url):`` or start()/stop().
    ``ended`` counts what it ended or undid; ``error`` is the last error a round met."""

    def __init__(self, url: str, *, bound: float = 0.8, every: float = 0.1) -> None:
        self.bound = check_number(bound, "bound", positive=True, high=60)
        self.every = check_number(every, "every", positive=True, high=60)
        self.url, self.ended, self.error, self.conn = url, 0, None, None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="labkit-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self.conn = driver().connect(self.url, autocommit=True, cursor_factory=driver().RawCursor)
        self.thread.start()
        return self

    def _run(self) -> None:
        psycopg = driver()
        while not self.stopping.wait(self.every):
            try:
                row = self.conn.execute("SELECT labkit.tick($1)", [self.bound]).fetchone()
                self.ended += row[0]
            except psycopg.Error as exc:  # keep watching: one bad round must not end the watch
                self.error = exc
                if self.conn.broken or self.conn.closed:
                    with contextlib.suppress(psycopg.Error):
                        self.conn = driver().connect(
                            self.url, autocommit=True, cursor_factory=driver().RawCursor
                        )

    def stop(self) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(10)
        if self.conn is not None:
            self.conn.close()

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


#: the one pg_hba.conf line ``--lan`` adds: the superuser and the instructor stay on 127.0.0.1
LAN_RULE = "host postgres labkit_room,+labkit_student 0.0.0.0/0 scram-sha-256"
LAN_WARNING = (
    "WARNING: the classroom server listens on {address}: anyone on that network can reach it "
    "and try the room's secret. Only the students' logins are open to it, never the "
    "instructor's. Use it only on a network you trust, and stop the server (Ctrl-C) when the "
    "class ends."
)


def lan_warning(address: str) -> str:
    """The warning printed when the server binds ``address`` instead of 127.0.0.1."""
    return LAN_WARNING.format(address=address)


def _secret_file(url: str, port: int) -> Path:
    """Write ``url`` to a new file only its owner can read; return its path."""
    path = Path(tempfile.gettempdir()) / f"labkit-room-{os.getuid()}-{port}.url"
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(url + "\n")
    return path


def serve(
    address: str = "127.0.0.1",
    *,
    ttl: float = 1.0,
    cap: float | None = None,
    seats: int = 40,
    out=print,
    wait=None,
) -> None:
    """Start the room's server on ``address``, print the students' line, write the instructor's
    URL to an owner-only file, and keep it up (watchdog running) until ``wait()`` returns or is
    interrupted (default: until Ctrl-C); the server and the file go on every exit path."""
    import ipaddress

    from labkit.engines.postgres import PostgresServer

    try:
        ipaddress.ip_address(address)
    except (ValueError, TypeError):
        raise BadArgument("address", f"{address!r} is not an IP address, e.g. 192.168.1.20")
    ttl = check_number(ttl, "ttl", positive=True, high=3600)
    seats = check_number(seats, "seats", integer=True, positive=True, high=1000)
    if cap is not None and not (math.isfinite(cap) and ttl <= cap <= 36000):
        raise BadArgument("cap", f"must be at least the ttl ({ttl:g}) and finite, got {cap!r}")
    if address != "127.0.0.1":
        out(lan_warning(address))

    class RoomServer(PostgresServer):
        def _launch(self) -> None:  # the LAN reaches the registration and students' logins only
            hba = self.data / "pg_hba.conf"
            line = LAN_RULE + "\n"
            if address != "127.0.0.1" and line not in hba.read_text():
                with open(hba, "a") as f:
                    f.write(line)
            super()._launch()

    listen = address if address == "127.0.0.1" else f"127.0.0.1,{address}"  # ours stays local
    settings = {
        "listen_addresses": listen,
        "max_connections": str(seats * LIMITS["connections"] + 30),
    }
    with RoomServer(settings=settings) as server:
        password = install(server.url, ttl=ttl, cap=cap, seats=seats)
        room = f"postgresql://labkit_room:{password}@{address}:{server.port}/postgres"
        secret = _secret_file(server.url, server.port)
        try:
            with Watchdog(server.url):
                out(
                    f"Students: pip install the labkit wheel (see README), then in Python:\n"
                    f"  import labkit.classroom\n"
                    f"  worker = labkit.classroom.join({room!r}, 'your_name')"
                )
                out(
                    f"Instructor: your URL is in {secret} (readable only by you):\n"
                    f"  room = labkit.classroom.Room({str(secret)!r})"
                )
                out("Ctrl-C stops the server and deletes the room.")
                with contextlib.suppress(KeyboardInterrupt):
                    (wait or threading.Event().wait)()
        finally:
            secret.unlink(missing_ok=True)


def main(argv=None) -> int:
    """``python -m labkit.classroom serve [--lan ADDRESS] [--ttl S] [--cap S] [--seats N]``."""
    import argparse

    def number(kind, low, high):
        def parse(text: str):
            try:
                value = kind(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
            if not (math.isfinite(value) and low < value <= high):
                raise argparse.ArgumentTypeError(f"must be above {low} and at most {high}")
            return value

        return parse

    parser = argparse.ArgumentParser(prog="python -m labkit.classroom")
    command = parser.add_subparsers(dest="command", required=True).add_parser("serve")
    command.add_argument("--lan", metavar="ADDRESS", help="listen on this address, not 127.0.0.1")
    command.add_argument("--ttl", type=number(float, 0, 3600), default=1.0, help="lease seconds")
    command.add_argument("--cap", type=number(float, 0, 36000), help="longest hold (10 leases)")
    command.add_argument("--seats", type=number(int, 0, 1000), default=40, help="names (40)")
    args = parser.parse_args(argv)
    try:
        serve(args.lan or "127.0.0.1", ttl=args.ttl, cap=args.cap, seats=args.seats)
    except BadArgument as exc:
        parser.error(str(exc))
    return 0
