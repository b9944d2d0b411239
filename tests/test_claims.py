"""Every sentence a lesson says about a drawn run is checked on that run (tests/claims.py)."""

import dataclasses
import functools
import json
import os
import re

import pytest
from claims import (
    CLAIMS,
    a_overwrites_b_inv1,
    a_write_refused_with_7,
    b_bills_order_twice,
    b_refused_at_32_and_stops,
    b_replaces_a_unseen,
    two_emails,
)

from labkit.scenarios import (
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
