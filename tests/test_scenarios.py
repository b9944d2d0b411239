"""Each scenario's lesson, both halves: the naive variant really fails somewhere in its knobs' range,
the protected one never does, and the protection is what stopped it."""

import itertools

import pytest

from labkit.sim.history import check
from labkit.scenarios import SCENARIOS

# scenario -> (knob grid, the violation kinds its naive variant must show)
SWEEPS = {
    "expired_but_alive": ({"pause": [0, 5, 9.5, 10, 10.5, 12, 30, 60], "ttl": [5, 10, 30]},
                          {"lost_update", "stale_accepted"}),
    "raise_then_read": ({"gap": [0, 1, 2, 3, 5, 10], "pause": [5, 10.5, 12, 20]},
                        {"lost_update"}),
    "check_then_act": ({"gap": [0, 1, 2, 3, 5, 8, 15], "ttl": [5, 10]},
                       {"stale_accepted", "lost_update"}),
    "split_databases": ({"pause": [0, 5, 9, 10, 12, 30], "ttl": [5, 10]},
                        {"stale_accepted", "lost_update"}),
    "bypass_writer": ({"pause": [0, 5, 10, 12, 30], "ttl": [10, 30]},
                      {"lost_update"}),
    "lock_wait": ({"hold": [0, 5, 7, 10, 20, 30], "ttl": [5, 10]},
                  {"stale_accepted"}),
    "same_generation_duplicate": ({"repeats": [1, 2, 3, 5]},
                                  {"duplicate_effect"}),
}
SEEDS = (0, 1, 2)


def grid(knobs):
    names = sorted(knobs)
    for values in itertools.product(*(knobs[n] for n in names)):
        yield dict(zip(names, values))


def test_every_scenario_is_swept():
    """The sweep covers every scenario of lessons 01-03 (and fails loudly if one is added unswept)."""
    mine = {name for name, f in SCENARIOS.items() if f.__module__ == "labkit.scenarios.fencing"}
    assert mine == set(SWEEPS)


@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_naive_fails_somewhere_protected_never(name):
    """Across the knob grid and seeds: naive runs show the lesson's violation at some points and none
    at others (there is a boundary); protected runs show none, and at every point where the naive run
    failed, the protected run's history shows the mechanism at work (a refusal, a key, or a lock wait)."""
    f, (knobs, expected) = SCENARIOS[name], SWEEPS[name]
    failed = clean = 0
    for point, seed in itertools.product(grid(knobs), SEEDS):
        naive, safe = f(protected=False, seed=seed, **point), f(protected=True, seed=seed, **point)
        assert safe.violations == (), (name, point, seed, safe.verdict)
        assert check(safe.history) == []
        if naive.violations:
            failed += 1
            assert naive.kinds & expected, (name, point, seed, naive.kinds)
            stopped = {e.outcome for e in safe.history} & {"rejected", "duplicate", "busy", "lost"}
            in_time = any(e.began is not None for e in safe.history)  # one transaction, begun in time
            assert stopped or in_time, (name, point, seed, "protected run shows no mechanism at work")
        else:
            clean += 1
    assert failed > 0, f"{name}: the naive variant never failed"
    assert clean > 0, f"{name}: the naive variant failed everywhere: no boundary to find"


@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_default_knobs_show_the_failure(name):
    """At the source's numbers (the defaults) the naive variant fails and the protected one holds."""
    f, (_, expected) = SCENARIOS[name], SWEEPS[name]
    naive, safe = f(protected=False), f()
    assert naive.kinds & expected and safe.violations == ()
    assert naive.verdict != safe.verdict


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_equal_histories_for_a_fixed_seed(name):
    """Running a scenario twice with one seed gives equal whole histories, tables and verdicts."""
    for protected in (False, True):
        first, second = (SCENARIOS[name](protected=protected, seed=7) for _ in range(2))
        assert (first.history, first.tables, first.verdict) == (second.history, second.tables, second.verdict)


@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_tables_match_the_history(name):
    """The invoices read from the real file are exactly what the last committed write of each put there."""
    for protected in (False, True):
        result = SCENARIOS[name](protected=protected)
        last = {}
        for e in result.history:
            if e.action == "write" and e.outcome == "ok":
                last[e.target] = e.generation
        assert {r["invoice_id"]: r["generation"] for r in result.tables["invoices"]} == last


def test_source_numbers():
    """Lesson 01 at the source's numbers: A holds 7, B 8, and the fence ends at 8 when protected."""
    safe = SCENARIOS["expired_but_alive"]()
    grants = [(e.worker, e.generation) for e in safe.history if e.action == "acquire" and e.outcome == "ok"]
    assert grants == [("A", 7), ("B", 8)]
    assert safe.tables["job_fence"] == [{"job_id": "invoice-run", "epoch": 0, "generation": 8}]
    assert safe.params == {"pause": 30.0, "ttl": 10.0, "protected": True, "seed": 0}
