"""Lesson 08: the fenced file and the unfenced email.

>>> naive = email_transfer(protected=False)
>>> sorted(naive.kinds), [w.kind for w in naive.warnings], email_transfer().violations
(['duplicate_effect'], ['acted_after_expiry'], ())
"""

import os

from labkit.mechanisms.effects import EmailProvider, FencedFileStore, Outbox
from labkit.errors import StaleGeneration, check_number
from labkit.mechanisms.recovery import operation_key
from labkit.sim.engine import scenario
from labkit.sim.steps import with_tokens
from labkit.sim.worker import JOB

__all__ = ["email_transfer"]


@scenario
def email_transfer(sim, *, protected, pause=30.0, ttl=10.0, relay_crashes=1):
    """Lesson 08: the fence stops a stale file write but not its email; the outbox stops both."""
    crashes = check_number(relay_crashes, "relay_crashes", integer=True, high=5)
    folder = os.path.join(os.path.dirname(sim.path("resource")), "files")
    FencedFileStore(sim.database("resource"), folder, JOB)
    Outbox(sim.database("resource"), sim.clock)
    provider = EmailProvider(sim.database("provider"), sim.clock)
    sim.layout.update({"files": "resource", "outbox": "resource", "provider_records": "provider"})
    with_tokens(sim)
    key = operation_key(JOB, "report-email")

    def step(w, generation, text):
        store, outbox = FencedFileStore(w.db, folder, JOB), Outbox(w.db, sim.clock)
        mail = {"to": "billing@example.com", "subject": f"{JOB} report", "body": text}
        yield from w.wait_for_lock(target="report.txt")
        if not protected:
            provider.send(**mail)  # no generation, no key: it just goes
            w.record("email", key=key, target="report-email")
        try:
            with store.fence.guard(generation) as tx:
                store.write("report.txt", text.encode(), generation, tx=tx)
                if protected:
                    outbox.add(tx, key, "email", mail)
        except StaleGeneration:
            w.record("write", "rejected", generation=generation, target="report.txt")
            if protected:
                w.record("email", "rejected", generation=generation, key=key, target="report-email")
            return
        w.record("raise", generation=generation, target=JOB)
        w.record("write", generation=generation, target="report.txt")

    def run_a(w):
        lease = yield from w.acquire(ttl)
        w.read(["INV-1"])
        yield from w.point("before-step")
        yield from step(w, lease.generation, "report by A (stale)")
        yield from w.release(lease)

    def run_b(w):
        lease = yield from w.acquire_when_free(ttl)
        yield from w.raise_fence(lease.generation)
        w.read(["INV-1"])
        yield w.env.timeout(1.0)
        yield from step(w, lease.generation, "report by B")
        yield from w.release(lease)

    def relay(w):
        outbox, left = Outbox(w.db, sim.clock), crashes
        while b.is_alive or outbox.pending():
            for row_key, _kind, payload, _generation in outbox.pending("email"):
                sent = provider.deliver(payload, idempotency_key=row_key)
                outcome = "duplicate" if sent.replayed else "ok"
                w.record("email", outcome, key=row_key, target="report-email")
                if left:
                    left -= 1
                    w.record("crash", target="between send and mark")
                    yield from w.pause(2.0, "restart")
                    break
                yield from w.locked(outbox.mark_sent, row_key, sent.id)
            yield w.env.timeout(1.0)

    sim.start(sim.worker("A", pauses={"before-step": pause}), run_a)
    b = sim.start(sim.worker("B"), run_b)
    if protected:
        sim.start(sim.worker("relay"), relay)
