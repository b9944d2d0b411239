"""Grading check of exercise 09 (registered in :mod:`labkit.grading`).

* 09.1 the right mechanism for each incident; a failure names the incident and the pick that is
  wrong, never the right one (the key stays with the grader).
"""

from __future__ import annotations

from labkit.grading import Schedule, expect, hostile, keys, task
from labkit.sim.history import Event


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

#: the incidents by property (what each needs is in ``solutions/keys.json``); a group's
#: incidents need different mechanisms, so one pick for every incident scores nothing
INCIDENT_GROUPS = {
    "who may act": ("frozen-export", "dead-holder", "restored-counter"),
    "in time": ("late-reply", "stuck-release", "thundering-restart"),
    "once": ("double-charge", "forgotten-run", "stale-email"),
}
INCIDENT_PROPS = {
    "who may act": "who may act, and with which number: a frozen worker, a dead holder, "
    "a restored counter",
    "in time": "deadlines, releases and retries: a late reply, a stuck release, a "
    "thundering restart",
    "once": "work and effects that must take effect once: a repeated charge, a "
    "forgotten run, a stale email",
}
#: the incidents, in the exercise's order
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
    properties=INCIDENT_PROPS,
)
def incident_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 09.1: ``answer(incident) -> one of MECHANISMS`` (the pick drawn as a write)."""
    name = schedule.knobs["incident"]
    prop = next(p for p, names in INCIDENT_GROUPS.items() if name in names)
    right = keys("09.1")[name]["mechanism"]
    got = answer(name)
    picked = got.strip().lower() if isinstance(got, str) else got
    ok = "ok" if picked == right else "rejected"
    history.append(Event(1.0, name, "write", ok, target=f"{picked!r:.40}"))
    expect(
        picked in MECHANISMS,
        f"the answer for {name!r} is one of {MECHANISMS}",
        f"it returned {got!r}",
        prop=prop,
    )
    rule = f"incident {name!r} gets the mechanism it needs"
    expect(picked == right, rule, f"{got!r} is not it: read the incident again", prop=prop)
