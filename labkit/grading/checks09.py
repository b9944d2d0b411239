"""Grading check of exercise 09 (registered in :mod:`labkit.grading`).

* 09.1 the right mechanism for each incident, with the reason in the failure.
"""

from __future__ import annotations

from labkit.grading import Schedule, expect, hostile, task


# ---------------------------------------------------------------- 09.1 pick the mechanism

MECHANISMS = (
    "lease",
    "fence",
    "idempotency key",
    "conservative deadline",
    "owner and generation check",
    "backoff with jitter",
    "durable claim and sweeper",
    "outbox",
    "new epoch",
)

#: incident -> (the mechanism, why, and why the usual wrong pick does not do it)
INCIDENTS = {
    "frozen-export": (
        "fence",
        "the worker that woke up was obsolete and wrote over its successor: only the resource "
        "itself, refusing a lower generation, can stop a write that is already on its way; a "
        "longer lease just needs a longer freeze",
    ),
    "dead-holder": (
        "lease",
        "the holder died and nobody else could ever start: a time limit on the permission is what "
        "lets a successor in",
    ),
    "double-charge": (
        "idempotency key",
        "both charges carried the current, valid generation; a fence lets equal generations "
        "through, so only a key per operation stops the repeat",
    ),
    "late-reply": (
        "conservative deadline",
        "the holder counted its lease from the reply's arrival; counting from the request's send "
        "time, minus a margin and the drift, would have stopped it before the authority moved on",
    ),
    "stuck-release": (
        "owner and generation check",
        "a delayed release matched the owner name of the new process; requiring the generation too "
        "makes it refuse",
    ),
    "thundering-restart": (
        "backoff with jitter",
        "identical retry intervals keep contenders in lockstep; growing, randomised waits spread "
        "them out",
    ),
    "forgotten-run": (
        "durable claim and sweeper",
        "the lease let a successor in, but nobody knew work was unfinished; a durable claim with "
        "progress and a sweeper that requeues it conditionally makes recovery happen",
    ),
    "stale-email": (
        "outbox",
        "the email provider cannot check generations; recording the email as an intent inside the "
        "fenced transaction (and relaying it with a key) keeps the stale worker's email from ever "
        "being sent",
    ),
    "restored-counter": (
        "new epoch",
        "the restored counter handed out a number already used; a provably new epoch from a "
        "durable authority orders every later token above all the old ones",
    ),
}
INCIDENT_ROWS = [(f"incident {name}", name) for name in INCIDENTS]


@task("09.1", "the right mechanism for each incident", hostile("incident", *INCIDENT_ROWS))
def incident_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 09.1: ``answer(incident) -> one of MECHANISMS``."""
    name = schedule.knobs["incident"]
    right, why = INCIDENTS[name]
    got = answer(name)
    picked = got.strip().lower() if isinstance(got, str) else got
    expect(
        picked in MECHANISMS,
        f"the answer for {name!r} is one of {MECHANISMS}",
        f"it returned {got!r}",
    )
    expect(picked == right, f"incident {name!r} needs the {right}: {why}", f"you picked {got!r}")
