"""What the lessons say their pictures show, one entry per sentence: the notebook, the quoted
sentence, the run the lesson's code cell draws, and a check on that run's events.

Read it like the lecture: each row is a sentence a student reads under a timeline, and the
function beside it says which events make the sentence true."""

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

from labkit.scenarios import (
    backup_restore,
    bypass_writer,
    check_then_act,
    crash_after_fence,
    email_transfer,
    expired_but_alive,
    herd,
    issuer_failover,
    late_release,
    late_renewal,
    lock_wait,
    raise_then_read,
    same_generation_duplicate,
    split_databases,
    stale_watch,
    version_wait,
)


def find(history, worker=None, action=None, outcome=None, target=None) -> list:
    """The events matching every field given."""
    return [
        e
        for e in history
        if (worker is None or e.worker == worker)
        and (action is None or e.action == action)
        and (outcome is None or e.outcome == outcome)
        and (target is None or e.target == target)
    ]


def grant(history, worker):
    """The worker's first granted acquire (None if it never got the lease)."""
    got = find(history, worker, "acquire", "ok")
    return got[0] if got else None


def last_write(history, target):
    """The last committed write to ``target``."""
    return find(history, action="write", outcome="ok", target=target)[-1]


# -- what the predicates say, one small function each ---------------------------------------


def a_overwrites_b_inv1(h):
    """A's write to INV-1 commits after B's, and is the last one: it replaced B's invoice."""
    b, a = find(h, "B", "write", "ok", "INV-1"), find(h, "A", "write", "ok", "INV-1")
    return bool(a and b) and a[-1].time > b[-1].time and last_write(h, "INV-1").worker == "A"


def a_write_refused_with_7(h):
    """A's write with generation 7 is rejected and no write of A's commits."""
    refused = find(h, "A", "write", "rejected")
    return bool(refused) and refused[0].generation == 7 and not find(h, "A", "write", "ok")


def a_late_write_refused(h):
    """After its pause A's write with 7 is rejected, and nothing of A's commits after it woke."""
    woke = find(h, "A", "resume")[0].time
    refused = [e for e in find(h, "A", "write", "rejected") if e.time >= woke]
    late = [e for e in find(h, "A", "write", "ok") if e.time >= woke]
    return bool(refused) and refused[0].generation == 7 and not late


def a7_then_b8_at_10(h):
    """A is granted 7 at t=0, B is granted 8 at t=10."""
    a, b = grant(h, "A"), grant(h, "B")
    return (a.time, a.generation, b.time, b.generation) == (0, 7, 10, 8)


def inv1_ends_with_7(h):
    """The last committed INV-1 carries generation 7, though B (8) wrote it and released before."""
    b_release = find(h, "B", "release", "ok")
    return (
        last_write(h, "INV-1").generation == 7
        and bool(b_release)
        and b_release[0].time < last_write(h, "INV-1").time
    )


def a_release_refused_after_its_write(h):
    """A's only refusal is its release, after its write committed."""
    release, write = find(h, "A", "release", "lost"), find(h, "A", "write", "ok")
    return bool(release and write) and release[0].time >= write[-1].time


def b_renews_at_17_and_a_is_refused(h):
    """B's renewal at t=17 succeeds, B writes and releases; A's own renewal is refused."""
    renew = find(h, "B", "renew", "ok")
    return (
        [e.time for e in renew] == [17]
        and len(find(h, "B", "write", "ok")) == 2
        and bool(find(h, "B", "release", "ok"))
        and bool(find(h, "A", "renew", "lost"))
    )


def b_refused_at_32_and_stops(h):
    """B's lease ends at 20; its renewal at 32 is refused, and B writes and releases nothing."""
    refused = find(h, "B", "renew", "lost")
    return (
        grant(h, "B").until == 20
        and [e.time for e in refused] == [32]
        and not find(h, "B", "write")
        and not find(h, "B", "release")
    )


def a_inv1_stands(h):
    """A's INV-1 is the last committed INV-1 and nothing with a higher generation committed."""
    return last_write(h, "INV-1").worker == "A" and not [
        e for e in find(h, action="write", outcome="ok") if (e.generation or 0) > 7
    ]


def b_writes_12s_after_its_lease(h):
    """B's first committed write comes 12 s after its lease's end."""
    return find(h, "B", "write", "ok")[0].time - grant(h, "B").until == 12


def a_lands_in_b_gap(h):
    """A's write commits between B's read of INV-1 and B's write, and B's write is last."""
    read = find(h, "B", "read", target="INV-1")[0]
    a, b = find(h, "A", "write", "ok", "INV-1"), find(h, "B", "write", "ok", "INV-1")
    return (
        bool(a and b)
        and read.time <= a[0].time <= b[0].time
        and last_write(h, "INV-1").worker == "B"
    )


def b_bills_order_twice(h):
    """B's two writes with its key both commit, with the same generation 8."""
    billed = find(h, "B", "write", "ok")
    return (
        len(billed) == 2
        and {e.key for e in billed} == {billed[0].key}
        and {e.generation for e in billed} == {8}
    )


def b_bills_order_once(h):
    """B's repeat with the same key is answered as a duplicate: one commit."""
    return len(find(h, "B", "write", "ok")) == 1 and len(find(h, "B", "write", "duplicate")) == 1


def a_moves_fence_back(h):
    """A's raise to 7 commits after B's raise to 8, and A's INV-1 replaces B's."""
    b_raise = find(h, "B", "raise", "ok")
    a_raise = [e for e in find(h, "A", "raise", "ok") if e.generation == 7]
    return (
        bool(a_raise and b_raise) and a_raise[-1].time > b_raise[0].time and a_overwrites_b_inv1(h)
    )


def fence_8_but_inv1_7(h):
    """B's raise to 8 commits, yet the last committed INV-1 carries A's 7."""
    return bool(find(h, "B", "raise", "ok")) and last_write(h, "INV-1").generation == 7


def b_reads_a_then_replaces(h):
    """B raises the fence after A's commit, reads A's INV-1 (7), then replaces it."""
    a = find(h, "A", "write", "ok", "INV-1")
    b_raise = [e for e in find(h, "B", "raise", "ok") if e.generation == 8]
    read = [e for e in find(h, "B", "read", target="INV-1") if e.generation == 7]
    return (
        bool(a and b_raise and read)
        and a[0].time <= b_raise[0].time
        and last_write(h, "INV-1").worker == "B"
    )


def a_export_lands_on_inv2(h):
    """A's fenced INV-1 bounces, but its unfenced INV-2 commits after B's and is the last."""
    return (
        bool(find(h, "A", "write", "rejected", "INV-1"))
        and last_write(h, "INV-2").worker == "A"
        and bool(find(h, "B", "write", "ok", "INV-2"))
    )


def two_holders_with_7(h):
    """B is granted 7 at t=2, while A, also granted 7, holds the lease until 10."""
    a, b = grant(h, "A"), grant(h, "B")
    return a.generation == b.generation == 7 and b.time == 2 and a.until == 10


def b_handed_7_again(h):
    """After the restore B is granted the very generation A holds, 7."""
    return grant(h, "A").generation == grant(h, "B").generation == 7


def a_writes_after_authority_tick(h):
    """A commits writes at or after the end of the lease the authority granted it, where B takes over."""
    end = max(e.until for e in find(h, "A", action="renew", outcome="ok") + [grant(h, "A")])
    return any(e.time >= end for e in find(h, "A", "write", "ok")) and grant(h, "B").time == end


def a_renewed_at_10_from_12_to_20(h):
    """A's one granted renewal is at t=10 (its request's arrival) and moves its lease's end from 12 to 20."""
    renewals = find(h, "A", action="renew", outcome="ok")
    return [(e.time, e.until) for e in renewals] == [(10, 20)] and grant(h, "A").until == 12


def a_stops_before_tick(h):
    """Every write of A's begins before its lease ends, and B's writes are the last of each invoice."""
    end = max(e.until for e in find(h, "A", action="renew", outcome="ok") + [grant(h, "A")])
    return all(e.time < end for e in find(h, "A", "write")) and all(
        last_write(h, inv).worker == "B" for inv in ("INV-1", "INV-2", "INV-3")
    )


def a_idle_9_to_13(h):
    """A commits no write strictly between t=8 and t=13."""
    times = [e.time for e in find(h, "A", "write", "ok")]
    return 8 in times and 13 in times and not [t for t in times if 8 < t < 13]


def a_release_deletes_b_lease(h):
    """A's late release commits while B holds 8, C is granted 9 before B finished, B's last write bounces."""
    release = find(h, "A", "release", "ok")
    c = grant(h, "C")
    return (
        bool(release)
        and grant(h, "B").time < release[0].time < grant(h, "B").until
        and c.generation == 9
        and c.time < grant(h, "B").until
        and bool(find(h, "B", "write", "rejected"))
    )


def a_release_refused(h):
    """A's late release is refused and C only gets the lease after B released it."""
    b_release = find(h, "B", "release", "ok")
    return (
        bool(find(h, "A", "release", "lost"))
        and bool(b_release)
        and grant(h, "C").time >= b_release[0].time
    )


def a_lands_on_b_after_pause(h):
    """A, paused at t=4, commits INV-1 after B's INV-1 (generation 8) and is the last writer."""
    return (
        find(h, "A", "pause")[0].time == 4
        and grant(h, "B").generation == 8
        and a_overwrites_b_inv1(h)
    )


def w_acts_on_replayed_notice(h):
    """W writes with 8 after X (9) took the lease, and overwrites X's INV-1."""
    w = find(h, "W", "write", "ok")
    return bool(w) and w[0].time > grant(h, "X").time and last_write(h, "INV-1").worker == "W"


def w_writes_nothing_stale(h):
    """No write of W's commits before X released, and the last INV-1 is never W's with 8 over X's 9."""
    x_release = find(h, "X", "release", "ok")
    early = [e for e in find(h, "W", "write", "ok") if x_release and e.time < x_release[0].time]
    return bool(x_release) and not early


def c1_billed_twice(h):
    """c1 is committed as c1@7 by A and again as c1@9 by C; A's c2 bounces."""
    targets = {e.target for e in find(h, action="write", outcome="ok")}
    return {"c1@7", "c1@9"} <= targets and bool(find(h, "A", "write", "rejected", "c2@7"))


def each_customer_once(h):
    """Each customer's key commits exactly once."""
    keys = [e.key for e in find(h, action="write", outcome="ok")]
    return len(keys) == 3 and len(set(keys)) == 3


def two_emails(h):
    """Two emails go out, B's and then A's stale one, while A's file write bounces."""
    sent = find(h, action="email", outcome="ok")
    return [e.worker for e in sent] == ["B", "A"] and bool(find(h, "A", "write", "rejected"))


def one_email_with_replay(h):
    """The relay sends once, crashes, sends again and the provider answers duplicate; A's intent is refused."""
    relay = [e.outcome for e in find(h, "relay", "email")]
    return relay == ["ok", "duplicate"] and bool(find(h, "A", "email", "rejected"))


def lands_between_read_and_write(h, writer, reader, target):
    """``writer``'s committed ``target`` falls between ``reader``'s read of it and its write,
    and the reader's write is the last: the reader replaced it without having seen it."""
    read = find(h, reader, "read", target=target)
    mine = find(h, writer, "write", "ok", target)
    theirs = find(h, reader, "write", "ok", target)
    return (
        any(
            r.time <= m.time <= t.time and h.index(r) < h.index(m) < h.index(t)
            for r in read
            for m in mine
            for t in theirs
        )
        and last_write(h, target).worker == reader
    )


def a_inv2_unseen_by_b(h):
    """A's second write, INV-2, lands between B's read and B's write of INV-2."""
    return lands_between_read_and_write(h, "A", "B", "INV-2")


def b_replaces_a_unseen(h):
    """Some write of A's lands after B read that invoice and before B wrote it."""
    return any(
        lands_between_read_and_write(h, "A", "B", inv) for inv in ("INV-1", "INV-2", "INV-3")
    )


def a_passes_level_with_b(h):
    """A's late INV-2 commits after B's, carrying the very generation B wrote it with."""
    a, b = find(h, "A", "write", "ok", "INV-2"), find(h, "B", "write", "ok", "INV-2")
    return (
        bool(a and b)
        and a[-1].time > b[-1].time
        and a[-1].generation == b[-1].generation
        and last_write(h, "INV-2").worker == "A"
    )


def b_gets_a_number_again(h):
    """B is granted A's own generation, and A's late write passes level with B's."""
    return grant(h, "B").generation == grant(h, "A").generation and a_passes_level_with_b(h)


def c_takes_over_at_b_expiry(h):
    """B (8) crashes; C is granted 9 exactly when B's lease ends."""
    b, c = grant(h, "B"), grant(h, "C")
    return (
        bool(find(h, "B", "crash")) and (b.generation, c.generation) == (8, 9) and c.time == b.until
    )


def file_holds_b_report(h):
    """The last committed report.txt is B's with 8; A's write of it is refused."""
    last = last_write(h, "report.txt")
    return (last.worker, last.generation) == ("B", 8) and bool(
        find(h, "A", "write", "rejected", "report.txt")
    )


def outcome_grid(scenario, x, y, protected=False, **fixed):
    """The cells :func:`labkit.views.plot.outcome_map` colours for the same call: its "history"
    is ``{(x value, y value): the run's violation kinds}``."""
    (xname, xs), (yname, ys) = x, y
    cells = {
        (xv, yv): scenario(protected=protected, **{**fixed, xname: xv, yname: yv}).kinds
        for xv in xs
        for yv in ys
    }
    harmful = sorted(cell for cell, kinds in cells.items() if kinds)
    return SimpleNamespace(history=cells, verdict=f"harmful cells {harmful}")


def first_harm(cells, y) -> object:
    """The smallest x whose cell in row ``y`` has a lost update (None: none has)."""
    return min((x for (x, yy), kinds in cells.items() if yy == y and "lost_update" in kinds),
               default=None)


def every_ttl_has_a_losing_pause(cells):
    """Each lease length's row has a pause whose run loses an update."""
    return all(first_harm(cells, ttl) is not None for ttl in {y for _, y in cells})


def minute_survives_30_loses_to_90(cells):
    """ttl=60: the 30 s pause's run is clean, the 90 s pause's loses an update."""
    return not cells[(30, 60)] and "lost_update" in cells[(90, 60)]


def longer_lease_moves_the_boundary(cells):
    """In each ttl row the harmful gaps are all those from the row's first harmful one on, and a
    longer lease has a later first harmful gap."""
    ttls, gaps = sorted({y for _, y in cells}), sorted({x for x, _ in cells})
    firsts = [first_harm(cells, ttl) for ttl in ttls]
    suffix = all(("lost_update" in cells[(g, ttl)]) == (f is not None and g >= f)
                 for ttl, f in zip(ttls, firsts) for g in gaps)
    return None not in firsts and suffix and firsts == sorted(set(firsts))


def herd_runs(**knobs):
    """Lesson 06's three herd runs, as its plot cell makes them: their histories by label."""
    runs = {"no backoff": herd(protected=False, **knobs),
            "jittered backoff": herd(strategy="jitter", **knobs),
            "predecessor watch": herd(strategy="watch", **knobs)}
    history = {label: run.history for label, run in runs.items()}
    return SimpleNamespace(history=history, verdict="; ".join(r.verdict for r in runs.values()))


def attempts(history) -> list:
    """The contenders' acquire attempts (H, the first holder, is not one)."""
    return [e for e in history if e.action == "acquire" and e.worker != "H"]


def eight_or_nine_grants(runs):
    """Each of the three runs grants the lease to a contender eight or nine times."""
    return all(len([e for e in attempts(h) if e.outcome == "ok"]) in (8, 9) for h in runs.values())


def losers_retry_every_second_in_step(runs):
    """No backoff: every attempt falls on a whole second, and many contenders try at each."""
    at = Counter(e.time for e in attempts(runs["no backoff"]))
    return len(at) >= 8 and all(t == int(t) and n > 1 for t, n in at.items())


def jitter_busier_first_then_thinner(runs):
    """Jitter: more attempts than no backoff in the first second, fewer in all, and after the
    first second never two at one instant, where no backoff has dozens."""
    none, jitter = attempts(runs["no backoff"]), attempts(runs["jittered backoff"])
    first = [sum(1 for e in run if int(e.time) == 1) for run in (none, jitter)]
    together = [max(Counter(e.time for e in run if e.time >= 2).values(), default=0)
                for run in (none, jitter)]
    return first[1] > first[0] and len(jitter) < len(none) and together[1] == 1 < together[0]


def watch_one_attempt_per_grant(runs):
    """The watch: every attempt is granted."""
    tried = attempts(runs["predecessor watch"])
    return bool(tried) and all(e.outcome == "ok" for e in tried)


def a_holds_9(h):
    """A is granted 9, the last of three tokens issued after the backup (which holds 6)."""
    return grant(h, "A").generation == 9


def b_below_the_fence_locked_out(h):
    """B is granted less than A's 9 and its raise of the fence is refused, while A's stale write
    commits long after its lease ended."""
    a, b = grant(h, "A"), grant(h, "B")
    late = [e for e in find(h, "A", "write", "ok") if e.time >= a.until + 10]
    return b.generation < a.generation and bool(find(h, "B", "raise", "rejected")) and bool(late)


def bump_reaches_every_number(h):
    """B is granted more than A's 9, and A's late write bounces: nothing of A's commits late."""
    a, b = grant(h, "A"), grant(h, "B")
    late = [e for e in find(h, "A", "write", "ok") if e.time >= a.until]
    return b.generation > a.generation and bool(find(h, "A", "write", "rejected")) and not late


def lease_end(h, worker):
    """The end of ``worker``'s lease at the authority: its last granted acquire or renewal."""
    return max(e.until for e in find(h, worker, "renew", "ok") + [grant(h, worker)])


def b_moves_in_3s_early(h):
    """B, its clock 3 s ahead, is granted the lease 3 s before A's ends, and A commits in between."""
    end, b = lease_end(h, "A"), grant(h, "B")
    during = [e for e in find(h, "A", "write", "ok") if b.time <= e.time < end]
    return b.time == end - 3 and bool(during)


def a_stops_3s_early(h):
    """Every write of A's begins 3 s or more before its lease ends, so none lands after B's grant."""
    end = lease_end(h, "A")
    return bool(find(h, "A", "write")) and all(e.time <= end - 3 for e in find(h, "A", "write"))


@dataclass(frozen=True)
class Claim:
    """A sentence of a lesson, the run it describes and the check on that run's events."""

    notebook: str
    sentence: str
    call: Callable
    knobs: dict
    holds: Callable

    def run(self):
        return self.call(**self.knobs)


def claim(notebook, sentence, call, holds, **knobs) -> Claim:
    return Claim(notebook, sentence, call, knobs, holds)


U, P = {"protected": False}, {"protected": True}
# the grids of the lessons' outcome_map cells, as those cells give them
PAUSES_01, TTLS_01 = ("pause", (0, 5, 10, 15, 20, 30, 45, 60, 90, 120)), ("ttl", (5, 10, 20, 30, 60))
GAPS_03, TTLS_03 = ("gap", (0, 1, 2, 3, 4, 6, 8, 12, 20, 30)), ("ttl", (5, 10, 20, 30))

# One row per sentence, as the lessons read (kept one line each: a table, not code).
# fmt: off
CLAIMS = [
    # 00-start-here
    claim('00-start-here', "move it above and A's late write lands on B's work",
          expired_but_alive, a_overwrites_b_inv1, **U),
    claim('00-start-here', 'The `protected` button sends every write through a fence.',
          expired_but_alive, a_write_refused_with_7, **P),
    # 01-expired-but-alive
    claim('01-expired-but-alive', 'A acquires at t = 0 (generation 7)',
          expired_but_alive, a7_then_b8_at_10, **U, pause=30, ttl=10),
    claim('01-expired-but-alive', "At t = 30 A resumes and writes INV-1 from its old read: B's INV-1 is replaced",
          expired_but_alive, a_overwrites_b_inv1, **U, pause=30, ttl=10),
    claim('01-expired-but-alive', 'INV-1 carries generation 7 although generation 8 had already completed the run.',
          expired_but_alive, inv1_ends_with_7, **U, pause=30, ttl=10),
    claim('01-expired-but-alive', 'The only hint A ever gets is the refused release *after* its write',
          expired_but_alive, a_release_refused_after_its_write, **U, pause=30, ttl=10),
    claim('01-expired-but-alive', "here 8 once B has written, and refuses A's 7",
          expired_but_alive, a_write_refused_with_7, **P, pause=30, ttl=10),
    claim('01-expired-but-alive', 'For every lease length there is a pause long enough.',
          outcome_grid, every_ttl_has_a_losing_pause, scenario=expired_but_alive, x=PAUSES_01, y=TTLS_01),
    claim('01-expired-but-alive', 'A one-minute lease survives the 30-second pause, and loses to a 90-second one.',
          outcome_grid, minute_survives_30_loses_to_90, scenario=expired_but_alive, x=PAUSES_01, y=TTLS_01),
    # 02-fencing-tokens
    claim('02-fencing-tokens', "With a 15 s stop, B's renewal at t=17 succeeds",
          lock_wait, b_renews_at_17_and_a_is_refused, **P, hold=15, ttl=10),
    claim('02-fencing-tokens', 'Its renewal is refused, so B stops: it writes nothing',
          lock_wait, b_refused_at_32_and_stops, **P, hold=30, ttl=10),
    claim('02-fencing-tokens', "A's INV-1 stands, and that is safe",
          lock_wait, a_inv1_stands, **P, hold=30, ttl=10),
    claim('02-fencing-tokens', 'B writes 12 s after its own lease ended',
          lock_wait, b_writes_12s_after_its_lease, **U, hold=30, ttl=10),
    claim('02-fencing-tokens', "A's second write lands after B has read INV-2, B replaces it without having seen it",
          lock_wait, a_inv2_unseen_by_b, **U, hold=30, ttl=10),
    claim('02-fencing-tokens', "A's write lands in the gap",
          raise_then_read, a_lands_in_b_gap, **U, gap=5, pause=12),
    claim('02-fencing-tokens', "A's write bounces, and what B reads",
          raise_then_read, a_write_refused_with_7, **P, gap=5, pause=12),
    claim('02-fencing-tokens', 'passes the fence and bills the order a second time',
          same_generation_duplicate, b_bills_order_twice, **U, repeats=2),
    claim('02-fencing-tokens', 'the repeat finds the key and returns the first result',
          same_generation_duplicate, b_bills_order_once, **P, repeats=2),
    # 03-dangerous-variants
    claim('03-dangerous-variants', "A's write replaced B's invoice **and moved the fence back** to 7",
          check_then_act, a_moves_fence_back, **U, gap=5, ttl=10),
    claim('03-dangerous-variants', 'whose conditional `UPDATE` is the check and the write',
          check_then_act, a_write_refused_with_7, **P, gap=5, ttl=10),
    claim('03-dangerous-variants', 'The fence says 8 and INV-1 says 7.',
          split_databases, fence_8_but_inv1_7, **U, pause=30, ttl=10),
    claim('03-dangerous-variants', "raises the fence after A's commit, and reads A's invoice before replacing it",
          split_databases, b_reads_a_then_replaces, **P, pause=15, ttl=10),
    claim('03-dangerous-variants', "INV-2 directly, and that write lands on B's run",
          bypass_writer, a_export_lands_on_inv2, **U, pause=30, ttl=10),
    claim('03-dangerous-variants', 'A longer lease moves the boundary, as in lesson 01',
          outcome_grid, longer_lease_moves_the_boundary, scenario=check_then_act, x=GAPS_03, y=TTLS_03),
    # 04-who-issues-the-numbers
    claim('04-who-issues-the-numbers', 'Say three tokens were issued after the backup (A holds the last one, 9)',
          backup_restore, a_holds_9, **U, issued_after_backup=3, bump=0),
    claim('04-who-issues-the-numbers', 'B either receives a number below the fence (the rightful holder is locked out',
          backup_restore, b_below_the_fence_locked_out, **U, issued_after_backup=3, bump=0),
    claim('04-who-issues-the-numbers', 'B either receives a number below the fence (the rightful holder is locked out',
          backup_restore, b_below_the_fence_locked_out, **U, issued_after_backup=3, bump=1),
    claim('04-who-issues-the-numbers', 'A constant is safe only if the restored counter plus the constant reaches every number',
          backup_restore, bump_reaches_every_number, **U, issued_after_backup=3, bump=3),
    claim('04-who-issues-the-numbers', 'A constant is safe only if the restored counter plus the constant reaches every number',
          backup_restore, bump_reaches_every_number, **U, issued_after_backup=3, bump=10),
    claim('04-who-issues-the-numbers', 'Two holders at once, both with 7',
          issuer_failover, two_holders_with_7, **U, lag=5, failover_at=2),
    claim('04-who-issues-the-numbers', 'the restore brings back 6, and B is handed 7 again',
          backup_restore, b_handed_7_again, **U, issued_after_backup=1),
    claim('04-who-issues-the-numbers', "A's old 7 bounces off the new epoch",
          issuer_failover, a_late_write_refused, **P, lag=5, failover_at=2),
    claim('04-who-issues-the-numbers', "A's old 7 bounces off the new epoch",
          backup_restore, a_late_write_refused, **P, issued_after_backup=1),
    claim('04-who-issues-the-numbers', "its write passes the fence level with B's and B's invoice is lost",
          issuer_failover, a_passes_level_with_b, **U, lag=5, failover_at=2),
    claim('04-who-issues-the-numbers', "or, worse, exactly A's number again, which the fence lets through",
          backup_restore, b_gets_a_number_again, **U, issued_after_backup=3, bump=2),
    # 05-late-renewal
    claim('05-late-renewal', "A's markers keep coming after that tick",
          late_renewal, a_writes_after_authority_tick, **U),
    claim('05-late-renewal', "The open triangle at t=10 is A's\nrenewal, granted when its request reached the authority",
          late_renewal, a_renewed_at_10_from_12_to_20, **U),
    claim('05-late-renewal', 'so B replaced them without ever seeing them',
          late_renewal, b_replaces_a_unseen, **U),
    claim('05-late-renewal', "A's writes now stop before the authority's tick, and B's run is untouched.",
          late_renewal, a_stops_before_tick, **P),
    claim('05-late-renewal', 'A also sits idle from t=9 to t=13.',
          late_renewal, a_idle_9_to_13, **P),
    claim('05-late-renewal', 'B sees the end `offset` seconds early and moves in while A is still entitled to work',
          late_renewal, b_moves_in_3s_early, **U, response_latency=0.0, offset=3.0),
    claim('05-late-renewal', 'The protected A assumes such a bound (here: the offset itself) and stops that much earlier',
          late_renewal, a_stops_3s_early, **P, response_latency=0.0, offset=3.0),
    # 06-lease-hygiene
    claim('06-lease-hygiene', 'All three hand out the lease eight or nine times',
          herd_runs, eight_or_nine_grants),
    claim('06-lease-hygiene', 'Without backoff, every loser comes back every second, in step.',
          herd_runs, losers_retry_every_second_in_step),
    claim('06-lease-hygiene', 'With jitter the first second is even busier',
          herd_runs, jitter_busier_first_then_thinner),
    claim('06-lease-hygiene', 'The watch needs one attempt per grant.',
          herd_runs, watch_one_attempt_per_grant),
    claim('06-lease-hygiene', "B's last write is refused by the fence (C raised it to 9)",
          late_release, a_release_deletes_b_lease, **U),
    claim('06-lease-hygiene', "A's late `DELETE` matches nothing and is refused",
          late_release, a_release_refused, **P),
    claim('06-lease-hygiene', "Unfenced, A's write lands on B's run",
          version_wait, a_lands_on_b_after_pause, **U),
    claim('06-lease-hygiene', "with writes through the fence, A's 7 bounces off 8.",
          version_wait, a_write_refused_with_7, **P),
    claim('06-lease-hygiene', 'The naive W treats that as its turn',
          stale_watch, w_acts_on_replayed_notice, **U),
    claim('06-lease-hygiene', 'joins again at the back and waits',
          stale_watch, w_writes_nothing_stale, **P),
    claim('06-lease-hygiene', "C (`host-2`) walks in while B is still working",
          late_release, a_release_deletes_b_lease, **U),
    # 07-recovery
    claim('07-recovery', 'c1 was billed twice: once by A before it stalled',
          crash_after_fence, c1_billed_twice, **U),
    claim('07-recovery', 'leaves nothing for the retry to repeat',
          crash_after_fence, each_customer_once, **P),
    claim('07-recovery', "C (9) takes over once B's lease lapses",
          crash_after_fence, c_takes_over_at_b_expiry, **U),
    # 08-transfer-file-and-email
    claim('08-transfer-file-and-email', "sent two emails, and the second one announces A's stale report",
          email_transfer, two_emails, **U),
    claim('08-transfer-file-and-email', 'sends again with the same key and the provider recognises it',
          email_transfer, one_email_with_replay, **P),
    claim('08-transfer-file-and-email', "The file holds B's report (generation 8): the fence refused A's write.",
          email_transfer, file_holds_b_report, **U),
    # 09-review
    claim('09-review', 'only the\nfence, which orders generations, stops it',
          expired_but_alive, a_overwrites_b_inv1, **U),
    claim('09-review', 'only the\nfence, which orders generations, stops it',
          expired_but_alive, a_write_refused_with_7, **P),
    claim('09-review', 'only the operation key stops the repeat',
          same_generation_duplicate, b_bills_order_twice, **U),
    claim('09-review', 'only the operation key stops the repeat',
          same_generation_duplicate, b_bills_order_once, **P),
]
# fmt: on
