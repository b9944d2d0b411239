"""Grading checks of exercise 03 (registered in :mod:`labkit.grading`).

* 03.1 the race-free batch writer: all invoices or none, run by
  :func:`labkit.grading.fenced.fenced_trial` with batches.
* 03.2 the two-database quiz: the answer key (in ``solutions/keys.json``), with a hint per
  wrong answer.
* 03.3 protect a new resource: ``payouts``, whose writers bypass ``Fence.guard`` with raw SQL
  from other connections; each write is judged by what the table and the fence show after it.
"""

from __future__ import annotations

from random import Random
from typing import Iterator

from labkit.clock import VirtualClock
from labkit.db import execute
from labkit.errors import LabkitError, StaleGeneration
from labkit.fence import Fence, show, token
from labkit.grading.lab import TRIGGERS, lease_event, scratch
from labkit.grading.fenced import FENCED_HOSTILE, fenced_trial
from labkit.grading import BOOL, NONE, Schedule, expect, hostile, keys, task
from labkit.lease import LeaseAuthority
from labkit.sim.history import Event


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


# ---------------------------------------------------------------- 03.3: protect a new resource

PAY = "payout-run"
PAYOUTS = (
    "CREATE TABLE payouts (job_id TEXT NOT NULL, payout_id TEXT NOT NULL, amount INTEGER NOT "
    "NULL, epoch INTEGER NOT NULL DEFAULT 0, counter INTEGER NOT NULL, PRIMARY KEY (job_id, "
    "payout_id))"
)
GUARDED = {
    "stale": "a bypassing INSERT whose token is below the job's fence (raised by Fence.guard for "
    "another table) is refused and writes nothing, while the holder's newer row is kept",
    "updates": "a bypassing UPDATE that gives a payout a token below the fence is refused and "
    "changes nothing, while the holder's own UPDATE is kept",
    "epochs": "tokens compare as (epoch, counter): after a failover the new holder's (2, 1) is "
    "kept and the old holder's (1, n) is refused, however large n",
    "forged": "a token above the last one this database's lease authority issued is refused and "
    "leaves the fence alone, while the holder's issued token still passes",
    "holder": "the holder's several rows with the token the fence holds are all kept, even once "
    "a newer lease is issued, and the newer holder's row raises the fence, so that Fence.guard "
    "then refuses the older token",
}
GUARDED_HOSTILE = hostile("story", *((f"the {p} story: {w}", p) for p, w in GUARDED.items()))
_INSERT = "INSERT INTO payouts VALUES (:job, :id, :amount, :epoch, :counter)"
_INVOICE = "INSERT INTO invoices VALUES (:job, :id, :amount, :counter)"
_UPDATE = (
    "UPDATE payouts SET amount = :amount, epoch = :epoch, counter = :counter "
    "WHERE job_id = :job AND payout_id = :id"
)


def _story(rng: Random) -> dict:
    return {"story": rng.choice(list(GUARDED))}


class _Payouts:
    """03.3's world: ``payouts`` (token ``(epoch, counter)``) beside the job's fence and, in every
    story but the failover's, its lease authority; writers bypass the fence with raw SQL."""

    def __init__(self, tmp, rng: Random, story: str, history: list) -> None:
        self.db, self.rng, self.prop, self.history, self.t = tmp.open(), rng, story, history, 0.0
        self.writers = {w: tmp.open() for w in ("A", "B", "C", "F", "answer")}
        self.fence, self.ids = Fence(self.db, PAY), 0
        execute(self.db, PAYOUTS)

    def log(self, who, action, outcome="ok", token=None, target=None) -> None:
        self.t += 1.0
        self.history.append(Event(self.t, who, action, outcome, token, target=target))

    def state(self) -> tuple:
        sql = "SELECT payout_id, amount, epoch, counter FROM payouts ORDER BY payout_id"
        return tuple(execute(self.db, sql)), token(self.fence.current())

    def row(self, gen, payout: str | None = None) -> dict:
        """A payout row with token ``gen``: a new one, or ``payout`` with a new amount."""
        self.ids += payout is None
        payout_id = payout or f"P-{self.ids}"
        amount = self.rng.randrange(100, 990, 5)
        epoch, counter = token(gen)
        return {"job": PAY, "id": payout_id, "amount": amount, "epoch": epoch, "counter": counter}

    def issued(self, generation: int) -> None:
        """The lease authority in this database has issued up to ``generation``."""
        execute(self.db, "INSERT INTO lease_counter VALUES (?, ?)", (PAY, generation))

    def lease(self, who: str) -> int:
        lease = LeaseAuthority(self.db, VirtualClock(self.t)).acquire(PAY, who, ttl=100.0)
        lease_event(self.history, self.t, lease)
        return lease.generation

    def guard(self, who: str, gen, table: str = "invoices", n: int = 1) -> bool:
        """``who`` writes ``n`` rows through the helper, ``Fence.guard(gen)``; whether it was accepted."""
        before = self.fence.current()
        try:
            with self.fence.guard(gen) as tx:
                for row in (self.row(gen) for _ in range(n)):
                    if table == "invoices":
                        row["id"] = row["id"].replace("P", "INV")
                    tx.execute(_INSERT if table == "payouts" else _INVOICE, row)
        except StaleGeneration:
            self.log(who, "write", "rejected", gen, f"{table} via Fence.guard")
            return False
        self.log(who, "write", "ok", gen, f"{table} via Fence.guard")
        if self.fence.current() != before:
            self.log(who, "raise", "ok", self.fence.current(), PAY)
        return True

    def write(self, who: str, gen, kept: bool, payout: str | None = None) -> None:
        """``who`` bypasses the fence: a raw INSERT (or an UPDATE of ``payout``) with token ``gen``,
        judged by what the table and the fence show afterwards."""
        params, before = self.row(gen, payout), self.state()
        payout, verb = params["id"], "UPDATE" if payout else "INSERT"
        try:
            execute(self.writers[who], _INSERT if verb == "INSERT" else _UPDATE, params)
            out = "it was accepted"
        except LabkitError as exc:
            out = f"it was refused ({type(exc).__name__}: {str(exc)[:80]})"
        after = self.state()
        self.log(who, "write", "ok" if after[0] != before[0] else "rejected", gen, payout)
        if after[1] != before[1]:
            self.log(who, "raise", "ok", show(after[1]), PAY)
        mine = tuple(params[k] for k in ("id", "amount", "epoch", "counter"))
        rows = {r[0]: r for r in before[0]} | {payout: mine}
        want = tuple(sorted(rows.values())) if kept else before[0]
        rule = f"{who}'s raw {verb} of {payout} with token {gen} (fence at {show(before[1])}) is "
        rule += "kept as written" if kept else "refused: the table and the fence stay as they were"
        ok = after[0] == want and (kept or (after == before and out != "it was accepted"))
        saw = f"{out}; payouts {before[0]} -> {after[0]}, fence {show(after[1])}"
        expect(ok, rule, saw, prop=self.prop)

    def tell(self) -> Iterator[None]:
        """The story of this schedule, each write judged as it happens."""
        rng, g = self.rng, self.rng.randint(8, 40)
        if self.prop == "stale":  # old payouts; the fence raised since through another table
            old = g - rng.randint(3, 6)
            self.issued(g), self.guard("A", old, "payouts"), self.guard("B", g)
            yield
            self.write("A", rng.randint(old + 1, g - 1), kept=False)
            self.write("B", self.lease("B"), kept=True)
        elif self.prop == "updates":
            self.issued(g), self.guard("B", g, "payouts", n=2)
            yield
            self.write("A", g - rng.randint(1, 5), kept=False, payout="P-1")
            self.write("B", self.lease("B"), kept=True, payout="P-2")
        elif self.prop == "epochs":  # the issuer lives elsewhere, and fails over
            c = rng.randint(5, 40)
            self.guard("A", (1, c), "payouts")
            yield
            self.log("issuer", "failover", "ok", (2, 0), "epoch 2")
            self.write("B", (2, 1), kept=True)
            self.write("A", (1, c + rng.choice([0, rng.randint(1, 10**6)])), kept=False)
        elif self.prop == "forged":
            self.issued(g), self.guard("B", g)
            yield
            self.write("F", g + rng.choice([1, rng.randint(2, 10**9)]), kept=False)
            self.write("B", self.lease("B"), kept=True)
        else:  # B writes around the helper with its own token, after C's newer lease is issued
            self.issued(g), self.guard("B", g)
            yield
            newer = self.lease("C")  # the fence, not the issuer, decides: B's g is still current
            for _ in range(rng.randint(2, 3)):
                self.write("B", g, kept=True)
            self.write("C", newer, kept=True)
            rose = self.fence.current() == newer and not self.guard("B", g)
            rule = f"C's row with {newer} raised the fence to it, so Fence.guard({g}) is refused"
            expect(rose, rule, f"the fence is at {self.fence.current()}", prop=self.prop)


@task(
    "03.3",
    "protect a new resource",
    GUARDED_HOSTILE,
    count=10,
    make=_story,
    returns=(NONE,),
    properties=GUARDED,
)
def protect_check(answer, schedule: Schedule, history: list) -> None:
    """Trial for 03.3: ``answer(db, job) -> None`` makes ``payouts`` refuse stale tokens from
    writers that bypass ``Fence.guard``; the table and the fence are read after each write."""
    with scratch() as tmp:
        world = _Payouts(tmp, schedule.rng, schedule.knobs["story"], history)
        story = world.tell()
        next(story)  # the table in use, before the answer protects it
        rows, lent = world.state()[0], world.writers["answer"]
        TRIGGERS[id(lent.conn)] = frozenset({"payouts", "invoices", "job_fence"})  # it may add some
        try:
            answer(lent, PAY)
        finally:
            TRIGGERS.pop(id(lent.conn), None)
        world.log("answer", "protect", "ok", target="payouts")
        left = lent.conn.in_transaction
        expect(not left, "the answer ends its transaction", "it left one open", prop=world.prop)
        expect(world.state()[0] == rows, "the answer changes no payout", f"{rows}", world.prop)
        next(story, None)
