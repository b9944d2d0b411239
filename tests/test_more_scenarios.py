"""Scenarios of lessons 04-08: each failure really happens unprotected and never happens protected."""

import itertools

import pytest

from labkit import BadArgument, BadArgumentType
from labkit import scenarios as ms
from labkit.scenarios import delays, effects, issuers, recovery, waiting
from labkit.mechanisms.issuers import bump_is_safe
from labkit.sim import SCENARIOS

MODULES = (issuers, delays, waiting, recovery, effects)
NAMES = [name for module in MODULES for name in module.__all__]   # lessons 04-08's nine scenarios


def sweep(scenario, **ranges):
    """Run ``scenario`` both ways over the product of ``ranges``: [(knobs, unprotected, protected)]."""
    names = list(ranges)
    runs = []
    for values in itertools.product(*ranges.values()):
        knobs = dict(zip(names, values))
        runs.append((knobs, scenario(protected=False, **knobs), scenario(protected=True, **knobs)))
    return runs


def outcomes(result, action="write"):
    """(worker, outcome, generation, target) of every ``action`` event, in order."""
    return [(e.worker, e.outcome, e.generation, e.target) for e in result.history if e.action == action]


def test_every_scenario_is_registered_with_its_knobs():
    """All nine are in SCENARIOS, with keyword-only knobs and source defaults."""
    assert len(NAMES) == 9
    for name in NAMES:
        assert SCENARIOS[name] is getattr(ms, name)
    assert ms.issuer_failover.knobs == {"lag": 5.0, "failover_at": 2.0, "pause": 30.0, "ttl": 10.0}
    assert ms.late_renewal.knobs == {"request_latency": 2.0, "response_latency": 3.0, "margin": 1.0,
                                     "drift": 0.0, "offset": 0.0, "ttl": 10.0}
    assert ms.email_transfer.knobs == {"pause": 30.0, "ttl": 10.0, "relay_crashes": 1}


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_run(name):
    """A scenario replays identically for a fixed seed: same history, same tables, same verdict."""
    scenario = getattr(ms, name)
    kw = {"contenders": 20, "strategy": "jitter"} if name == "herd" else {}
    for protected in (False, True):
        a, b = scenario(protected=protected, seed=3, **kw), scenario(protected=protected, seed=3, **kw)
        assert (a.history, a.tables, a.verdict) == (b.history, b.tables, b.verdict)


def warned(run) -> set:
    """The kinds of a run's warnings (timing discipline, never a violation)."""
    return {w.kind for w in run.warnings}


def test_issuer_failover_fails_exactly_when_the_failover_beats_replication():
    """Unprotected, the token 7 is handed out twice iff the failover comes before 7 reached the replica;
    then A's late write passes the fence beside B's. With a new epoch it never does."""
    for knobs, naive, safe in sweep(ms.issuer_failover, lag=[0.0, 1.0, 5.0, 20.0], failover_at=[0.5, 8.0]):
        lost = knobs["lag"] > knobs["failover_at"]
        assert bool(naive.violations) == lost, knobs
        if lost:
            assert naive.kinds == {"lost_update"} and warned(naive) == {"acted_after_expiry"}
            assert ("B", "ok", 7, "invoice-run") in outcomes(naive, "acquire")
            assert naive.verdict.startswith("token 7 went to A and B")
        assert safe.violations == (), knobs
        assert ("A", "rejected", 7, "INV-2") in outcomes(safe)
    safe = ms.issuer_failover()
    assert [o for o in outcomes(safe, "acquire") if o[1] == "ok"] == [("A", "ok", 7, "invoice-run"),
                                                                    ("B", "ok", (1, 1), "invoice-run")]
    assert [(r["epoch"], r["generation"]) for r in safe.tables["invoices"]] == [(1, 1), (1, 1)]


def test_issuer_failover_loses_the_lease_too_and_only_the_fence_stops_the_damage():
    """The lease record replicates like the counter: failing over before A's grant arrived loses A's
    lease, so B acquires at the failover (t=2) while A's lease runs to 10: two holders at once, both
    with 7 unprotected (A's late write lands); protected, B holds (1, 1) and A's write bounces."""
    for protected in (False, True):
        run = ms.issuer_failover(protected=protected)
        grants = [e for e in run.history if e.action == "acquire" and e.outcome == "ok"]
        assert [(e.worker, e.time) for e in grants] == [("A", 0.0), ("B", 2.0)] and grants[0].until == 10.0
        assert "Two holders at once: B from t=2, A's lease to t=10" in run.verdict
        late = [e for e in run.history if e.worker == "A" and e.target == "INV-2" and e.action == "write"]
        assert [e.outcome for e in late] == (["rejected"] if protected else ["ok"])
        assert bool(run.violations) is not protected
    replicated = ms.issuer_failover(protected=False, lag=1.0)   # the lease reached the replica
    assert [e.time for e in replicated.history if e.action == "acquire" and e.outcome == "ok"] == [0.0, 10.0]


def test_backup_restore_is_safe_only_with_an_epoch_or_a_big_enough_constant():
    """After the restore, B's token is 7 + bump against A's 6 + n: equal -> A's late write lands
    (violations); lower -> B is locked out and A's late write lands anyway, over nothing newer (a
    warning: acted after its lease expired); higher (bump >= n, bump_is_safe) -> A bounces.
    Protected, the new epoch always orders B above A."""
    for knobs, naive, safe in sweep(ms.backup_restore, issued_after_backup=[1, 2, 3], bump=[0, 1, 2, 1000]):
        n, bump = knobs["issued_after_backup"], knobs["bump"]
        locked_out = [e for e in naive.history if e.action == "raise" and e.outcome == "rejected"]
        assert bool(naive.violations) == (bump == n - 1), knobs
        assert bool(locked_out) == (bump < n - 1), knobs
        assert bump_is_safe(6, bump, 6 + n) == (not naive.violations and not locked_out), knobs
        assert bump_is_safe(6, bump, 6 + n) == (not naive.warnings), knobs
        if bump == n - 1:
            assert naive.kinds == {"lost_update"} and warned(naive) == {"acted_after_expiry"}
        elif locked_out:
            assert naive.kinds == set() and warned(naive) == {"acted_after_expiry"}
        assert safe.violations == (), knobs
        assert ("A", "rejected", 6 + n, "INV-2") in outcomes(safe)
        assert not [e for e in safe.history if e.action == "raise" and e.outcome == "rejected"]


def test_late_renewal_counting_from_arrival_acts_after_expiry():
    """Counting a full lease from the answer's arrival writes after B took over (acted_after_expiry,
    and unfenced, lost/stale writes); B's clock running ahead lets B in early (conflicting writes).
    The conservative keeper, counting from the send time with margin, drift and offset bounds, never fails."""
    failed = 0
    runs = sweep(ms.late_renewal, request_latency=[0.0, 2.0, 4.0], response_latency=[0.0, 3.0],
                 drift=[0.0, 0.2], offset=[0.0, 3.0])
    for knobs, naive, safe in runs:
        assert safe.violations == (), knobs
        assert not [e for e in safe.history if e.outcome == "rejected"], knobs   # it stopped in time
        if naive.violations:
            failed += 1
            assert naive.kinds <= {"lost_update", "stale_accepted"}, knobs
            if knobs["offset"] == 0.0:
                assert "acted_after_expiry" in warned(naive), knobs
        if knobs["offset"] or knobs["response_latency"] or knobs["drift"]:
            assert naive.violations, knobs
    assert failed >= len(runs) // 2
    default = ms.late_renewal(protected=False)
    assert default.kinds == {"lost_update", "stale_accepted"} and warned(default) == {"acted_after_expiry"}
    exact = ms.late_renewal(protected=False, request_latency=0.0, response_latency=0.0)
    assert exact.violations == ()          # no latency, no drift, no offset: the naive count is exact


def test_late_renewal_keeper_stops_before_the_authoritys_expiry():
    """Protected at the defaults: A's last write comes before the renewed expiry, B's first after it."""
    result = ms.late_renewal()
    renewed = [e.until for e in result.history if e.action == "renew" and e.worker == "A"]
    a_writes = [e.time for e in result.history if e.worker == "A" and e.action == "write"]
    b_first = min(e.time for e in result.history if e.worker == "B" and e.action == "write")
    assert renewed == [20.0] and max(a_writes) < renewed[0] <= b_first


def test_late_release_deletes_the_successors_lease_only_when_naive():
    """A release arriving while B holds the lease deletes it when it checks only name and owner;
    labkit's (owner AND generation) is refused. Early or very late releases harm nobody."""
    for knobs, naive, safe in sweep(ms.late_release, delay=[0.0, 5.0, 12.0, 30.0]):
        arrives = 2.0 + knobs["delay"]
        assert bool(naive.violations) == (10.0 < arrives < 15.0), knobs
        if naive.violations:
            assert naive.kinds == {"foreign_release"}
            assert ("A", "ok", 7, "invoice-run") in outcomes(naive, "release")
        assert safe.violations == (), knobs
    safe = ms.late_release()
    assert ("A", "lost", 7, "invoice-run") in outcomes(safe, "release")
    assert ("B", "ok", 8, "invoice-run") in outcomes(safe, "release")


def herd_row(result):
    """The one summary row of a herd run."""
    [row] = result.tables["herd"]
    return row


@pytest.mark.parametrize("contenders", [1, 10, 100, 1000])
def test_herd_attempts_and_wakeups_by_strategy(contenders):
    """No backoff: every waiter retries every second; jitter spreads and thins the retries;
    a predecessor watch wakes one waiter per release. Nobody breaks safety in any of them."""
    none = ms.herd(protected=False, contenders=contenders)
    jitter = ms.herd(contenders=contenders, strategy="jitter")
    watch = ms.herd(contenders=contenders, strategy="watch")
    rows = {r["strategy"]: r for r in map(herd_row, (none, jitter, watch))}
    for r in (none, jitter, watch):
        assert r.violations == ()
        grants = [e for e in r.history if e.action == "acquire" and e.outcome == "ok"]
        assert len(grants) == herd_row(r)["grants"] + 1          # + the first holder
        assert herd_row(r)["attempts"] == sum(1 for e in r.history if e.action == "acquire") - 1
    assert rows["watch"]["attempts"] == rows["watch"]["grants"]  # every woken waiter wins
    assert rows["watch"]["wakeups"] <= rows["watch"]["grants"] + 1
    if contenders >= 10:
        assert rows["none"]["attempts"] > 5 * rows["watch"]["attempts"]
        assert rows["none"]["wakeups"] >= contenders
    if contenders >= 100:
        assert rows["jitter"]["attempts"] < rows["none"]["attempts"]
        seconds = {r["second"]: r["attempts"] for r in jitter.tables["herd_seconds"]}
        assert seconds[8] < seconds[1] / 4                        # retries thin out over time


def test_stale_watch_acts_on_a_replayed_notification_only_when_naive():
    """After an outage longer than the session, the replayed 'A is gone' makes the naive watcher write
    with its dead number 8 after X's 9; the rechecking watcher rejoins as 10 and waits."""
    for knobs, naive, safe in sweep(ms.stale_watch, outage=[1.0, 6.0, 10.0]):
        assert bool(naive.violations) == (knobs["outage"] > 3.0), knobs
        if naive.violations:
            assert naive.kinds == {"stale_accepted", "lost_update"}
            assert ("W", "ok", 8, "INV-1") in outcomes(naive)
        assert safe.violations == (), knobs
    safe = ms.stale_watch()
    assert [(w, g) for w, o, g, t in outcomes(safe, "acquire")] == [("A", 7), ("X", 9), ("W", 10)]


def test_version_wait_needs_the_fence_for_a_paused_holder():
    """B claims only after an unchanged full duration, yet a pause longer than that lets A write late:
    unfenced it overwrites B, fenced it bounces. B's clock offset changes nothing."""
    for knobs, naive, safe in sweep(ms.version_wait, pause=[2.0, 30.0, 60.0], offset=[0.0, 1e6]):
        late = knobs["pause"] == 30.0 or knobs["pause"] == 60.0
        assert naive.kinds == ({"lost_update", "stale_accepted"} if late else set()), knobs
        assert safe.violations == (), knobs
        claims = [e for e in safe.history if e.action == "acquire" and e.outcome == "ok"]
        assert [e.generation for e in claims] == [7, 8]
    a, b = ms.version_wait(offset=0.0), ms.version_wait(offset=1e6)
    assert a.history == b.history


def billed(result):
    """Customer -> number of invoice rows for that customer."""
    counts = {}
    for row in result.tables["invoices"]:
        customer = row["invoice_id"].split("@")[0]
        counts[customer] = counts.get(customer, 0) + 1
    return counts


def test_crash_after_fence_recovers_every_invoice_exactly_once():
    """Unprotected (age-only requeue, restart from c1, no operation ids) bills c1 again; protected
    (progress, conditional requeue, operation ids) bills every customer once, whenever B crashes."""
    for knobs, naive, safe in sweep(ms.crash_after_fence, crash_after=[0, 1, 2], invoices=[3, 5]):
        customers = {f"c{i + 1}" for i in range(knobs["invoices"])}
        assert "duplicate_effect" in naive.kinds, knobs
        assert billed(naive)["c1"] >= 2
        assert safe.violations == (), knobs
        assert billed(safe) == dict.fromkeys(customers, 1), knobs
        assert [r["state"] for r in safe.tables["claims"]] == ["done"]
    with_repeat = ms.crash_after_fence(crash_after=1)
    assert ("C", "duplicate", 9, "c2@9") in outcomes(with_repeat)   # the key stopped the repeat


def test_crash_after_fence_sweeper_requeues_each_dead_claim_once():
    """The protected sweeper requeues A's claim, then B's, and nothing else."""
    result = ms.crash_after_fence()
    assert [(e.worker, e.generation) for e in result.history if e.action == "sweep"] == \
        [("sweeper", 7), ("sweeper", 8)]


def emails(result):
    """(worker, outcome) of every email event."""
    return [(e.worker, e.outcome) for e in result.history if e.action == "email"]


def test_email_transfer_stale_email_goes_out_unless_it_goes_through_the_outbox():
    """Unprotected, A's file write bounces but its email went out first (two emails for one report);
    protected, A's intent is refused with its file and the relay delivers exactly one email."""
    for knobs, naive, safe in sweep(ms.email_transfer, pause=[0.0, 30.0], relay_crashes=[0, 1, 3]):
        assert "duplicate_effect" in naive.kinds, knobs
        assert len(naive.tables["provider_records"]) == 2
        assert safe.violations == (), knobs
        assert len(safe.tables["provider_records"]) == 1, knobs
        assert [r["state"] for r in safe.tables["outbox"]] == ["sent"]
        assert emails(safe).count(("relay", "duplicate")) == knobs["relay_crashes"] and \
            emails(safe).count(("relay", "ok")) == 1
    naive, safe = ms.email_transfer(protected=False), ms.email_transfer()
    assert naive.kinds == {"duplicate_effect"} and warned(naive) == {"acted_after_expiry"}
    assert emails(naive) == [("B", "ok"), ("A", "ok")]
    assert ("A", "rejected", 7, "report.txt") in outcomes(naive)
    assert ("A", "rejected") in emails(safe)
    assert [(r["name"], r["generation"]) for r in safe.tables["files"]] == [("report.txt", 8)]


@pytest.mark.parametrize("name, knob, value", [
    ("issuer_failover", "lag", -1.0), ("backup_restore", "issued_after_backup", 0),
    ("late_renewal", "drift", 0.9), ("late_release", "delay", float("nan")),
    ("herd", "contenders", 0), ("herd", "strategy", "fast"), ("stale_watch", "session", 0.0),
    ("version_wait", "duration", 0.0), ("crash_after_fence", "crash_after", 99),
    ("email_transfer", "relay_crashes", 1.5), ("herd", "colour", 1),
])
def test_bad_knobs_are_refused_by_name(name, knob, value):
    """A bad or unknown knob raises naming it."""
    with pytest.raises((BadArgument, BadArgumentType)) as caught:
        getattr(ms, name)(**{knob: value})
    assert caught.value.argument == knob


@pytest.mark.parametrize("module", [m.__name__.removeprefix("labkit.") for m in MODULES]
                         + [f"mechanisms.{m}" for m in ("issuers", "timing", "recovery", "effects")])
def test_docstring_examples_hold(module):
    """Every example in the docstrings of lessons 04-08's modules runs and prints what it shows."""
    import doctest
    import importlib
    result = doctest.testmod(importlib.import_module(f"labkit.{module}"))
    assert result.attempted > 0 and result.failed == 0
