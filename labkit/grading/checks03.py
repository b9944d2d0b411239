"""Grading checks of exercise 03 (registered in :mod:`labkit.grading`).

* 03.1 the race-free batch writer: all invoices or none, run by
  :func:`labkit.grading.writers.fenced_trial` with batches.
* 03.2 the two-database quiz: the answer key (in ``solutions/keys.json``), with a hint per
  wrong answer.
"""

from __future__ import annotations

from labkit.grading.writers import FENCED_HOSTILE, fenced_trial
from labkit.grading import BOOL, Schedule, expect, keys, task


BATCH = {
    "newer": "a batch with a generation above the fence returns True, stores its invoices "
    "and raises the fence of its own job (and nothing else)",
    "equal": "a batch with the generation the fence already holds is accepted the same way",
    "stale": "a batch with a generation below the fence returns False and writes nothing, "
    "even when it races another writer",
    "fence first": "the fence is raised before anything reads or writes the invoices",
    "ends": "every call ends its transaction with COMMIT or ROLLBACK",
    "all or nothing": "the batch is all or nothing: others see all of it and the fence's "
    "raise at its COMMIT, and a crash on any invoice leaves none of them",
    "propagates": "an error (a full disk, 'database is locked') reaches the caller as raised, "
    "not replaced by a failed ROLLBACK, and is not returned as False",
}


@task(
    "03.1", "the race-free batch writer", FENCED_HOSTILE, count=12, returns=BOOL, properties=BATCH
)
def batch_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 03.1: ``answer(conn, job, generation, invoices) -> bool``, all invoices or none."""
    fenced_trial(answer, schedule, history, batch=True)


# ---------------------------------------------------------------- 03.2: why two databases fail


#: 03.2's questions in two groups, each a property; within a group the right letters differ,
#: so an answer giving one letter to every question scores nothing
QUIZ_GROUPS = {"transactions": ("q1", "q3"), "generations": ("q2", "q4")}
QUIZ_PROPS = {
    "transactions": "what SQLite sees: two transactions in two files, or one write lock "
    "held in one file (q1, q3)",
    "generations": "nothing in resource.db compares generations, so the fence must live "
    "with the invoices (q2, q4)",
}
QUIZ_HOSTILE = [
    {"name": f"questions {' and '.join(qs)}", "group": g} for g, qs in QUIZ_GROUPS.items()
]


@task("03.2", "the two-database quiz", QUIZ_HOSTILE, returns=(dict,), properties=QUIZ_PROPS)
def quiz_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 03.2: ``answer() -> {"q1": "a".."d", ...}``, one group of questions per
    schedule, judged by the key in solutions/ (the picks drawn as the answer's writes)."""
    from labkit.sim.history import Event

    QUIZ, _HINTS = (keys("03.2")[part] for part in ("answers", "hints"))
    group = schedule.knobs["group"]
    got = answer()
    whole = isinstance(got, dict) and set(got) == set(QUIZ)
    letters = {q: str(v).strip().lower() for q, v in got.items()} if whole else {}
    for t, q in enumerate(QUIZ_GROUPS[group] if whole else [f"{got!r:.40}"]):
        right = "ok" if letters.get(q) == QUIZ.get(q) else "rejected"
        history.append(Event(t + 1.0, "answer", "write", right, target=f"{q} {letters.get(q, '')}"))
    rule = f"the answer is a dict with exactly the keys {sorted(QUIZ)}"
    expect(whole, rule, f"it returned {got!r}", prop=group)
    mine = QUIZ_GROUPS[group]
    odd = [q for q in mine if letters[q] not in ("a", "b", "c", "d")]
    expect(
        not odd,
        "every answer is one of the letters a, b, c, d",
        f"{odd[:1]} is {got[odd[0]]!r}" if odd else "",
        prop=group,
    )
    wrong = [q for q in mine if letters[q] != QUIZ[q]]
    expect(
        not wrong,
        f"every question of {' and '.join(mine)} is answered right ({len(mine) - len(wrong)} "
        f"of {len(mine)} are)",
        "; ".join(f"{q}: think again about {_HINTS[q]}" for q in wrong),
        prop=group,
    )
