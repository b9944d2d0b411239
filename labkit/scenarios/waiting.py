"""Lesson 06: waiting for a lease someone else holds.

>>> herd(protected=False, contenders=20).verdict
'none: 20 contenders made 152 attempts and 152 wake-ups for 8 grants'
>>> herd(contenders=20).verdict
'watch: 20 contenders made 9 attempts and 10 wake-ups for 9 grants'
"""

import itertools

from labkit.db import execute, transaction
from labkit.errors import BadArgument, LeaseLost, check_number
from labkit.mechanisms.timing import VersionLease, backoff
from labkit.sim.engine import scenario
from labkit.sim.steps import amount, with_tokens, write_each
from labkit.sim.worker import LEASE

__all__ = ["herd", "stale_watch", "version_wait"]

# One row per turn a contender takes (arriving, or waking up); the counts are SQL over it.
_HERD_SQL = (
    """CREATE TABLE herd_log (at REAL NOT NULL, worker TEXT NOT NULL, strategy TEXT NOT NULL,
        woke INTEGER NOT NULL, attempted INTEGER NOT NULL, granted INTEGER NOT NULL)""",
    """CREATE VIEW herd AS SELECT strategy, count(DISTINCT worker) AS contenders,
        sum(attempted) AS attempts, sum(woke) AS wakeups, sum(granted) AS grants
        FROM herd_log GROUP BY strategy""",
    """CREATE VIEW herd_seconds AS SELECT CAST(at AS INTEGER) AS second,
        sum(attempted) AS attempts, sum(woke) AS wakeups FROM herd_log GROUP BY second""",
)
_HERD_VERDICT = (
    "{strategy}: {contenders} contenders made {attempts} attempts and {wakeups} wake-ups "
    "for {grants} grants"
)

# stale_watch's queue: numbers from the lease's permanent counter, sessions kept by heartbeats.
_NEXT_NUMBER = (
    "UPDATE lease_counter SET generation = generation + 1 WHERE name = $1 RETURNING generation"
)
_HEARTBEAT = (
    "UPDATE waiters SET session_until = $1 WHERE seq = $2 AND session_until > $3 RETURNING 1"
)


@scenario
def herd(
    sim,
    *,
    protected,
    contenders=100,
    strategy="watch",
    hold=1.0,
    poll=1.0,
    base=0.5,
    cap=8.0,
    horizon=8.0,
    ttl=10.0,
):
    """Lesson 06: ``contenders`` wake when the lease is released; how many attempts and wake-ups?

    Unprotected, losers retry every ``poll`` s in lockstep; ``"jitter"`` backs off (full jitter,
    ``base``/``cap``), ``"watch"`` wakes one waiter per release; all give up after ``horizon`` s.
    ``tables["herd"]`` and ``tables["herd_seconds"]`` are SQL views counting ``herd_log``."""
    n = check_number(contenders, "contenders", integer=True, low=1, high=5000)
    if strategy not in ("none", "jitter", "watch"):
        raise BadArgument("strategy", f"must be 'none', 'jitter' or 'watch', got {strategy!r}")
    hold = check_number(hold, "hold")
    used = strategy if protected else "none"
    authority, env, rng, db = sim.authority, sim.env, sim.rng, sim.database("resource")
    released, queue = 1.0, []
    with transaction(db):
        for statement in _HERD_SQL:
            execute(db, statement)
    sim.layout.update(dict.fromkeys(("herd_log", "herd", "herd_seconds"), "resource"))

    def log(name, woke, attempted=False, granted=False):  # a turn is a row, as it happens
        with transaction(db):
            row = (env.now, name, used, int(woke), int(attempted), int(granted))
            execute(db, "INSERT INTO herd_log VALUES ($1, $2, $3, $4, $5, $6)", row)

    def wake_next():
        if used == "watch" and queue:  # a release wakes only the next in line
            queue.pop(0).succeed()

    def attempt(name):
        lease = authority.try_acquire(LEASE, name, ttl)
        seen = lease or authority.current(LEASE)  # ours, or the holder's that refused us
        fields = {"generation": seen.generation, "target": LEASE, "until": seen.expires_at}
        sim.record(name, "acquire", "ok" if lease else "held", **fields)
        log(name, woke=True, attempted=True, granted=lease is not None)
        return lease

    def contender(name):
        yield env.timeout(released)
        if used == "watch":
            log(name, woke=False)  # arrives and joins the queue
        for tries in itertools.count():
            if used == "watch":
                queue.append(woken := env.event())
                yield woken
            elif tries:
                wait = poll if used == "none" else backoff(tries - 1, base=base, cap=cap, rng=rng)
                yield env.timeout(wait)
            if env.now > released + horizon:
                if used == "watch":
                    log(name, woke=True)  # woken too late: gives up without trying
                return
            if (lease := attempt(name)) is not None:
                yield env.timeout(hold)
                try:  # a hold past the ttl: the lease expired, and may be someone else's now
                    authority.release(lease)
                    outcome = "ok"
                except LeaseLost:
                    outcome = "lost"
                sim.record(name, "release", outcome, generation=lease.generation, target=LEASE)
                wake_next()
                return

    def first_holder(w):
        lease = yield from w.acquire(ttl)
        yield env.timeout(released)
        yield from w.release(lease)
        wake_next()

    sim.start(sim.worker("H"), first_holder)
    for i in range(n):
        env.process(contender(f"c{i + 1}"))

    return lambda history, violations, tables: _HERD_VERDICT.format(**tables["herd"][0])


herd.naive = {"strategy": "none"}  # unprotected, whatever is asked ("none" too): a panel shows it


@scenario
def stale_watch(sim, *, protected, outage=6.0, session=3.0):
    """Lesson 06: a watcher acts on a notification kept over its outage; it must recheck first."""
    db, env = sim.database("authority"), sim.env
    watchers: dict[int, list] = {}  # seq watched -> [(worker name, event)]
    offline: dict[str, list] = {}  # worker -> notifications buffered while offline

    def sql(statement, *params):  # one statement in its own transaction
        with transaction(db):
            return execute(db, statement, params)

    sql("""CREATE TABLE waiters (seq INTEGER PRIMARY KEY, worker TEXT NOT NULL,
        session_until REAL NOT NULL)""")
    sim.layout["waiters"] = "authority"

    def notify(seq):
        for name, event in watchers.pop(seq, []):
            if name in offline:
                offline[name].append(event)
            elif not event.triggered:
                event.succeed("live")

    def reaper():
        while env.now < 2.0 + outage + 12.0:
            expired = "DELETE FROM waiters WHERE session_until <= $1 RETURNING seq"
            for (seq,) in sql(expired, env.now):
                sim.record("authority", "notify", target=f"session of {seq} expired")
                notify(seq)
            yield env.timeout(0.5)

    def join(w):
        """Take the next number, enter the queue with a new session, and keep that session alive."""
        with transaction(db):
            seq = execute(db, _NEXT_NUMBER, (LEASE,))[0][0]
            execute(db, "INSERT INTO waiters VALUES ($1, $2, $3)", (seq, w.name, env.now + session))
        env.process(heartbeats(w, seq))
        return seq

    def heartbeats(w, seq):
        """Every second while online, extend the session; stop once the entry is gone."""
        while w.name in offline or sql(_HEARTBEAT, env.now + session, seq, env.now):
            yield env.timeout(1.0)

    def take_turn(w, invoices, work=1.0):
        seq = join(w)
        while True:
            mine = "SELECT 1 FROM waiters WHERE seq = $1 AND session_until > $2"
            if not execute(db, mine, (seq, env.now)):
                seq = join(w)  # our session expired: join again, with a new number
                continue
            live = "SELECT max(seq) FROM waiters WHERE seq < $1 AND session_until > $2"
            before = execute(db, live, (seq, env.now))[0][0]
            if before is None:  # the lowest live number: our turn
                w.record("acquire", "ok", generation=seq, target=LEASE)
                break
            event = env.event()
            watchers.setdefault(before, []).append((w.name, event))
            how = yield event
            w.record("notify", generation=seq, target=f"{before} is gone ({how})")
            if how == "replayed" and not protected:
                break  # a notification kept over the outage, taken as the turn
        yield from write_each(w, invoices, seq, fenced=protected, base=100, every=work)
        left = sql("DELETE FROM waiters WHERE seq = $1 RETURNING seq", seq)
        w.record("release", "ok" if left else "lost", generation=seq, target=LEASE)
        notify(seq)

    def network(w):
        yield env.timeout(2.0)
        offline[w.name] = []
        w.record("pause", target="network down", until=env.now + outage)
        yield env.timeout(outage)
        for event in offline.pop(w.name):
            if not event.triggered:
                event.succeed("replayed")
        w.record("resume", target="network back")

    with_tokens(sim)
    env.process(reaper())
    sim.start(sim.worker("A"), take_turn, ("INV-1", "INV-2"), work=3.0)
    sim.start(w := sim.worker("W"), take_turn, ("INV-1", "INV-2"), at=0.5)
    env.process(network(w))
    sim.start(sim.worker("X"), take_turn, ("INV-1", "INV-2", "INV-3"), at=1.0)


@scenario
def version_wait(sim, *, protected, pause=30.0, duration=10.0, heartbeat=3.0, offset=0.0):
    """Lesson 06: version-wait compares no clocks, yet a paused holder still needs the fence."""
    setup = VersionLease(sim.database("authority"), sim.clock)
    for n in range(6):  # six earlier holders, each released
        setup.release(setup.claim(setup.observe(LEASE), f"earlier-{n + 1}", duration=duration))
    sim.layout["version_leases"] = "authority"

    def run_a(w):
        leases = VersionLease(w.connection("authority"), w.clock)
        mine = leases.claim(leases.observe(LEASE), "A", duration=duration)
        g = mine.generation  # a heartbeat moves the version, never the generation
        w.record("acquire", generation=g, target=LEASE)
        w.read(["INV-1"])
        beats = [t for t in (heartbeat * k for k in range(1, 100)) if t < 4.0]
        for t in beats:  # alive and working until t=4
            yield w.env.timeout(t - w.env.now)
            mine = leases.heartbeat(mine)
            w.record("renew", "ok" if mine else "lost", generation=g, target=LEASE)
            if mine is None:
                return  # B claimed it already (a duration shorter than the beat): stop
        yield w.env.timeout(4.0 - w.env.now)
        yield from w.pause(pause, "gc")
        yield from w.write("INV-1", amount(w, 100), g, fenced=protected)
        alive = leases.heartbeat(mine)
        w.record("renew", "ok" if alive else "lost", generation=g, target=LEASE)
        if alive:
            outcome = "ok" if leases.release(alive) else "lost"
            w.record("release", outcome, generation=g, target=LEASE)

    def run_b(w):
        leases = VersionLease(w.connection("authority"), w.clock)
        while True:
            seen = leases.observe(LEASE)
            if not leases.ready(seen):
                yield w.env.timeout(seen.duration - leases.waited(seen))
            mine = leases.claim(seen, "B", duration=duration)
            if mine is not None:
                break
            w.record("acquire", "held", generation=seen.generation, target=LEASE)
        g = mine.generation
        w.record("acquire", generation=g, target=LEASE)
        if protected:
            yield from w.raise_fence(g)
        yield from write_each(w, ("INV-1", "INV-2"), g, fenced=protected)
        w.record("release", "ok" if leases.release(mine) else "lost", generation=g, target=LEASE)

    with_tokens(sim)
    sim.start(sim.worker("A"), run_a)
    sim.start(sim.worker("B", offset=offset), run_b, at=0.5)
