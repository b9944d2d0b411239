"""The failures of lessons 04-08, replayed on the engine in :mod:`labkit.sim`.

Same form as :mod:`labkit.scenarios`: ``f(*, protected=True, seed=0, **knobs) -> Result``,
keyword-only knobs with the source's numbers as defaults (10 s lease, 30 s
pause, generations 7 and 8), ``protected=False`` for the naive variant. Every
worker acts on real SQLite files through the real labkit mechanisms
(:mod:`labkit.issuers`, :mod:`labkit.timing`, :mod:`labkit.recovery`,
:mod:`labkit.effects`), and :func:`labkit.check` judges the history.

Two conventions beyond the engine's vocabulary:

* An event's ``key`` names the logical operation ("bill c1", "the report
  email") whether or not the writer enforced it, so the checker can see a
  repeat that nothing stopped (as :func:`~labkit.scenarios.same_generation_duplicate` does).
* Informational actions the checker ignores: ``failover`` and ``restore``
  (worker ``ops``), ``sweep`` (worker ``sweeper``), ``notify`` (a watch fired).

Example:
    >>> from labkit.more_scenarios import issuer_failover
    >>> sorted(issuer_failover(protected=False).kinds)
    ['acted_after_expiry', 'lost_update']
    >>> issuer_failover().violations
    ()
"""

from __future__ import annotations

import os

from .db import execute, transaction
from .effects import EmailProvider, FencedFileStore, Outbox
from .errors import BadArgument, LeaseLost, StaleGeneration
from .history import Event, check
from .issuers import EpochAuthority, EpochIssuer, ReplicatedIssuer, backup, restore
from .lease import LeaseAuthority
from .recovery import Claims, operation_key, produce
from .sim import JOB, LEASE, Crashed, Result, check_knob, describe, scenario, upsert_invoice
from .timing import LeaseKeeper, VersionLease, backoff

__all__ = ["issuer_failover", "backup_restore", "late_renewal", "late_release", "herd", "stale_watch",
           "version_wait", "crash_after_fence", "email_transfer"]

INVOICES = ("INV-1", "INV-2", "INV-3")


def _amount(w, base: int) -> int:
    """An invoice amount drawn from the seeded rng."""
    return base + 5 * w.sim.rng.randrange(0, 10)


def _note(sim, worker: str, action: str, outcome: str = "ok", **fields) -> None:
    """Append an event for a participant that is not a :class:`~labkit.sim.Worker`."""
    sim.history.append(Event(float(sim.env.now), worker, action, outcome, fields.get("generation"),
                             fields.get("key"), fields.get("target"), fields.get("until")))


def _final_with_tokens(sim) -> None:
    """Let invoices carry ``(epoch, n)`` tokens and count the ``files`` table in the final state.

    The engine's final state is ``invoice_id -> generation``; these scenarios
    also write epochs and fenced files, so the run's result reads them too.
    """
    db = sim.database("resource")
    if "epoch" not in [r[1] for r in execute(db, "PRAGMA table_info(invoices)")]:
        execute(db, "ALTER TABLE invoices ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0")

    def result(params: dict, wording=None) -> Result:
        tables = sim.tables()
        final = {r["invoice_id"]: (r["epoch"], r["generation"]) for r in tables.get("invoices", [])}
        final.update({r["name"]: (r["epoch"], r["generation"]) for r in tables.get("files", [])})
        history = tuple(sim.history)
        violations = tuple(check(history, final=final))
        verdict = (wording(history, violations, tables) if wording else None) or describe(history, violations)
        return Result(dict(params), history, tables, violations, verdict)
    sim.result = result


def _write(w, invoice: str, amount: int, token, *, fenced: bool, key: str | None = None):
    """Upsert ``invoice`` with ``token`` (an int or ``(epoch, n)``), through the fence when ``fenced``."""
    epoch, n = token if isinstance(token, tuple) else (0, token)
    yield from w.wait_for_lock(target=invoice)
    sql = """INSERT INTO invoices(job_id, invoice_id, amount, generation, epoch) VALUES (?, ?, ?, ?, ?)
             ON CONFLICT(job_id, invoice_id) DO UPDATE SET amount = excluded.amount,
                 generation = excluded.generation, epoch = excluded.epoch"""
    try:
        if fenced:
            with w.fence().guard(token) as tx:
                tx.execute(sql, (JOB, invoice, amount, n, epoch))
        else:
            with transaction(w.db) as conn:
                execute(conn, sql, (JOB, invoice, amount, n, epoch))
    except StaleGeneration:
        return w.record("write", "rejected", generation=token, key=key, target=invoice).outcome
    if fenced:
        w.record("raise", "ok", generation=token, target=JOB)
    return w.record("write", "ok", generation=token, key=key, target=invoice).outcome


def _acquire(w, ttl: float, *, issue=None, owner=None, authority=None, poll=None, tokens=None):
    """Poll the authority until granted; the token comes from ``issue()`` in the same step as the grant.

    Returns ``(lease, token)``. ``tokens`` (owner -> token) labels "held" answers.
    """
    authority = authority or w.sim.authority
    owner = owner or w.name
    while True:
        lease = authority.try_acquire(LEASE, owner, ttl)
        if lease is not None:
            token = issue() if issue else lease.generation
            if tokens is not None:
                tokens[owner] = token
            w.record("acquire", "ok", generation=token, target=LEASE, until=lease.expires_at)
            return lease, token
        held = authority.current(LEASE)
        label = (tokens or {}).get(held.owner, held.generation) if held else None
        w.record("acquire", "held", generation=label, target=LEASE, until=held and held.expires_at)
        wait = poll if poll is not None or held is None else held.expires_at - authority.clock.now()
        yield w.env.timeout(max(wait or 0.0, w.sim.tick))


def _release(w, lease, token, *, authority=None) -> bool:
    """labkit's release (owner AND generation), recorded with the token the worker acted with."""
    try:
        (authority or w.sim.authority).release(lease)
    except LeaseLost:
        w.record("release", "lost", generation=token, target=LEASE)
        return False
    w.record("release", "ok", generation=token, target=LEASE)
    return True


# ---------------------------------------------------------------- lesson 04


def _reissued(history, violations, tables) -> str | None:
    """Name a token that was granted to two workers, then the worst violation (or what stopped it)."""
    owners: dict = {}
    for e in history:
        if e.action == "acquire" and e.outcome == "ok":
            owners.setdefault(e.generation, []).append(e.worker)
    twice = [f"{g} went to {' and '.join(ws)}" for g, ws in owners.items() if len(ws) > 1]
    locked_out = [e for e in history if e.action == "raise" and e.outcome == "rejected"]
    head = (f"token {'; '.join(twice)}. " if twice else "") + \
        (f"{locked_out[0].worker} was locked out by an older, higher token. " if locked_out else "")
    return head + describe(history, violations) if head else None


def _stale_holder_and_successor(sim, ttl: float, take):
    """A takes a token, writes INV-1, pauses, writes INV-2 late; B takes over at A's expiry."""

    def run_a(w):
        lease, token = yield from _acquire(w, ttl, issue=take)
        w.read(["INV-1", "INV-2"])
        yield w.env.timeout(1.0)
        yield from _write(w, "INV-1", _amount(w, 100), token, fenced=True)
        yield from w.point("after-write")
        yield from _write(w, "INV-2", _amount(w, 100), token, fenced=True)
        _release(w, lease, token)

    def run_b(w, poll):
        lease, token = yield from _acquire(w, ttl, issue=take, poll=poll)
        if not (yield from w.raise_fence(token)):
            return                     # the legitimate holder is locked out by an old, higher token
        w.read(["INV-1", "INV-2"])
        for invoice in ("INV-1", "INV-2"):
            yield w.env.timeout(1.0)
            yield from _write(w, invoice, _amount(w, 200), token, fenced=True)
        _release(w, lease, token)
    return run_a, run_b


@scenario
def issuer_failover(sim, *, protected, lag=5.0, failover_at=2.0, pause=30.0, ttl=10.0):
    """Lesson 04: a token counter on an asynchronously replicated store fails over and repeats a number.

    Tokens come from :class:`~labkit.issuers.ReplicatedIssuer` (two real SQLite
    files; the replica applies the primary's log ``lag`` s late). A gets 7,
    writes INV-1 through the fence and pauses ``pause`` s. At ``failover_at``
    the primary dies and the replica is promoted; if 7 had not arrived, B (at
    A's expiry) is handed 7 again. A wakes up and its INV-2 with 7 passes the
    fence, level with B's: B's invoice is lost. Protected: after the failover
    the issuer starts a new epoch from a durable :class:`~labkit.issuers.EpochAuthority`,
    B gets ``(1, 1)`` and A's 7 bounces.

    Knobs:
        lag: replication delay (s). failover_at: when the primary dies (s).
        pause: A's stop after its first write (s). ttl: the lease's length (s).
    """
    lag, failover_at, pause = check_knob(lag, "lag"), check_knob(failover_at, "failover_at"), check_knob(pause, "pause")
    ttl = check_knob(ttl, "ttl", positive=True)
    _final_with_tokens(sim)
    primary, replica = sim.database("primary"), sim.database("replica")
    warm = ReplicatedIssuer(primary, replica, sim.clock, LEASE, lag=0)
    for _ in range(6):                     # six earlier tokens, long since replicated
        warm.issue()
    warm.replicate()
    issuer = ReplicatedIssuer(primary, replica, sim.clock, LEASE, lag=lag)
    durable = EpochAuthority(sim.database("durable"))
    sim.layout.update({"epoch_counter": "replica", "epochs": "durable"})
    run_a, run_b = _stale_holder_and_successor(sim, ttl, issuer.issue)

    def ops():
        yield sim.env.timeout(failover_at)
        lost = issuer.failover()
        _note(sim, "ops", "failover", target=f"primary lost, {lost} token(s) in flight")
        if protected:
            epoch = issuer.issuer().start_epoch(durable)
            _note(sim, "ops", "failover", generation=(epoch, 0), target="new epoch")

    sim.env.process(ops())
    sim.start(sim.worker("A", pauses={"after-write": pause}), run_a)
    sim.start(sim.worker("B"), run_b, None)
    return _reissued


@scenario
def backup_restore(sim, *, protected, issued_after_backup=1, bump=0, restore_at=3.0, pause=30.0, ttl=10.0):
    """Lesson 04: restoring last night's backup moves the token counter backward.

    The authority's database (leases and the token counter, at 6) is backed up
    with SQLite's backup API. ``issued_after_backup`` tokens are issued after
    it; the last one is A's (7 by default). A writes INV-1 and pauses. At
    ``restore_at`` the database is restored: the counter is back at 6 and A's
    lease row is gone, so B gets in early and is handed A's number again.
    Unprotected, the restore may add ``bump`` to the counter (the "large
    constant"): safe only if ``bump >= issued_after_backup``. Protected, the
    restore is followed by a new epoch from a durable authority.

    Knobs:
        issued_after_backup: tokens issued between backup and restore (>= 1).
        bump: constant added to the counter after the restore (unprotected).
        restore_at: when the restore happens (s). pause: A's stop (s). ttl: lease length (s).
    """
    n = check_knob(issued_after_backup, "issued_after_backup", integer=True, low=1, high=1000)
    bump = check_knob(bump, "bump", integer=True, high=10 ** 6)
    restore_at, pause = check_knob(restore_at, "restore_at"), check_knob(pause, "pause")
    ttl = check_knob(ttl, "ttl", positive=True)
    _final_with_tokens(sim)
    store = sim.database("authority")
    issuer, durable = EpochIssuer(store, LEASE), EpochAuthority(sim.database("durable"))
    for _ in range(6):
        issuer.issue()
    backup(store, sim.path("nightly"))
    for _ in range(n - 1):                 # holders that came and went after the backup
        issuer.issue()
    sim.layout.update({"epoch_counter": "authority", "epochs": "durable"})
    run_a, run_b = _stale_holder_and_successor(sim, ttl, issuer.issue)

    def ops():
        yield sim.env.timeout(restore_at)
        restore(store, sim.path("nightly"))
        _note(sim, "ops", "restore", generation=issuer.current(), target="authority from nightly backup")
        if protected:
            epoch = issuer.start_epoch(durable)
            _note(sim, "ops", "restore", generation=(epoch, 0), target="new epoch")
        elif bump:
            _note(sim, "ops", "restore", generation=issuer.bump(bump), target=f"counter + {bump}")

    sim.env.process(ops())
    sim.start(sim.worker("A", pauses={"after-write": pause}), run_a)
    sim.start(sim.worker("B"), run_b, 2.0, at=0.5)
    return _reissued


# ---------------------------------------------------------------- lessons 05 and 06


@scenario
def late_renewal(sim, *, protected, request_latency=2.0, response_latency=3.0, margin=1.0, drift=0.0,
                 offset=0.0, ttl=10.0):
    """Lesson 05: a renewal answer spends time in the network; counting from its arrival acts too long.

    A acquires, then updates the three invoices once a second, and renews once.
    B compares the lease record's expiry (the authority's clock) against its
    own wall clock, ``offset`` s ahead, and takes over as soon as it reads
    expired. Unprotected, A counts a full ``ttl`` from each answer's ARRIVAL
    and writes without the fence: it keeps writing after the authority let B
    in. Protected, a :class:`~labkit.timing.LeaseKeeper` counts from each
    request's SEND time on A's clock, minus ``margin`` and the offset bound,
    corrected for ``drift``; writes also go through the fence.

    Knobs:
        request_latency, response_latency: one-way delays to and from the authority (s).
        margin: the keeper's explicit margin (s).
        drift: how much slower A's clock runs (fraction, 0 .. 0.5).
        offset: how far B's clock runs ahead of the authority's (s).
        ttl: the lease's length (s).
    """
    margin, offset = check_knob(margin, "margin"), check_knob(offset, "offset")
    drift = check_knob(drift, "drift", high=0.5)
    ttl = check_knob(ttl, "ttl", positive=True)
    a = sim.worker("A", request_latency=request_latency, response_latency=response_latency, drift=-drift)
    keeper = LeaseKeeper(sim.authority, LEASE, "A", ttl=ttl, margin=margin + offset, max_drift=drift, clock=a.clock)
    state = {"naive": -1.0, "pending": True}

    def granted(w, lease, sent):
        if lease is None:
            keeper.lost()
            state["naive"] = -1.0
        else:
            keeper.confirm(lease, sent)
            state["naive"] = w.clock.now() + ttl          # a full lease from the answer's arrival

    def renewer(w):
        yield w.env.timeout(0.3 * ttl)
        sent = w.clock.now()
        granted(w, (yield from w.renew(keeper.lease)), sent)
        state["pending"] = False

    def run_a(w):
        sent = w.clock.now()
        lease = yield from w.acquire(ttl)
        granted(w, lease, sent)
        if lease is None:
            return
        w.env.process(renewer(w))
        for k in range(int(4 * ttl)):
            while not (keeper.may_act() if protected else w.clock.now() < state["naive"]):
                if not state["pending"]:
                    return                                # no renewal coming: stop for good
                yield w.env.timeout(w.sim.tick)
            yield from _write(w, INVOICES[k % 3], _amount(w, 100), lease.generation, fenced=protected)
            yield w.env.timeout(1.0)

    def run_b(w):
        own_view = LeaseAuthority(sim.database("authority"), w.clock)
        lease, token = yield from _acquire(w, ttl, authority=own_view)
        if protected:
            yield from w.raise_fence(token)
        w.read(list(INVOICES))
        for invoice in INVOICES:
            yield w.env.timeout(1.0)
            yield from _write(w, invoice, _amount(w, 200), token, fenced=protected)
        _release(w, lease, token, authority=own_view)

    _final_with_tokens(sim)
    sim.start(a, run_a)
    sim.start(sim.worker("B", offset=offset), run_b, at=float(request_latency) + 1.0)


@scenario
def late_release(sim, *, protected, delay=12.0, ttl=10.0):
    """Lesson 06: a late release from A deletes B's lease unless it checks owner AND generation.

    A and B run on the same host and use its name, ``host-1``, as owner id (B
    is A's replacement process). A finishes at t=2 and sends its release; the
    request is delayed ``delay`` s. Meanwhile A's lease expires and B acquires
    (8). Unprotected, the release arriving late is ``DELETE ... WHERE name AND
    owner``: it deletes B's lease, and C (``host-2``) gets the lease while B
    still works. Protected, labkit's release also requires generation 7 and is refused.

    Knobs:
        delay: how long A's release request is in flight (s). ttl: the lease's length (s).
    """
    delay, ttl = check_knob(delay, "delay"), check_knob(ttl, "ttl", positive=True)

    def release_a(w, lease):
        if protected:
            return _release(w, lease, lease.generation)
        with transaction(sim.database("authority")) as conn:
            gone = execute(conn, "DELETE FROM leases WHERE name = ? AND owner = ? RETURNING name",
                           (lease.name, lease.owner))
        w.record("release", "ok" if gone else "lost", generation=lease.generation, target=LEASE)
        return bool(gone)

    def run_a(w):
        lease, token = yield from _acquire(w, ttl, owner="host-1")
        yield w.env.timeout(1.0)
        yield from _write(w, "INV-1", _amount(w, 100), token, fenced=True)
        yield w.env.timeout(1.0 + delay)            # the release request in flight
        release_a(w, lease)

    def run_worker(w, owner, invoices):
        lease, token = yield from _acquire(w, ttl, owner=owner, poll=1.0)
        yield from w.raise_fence(token)
        w.read(list(invoices))
        for invoice in invoices:
            yield w.env.timeout(1.0)
            if (yield from _write(w, invoice, _amount(w, 200), token, fenced=True)) != "ok":
                break
        _release(w, lease, token)

    _final_with_tokens(sim)
    sim.start(sim.worker("A"), run_a)
    sim.start(sim.worker("B"), run_worker, "host-1", ("INV-1", "INV-2", "INV-3", "INV-4", "INV-5"))
    sim.start(sim.worker("C"), run_worker, "host-2", ("INV-1", "INV-2", "INV-3"), at=3.5)


_STRATEGIES = ("none", "jitter", "watch")


@scenario
def herd(sim, *, protected, contenders=100, strategy="watch", hold=1.0, poll=1.0, base=0.5, cap=8.0,
         horizon=8.0, ttl=10.0):
    """Lesson 06: ``contenders`` wake up when the lease is released; how many attempts and wake-ups?

    H holds the lease until t=1 and releases it; every contender then wants it,
    and each winner holds it ``hold`` s and releases. Contenders give up
    ``horizon`` s after the first release. Every attempt is a real
    ``try_acquire`` on the authority. Unprotected (``"none"``): no backoff,
    every loser retries every ``poll`` s in lockstep. Protected, ``strategy``:
    ``"jitter"`` (losers sleep :func:`~labkit.timing.backoff`, full jitter,
    ``base``/``cap``) or ``"watch"`` (contenders queue; each release wakes only
    the next one). The counts are in ``tables["herd"]`` (one row) and
    ``tables["herd_seconds"]`` (attempts and wake-ups per second).

    Knobs:
        contenders: how many want the lease (1 .. 5000). strategy: ``"jitter"`` or ``"watch"``.
        hold: how long each winner holds (s). poll: the no-backoff retry interval (s).
        base, cap: the backoff's first and largest window (s). horizon: how long contenders try (s).
        ttl: the lease's length (s).
    """
    n = check_knob(contenders, "contenders", integer=True, low=1, high=5000)
    if strategy not in _STRATEGIES[1:]:
        raise BadArgument("strategy", f"must be 'jitter' or 'watch', got {strategy!r}")
    hold, poll = check_knob(hold, "hold", positive=True), check_knob(poll, "poll", positive=True)
    base, cap = check_knob(base, "base", positive=True), check_knob(cap, "cap", positive=True)
    horizon, ttl = check_knob(horizon, "horizon"), check_knob(ttl, "ttl", positive=True)
    used = strategy if protected else "none"
    authority, env, rng = sim.authority, sim.env, sim.rng
    released = 1.0
    stats = {"attempts": 0, "wakeups": 0, "grants": 0}
    seconds: dict[int, list[int]] = {}
    queue: list = []                        # watch: waiting contenders, in arrival order
    holder = {"generation": None, "until": None}

    def count(what: str) -> None:
        stats[what] += 1
        seconds.setdefault(int(env.now), [0, 0])[what == "wakeups"] += 1

    def hold_then_release(name: str, lease):
        yield env.timeout(hold)
        authority.release(lease)
        _note(sim, name, "release", generation=lease.generation, target=LEASE)
        if used == "watch" and queue:
            count("wakeups")
            queue.pop(0).succeed()

    def attempt(name: str):
        count("attempts")
        lease = authority.try_acquire(LEASE, name, ttl)
        if lease is None:
            _note(sim, name, "acquire", "held", generation=holder["generation"], target=LEASE,
                  until=holder["until"])
            return None
        holder.update(generation=lease.generation, until=lease.expires_at)
        stats["grants"] += 1
        _note(sim, name, "acquire", generation=lease.generation, target=LEASE, until=lease.expires_at)
        return lease

    def contender(name: str):
        yield env.timeout(released)
        tries = 0
        while env.now <= released + horizon:
            if used == "watch":
                woken = env.event()
                queue.append(woken)
                yield woken
            elif tries:
                yield env.timeout(poll if used == "none" else backoff(tries - 1, base=base, cap=cap, rng=rng))
            if env.now > released + horizon:
                return
            if tries or used != "watch":
                count("wakeups")
            tries += 1
            lease = attempt(name)
            if lease is not None:
                yield from hold_then_release(name, lease)
                return

    def first_holder(w):
        lease = yield from w.acquire(ttl)
        holder.update(generation=lease.generation, until=lease.expires_at)
        yield env.timeout(released)
        yield from w.release(lease)
        if used == "watch" and queue:
            count("wakeups")
            queue.pop(0).succeed()

    def tally():
        yield env.timeout(released + horizon + hold + 1.0)
        db = sim.database("resource")
        with transaction(db):
            execute(db, "CREATE TABLE herd (strategy TEXT, contenders INTEGER, attempts INTEGER, "
                        "wakeups INTEGER, grants INTEGER)")
            execute(db, "INSERT INTO herd VALUES (?, ?, ?, ?, ?)",
                    (used, n, stats["attempts"], stats["wakeups"], stats["grants"]))
            execute(db, "CREATE TABLE herd_seconds (second INTEGER, attempts INTEGER, wakeups INTEGER)")
            for second, (attempts, wakeups) in sorted(seconds.items()):
                execute(db, "INSERT INTO herd_seconds VALUES (?, ?, ?)", (second, attempts, wakeups))

    sim.start(sim.worker("H"), first_holder)
    for i in range(n):
        env.process(contender(f"c{i + 1}"))
    env.process(tally())
    sim.layout.update({"herd": "resource", "herd_seconds": "resource"})

    def wording(history, violations, tables):
        row = tables["herd"][0]
        return (f"{used}: {row['contenders']} contenders made {row['attempts']} attempts and "
                f"{row['wakeups']} wake-ups for {row['grants']} grants")
    return wording


@scenario
def stale_watch(sim, *, protected, outage=6.0, session=3.0):
    """Lesson 06: a watcher reconnects, receives a stale notification, and must recheck before acting.

    A queue lock: each contender joins with a number from the permanent counter
    (its fencing token) and a session kept alive by heartbeats; the holder is
    the lowest live number; each waiter watches its predecessor. A (7) holds,
    W (8) watches A, X (9) watches W. W's network drops at t=2 for ``outage``
    s: its session (``session`` s) expires, its entry is removed, and X moves
    up. A releases at t=6 and X takes over. When W reconnects it receives the
    buffered "A is gone". Unprotected, W takes that as its turn and writes with
    8 (no fence). Protected, W rechecks the queue, finds its entry gone, joins
    again and waits; writes go through the fence.

    Knobs:
        outage: how long W's network is down (s). session: a session's lifetime without heartbeats (s).
    """
    outage, session = check_knob(outage, "outage"), check_knob(session, "session", positive=True)
    db, env = sim.database("authority"), sim.env
    with transaction(db):
        execute(db, "CREATE TABLE waiters (seq INTEGER PRIMARY KEY, worker TEXT NOT NULL, "
                    "session_until REAL NOT NULL)")
    sim.layout["waiters"] = "authority"
    watchers: dict[int, list] = {}          # seq watched -> [(worker name, event)]
    offline: dict[str, list] = {}           # worker -> notifications buffered while offline

    def notify(seq: int) -> None:
        for name, event in watchers.pop(seq, []):
            if name in offline:
                offline[name].append(event)
            elif not event.triggered:
                event.succeed("live")

    def reaper():
        while env.now < 2.0 + outage + 12.0:
            with transaction(db):
                gone = execute(db, "DELETE FROM waiters WHERE session_until <= ? RETURNING seq", (env.now,))
            for (seq,) in gone:
                _note(sim, "authority", "notify", target=f"session of {seq} expired")
                notify(seq)
            yield env.timeout(0.5)

    def join(w) -> int:
        with transaction(db):
            seq = execute(db, "INSERT INTO lease_counter(name, generation) VALUES (?, 1) ON CONFLICT(name) "
                              "DO UPDATE SET generation = generation + 1 RETURNING generation", (LEASE,))[0][0]
            execute(db, "INSERT INTO waiters VALUES (?, ?, ?)", (seq, w.name, env.now + session))
        return seq

    def heartbeats(w, seq):
        while True:
            if w.name not in offline:
                with transaction(db):
                    alive = execute(db, "UPDATE waiters SET session_until = ? WHERE seq = ? "
                                        "AND session_until > ? RETURNING seq", (env.now + session, seq, env.now))
                if not alive:
                    return
            yield env.timeout(1.0)

    def lower(seq: int):
        rows = execute(db, "SELECT max(seq) FROM waiters WHERE seq < ? AND session_until > ?", (seq, env.now))
        return rows[0][0]

    def take_turn(w, invoices, work=1.0):
        seq = join(w)
        env.process(heartbeats(w, seq))
        while True:
            if not execute(db, "SELECT 1 FROM waiters WHERE seq = ? AND session_until > ?", (seq, env.now)):
                seq = join(w)                  # our session expired: join again, with a new number
                env.process(heartbeats(w, seq))
                continue
            before = lower(seq)
            if before is None:
                w.record("acquire", "ok", generation=seq, target=LEASE)   # lowest live number: our turn
                break
            event = env.event()
            watchers.setdefault(before, []).append((w.name, event))
            how = yield event
            _note(sim, w.name, "notify", generation=seq, target=f"{before} is gone ({how})")
            if how == "replayed" and not protected:
                break                          # a notification kept over the outage, taken as the turn
        w.read(list(invoices))
        for invoice in invoices:
            yield env.timeout(work)
            yield from _write(w, invoice, _amount(w, 100), seq, fenced=protected)
        with transaction(db):
            left = execute(db, "DELETE FROM waiters WHERE seq = ? RETURNING seq", (seq,))
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

    a, w_, x = sim.worker("A"), sim.worker("W"), sim.worker("X")
    _final_with_tokens(sim)
    env.process(reaper())
    sim.start(a, take_turn, ("INV-1", "INV-2"), work=3.0)
    sim.start(w_, take_turn, ("INV-1", "INV-2"), at=0.5)
    env.process(network(w_))
    sim.start(x, take_turn, ("INV-1", "INV-2", "INV-3"), at=1.0)


@scenario
def version_wait(sim, *, protected, pause=30.0, duration=10.0, heartbeat=3.0, offset=0.0):
    """Lesson 06: the version-wait protocol compares no clocks, and still needs the fence.

    :class:`~labkit.timing.VersionLease`: A claims (generation 7) and bumps the
    record's version every ``heartbeat`` s, until it pauses at t=4 for
    ``pause`` s. B observes the version, waits the record's ``duration`` on its
    own clock (``offset`` s away from everyone's: it does not matter) and
    claims only if the version did not move; else it observes again. A wakes
    up and writes INV-1 with 7. Unprotected, writes are plain upserts and A's
    lands on B's run; protected, they go through the fence and A's bounces.

    Knobs:
        pause: A's stop (s). duration: the lease duration stored in the record (s).
        heartbeat: A's version bumps (s). offset: B's clock offset (s).
    """
    pause, duration = check_knob(pause, "pause"), check_knob(duration, "duration", positive=True)
    heartbeat, offset = check_knob(heartbeat, "heartbeat", positive=True), check_knob(offset, "offset")
    setup = VersionLease(sim.database("authority"), sim.clock)
    for n in range(6):                        # six earlier holders, each released
        setup.release(setup.claim(setup.observe(LEASE), f"earlier-{n + 1}", duration=duration))
    sim.layout["version_leases"] = "authority"

    def run_a(w):
        leases = VersionLease(w.connection("authority"), w.clock)
        mine = leases.claim(leases.observe(LEASE), "A", duration=duration)
        w.record("acquire", generation=mine.generation, target=LEASE)
        w.read(["INV-1"])
        beats = [t for t in (heartbeat * k for k in range(1, 100)) if t < 4.0]
        for t in beats:                      # alive and working until t=4
            yield w.env.timeout(t - w.env.now)
            mine = leases.heartbeat(mine)
            w.record("renew", generation=mine.generation, target=LEASE)
        yield w.env.timeout(4.0 - w.env.now)
        yield from w.pause(pause, "gc")
        yield from _write(w, "INV-1", _amount(w, 100), mine.generation, fenced=protected)
        alive = leases.heartbeat(mine)
        w.record("renew", "ok" if alive else "lost", generation=mine.generation, target=LEASE)
        if alive:
            w.record("release", "ok" if leases.release(alive) else "lost", generation=mine.generation,
                     target=LEASE)

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
        w.record("acquire", generation=mine.generation, target=LEASE)
        if protected:
            yield from w.raise_fence(mine.generation)
        w.read(["INV-1", "INV-2"])
        for invoice in ("INV-1", "INV-2"):
            yield w.env.timeout(1.0)
            yield from _write(w, invoice, _amount(w, 200), mine.generation, fenced=protected)
        released = leases.release(mine)
        w.record("release", "ok" if released else "lost", generation=mine.generation, target=LEASE)

    _final_with_tokens(sim)
    sim.start(sim.worker("A"), run_a)
    sim.start(sim.worker("B", offset=offset), run_b, at=0.5)


# ---------------------------------------------------------------- lessons 07 and 08


@scenario
def crash_after_fence(sim, *, protected, crash_after=0, invoices=3, pause=30.0, ttl=10.0, sweep_every=5.0):
    """Lesson 07: B raises the fence and crashes; who notices the unfinished work, and who repeats it?

    The job bills customers c1 .. c``invoices``, one invoice each, tracked in a
    durable ``claims`` row. A (7) bills c1 and pauses ``pause`` s. B (8)
    takes the lease and the requeued job, raises the fence, bills
    ``crash_after`` customers and crashes before its next checkpoint. C (9)
    takes over when B's lease lapses. A sweeper requeues stale claims every
    ``sweep_every`` s. Unprotected: no progress is recorded, the sweeper
    requeues by age alone and a retry starts from c1 without operation ids, so
    c1 is billed twice. Protected: progress checkpoints, a conditional requeue
    (:meth:`~labkit.recovery.Claims.sweep`) and :func:`~labkit.recovery.produce`
    with operation ids: every customer billed exactly once.

    Knobs:
        crash_after: customers B bills before crashing (0: right after raising the fence).
        invoices: customers in the job (1 .. 20). pause: A's stop after its first invoice (s).
        ttl: the lease's length (s). sweep_every: the sweeper's period (s); a claim is stale after ``ttl`` s.
    """
    units = check_knob(invoices, "invoices", integer=True, low=1, high=20)
    crash_after = check_knob(crash_after, "crash_after", integer=True, high=units)
    pause, ttl = check_knob(pause, "pause"), check_knob(ttl, "ttl", positive=True)
    sweep_every = check_knob(sweep_every, "sweep_every", positive=True)
    customers = [f"c{i + 1}" for i in range(units)]
    Claims(sim.database("resource"), sim.clock).enqueue(JOB)
    sim.layout.update({"claims": "resource"})

    def claims_of(w):
        return Claims(w.db, sim.clock)

    def done(w) -> bool:
        return claims_of(w).get(JOB).state == "done"

    def bill(w, claim, unit):
        key = operation_key(JOB, unit)
        invoice = f"{unit}@{claim.generation}"
        yield from w.wait_for_lock(target=invoice)
        try:
            if protected:
                fresh = produce(w.fence(), claim, unit, 100)
            else:
                with w.fence().guard(claim.generation) as tx:
                    tx.execute("INSERT INTO invoices VALUES (?, ?, ?, ?)", (JOB, invoice, 100, claim.generation))
                fresh = True
        except StaleGeneration:
            return w.record("write", "rejected", generation=claim.generation, key=key, target=invoice).outcome
        w.record("raise", generation=claim.generation, target=JOB)
        return w.record("write", "ok" if fresh else "duplicate", generation=claim.generation, key=key,
                        target=invoice).outcome

    def run(w, crash=None):
        lease = yield from w.acquire_when_free(ttl)
        while True:                              # wait for the job to be claimable, keeping the lease
            claim = yield from w.locked(claims_of(w).claim, JOB, w.name, lease.generation)
            if claim is not None or done(w):
                break
            yield w.env.timeout(1.0)
            if lease.expires_at - w.env.now < 3.0 and (lease := (yield from w.renew(lease))) is None:
                return
        if claim is None:
            return
        if not (yield from w.raise_fence(claim.generation)):
            return
        billed = 0
        for i in range(claim.progress if protected else 0, units):
            if crash is not None and billed == crash:
                yield from w.point("crash")
            if lease.expires_at - w.env.now < 3.0 and (lease := (yield from w.renew(lease))) is None:
                return
            yield w.env.timeout(1.0)
            yield from w.point(f"before-{customers[i]}")
            if (yield from bill(w, claim, customers[i])) == "rejected":
                return
            billed += 1
            if protected:
                if crash is not None and billed == crash:
                    yield from w.point("crash")     # after the invoice, before its checkpoint
                try:
                    claim = yield from w.locked(claims_of(w).checkpoint, claim, i + 1)
                except LeaseLost:
                    return
        if protected:
            yield from w.locked(claims_of(w).finish, claim)
        else:
            yield from w.locked(_naive_finish, w.db)
        yield from w.release(lease)

    def sweeper(w):
        while sim.env.now < pause + 6 * ttl and not done(w):
            if protected:
                for seen in claims_of(w).stale(older_than=ttl):
                    if (yield from w.locked(claims_of(w).requeue, seen)):
                        w.record("sweep", generation=seen.generation, target=JOB)
            else:
                for (generation,) in (yield from w.locked(_naive_requeue, w.db, sim.env.now - ttl)):
                    w.record("sweep", generation=generation, target=JOB)
            yield sim.env.timeout(sweep_every)

    sim.start(sim.worker("A", pauses={"before-c2": pause}), run)
    sim.start(sim.worker("B", crash_at="crash"), run, crash_after, at=0.5)
    sim.start(sim.worker("C"), run, at=12.0)
    sim.start(sim.worker("sweeper"), sweeper)


def _naive_requeue(db, cutoff: float) -> list[tuple]:
    """The known-wrong sweeper: requeue every claim older than ``cutoff``, by age alone, in one go."""
    with transaction(db):
        return execute(db, "UPDATE claims SET owner = NULL, state = 'queued', version = version + 1 "
                           "WHERE state = 'claimed' AND updated_at <= ? RETURNING generation", (cutoff,))


def _naive_finish(db) -> None:
    with transaction(db):
        execute(db, "UPDATE claims SET state = 'done', version = version + 1 WHERE job = ?", (JOB,))


@scenario
def email_transfer(sim, *, protected, pause=30.0, ttl=10.0, relay_crashes=1):
    """Lesson 08: the fenced file and the unfenced email.

    Each run writes ``report.txt`` to a :class:`~labkit.effects.FencedFileStore`
    and emails it through an :class:`~labkit.effects.EmailProvider` that knows
    nothing of generations. A (7) pauses ``pause`` s before its step; B (8)
    takes over and does the run. Unprotected, each worker sends its email
    straight to the provider and then writes the file: A's file write bounces
    off the fence, but A's email has already gone out. Protected, the email
    intent goes into the :class:`~labkit.effects.Outbox` inside the fenced
    transaction that writes the file, so A's intent is refused with its file;
    a relay sends B's with the provider's idempotency key, crashing
    ``relay_crashes`` times between sending and marking: still one email.

    Knobs:
        pause: A's stop before its step (s). ttl: the lease's length (s).
        relay_crashes: how many times the relay crashes after sending, before marking (0 .. 5).
    """
    pause, ttl = check_knob(pause, "pause"), check_knob(ttl, "ttl", positive=True)
    crashes = check_knob(relay_crashes, "relay_crashes", integer=True, high=5)
    folder = os.path.join(os.path.dirname(sim.path("resource")), "files")
    FencedFileStore(sim.database("resource"), folder, JOB)
    Outbox(sim.database("resource"), sim.clock)
    provider = EmailProvider(sim.database("provider"), sim.clock)
    sim.layout.update({"files": "resource", "outbox": "resource", "provider_records": "provider"})
    _final_with_tokens(sim)
    key = operation_key(JOB, "report-email")
    state = {"finished": False}

    def step(w, generation, text):
        store, outbox = FencedFileStore(w.db, folder, JOB), Outbox(w.db, sim.clock)
        mail = {"to": "billing@example.com", "subject": f"{JOB} report", "body": text}
        yield from w.wait_for_lock(target="report.txt")
        if not protected:
            provider.send(**mail)                                   # no generation, no key: it just goes
            w.record("email", key=key, target="report-email")
        try:
            with store.fence.guard(generation) as tx:
                store.write("report.txt", text.encode(), generation, tx=tx)
                if protected:
                    outbox.add(tx, key, "email", mail)
        except StaleGeneration:
            w.record("write", "rejected", generation=generation, target="report.txt")
            if protected:
                w.record("email", "rejected", generation=generation, key=key, target="report-email")
            return False
        w.record("raise", generation=generation, target=JOB)
        w.record("write", generation=generation, target="report.txt")
        return True

    def run_a(w):
        lease = yield from w.acquire(ttl)
        w.read(["INV-1"])
        yield from w.point("before-step")
        yield from step(w, lease.generation, "report by A (stale)")
        yield from w.release(lease)

    def run_b(w):
        lease = yield from w.acquire_when_free(ttl)
        yield from w.raise_fence(lease.generation)
        w.read(["INV-1"])
        yield w.env.timeout(1.0)
        yield from step(w, lease.generation, "report by B")
        yield from w.release(lease)
        state["finished"] = True

    def relay(w):
        outbox, left = Outbox(w.db, sim.clock), crashes
        while not (state["finished"] and not outbox.pending()):
            for row_key, _kind, payload, _generation in outbox.pending("email"):
                sent = outbox.send(row_key, payload, provider)
                w.record("email", "duplicate" if sent.replayed else "ok", key=row_key, target="report-email")
                if left:
                    left -= 1
                    w.record("crash", target="between send and mark")
                    yield from w.pause(2.0, "restart")
                    break
                yield from w.locked(outbox.mark_sent, row_key, sent.id)
            yield w.env.timeout(1.0)

    sim.start(sim.worker("A", pauses={"before-step": pause}), run_a)
    sim.start(sim.worker("B"), run_b)
    if protected:
        sim.start(sim.worker("relay"), relay)
