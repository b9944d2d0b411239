"""Classroom mode on one PostgreSQL server: a room of students' workers on one lease and one fence.

The superuser that initdb made is the instructor's login. It installs the ``labkit`` schema,
owned by ``labkit_instructor`` (no login). Students register through ``labkit_room``, whose
password is the instructor's room secret and whose only right is to EXECUTE
``labkit.register(name)``: that makes the student's own login role (at most ``seats`` names a
room) and returns its password and a per-student secret. A student's role, a member of
``labkit_student``, may only EXECUTE the ``SECURITY DEFINER`` functions ``acquire``, ``renew``,
``release`` and ``write``; each checks the caller's name, secret and login role, and runs with
``search_path = labkit, pg_temp`` and its own ``lock_timeout``. Everything else is revoked from
PUBLIC: the tables, the public schema, temporary tables, advisory locks, ``pg_sleep``,
``pg_notify`` and the large-object functions.

The server decides what is fenced: ``write`` takes no such argument, and whether the room is
protected is a row only the instructor can change (:meth:`labkit.engines.room.Room.protect`).
Each grant raises the fence to the new generation, so a paused holder's fenced write is refused
as soon as anyone else has held the lease. A renewal past ``cap`` seconds of holding is refused.

Time is bounded from outside a student's session (any session may change its own
``statement_timeout``, and a function's ``SET statement_timeout`` does not bound the statement
that called it): :func:`labkit.engines.room.Watchdog` runs :data:`TICK` as the superuser.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from labkit.engines.postgres_db import driver
from labkit.errors import BadArgument, LabkitError, check_number

__all__ = ["INSTALL", "NAME", "RoomRefused", "bad_name", "install", "LIMITS"]

NAME = re.compile(r"[a-z][a-z0-9_]{0,29}")  # a student's name: also their role's, after student_
#: each student's login: connections, temp files (superuser-only: the student cannot raise it)
LIMITS = {"connections": 2, "temp_file_limit": "8MB", "lock_timeout": "1500ms"}

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
    PERFORM 1 FROM room WHERE key = 'seats' FOR UPDATE;  -- one registration at a time
    IF EXISTS (SELECT 1 FROM students WHERE name = p_name) THEN
        RAISE EXCEPTION 'labkit: the name % is taken: pick another', p_name USING ERRCODE = '42710';
    END IF;
    IF (SELECT count(*) FROM students) >= (SELECT value::int FROM room WHERE key = 'seats') THEN
        RAISE EXCEPTION 'labkit: the room is full (% names): ask the instructor',
            (SELECT value FROM room WHERE key = 'seats') USING ERRCODE = '53300';
    END IF;
    login := 'student_' || p_name;
    password := replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '');
    secret := replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '');
    EXECUTE format('CREATE ROLE %I LOGIN PASSWORD %L IN ROLE labkit_student CONNECTION LIMIT %s',
                   login, password, {connections});
    IF current_setting('server_version_num')::int >= 150000 THEN  -- else the database's, below
        EXECUTE format('ALTER ROLE %I SET temp_file_limit = %L', login, '{temp_file_limit}');
    END IF;
    INSERT INTO students (name, role, secret)
        VALUES (p_name, login, sha256(convert_to(secret, 'UTF8')));
    INSERT INTO events (student, action, outcome) VALUES (p_name, 'join', 'ok');
    RETURN NEXT;""",
    "acquire(p_name text, p_secret text) RETURNS TABLE(gen bigint, ttl float8, pause float8)": """
    PERFORM labkit._me(p_name, p_secret);
    SELECT value::float8 INTO ttl FROM room WHERE key = 'ttl';
    UPDATE lease SET holder = p_name, generation = lease.generation + 1,
        expires = clock_timestamp() + make_interval(secs => ttl), granted = clock_timestamp()
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
    DELETE FROM pauses WHERE id = (SELECT min(id) FROM pauses WHERE student = p_name)
        RETURNING seconds INTO pause;  -- pauses queue: each win takes the oldest one
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
          AND clock_timestamp() + make_interval(secs => (SELECT value::float8 FROM room
              WHERE key = 'ttl')) <= granted + make_interval(secs => (SELECT value::float8
              FROM room WHERE key = 'cap'))  -- the cap: nobody holds longer by renewing
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
    "write(p_name text, p_secret text, p_gen bigint) RETURNS boolean": """
    PERFORM labkit._me(p_name, p_secret);
    IF NOT EXISTS (SELECT 1 FROM grants WHERE generation = p_gen AND student = p_name) THEN
        RAISE EXCEPTION 'labkit: generation % was never granted to %', p_gen, p_name
            USING ERRCODE = '22023';
    END IF;
    IF (SELECT value = 'on' FROM room WHERE key = 'protected') THEN  -- the instructor's choice
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
    expires timestamptz, granted timestamptz);
CREATE TABLE labkit.grants (generation bigint PRIMARY KEY, student text NOT NULL);
CREATE TABLE labkit.job_fence (job text PRIMARY KEY, generation bigint NOT NULL);
CREATE TABLE labkit.writes (id bigserial PRIMARY KEY, student text NOT NULL,
    generation bigint NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE labkit.events (id bigserial PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT clock_timestamp(), began timestamptz,
    student text NOT NULL, action text NOT NULL, outcome text NOT NULL,
    generation bigint, until timestamptz);
CREATE INDEX events_at ON labkit.events (at);
CREATE TABLE labkit.pauses (id bigserial PRIMARY KEY, student text NOT NULL,
    seconds float8 NOT NULL);
INSERT INTO labkit.lease VALUES ('job', NULL, 0, NULL, NULL);
INSERT INTO labkit.job_fence VALUES ('job', 0)"""

#: what a student could use to hold the server's shared resources or wait on purpose
HAZARDS = """SELECT oid::regprocedure FROM pg_proc WHERE pronamespace = 'pg_catalog'::regnamespace
    AND (proname LIKE 'pg\\_advisory%' OR proname LIKE 'pg\\_try\\_advisory%'
         OR proname LIKE 'lo\\_%' OR proname IN ('loread', 'lowrite', 'pg_sleep', 'pg_sleep_for',
         'pg_sleep_until', 'pg_notify'))"""

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
    labkit.release(text, text, bigint), labkit.write(text, text, bigint) TO labkit_student"""
#: who may set a student's temp_file_limit: on PostgreSQL 15 and later the instructor, per role;
#: before 15 only a superuser can, so the whole database gets it
TEMP_LIMIT = {
    True: "GRANT SET ON PARAMETER temp_file_limit TO labkit_instructor",
    False: f"ALTER DATABASE postgres SET temp_file_limit = '{LIMITS['temp_file_limit']}'",
}

#: one watchdog round, run by the superuser: end every student or registration backend that
#: holds a transaction open (not waiting for a lock) or blocks a waiter longer than the bound, or
#: a registration session older than it; undo any change to the registration login. Returns how
#: many backends it ended and changes it undid.
TICK = """CREATE FUNCTION labkit.tick(bound float8) RETURNS integer LANGUAGE plpgsql
    SET search_path = labkit, pg_catalog, pg_temp AS $fn$
DECLARE
    cut timestamptz := clock_timestamp() - make_interval(secs => bound);
    ended integer; verifier text := (SELECT value FROM room WHERE key = 'verifier');
BEGIN
    SELECT count(pg_terminate_backend(a.pid)) INTO ended FROM pg_stat_activity AS a
    WHERE a.pid <> pg_backend_pid() AND a.backend_type = 'client backend'
      AND (a.usename = 'labkit_room' OR a.usesysid IN (SELECT member FROM pg_auth_members
           WHERE roleid = 'labkit_student'::regrole))
      AND ((a.usename = 'labkit_room' AND a.backend_start < cut)
           OR (a.wait_event_type IS DISTINCT FROM 'Lock'  -- a waiter is not the one to end
               AND (a.xact_start < cut
                    OR a.pid IN (SELECT unnest(pg_blocking_pids(w.pid))
                                 FROM pg_stat_activity AS w WHERE w.wait_event_type = 'Lock'
                                 AND w.state_change < clock_timestamp()
                                     - make_interval(secs => bound / 2)))));
    IF (SELECT rolpassword FROM pg_authid WHERE rolname = 'labkit_room') <> verifier THEN
        EXECUTE format('ALTER ROLE labkit_room PASSWORD %L', verifier);
        ended := ended + 1;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_db_role_setting WHERE setrole = 'labkit_room'::regrole) THEN
        ALTER ROLE labkit_room RESET ALL;
        ALTER ROLE labkit_room IN DATABASE postgres RESET ALL;
        ended := ended + 1;
    END IF;
    RETURN ended;
END $fn$"""


def _function(head: str, body: str) -> str:
    for key, value in LIMITS.items():
        body = body.replace("{" + key + "}", str(value))
    return (
        f"CREATE FUNCTION labkit.{head} LANGUAGE plpgsql SECURITY DEFINER "
        f"SET search_path = labkit, pg_temp SET lock_timeout = '{LIMITS['lock_timeout']}' "
        f"AS $fn$ DECLARE till timestamptz; done bigint;\nBEGIN {body}\nEND $fn$"
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
    TICK,
]


class RoomRefused(LabkitError):
    """The classroom server refused a call: ``code`` is PostgreSQL's SQLSTATE."""

    def __init__(self, message: str, code: str | None = None) -> None:
        self.code = code
        super().__init__(message)


def bad_name(name: Any, argument: str = "name") -> str:
    """Return ``name`` if it can name a student, else raise BadArgument naming ``argument``."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise BadArgument(
            argument, f"{name!r} is not a student name: 1 to 30 of a-z, 0-9, _ (a letter first)"
        )
    return name


def install(
    url: str, *, ttl: float = 1.0, cap: float | None = None, seats: int = 40, protected: bool = True
) -> str:
    """Install the classroom on the server at ``url`` (a superuser's); return the room secret
    (the registration login's password). A lease is ``ttl`` seconds, renewed up to ``cap``
    (default 10 leases) in all; at most ``seats`` names register; ``protected`` fences writes."""
    ttl = check_number(ttl, "ttl", positive=True, high=3600)
    cap = check_number(10 * ttl if cap is None else cap, "cap", positive=True, high=36000)
    if cap < ttl:
        raise BadArgument("cap", f"must be at least one lease (ttl={ttl:g}), got {cap:g}")
    seats = check_number(seats, "seats", integer=True, positive=True, high=1000)
    if not isinstance(protected, bool):
        raise BadArgument("protected", f"must be True or False, got {protected!r}")
    psycopg = driver()
    from psycopg import sql

    password = secrets.token_urlsafe(18)
    with (
        psycopg.connect(url, autocommit=True, cursor_factory=psycopg.RawCursor) as conn,
        conn.transaction(),
    ):
        for statement in INSTALL:
            conn.execute(statement)
        create = "CREATE ROLE labkit_room LOGIN PASSWORD {} CONNECTION LIMIT 10"
        conn.execute(sql.SQL(create).format(sql.Literal(password)))
        for statement in filter(str.strip, _PRIVILEGES.split(";")):  # now labkit_room exists
            conn.execute(statement)
        conn.execute(TEMP_LIMIT[conn.info.server_version >= 150000])
        for (function,) in conn.execute(HAZARDS).fetchall():
            conn.execute(
                sql.SQL("REVOKE EXECUTE ON FUNCTION {} FROM PUBLIC").format(sql.SQL(function))
            )
        verifier = "SELECT rolpassword FROM pg_authid WHERE rolname = 'labkit_room'"
        settings = {
            "ttl": ttl,
            "cap": cap,
            "seats": seats,
            "protected": "on" if protected else "off",
        }
        settings["verifier"] = conn.execute(verifier).fetchone()[0]
        for key, value in settings.items():
            conn.execute("INSERT INTO labkit.room VALUES ($1, $2)", [key, str(value)])
    return password
