"""Grading checks of exercise 08 (registered in :mod:`labkit.grading`).

* 08.1 the outbox relay: a fake email provider behind a bad network; the relay
  dies between sending and marking, and is restarted until a clean run.
* 08.2 the report and its email intent in one fenced transaction: stale
  workers, redone steps and workers that die half-way.
"""

from __future__ import annotations

import contextlib
from random import Random

from labkit.clock import VirtualClock
from labkit.db import execute
from labkit.grading import Schedule, hostile, task
from labkit.grading.checks07 import _judge
from labkit.grading.lab import process, scratch
from labkit.sim.history import Event

# ---------------------------------------------------------------- 08.1 outbox relay


def _world(tmp, rng: Random):
    """The resource's connection, a fake email provider with its own file, and their clock."""
    from labkit.mechanisms.effects import EmailProvider

    admin, clock = tmp.open(), VirtualClock(rng.uniform(0, 100))
    return admin, EmailProvider(tmp.open("provider.db"), clock), clock


class _Down(Exception):
    """The email provider could not be reached, or the relay died around the call."""


class _FlakyMail:
    """An :class:`~labkit.mechanisms.effects.EmailProvider` seen through a bad network.

    ``fail`` maps call numbers to ``"before"`` (the request never arrives) or
    ``"after"`` (the email goes out, the answer is lost and the caller dies).
    """

    kind = "email"
    public = ("kind",)  # what an answer may read (labkit's Outbox.relay reads it)

    def __init__(self, provider, fail: dict, fate: dict) -> None:
        self.provider, self.fail, self.fate, self.calls = provider, fail, fate, 0

    def send(self, to, subject, body, *, idempotency_key=None):
        self.calls += 1
        how = self.fail.get(self.calls)
        if self.fate["dead"] or how == "before":
            raise _Down("the email provider could not be reached")
        delivery = self.provider.send(to, subject, body, idempotency_key=idempotency_key)
        if how == "after":
            self.fate["dead"] = True
            raise _Down("the relay died before it saw the provider's answer")
        return delivery

    def deliver(self, payload, *, idempotency_key=None):
        email = payload["to"], payload["subject"], payload["body"]
        return self.send(*email, idempotency_key=idempotency_key)


def _relay_knobs(rng: Random) -> dict:
    n = rng.randint(1, 5)
    return {
        "intents": n,
        "sent_before": rng.randint(0, n - 1),
        "charges": rng.randint(0, 1),
        "fail": {
            rng.randint(1, n + 1): rng.choice(["before", "after"]) for _ in range(rng.randint(0, 2))
        },
        "dies_at": rng.choice([0, 0, rng.randint(1, 12)]),
    }


RELAY_HOSTILE = hostile(
    "intents sent_before charges fail dies_at",
    ("three emails, no trouble", 3, 0, 0, {}, 0),
    ("the 1st send goes out but the relay dies before marking it", 2, 0, 0, {1: "after"}, 0),
    ("the 2nd send never reaches the provider", 3, 0, 1, {2: "before"}, 0),
    ("one email was relayed before; the 1st send now dies after delivering", 3, 1, 0, {1: "after"}, 0),
    ("the relay dies at its 3rd SQL statement", 2, 0, 0, {}, 3),
)  # fmt: skip


def _publish_intents(admin, outbox, k, rng, job: str) -> tuple[list, list]:
    """B (generation 8) commits the email intents; stale A (7) tries too and is fenced out."""
    from labkit.errors import StaleGeneration
    from labkit.fence import Fence

    fence = Fence(admin, job)
    emails = []
    for i in range(k["intents"]):
        to = rng.choice(["ops@example.com", "billing@example.com"])
        body = f"total {rng.randrange(10**6)}"
        email = {"to": to, "subject": f"run {job} report {i}", "body": body}
        emails.append((f"{job}/report-{i}", email))
    with fence.guard(8) as tx:
        for key, email in emails:
            outbox.add(tx, key, "email", email)
        for c in range(k["charges"]):
            outbox.add(tx, f"{job}/charge-{c}", "charge", {"account": "acct-1", "amount": 100 + c})
    with contextlib.suppress(StaleGeneration), fence.guard(7) as tx:
        stale = {"to": "ops@example.com", "subject": "stale", "body": "A"}
        outbox.add(tx, f"{job}/stale-email", "email", stale)
    return emails, [key for key, _ in emails[: k["sent_before"]]]


RELAY_PROPS = {
    "never lost": "every committed email intent is delivered, even when a send fails",
    "never twice": "no email goes out twice, even when the relay dies between sending and marking",
    "marked sent": "after a clean relay run, every delivered intent is marked sent",
    "others alone": "the email relay leaves other kinds of intent alone",
}
RELAY_RULES = {  # the findings' rules that RELAY_PROPS does not word already
    "never lost": "every committed email intent is delivered, even when a send fails or the "
    "relay dies",
    "once": "each committed email intent reaches the provider once (a resend carries its key), "
    "even when the relay dies between sending and marking",
    "only": "the relay sends only the committed email intents",
}


@task(
    "08.1",
    "the outbox relay",
    RELAY_HOSTILE,
    count=16,
    make=_relay_knobs,
    properties=RELAY_PROPS,
)
def relay_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 08.1: ``answer(db, mail)`` sends pending email intents, each with its key."""
    from labkit.mechanisms.effects import Outbox

    rng, k = schedule.rng, schedule.knobs
    job = f"invoice-run-{rng.randrange(1000)}"
    with scratch() as tmp:
        admin, provider, clock = _world(tmp, rng)
        outbox = Outbox(admin, clock)
        emails, sent_before = _publish_intents(admin, outbox, k, rng, job)
        for key, email in emails:
            if key in sent_before:  # relayed earlier by the reference relay
                outbox.mark_sent(key, provider.send(**email, idempotency_key=key).id)
        calls = 0
        for runs in range(1, 7):  # the relay is restarted until one run goes through cleanly
            conn, statements = tmp.open(), iter(range(1, 10**6))
            dies_at = k["dies_at"] if runs == 1 else 0
            try:
                with process(
                    conn, lambda sql: bool(dies_at) and next(statements) >= dies_at
                ) as fate:
                    mail = _FlakyMail(provider, k["fail"] if runs == 1 else {}, fate)
                    try:
                        answer(conn, mail)
                    except Exception:
                        if not (fate["dead"] or mail.fail):
                            raise
            finally:
                conn.conn.close()
            history.append(
                Event(clock.now(), f"relay run {runs}", "crash" if fate["dead"] else "resume", "ok")
            )
            clock.advance(1)
            calls += mail.calls
            if not mail.fail and not fate["dead"]:
                break
        records = provider.records()
        for r in records:
            key, subject = r["idempotency_key"], r["payload"]["subject"]
            history.append(Event(r["created_at"], "relay", "email", "ok", key=key, target=subject))
        states = dict(execute(admin, "SELECT key, state FROM outbox WHERE kind = 'email'"))
        charges = execute(admin, "SELECT state FROM outbox WHERE kind = 'charge'")
        sent, wanted = [r["payload"] for r in records], [e for _, e in emails]
        after = f"after {runs} relay runs"
        lost = [e["subject"] for e in wanted if e not in sent]
        marked = all(states[key] == "sent" for key, _ in emails)
        checks = [
            ("never lost", not lost, RELAY_RULES["never lost"], f"never delivered {after}: {lost}"),
            ("marked sent", marked, RELAY_PROPS["marked sent"], f"outbox states: {states}"),
        ]
        if calls:  # the answer sent something: judge what it sent and what it marked
            twice = [e["subject"] for e in wanted if sent.count(e) > 1]
            extra = [p["subject"] for p in sent if p not in wanted]
            alone = all(s == "pending" for (s,) in charges)
            again = f"delivered more than once {after}: {twice}"
            unasked = f"emails no intent asked for: {extra}"
            others = f"charge intents now {charges}"
            checks += [
                ("never twice", not twice, RELAY_RULES["once"], again),
                ("never twice", not extra, RELAY_RULES["only"], unasked),
                ("others alone", alone, RELAY_PROPS["others alone"], others),
            ]
        _judge(checks)


# ---------------------------------------------------------------- 08.2 publish the report and the email intent


class _Dying:
    """Wraps an object; the worker dies at the ``at``-th call to any of ``names`` (shared ``count``)."""

    def __init__(self, inner, names: tuple, count: dict, at: int) -> None:
        self._inner, self._names, self._count, self._at = inner, names, count, at

    def __getattr__(self, name):
        value = getattr(self._inner, name)
        if name not in self._names or not callable(value):
            return value

        def call(*args, **kwargs):
            self._count["n"] += 1
            if self._at and self._count["n"] >= self._at:
                raise _Down(f"the worker died at its call to {name}()")
            return value(*args, **kwargs)

        return call


PUBLISH_HOSTILE = hostile(
    "story",
    ("B (8) has raised the fence; stale A (7) wakes up and publishes before B does", "early"),
    ("B (8) publishes; then stale A (7) wakes up and publishes its own report", "stale"),
    ("B (8) publishes and dies; C (9) redoes the same step", "redo"),
    ("the worker dies at its first call to the email provider", "mail_dies"),
    ("the worker dies between its file write and its email intent", "half"),
)


def _publish_knobs(rng: Random) -> dict:
    return {"story": rng.choice(["early", "stale", "redo", "mail_dies", "half"])}


@task(
    "08.2",
    "the report and its email intent in one fenced transaction",
    PUBLISH_HOSTILE,
    count=8,
    make=_publish_knobs,
    properties={
        "via outbox": "the email goes out only through the fenced outbox, never from a stale worker",
        "current report": "the committed report is the current owner's report",
        "one email": "the report is announced by exactly one email, even when the step is redone",
        "together": "the report file and its email intent commit together or not at all",
    },
)
def publish_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 08.2: ``answer(generation, *, fence, files, outbox, mail, report, email)``."""
    from labkit.errors import KeyReused, StaleGeneration
    from labkit.fence import Fence
    from labkit.grading import Broken
    from labkit.mechanisms.effects import FencedFileStore, Outbox

    rng, story = schedule.rng, schedule.knobs["story"]
    job = f"invoice-run-{rng.randrange(1000)}"
    checks: list = []
    with scratch() as tmp:
        admin, provider, clock = _world(tmp, rng)
        folder = tmp.path("files")
        surprises: list[str] = []
        total = rng.randrange(10**6)
        done = {"effects": 0}

        def worker(name: str, generation: int, report: bytes, body: str, *, mail_at=0, store_at=0):
            conn, count, fate = tmp.open(), {"n": 0}, {"dead": False}
            files = _Dying(FencedFileStore(conn, folder, job), ("write",), count, store_at)
            outbox = _Dying(Outbox(conn, clock), ("add",), count, store_at)
            mail = _FlakyMail(provider, {1: "before"} if mail_at else {}, fate)
            email = {"to": "ops@example.com", "subject": f"{job} report", "body": body}
            sent_before, outcome = len(provider.records()), "rejected"
            try:
                given = {"fence": Fence(conn, job), "files": files, "outbox": outbox, "mail": mail}
                answer(generation, **given, report=report, email=email)
            except NotImplementedError:
                raise
            except Exception as exc:  # stale, the planned death, or a surprise (judged at the end)
                if isinstance(exc, _Down):
                    outcome = "crashed"
                elif not isinstance(exc, StaleGeneration):
                    surprises.append(f"{name}: {type(exc).__name__}: {exc}")
            finally:
                conn.conn.close()
            if FencedFileStore(admin, folder, job).generation("report.txt") == generation:
                outcome = "ok"
            now, effects = clock.now(), count["n"] + mail.calls
            history.append(Event(now, name, "write", outcome, generation, target="report.txt"))
            for r in provider.records()[sent_before:]:
                key, subject = r["idempotency_key"], r["payload"]["subject"]
                history.append(Event(now, name, "email", "ok", generation, key=key, target=subject))
            done["effects"] += effects
            if effects and story != "half":  # there, only the file and its intent are judged
                rule = (
                    "the answer never calls the email provider itself (a stale worker that "
                    "reaches it cannot be stopped)"
                )
                detail = f"{name} ({generation}) called mail.send"
                checks.append(("via outbox", not mail.calls, rule, detail))
            clock.advance(1)

        def report(g: int) -> bytes:
            return f"total {total}, by generation {g}".encode()

        body_b = f"the total is {total}"
        if story == "early":
            with Fence(admin, job).guard(8):
                history.append(Event(clock.now(), "B", "raise", "ok", 8, target=job))
        if story in ("stale", "redo"):
            worker("B", 8, report(8), body_b)
        if story in ("stale", "early"):
            worker("A", 7, b"total 0 (stale)", "the total is 0 (stale)")
        if story in ("early", "mail_dies", "half"):
            dying = {"mail_dies": {"mail_at": 1}, "half": {"store_at": 2}}.get(story, {})
            worker("B", 8, report(8), body_b, **dying)
        if story == "redo":
            worker("C", 9, report(9), body_b)
        with contextlib.suppress(KeyReused):  # the provider sent another email under its key
            Outbox(admin, clock).relay(provider)  # the reference relay delivers what was committed
        content = FencedFileStore(admin, folder, job).read("report.txt")
        emails = [r["payload"]["body"] for r in provider.records()]
        for body in emails:
            history.append(Event(clock.now(), "relay", "email", "ok", target=body))
        intents = execute(admin, "SELECT COUNT(*) FROM outbox WHERE kind = 'email'")[0][0]
        want = report(9 if story == "redo" else 8)
        if story == "half" and done["effects"]:
            together = (content, intents) in ((None, 0), (want, 1))
            rule = "the report file and its email intent commit together or not at all"
            detail = f"after the worker died: report file {content!r}, {intents} email intents"
            checks.append(("together", together, rule, detail))
        elif story != "half":
            if content is not None or emails:
                fenced = "the total is 0 (stale)" not in emails
                rule = (
                    "a stale worker's email never goes out (its intent is fenced out with its "
                    "file write)"
                )
                checks.append(("via outbox", fenced, rule, f"emails: {emails}"))
            rule = "the committed report is the current owner's"
            detail = f"report.txt holds {content!r}, not {want!r}"
            checks.append(("current report", content == want, rule, detail))
            rule = (
                "the committed report is announced by exactly one email, even when the step is "
                "redone or the worker dies at the email provider"
            )
            checks.append(("one email", emails == [body_b], rule, f"emails sent: {emails}"))
        _judge(checks)
        if surprises:
            raise Broken("runs", "", "; ".join(surprises))
