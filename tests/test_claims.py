"""Every sentence a lesson says about a drawn run is checked on that run (tests/claims.py)."""

import dataclasses
import functools
import json
import os
import re

import pytest
from claims import (
    CLAIMS,
    GAPS_03,
    PAUSES_01,
    TTLS_01,
    TTLS_03,
    a_holds_9,
    a_stops_3s_early,
    b_below_the_fence_locked_out,
    b_moves_in_3s_early,
    bump_reaches_every_number,
    eight_or_nine_grants,
    every_ttl_has_a_losing_pause,
    herd_runs,
    jitter_busier_first_then_thinner,
    longer_lease_moves_the_boundary,
    losers_retry_every_second_in_step,
    minute_survives_30_loses_to_90,
    outcome_grid,
    watch_one_attempt_per_grant,
    a_overwrites_b_inv1,
    a_write_refused_with_7,
    b_bills_order_twice,
    b_refused_at_32_and_stops,
    b_replaces_a_unseen,
    two_emails,
)

from labkit.scenarios import (
    backup_restore,
    check_then_act,
    email_transfer,
    expired_but_alive,
    late_renewal,
    lock_wait,
    same_generation_duplicate,
)

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LESSONS = [f"{n:02d}" for n in range(10)]


def plain(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@functools.cache
def markdown(stem: str) -> dict:
    """cell id -> its markdown, whitespace folded, for one lesson."""
    with open(os.path.join(HERE, "notebooks", f"{stem}.ipynb"), encoding="utf-8") as f:
        cells = json.load(f)["cells"]
    return {c["id"]: plain("".join(c["source"])) for c in cells if c["cell_type"] == "markdown"}


@functools.cache
def run(call, knobs):
    return call(**dict(knobs))


def cell_of(c) -> str:
    found = [cid for cid, text in markdown(c.notebook).items() if plain(c.sentence) in text]
    assert len(found) == 1, (
        f"{c.notebook}: {c.sentence!r} is in {len(found)} markdown cells, not one"
    )
    return found[0]


def test_every_lesson_has_claims():
    assert {c.notebook[:2] for c in CLAIMS} == set(LESSONS)


@pytest.mark.parametrize(
    "c", CLAIMS, ids=lambda c: f"{c.notebook[:2]}-{c.holds.__name__}-{c.knobs.get('protected')}"
)
def test_claim_holds(c):
    cell = cell_of(c)
    result = run(c.call, tuple(sorted(c.knobs.items())))
    assert c.holds(result.history), (
        f"{c.notebook}.ipynb cell {cell}: {c.sentence!r} is false for "
        f"{c.call.__name__}({c.knobs}): {result.verdict}"
    )


def test_the_checks_can_fail():
    """The same predicates are false on runs with other knobs: they look at the events."""
    assert not a_overwrites_b_inv1(expired_but_alive(protected=True).history)
    assert not a_overwrites_b_inv1(expired_but_alive(protected=False, pause=5).history)
    assert not b_bills_order_twice(same_generation_duplicate(protected=True, repeats=2).history)
    assert not b_refused_at_32_and_stops(lock_wait(protected=True, hold=15, ttl=10).history)
    assert not b_replaces_a_unseen(late_renewal(protected=True).history)
    assert not two_emails(email_transfer(protected=True).history)


def test_an_edited_sentence_loses_its_claim_loudly():
    """A claim whose sentence no longer appears in its lesson fails, naming the notebook."""
    first = CLAIMS[0]
    edited = dataclasses.replace(first, sentence=first.sentence + " (edited)")
    with pytest.raises(AssertionError, match=first.notebook):
        cell_of(edited)
    assert not a_write_refused_with_7(expired_but_alive(protected=False).history)


def test_the_grid_claims_fail_on_a_grid_that_says_otherwise():
    """Lessons 01 and 03's outcome maps: each claim is false on the protected grid (no harm
    anywhere), and on the lesson's grid with the one fact it states turned round."""
    g01 = outcome_grid(expired_but_alive, PAUSES_01, TTLS_01).history
    g03 = outcome_grid(check_then_act, GAPS_03, TTLS_03).history
    for holds, grid in ((every_ttl_has_a_losing_pause, (expired_but_alive, PAUSES_01, TTLS_01)),
                        (minute_survives_30_loses_to_90, (expired_but_alive, PAUSES_01, TTLS_01)),
                        (longer_lease_moves_the_boundary, (check_then_act, GAPS_03, TTLS_03))):
        assert not holds(outcome_grid(*grid, protected=True).history), holds.__name__
    short = outcome_grid(expired_but_alive, ("pause", (0, 5, 10, 15, 20)), TTLS_01).history
    assert not every_ttl_has_a_losing_pause(short)  # no pause long enough for ttl=30 or 60
    assert not minute_survives_30_loses_to_90({**g01, (30, 60): {"lost_update"}})
    assert not minute_survives_30_loses_to_90({**g01, (90, 60): set()})
    assert not longer_lease_moves_the_boundary({**g03, (12, 30): {"lost_update"}})  # 30 before 20
    assert not longer_lease_moves_the_boundary({**g03, (8, 5): set()})  # a hole in ttl=5's row


def test_the_herd_claims_fail_when_the_runs_say_otherwise():
    """Lesson 06's herd: 5 contenders make 5 grants; polling every half second is not every
    second, in step; with the runs' labels swapped, jitter is not the busier first second nor
    the watch one attempt per grant."""
    runs = herd_runs().history
    assert not eight_or_nine_grants(herd_runs(contenders=5).history)
    assert not losers_retry_every_second_in_step(herd_runs(poll=0.5).history)
    assert not losers_retry_every_second_in_step({"no backoff": runs["jittered backoff"]})
    swapped = {"no backoff": runs["jittered backoff"], "jittered backoff": runs["no backoff"]}
    assert not jitter_busier_first_then_thinner(swapped)
    assert not watch_one_attempt_per_grant({"predecessor watch": runs["jittered backoff"]})


def test_the_bump_and_offset_claims_fail_on_other_knobs():
    """Lesson 04's bump table and lesson 05's clock offset, each claim on a run where its fact
    does not hold: A holds 7 after one token; bump 3 lifts B above the fence, bump 2 does not
    reach A's 9; with no offset B moves in only when A's lease ends, and the naive A does not
    stop early."""
    assert not a_holds_9(backup_restore(protected=False, issued_after_backup=1).history)
    assert not b_below_the_fence_locked_out(
        backup_restore(protected=False, issued_after_backup=3, bump=3).history)
    assert not bump_reaches_every_number(
        backup_restore(protected=False, issued_after_backup=3, bump=2).history)
    assert not b_moves_in_3s_early(
        late_renewal(protected=False, response_latency=0.0, offset=0.0).history)
    assert not a_stops_3s_early(
        late_renewal(protected=False, response_latency=0.0, offset=3.0).history)
