"""Classroom mode: a student's login can call labkit's functions and nothing else."""

from __future__ import annotations

import threading

import pytest

from labkit.errors import BadArgument, BadArgumentType
from tests import engines


@pytest.fixture(scope="module")
def room_server():
    """One throwaway server with the classroom installed: ``(server, room URL, Room)``."""
    engines.require_postgres()
    from labkit.engines import classroom
    from labkit.engines.postgres import PostgresServer
    from labkit.engines.room import Room

    with PostgresServer(settings=engines.FAST) as server:
        password = classroom.install(server.url, ttl=0.5, seats=31)
        room = Room(server.url)
        yield server, f"postgresql://labkit_room:{password}@127.0.0.1:{server.port}/postgres", room
        room.close()


@pytest.fixture
def room(room_server):
    """The room, emptied after the test."""
    yield room_server
    room_server[2].reset()


def connect_as(student):
    import psycopg

    return psycopg.connect(student.url, autocommit=True)


def refused(conn, statement, params=()):
    """Run ``statement`` as a student; return the error's SQLSTATE (it must fail)."""
    import psycopg

    with pytest.raises(psycopg.Error) as caught:
        conn.execute(statement, params)
    return caught.value.sqlstate


def test_a_student_joins_acquires_writes_renews_and_releases(room):
    """The whole cycle works through the functions, and the server logs every answer."""
    from labkit.engines.student import register

    _, url, admin = room
    ana = register(url, "ana")
    generation, ttl, pause = ana.acquire()
    assert (generation, ttl, pause) == (1, 0.5, 0.0)
    assert ana.write(generation) and ana.renew(generation) and ana.release(generation)
    assert admin.fence() == 1
    log = [(r[3], r[4], r[5], r[6]) for r in admin.events()]
    assert log == [("ana", "join", "ok", None), ("ana", "acquire", "ok", 1),
                   ("ana", "write", "ok", 1), ("ana", "renew", "ok", 1),
                   ("ana", "release", "ok", 1)]  # fmt: skip
    ana.close()


def test_a_students_login_is_refused_everything_else(room):
    """Direct writes, lowering or deleting the fence, temp tables and the password are refused."""
    from labkit.engines.student import register

    _, url, admin = room
    ana = register(url, "ana")
    ana.write(ana.acquire()[0])
    with connect_as(ana) as conn:
        assert (
            refused(conn, "INSERT INTO labkit.writes (student, generation) VALUES ('ana', 99)")
            == "42501"
        )
        assert refused(conn, "UPDATE labkit.job_fence SET generation = 0") == "42501"
        assert refused(conn, "DELETE FROM labkit.job_fence") == "42501"
        assert refused(conn, "SELECT * FROM labkit.events") == "42501"
        assert refused(conn, "SELECT * FROM labkit.room") == "42501"
        assert refused(conn, "SELECT rolpassword FROM pg_authid") == "42501"
        assert refused(conn, "SELECT passwd FROM pg_shadow") == "42501"
        assert refused(conn, "SELECT pg_read_file('pg_hba.conf')") == "42501"
        assert refused(conn, "CREATE TABLE public.mine (x int)") == "42501"
        assert refused(conn, "CREATE TEMP TABLE job_fence (job text, generation bigint)") == "42501"
        assert refused(conn, "SELECT labkit.register('eve')") == "42501"
    assert admin.fence() == 1
    ana.close()


def test_a_temp_table_cannot_shadow_the_fence_even_where_temp_tables_are_allowed(room):
    """With TEMP granted, a student's own job_fence in pg_temp is not the one the write uses."""
    from labkit.engines.student import register

    _, url, admin = room
    ana = register(url, "ana")
    admin.conn.execute("GRANT TEMPORARY ON DATABASE postgres TO student_ana")
    generation = ana.acquire()[0]
    ana.write(generation)
    ana.release(generation)
    generation = ana.acquire()[0]
    assert ana.write(generation) and admin.fence() == 2
    ana.conn.execute("CREATE TEMP TABLE job_fence (job text, generation bigint)")
    ana.conn.execute("INSERT INTO job_fence VALUES ('job', 0)")
    assert ana.write(1) is False  # the real fence, at 2, refuses; the temp one (0) would not
    assert ana.conn.execute("SELECT generation FROM job_fence").fetchall() == [(0,)]
    assert admin.fence() == 2
    ana.close()


def test_another_students_lease_cannot_be_released_with_their_name(room):
    """Ben knows Ana's name but not her secret: his release, renew and write are refused."""
    from labkit.engines.classroom import RoomRefused
    from labkit.engines.student import register

    _, url, admin = room
    ana, ben = register(url, "ana"), register(url, "ben")
    generation = ana.acquire()[0]
    posing = ben.name, ben.secret
    ben.name = "ana"
    for call in (ben.release, ben.renew, ben.write):
        with pytest.raises(RoomRefused, match="wrong name or secret"):
            call(generation)
    ben.secret = ana.secret  # even her secret, from his login, is not her
    with pytest.raises(RoomRefused, match="wrong name or secret"):
        ben.release(generation)
    ben.name, ben.secret = posing
    with pytest.raises(BadArgument, match="never granted"):
        ben.write(generation)
    assert ana.release(generation)
    assert [r[4:6] for r in admin.events() if r[3] == "ana"][-1] == ("release", "ok")
    ana.close(), ben.close()


def test_a_paused_student_writes_after_its_lease_and_the_fence_refuses_it(room):
    """The control row pauses Ana holding generation 1; Ben takes over; her write bounces."""
    from labkit.engines.student import register

    _, url, admin = room
    ana, ben = register(url, "ana"), register(url, "ben")
    admin.pause(["ana"], 2.0)
    generation, _, pause = ana.acquire()
    assert (generation, pause) == (1, 2.0)
    expired = threading.Event()
    while (won := ben.acquire()) is None:  # her lease runs out while she is paused
        expired.wait(0.05)
    assert ben.write(won[0])
    assert ana.write(generation) is False
    admin.protect(False)  # the instructor's choice: the same stale write lands
    try:
        assert admin.protected is False and ana.write(generation) is True
    finally:
        admin.protect(True)
    kinds = [(r[3], r[4], r[5]) for r in admin.events() if r[4] in ("pause", "write")]
    assert kinds == [("ana", "pause", "ok"), ("ben", "write", "ok"), ("ana", "write", "rejected"),
                     ("ana", "write", "ok")]  # fmt: skip
    ana.close(), ben.close()


def test_a_student_cannot_choose_an_unfenced_write(room):
    """The old hole, write(name, secret, generation, NULL), is gone: no call of a student's
    decides whether a write is fenced, and the stale write is refused however it is asked."""
    from labkit.engines.student import register

    _, url, admin = room
    ana, ben = register(url, "ana"), register(url, "ben")
    old = ana.acquire()[0]
    ana.release(old)
    ben.write(ben.acquire()[0])
    with connect_as(ana) as conn:
        for fenced in (None, False, True):
            statement = "SELECT labkit.write(%s, %s, %s, %s)"
            assert refused(conn, statement, [ana.name, ana.secret, old, fenced]) == "42883"
        found = conn.execute("SELECT labkit.write(%s, %s, %s)", [ana.name, ana.secret, old])
        assert found.fetchall() == [(False,)]
    assert ana.write(old) is False and admin.fence() == 2
    assert [r[5] for r in admin.events() if r[3] == "ana" and r[4] == "write"] == ["rejected"] * 2
    ana.close(), ben.close()


def test_only_the_instructor_decides_whether_the_room_is_fenced(room):
    """The setting is a row students cannot read or change, and protect() checks its input."""
    from labkit.engines.student import register

    _, url, admin = room
    ana = register(url, "ana")
    with connect_as(ana) as conn:
        assert refused(conn, "UPDATE labkit.room SET value = 'off'") == "42501"
    assert admin.protected is True
    with pytest.raises(BadArgumentType, match="on"):
        admin.protect("off")
    ana.close()


def test_reset_empties_the_room(room):
    """After reset no student, role, event, pause, lease or fence value is left."""
    import psycopg

    from labkit.engines.student import register

    _, url, admin = room
    ana = register(url, "ana")
    ana.write(ana.acquire()[0])
    admin.pause("ana", 5)
    admin.reset()
    assert admin.students() == [] and admin.events() == [] and admin.fence() == 0
    roles = admin.conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE 'student_%'")
    assert roles.fetchall() == []
    assert admin.conn.execute("SELECT count(*) FROM labkit.pauses").fetchone() == (0,)
    with pytest.raises(psycopg.OperationalError):
        connect_as(ana)
    again = register(url, "ana")  # the name is free again
    assert again.acquire()[0] == 1
    again.close()


@pytest.mark.parametrize("name", ["x'); DROP TABLE labkit.job_fence; --", 'a"b', "Robert", "", 7,
                                  "a" * 31, "student; drop role labkit"])  # fmt: skip
def test_a_name_that_is_not_a_plain_name_is_refused_and_nothing_is_written(room, name):
    """Names that look like SQL raise BadArgument naming ``name``, here and on the server."""
    from labkit.engines.student import register

    _, url, admin = room
    with pytest.raises(BadArgument, match="name"):
        register(url, name)
    import psycopg

    with psycopg.connect(url) as conn, pytest.raises(psycopg.Error, match="student name"):
        conn.execute("SELECT * FROM labkit.register(%s)", [name if isinstance(name, str) else "7"])
    assert admin.students() == [] and admin.events() == [] and admin.fence() == 0


def test_a_taken_name_is_refused(room):
    """A second join under the same name is refused: it cannot take over the first student."""
    from labkit.engines.classroom import RoomRefused
    from labkit.engines.student import register

    _, url, _ = room
    ana = register(url, "ana")
    with pytest.raises(RoomRefused, match="taken"):
        register(url, "ana")
    ana.close()


def test_joined_workers_run_and_stop(room):
    """Three joined workers take turns on the lease; stop() ends each; no violation when fenced."""
    from labkit.classroom import history
    from labkit.engines.student import join
    from labkit.sim import check

    _, url, admin = room
    workers = [join(url, name) for name in ("ana", "ben", "cai")]
    while sum(r[4:6] == ("write", "ok") for r in admin.events()) < 6:
        threading.Event().wait(0.05)
    for w in workers:
        w.stop()
    assert all(not w.thread.is_alive() and w.error is None for w in workers)
    events = history(admin.events())
    assert {e.worker for e in events if e.action == "write"} <= {"ana", "ben", "cai"}
    assert check(events) == []


def test_pausing_an_unknown_student_names_it_and_queues_nothing(room):
    """A typo in pause() is a BadArgument naming the name; the known names are not paused either."""
    from labkit.engines.student import register

    _, url, admin = room
    ana = register(url, "ana")
    with pytest.raises(BadArgument, match="names.*'nobody'.*registered: ana"):
        admin.pause(["ana", "nobody"], 2)
    with pytest.raises(BadArgument, match="names"):
        admin.pause(["Ana"], 2)
    assert admin.conn.execute("SELECT count(*) FROM labkit.pauses").fetchone() == (0,)
    assert ana.acquire()[2] == 0.0
    ana.close()


def test_pauses_queue_one_per_win(room):
    """Two pauses before Ana next wins are two pauses: her next two wins take them in order."""
    from labkit.engines.student import register

    _, url, admin = room
    ana = register(url, "ana")
    admin.pause("ana", 0.2)
    admin.pause(["ana"], 0.3)
    first = ana.acquire()
    ana.release(first[0])
    second = ana.acquire()
    ana.release(second[0])
    assert (first[2], second[2], ana.acquire()[2]) == (0.2, 0.3, 0.0)
    pauses = [r[6] for r in admin.events() if r[4] == "pause"]
    assert pauses == [first[0], second[0]]
    ana.close()


@pytest.mark.parametrize("flag, value", [("--ttl", "0"), ("--ttl", "-1"), ("--ttl", "nan"),
                                         ("--ttl", "inf"), ("--ttl", "soon"), ("--seats", "0"),
                                         ("--seats", "2.5"), ("--cap", "0")])  # fmt: skip
def test_serve_refuses_a_bad_number_with_a_message(flag, value, capsys):
    """No traceback and no server: argparse's usage error, naming the flag."""
    from labkit.engines.room import main

    with pytest.raises(SystemExit) as caught:
        main(["serve", flag, value])
    assert caught.value.code == 2
    error = capsys.readouterr().err
    assert flag in error and "Traceback" not in error


def test_serve_keeps_the_superuser_off_the_screen_and_the_lan(tmp_path):
    """The screen shows the students' full line; the instructor's URL is in a file only its
    owner reads, gone when the server stops; --lan's one rule opens the students' logins only."""
    import os
    import re
    import stat

    from labkit.engines.room import LAN_RULE, Room, serve
    from labkit.engines.student import register

    engines.require_postgres()
    shown, seen = [], {}

    def wait():
        path = re.search(r"your URL is in (\S+) ", " ".join(shown)).group(1)
        seen["path"], seen["mode"] = path, stat.S_IMODE(os.stat(path).st_mode)
        line = re.search(r"join\('([^']+)', 'your_name'\)", " ".join(shown)).group(1)
        room = Room(path)
        student = register(line, "ana")
        seen["students"] = room.students()
        student.close(), room.close()
        seen["url"] = open(path).read()

    serve(ttl=0.5, out=shown.append, wait=wait)
    screen = "\n".join(shown)
    assert seen["mode"] == 0o600 and seen["students"] == ["ana"]
    assert "import labkit.classroom" in screen and "labkit.classroom.join(" in screen
    password = re.search(r"//[^:]+:([^@]+)@", seen["url"]).group(1)
    assert seen["url"].startswith("postgresql://labkit:") and password not in screen
    assert not os.path.exists(seen["path"])
    host, databases, users, address, method = LAN_RULE.split()
    assert (databases, users.split(","), method) == ("postgres", ["labkit_room", "+labkit_student"],
                                                     "scram-sha-256")  # fmt: skip


def test_the_lan_flag_warns_that_anyone_on_the_network_can_reach_the_server():
    """Only the warning is tested: nothing binds or sends traffic off this machine."""
    from labkit.engines.room import lan_warning

    text = lan_warning("192.168.1.20")
    assert "192.168.1.20" in text and "anyone on that network can reach it" in text
    assert text.startswith("WARNING")


def test_serve_refuses_an_address_that_is_not_one():
    """A bad --lan value names ``address`` before any server starts."""
    from labkit.engines.room import serve

    with pytest.raises(BadArgument, match="address"):
        serve("my laptop", out=lambda *_: None)
    with pytest.raises(BadArgument, match="ttl"):
        serve(ttl=0, out=lambda *_: None)


def test_the_instructors_timeline_has_a_lane_for_each_of_31_students(room):
    """Drawn from the server's event log, 31 students get 31 lanes, alphabetical (registered in
    reverse): none is pooled or dropped."""
    from labkit.classroom import draw
    from labkit.engines.student import register

    _, url, admin = room
    students = [register(url, f"s{i:02d}") for i in reversed(range(31))]
    for s in students:
        s.acquire()  # the first wins, the others are refused: every one logs an attempt
    ax = draw(admin)
    names = {s.name for s in students}
    lanes = sorted((t for t in ax.texts if t.get_text() in names), key=lambda t: t.get_position()[1])
    assert [t.get_text() for t in lanes] == sorted(names)
    assert "31 students" in ax.get_title(loc="left")
    for s in students:
        s.close()


def test_timeline_takes_a_lane_count_and_says_how_many_workers_it_pooled():
    """``lanes=`` raises the 14-lane default; below the count, the caption names what is pooled."""
    import matplotlib.pyplot as plt

    from labkit.sim import Event
    from labkit.views.plot import timeline
    from types import SimpleNamespace

    history = [Event(float(i), f"w{i:02d}", "write", "ok", i + 1) for i in range(32)]
    run = SimpleNamespace(history=history, violations=[], verdict="no violation", params={})
    wide = timeline(run, lanes=40)
    assert len(wide.get_yticklabels()) == 33
    narrow = timeline(run)
    labels = [t.get_text() for t in narrow.get_yticklabels()]
    assert len(labels) == 15 and labels[-2:] == ["others", "fence"]
    assert "19 more workers not shown" in " ".join(t.get_text() for t in narrow.texts)
    with pytest.raises(BadArgument, match="lanes"):
        timeline(run, lanes=1)
    plt.close("all")
