"""Classroom mode on one PostgreSQL server: a room of students' workers on one lease and one fence.

The superuser that initdb made is the instructor's login. It installs the ``labkit`` schema,
owned by ``labkit_instructor`` (no login). Students reach the server through ``labkit_room``,
whose only right is to EXECUTE ``labkit.register(name)``: that makes the student's own login
role and returns its password and a per-student secret. A student's role, a member of
``labkit_student``, may only EXECUTE the ``SECURITY DEFINER`` functions ``acquire``, ``renew``,
``release`` and ``write``; each checks the caller's name, secret and login role, and runs with
``search_path = labkit, pg_temp``. Everything else is revoked from PUBLIC: the tables, the public
schema and temporary tables. Each function logs what it answered in ``labkit.events``, stamped
by the server's ``clock_timestamp()``. The instructor pauses students through ``labkit.pauses``:
a student's worker that next wins the lease sleeps that long while holding it (past its lease),
then writes with its old generation. Each grant raises the fence to the new generation, so a
paused holder's fenced write is refused as soon as anyone else has held the lease.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from labkit.engines.postgres_db import driver
from labkit.errors import BadArgument, LabkitError, check_number

__all__ = ["INSTALL", "NAME", "Room", "RoomRefused", "bad_name", "install"]

NAME = re.compile(r"[a-z][a-z0-9_]{0,29}")  # a student's name: also their role's, after student_
JOB = "job"

_FUNCTIONS = {
    "_me(p_name text, p_secret text) RETURNS void": """
    IF NOT EXISTS (SELECT 1 FROM students WHERE name = p_name AND role = session_user
                   AND secret = sha256(convert_to(p_secret, 'UTF8'))) THEN
        RAISE EXCEPTION 'labkit: wrong name or secret for this login' USING ERRCODE = '28P01';
    END IF;""",
    "register(p_name text) RETURNS TABLE(login text, password text, secret text)": """
    IF p_name IS NULL OR p_name !~ '^[a-z][a-z0-9_]{0,29}$' THEN
        RAISE EXCEPTION 'labkit: a student name is 1 to 30 of a-z, 0-9, _ (a letter first)'
            USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM students WHERE name = p_name) THEN
        RAISE EXCEPTION 'labkit: the name % is taken: pick another', p_name USING ERRCODE = '42710';
    END IF;
    login := 'student_' || p_name;
    password := replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '');
    secret := replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '');
    EXECUTE format('CREATE ROLE %I LOGIN PASSWORD %L IN ROLE labkit_student CONNECTION LIMIT 4',
                   login, password);
    INSERT INTO students (name, role, secret)
        VALUES (p_name, login, sha256(convert_to(secret, 'UTF8')));
    INSERT INTO events (student, action, outcome) VALUES (p_name, 'join', 'ok');
    RETURN NEXT;""",
    "acquire(p_name text, p_secret text) RETURNS TABLE(gen bigint, ttl float8, pause float8)": """
    PERFORM labkit._me(p_name, p_secret);
    SELECT value::float8 INTO ttl FROM room WHERE key = 'ttl';
    UPDATE lease SET holder = p_name, generation = lease.generation + 1,
        expires = clock_timestamp() + make_interval(secs => ttl)
        WHERE job = 'job' AND (lease.holder IS NULL OR lease.expires <= clock_timestamp())
        RETURNING lease.generation, lease.expires INTO gen, till;
    IF gen IS NULL THEN
        INSERT INTO events (student, action, outcome) VALUES (p_name, 'acquire', 'held');
        RETURN;
    END IF;
    INSERT INTO grants (generation, student) VALUES (gen, p_name);
    UPDATE job_fence SET generation = greatest(generation, gen) WHERE job = 'job';
    INSERT INTO events (student, action, outcome, generation, until)
        VALUES (p_name, 'acquire', 'ok', gen, till);
    DELETE FROM pauses WHERE student = p_name RETURNING seconds INTO pause;
    pause := coalesce(pause, 0);
    IF pause > 0 THEN
        INSERT INTO events (student, action, outcome, generation, until)
            VALUES (p_name, 'pause', 'ok', gen, clock_timestamp() + make_interval(secs => pause));
    END IF;
    RETURN NEXT;""",
    "renew(p_name text, p_secret text, p_gen bigint) RETURNS boolean": """
    PERFORM labkit._me(p_name, p_secret);
    UPDATE lease SET expires = clock_timestamp()
            + make_interval(secs => (SELECT value::float8 FROM room WHERE key = 'ttl'))
        WHERE job = 'job' AND holder = p_name AND generation = p_gen
          AND expires > clock_timestamp()
        RETURNING expires INTO till;
    INSERT INTO events (student, action, outcome, generation, until)
        VALUES (p_name, 'renew', CASE WHEN till IS NULL THEN 'lost' ELSE 'ok' END, p_gen, till);
    RETURN till IS NOT NULL;""",
    "release(p_name text, p_secret text, p_gen bigint) RETURNS boolean": """
    PERFORM labkit._me(p_name, p_secret);
    UPDATE lease SET holder = NULL, expires = NULL
        WHERE job = 'job' AND holder = p_name AND generation = p_gen
          AND expires > clock_timestamp()
        RETURNING generation INTO done;
    INSERT INTO events (student, action, outcome, generation)
        VALUES (p_name, 'release', CASE WHEN done IS NULL THEN 'lost' ELSE 'ok' END, p_gen);
    RETURN done IS NOT NULL;""",
    "write(p_name text, p_secret text, p_gen bigint, p_fenced boolean) RETURNS boolean": """
    PERFORM labkit._me(p_name, p_secret);
    IF NOT EXISTS (SELECT 1 FROM grants WHERE generation = p_gen AND student = p_name) THEN
        RAISE EXCEPTION 'labkit: generation % was never granted to %', p_gen, p_name
            USING ERRCODE = '22023';
    END IF;
    IF p_fenced THEN
        UPDATE job_fence SET generation = p_gen WHERE job = 'job' AND generation <= p_gen
            RETURNING generation INTO done;
        IF done IS NULL THEN
            INSERT INTO events (student, action, outcome, generation, began)
                VALUES (p_name, 'write', 'rejected', p_gen, now());
            RETURN false;
        END IF;
    ELSE
        UPDATE job_fence SET generation = greatest(generation, p_gen) WHERE job = 'job';
    END IF;
    INSERT INTO writes (student, generation) VALUES (p_name, p_gen);
    INSERT INTO events (student, action, outcome, generation, began)
        VALUES (p_name, 'write', 'ok', p_gen, now());
    RETURN true;""",
}

_TABLES = """
CREATE TABLE labkit.room (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE labkit.students (name text PRIMARY KEY, role text UNIQUE NOT NULL,
    secret bytea NOT NULL);
CREATE TABLE labkit.lease (job text PRIMARY KEY, holder text, generation bigint NOT NULL,
    expires timestamptz);
CREATE TABLE labkit.grants (generation bigint PRIMARY KEY, student text NOT NULL);
CREATE TABLE labkit.job_fence (job text PRIMARY KEY, generation bigint NOT NULL);
CREATE TABLE labkit.writes (id bigserial PRIMARY KEY, student text NOT NULL,
    generation bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE labkit.events (id bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT clock_timestamp(), began timestamptz,
    student text NOT NULL, action text NOT NULL, outcome text NOT NULL,
    generation bigint, until timestamptz);
CREATE TABLE labkit.pauses (student text PRIMARY KEY, seconds float8 NOT NULL);
INSERT INTO labkit.lease VALUES ('job', NULL, 0, NULL);
INSERT INTO labkit.job_fence VALUES ('job', 0)"""

_PRIVILEGES = """
REVOKE ALL ON DATABASE postgres FROM PUBLIC;
REVOKE ALL ON DATABASE template1 FROM PUBLIC;
REVOKE ALL ON SCHEMA public FROM PUBLIC;
REVOKE ALL ON SCHEMA labkit FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA labkit FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA labkit FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA labkit FROM PUBLIC;
GRANT CONNECT ON DATABASE postgres TO labkit_student, labkit_room;
GRANT USAGE ON SCHEMA labkit TO labkit_student, labkit_room;
GRANT EXECUTE ON FUNCTION labkit.register(text) TO labkit_room;
GRANT EXECUTE ON FUNCTION labkit.acquire(text, text), labkit.renew(text, text, bigint),
    labkit.release(text, text, bigint), labkit.write(text, text, bigint, boolean)
    TO labkit_student"""


def _function(head: str, body: str) -> str:
    return (
        f"CREATE FUNCTION labkit.{head} LANGUAGE plpgsql SECURITY DEFINER "
        f"SET search_path = labkit, pg_temp AS $fn$ DECLARE till timestamptz; done bigint;\n"
        f"BEGIN {body}\nEND $fn$"
    )


#: run by a superuser, in one transaction; then the room's role is made, then _PRIVILEGES
INSTALL = [
    "CREATE ROLE labkit_instructor NOLOGIN CREATEROLE",
    "CREATE ROLE labkit_student NOLOGIN",
    "CREATE SCHEMA labkit AUTHORIZATION labkit_instructor",
    "SET ROLE labkit_instructor",
    *filter(str.strip, _TABLES.split(";")),
    *(_function(head, body) for head, body in _FUNCTIONS.items()),
    "RESET ROLE",
]


class RoomRefused(LabkitError):
    """The classroom server refused a call: ``code`` is PostgreSQL's SQLSTATE."""

    def __init__(self, message: str, code: str | None = None) -> None:
        self.code = code
        super().__init__(message)


def bad_name(name: Any) -> str:
    """Return ``name`` if it can name a student, else raise BadArgument naming ``name``."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise BadArgument(
            "name", f"{name!r} is not a student name: 1 to 30 of a-z, 0-9, _ (a letter first)"
        )
    return name


def install(url: str, *, ttl: float = 1.0) -> str:
    """Install the classroom on the server at ``url`` (a superuser's); return the room password."""
    ttl = check_number(ttl, "ttl", positive=True, high=3600)
    psycopg = driver()
    from psycopg import sql

    password = secrets.token_urlsafe(18)
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        for statement in INSTALL:
            conn.execute(statement)
        conn.execute(
            sql.SQL("CREATE ROLE labkit_room LOGIN PASSWORD {} CONNECTION LIMIT 60").format(
                sql.Literal(password)
            )
        )
        for statement in filter(str.strip, _PRIVILEGES.split(";")):  # now labkit_room exists
            conn.execute(statement)
        conn.execute("INSERT INTO labkit.room VALUES ('ttl', %s)", [str(ttl)])
    return password


class Room:
    """The instructor's handle on a classroom: ``url`` is the superuser's (or the owner's)."""

    def __init__(self, url: str) -> None:
        self.conn = driver().connect(url, autocommit=True)

    def close(self) -> None:
        self.conn.close()

    def students(self) -> list[str]:
        """The names registered, in order."""
        return [n for (n,) in self.conn.execute("SELECT name FROM labkit.students ORDER BY 1")]

    def pause(self, names, seconds: float) -> None:
        """Make each of ``names`` sleep ``seconds`` holding the lease the next time it wins it."""
        seconds = check_number(seconds, "seconds", positive=True, high=3600)
        names = [bad_name(n) for n in ([names] if isinstance(names, str) else names)]
        with self.conn.transaction():
            for name in names:
                self.conn.execute(
                    "INSERT INTO labkit.pauses VALUES (%s, %s) "
                    "ON CONFLICT (student) DO UPDATE SET seconds = excluded.seconds",
                    [name, seconds],
                )

    def reset(self) -> None:
        """Empty the room: every student's role and session, the events, the lease, the fence."""
        from psycopg import sql

        roles = [r for (r,) in self.conn.execute("SELECT role FROM labkit.students")]
        self.conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ANY(%s)",
            [roles],
        )
        with self.conn.transaction():
            for role in map(sql.Identifier, roles):  # DROP OWNED: its grants too
                self.conn.execute(sql.SQL("DROP OWNED BY {0}; DROP ROLE {0}").format(role))
            self.conn.execute(
                "TRUNCATE labkit.students, labkit.grants, labkit.writes, labkit.events, "
                "labkit.pauses RESTART IDENTITY"
            )
            self.conn.execute(
                "UPDATE labkit.lease SET holder = NULL, generation = 0, expires = NULL"
            )
            self.conn.execute("UPDATE labkit.job_fence SET generation = 0")

    def events(self, since: int = 0) -> list[tuple]:
        """Rows ``(id, at, began, student, action, outcome, generation, until)`` after id
        ``since``; the times are seconds since the epoch, from the server's clock."""
        return self.conn.execute(
            "SELECT id, extract(epoch FROM at)::float8, extract(epoch FROM began)::float8, "
            "student, action, outcome, generation, extract(epoch FROM until)::float8 "
            "FROM labkit.events WHERE id > %s ORDER BY id",
            [since],
        ).fetchall()

    def fence(self) -> int:
        """The generation the fence holds now."""
        return self.conn.execute("SELECT generation FROM labkit.job_fence").fetchone()[0]


LAN_WARNING = (
    "WARNING: the classroom server listens on {address}: anyone on that network can reach it "
    "and try the room's password. Use it only on a network you trust, and stop the server "
    "(Ctrl-C) when the class ends."
)


def lan_warning(address: str) -> str:
    """The warning printed when the server binds ``address`` instead of 127.0.0.1."""
    return LAN_WARNING.format(address=address)


def serve(address: str = "127.0.0.1", *, ttl: float = 1.0, out=print, wait=None) -> None:
    """Start the room's server on ``address``, print the URLs, and keep it up until ``wait()``
    returns or is interrupted (default: until Ctrl-C); the server stops on every exit path."""
    import ipaddress
    import threading

    from labkit.engines.postgres import PostgresServer

    try:
        ipaddress.ip_address(address)
    except ValueError:
        raise BadArgument("address", f"{address!r} is not an IP address, e.g. 192.168.1.20")
    if address != "127.0.0.1":
        out(lan_warning(address))

    class RoomServer(PostgresServer):
        def _launch(self) -> None:  # let the LAN in (scram passwords), once
            hba = self.data / "pg_hba.conf"
            line = "host all all 0.0.0.0/0 scram-sha-256\n"
            if address != "127.0.0.1" and line not in hba.read_text():
                with open(hba, "a") as f:
                    f.write(line)
            super()._launch()

    listen = address if address == "127.0.0.1" else f"127.0.0.1,{address}"  # ours stays local
    with RoomServer(settings={"listen_addresses": listen}) as server:
        password = install(server.url, ttl=ttl)
        room = f"postgresql://labkit_room:{password}@{address}:{server.port}/postgres"
        out(f"Give students this line:\n  labkit.classroom.join({room!r}, 'their_name')")
        out(f"Instructor (keep this to yourself):\n  labkit.classroom.Room({server.url!r})")
        out("Ctrl-C stops the server and deletes the room.")
        try:
            (wait or threading.Event().wait)()
        except KeyboardInterrupt:
            pass


def main(argv=None) -> int:
    """``python -m labkit.classroom serve [--lan ADDRESS] [--ttl SECONDS]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m labkit.classroom")
    command = parser.add_subparsers(dest="command", required=True).add_parser("serve")
    command.add_argument("--lan", metavar="ADDRESS", help="listen on this address, not 127.0.0.1")
    command.add_argument("--ttl", type=float, default=1.0, help="the lease's seconds (1.0)")
    args = parser.parse_args(argv)
    serve(args.lan or "127.0.0.1", ttl=args.ttl)
    return 0
