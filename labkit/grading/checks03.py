"""Grading checks of exercise 03 (registered in :mod:`labkit.grading`).

* 03.1 the race-free batch writer: all invoices or none, run by
  :func:`labkit.grading.writers.fenced_trial` with batches.
* 03.2 the two-database quiz: the answer key (in ``solutions/keys.json``), with a hint per
  wrong answer.
"""

from __future__ import annotations

from labkit.grading.writers import FENCED_HOSTILE, fenced_trial
from labkit.grading import BOOL, Schedule, expect, keys, task


@task("03.1", "the race-free batch writer", FENCED_HOSTILE, count=16, returns=BOOL)
def batch_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 03.1: ``answer(conn, job, generation, invoices) -> bool``, all invoices or none."""
    fenced_trial(answer, schedule, history, batch=True)


# ---------------------------------------------------------------- 03.2: why two databases fail


@task("03.2", "the two-database quiz", [{"name": "the answer key"}], returns=(dict,))
def quiz_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 03.2: ``answer() -> {"q1": "a".."d", ...}``, judged by the key in solutions/."""
    QUIZ, _HINTS = (keys("03.2")[part] for part in ("answers", "hints"))
    got = answer()
    expect(
        isinstance(got, dict) and set(got) == set(QUIZ),
        f"the answer is a dict with exactly the keys {sorted(QUIZ)}",
        f"it returned {got!r}",
    )
    letters = {q: str(v).strip().lower() for q, v in got.items()}
    odd = [q for q, v in sorted(letters.items()) if v not in ("a", "b", "c", "d")]
    expect(
        not odd,
        "every answer is one of the letters a, b, c, d",
        f"{odd[:1]} is {got[odd[0]]!r}" if odd else "",
    )
    wrong = [q for q in sorted(QUIZ) if letters[q] != QUIZ[q]]
    expect(
        not wrong,
        f"every question is answered right ({len(QUIZ) - len(wrong)} of {len(QUIZ)} are)",
        "; ".join(f"{q}: think again about {_HINTS[q]}" for q in wrong),
    )
