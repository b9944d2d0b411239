"""Grading check of exercise 09 (registered in :mod:`labkit.grading`).

* 09.1 the right mechanism for each incident, with the reason in the failure.
"""

from __future__ import annotations

from labkit.grading import Schedule, expect, hostile, keys, task


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

#: the incidents of the exercise, in its order (what each needs is in ``solutions/keys.json``)
INCIDENTS = (
    "frozen-export",
    "dead-holder",
    "double-charge",
    "late-reply",
    "stuck-release",
    "thundering-restart",
    "forgotten-run",
    "stale-email",
    "restored-counter",
)
INCIDENT_ROWS = [(f"incident {name}", name) for name in INCIDENTS]


@task(
    "09.1",
    "the right mechanism for each incident",
    hostile("incident", *INCIDENT_ROWS),
    returns=(str,),
)
def incident_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 09.1: ``answer(incident) -> one of MECHANISMS``."""
    name = schedule.knobs["incident"]
    right, why = (keys("09.1")[name][part] for part in ("mechanism", "why"))
    got = answer(name)
    picked = got.strip().lower() if isinstance(got, str) else got
    expect(
        picked in MECHANISMS,
        f"the answer for {name!r} is one of {MECHANISMS}",
        f"it returned {got!r}",
    )
    expect(picked == right, f"incident {name!r} needs the {right}: {why}", f"you picked {got!r}")
