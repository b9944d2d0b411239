"""The classroom's live view: it reads only its window, counts in SQL, draws every student's lane
in alphabetical order, and redraws in the background while the kernel stays free."""

from __future__ import annotations

import io

import pytest

from polling import wait_for
from tests import engines

#: a synthetic log of ``n`` events over ``n * 0.01`` s ending now, of students ``names``: cycles
#: of acquire, write, renew, write (every 13th lease refused), release, then five refused acquires
SYNTHETIC = """INSERT INTO labkit.events (at, student, action, outcome, generation, until)
SELECT clock_timestamp() - make_interval(secs => ($1 - i) * 0.01),
    ($2::text[])[(i / 10) % cardinality($2::text[]) + 1],
    (ARRAY['acquire', 'write', 'renew', 'write', 'release', 'acquire', 'acquire', 'acquire',
           'acquire', 'acquire'])[i % 10 + 1],
    CASE WHEN i % 10 >= 5 THEN 'held' WHEN i % 10 = 3 AND (i / 10) % 13 = 0 THEN 'rejected'
         ELSE 'ok' END,
    CASE WHEN i % 10 < 5 THEN i / 10 END,
    CASE WHEN i % 10 IN (0, 2) THEN clock_timestamp()
        - make_interval(secs => ($1 - i) * 0.01) + interval '0.05 s' END
FROM generate_series(1, $1) AS i"""


@pytest.fixture(scope="module")
def classroom():
    """``(room URL, Room)`` on one throwaway server, with three students registered out of order
    and 5,000 synthetic events over 50 s."""
    engines.require_postgres()
    from labkit.engines import classroom as install
    from labkit.engines.postgres import PostgresServer
    from labkit.engines.room import Room
    from labkit.engines.student import register

    with PostgresServer(settings=engines.FAST) as server:
        password = install.install(server.url, ttl=0.5, seats=31)
        url = f"postgresql://labkit_room:{password}@127.0.0.1:{server.port}/postgres"
        room = Room(server.url)
        students = [register(url, name) for name in ("cai", "ana", "ben")]
        room.conn.execute(SYNTHETIC, [5000, ["cai", "ana", "ben"]])
        room.pause("ben", 0.01)
        yield url, room, students
        for s in students:
            s.close()
        room.close()


def count(room, sql, params=()):
    return room.conn.execute(sql, params).fetchone()[0]


def test_a_view_reads_only_its_window_then_only_what_is_new(classroom):
    """The first update fetches the rows of the last 10 s, not the log's 5,000; the next one
    fetches exactly the rows added since; the totals are the server's counts over the whole log."""
    from labkit.processes.room_view import View

    _, room, students = classroom
    in_window = count(room, "SELECT count(*) FROM labkit.events WHERE at >= "
                            "(SELECT max(at) FROM labkit.events) - interval '10 s'")  # fmt: skip
    view = View(room, window=10).update()
    assert view.read == in_window and 900 < in_window < 1100
    ana = students[1]
    generation = wait_for(lambda: ana.acquire(), "ana to win the lease")[0]
    ana.write(generation), ana.release(generation)
    added = count(room, "SELECT count(*) FROM labkit.events WHERE id > $1", [view.last])
    assert view.update().read == added and added >= 3
    totals = {s: tuple(c) for s, c in view.totals.items()}
    expected = room.conn.execute(
        "SELECT student, count(*) FILTER (WHERE action = 'write' AND outcome = 'ok'), "
        "count(*) FILTER (WHERE action = 'write' AND outcome = 'rejected'), "
        "count(*) FILTER (WHERE action = 'pause') FROM labkit.events GROUP BY 1"
    ).fetchall()
    assert totals == {s: tuple(c) for s, *c in expected}
    assert sum(c[1] for c in totals.values()) > 30  # the log has refusals to count
    assert min(r[1] for r in view.rows) >= max(r[1] for r in view.rows) - 10


def test_the_picture_has_alphabetical_lanes_readable_bars_a_thin_fence_and_counts(classroom):
    """Lanes ana, ben, cai (registered cai, ana, ben); each lease bar shows in the PNG's pixels
    in its lane; at most eight fence labels; the title counts students, stale writes refused
    and pauses."""
    import matplotlib.image

    from labkit.processes.room_view import LABELS, View, draw, png

    _, room, _ = classroom
    view = View(room, window=10)
    ax = draw(view)
    lanes = sorted((t for t in ax.texts if t.get_text() in ("ana", "ben", "cai")),
                   key=lambda t: t.get_position()[1])  # fmt: skip
    assert [t.get_text() for t in lanes] == ["ana", "ben", "cai"]
    refused = sum(c[1] for c in view.totals.values())
    pauses = sum(c[2] for c in view.totals.values())
    title = ax.get_title(loc="left")
    assert f"3 students" in title and f"{refused} stale writes refused" in title
    assert f"{pauses} pauses" in title and "protected" in title
    fence = [t for t in ax.texts if t.get_text().isdigit()]
    assert 2 <= len(fence) <= LABELS
    image = matplotlib.image.imread(io.BytesIO(png(ax)))
    height = image.shape[0]
    bars = ax.collections[0]
    assert len(bars.get_paths()) > 50
    seen = 0
    for path in bars.get_paths():
        (x0, y0), (x1, y1) = path.vertices.min(0), path.vertices.max(0)
        px0, py0 = ax.transData.transform((x0, y0))
        px1, py1 = ax.transData.transform((x1, y1))
        assert px1 - px0 >= 3  # at least 3 pixels wide, however short the lease
        col, row = int((px0 + px1) / 2), int(height - (py0 + py1) / 2)
        r, g, b = image[row, col, :3]
        seen += b > r + 0.15 and b > 0.7  # the lease's blue is there, in that lane
    assert seen >= 0.9 * len(bars.get_paths())


def test_watch_redraws_in_the_background_while_the_instructor_pauses(classroom):
    """watch() returns at once; it redraws on its own connection while this thread pauses a
    student on the room's; stop() ends it, with no error."""
    from labkit.classroom import watch

    _, room, _ = classroom
    shown = []
    watcher = watch(room, every=0.2, window=10, show=shown.append)
    assert watcher.thread.is_alive()
    room.pause(["ana", "cai"], 0.01)  # the kernel is free: this cell's next line runs now
    wait_for(lambda: watcher.redraws >= 3, "three redraws")
    watcher.stop()
    assert not watcher.thread.is_alive() and watcher.error is None
    assert all(p.startswith(b"\x89PNG") for p in shown) and len(shown) == watcher.redraws
    assert "redraws" in repr(watcher)
    with pytest.raises(Exception, match="room"):
        watch(object(), show=shown.append)
