"""The scenario engine: simulated workers on simpy, each with its own connection to real SQLite.

* :mod:`labkit.sim.engine`: :class:`Sim`, :class:`Result`, :func:`scenario`, :func:`play`.
* :mod:`labkit.sim.worker`: a simulated worker and its faults (pauses, latency, lost replies, crashes).
* :mod:`labkit.sim.history`: the history of attempts and the checker that reads it.
* :mod:`labkit.sim.steps`, :mod:`labkit.sim.files`, :mod:`labkit.sim.verdict`:
  the steps scenarios share, their scratch files, and their one-line verdict.
"""

from labkit.sim.engine import SCENARIOS, Result, Sim, play, scenario
from labkit.sim.history import Event, Violation, check
from labkit.sim.worker import JOB, LEASE, Crashed, NoResponse, Worker, upsert_invoice

__all__ = [
    "Sim",
    "Result",
    "scenario",
    "play",
    "SCENARIOS",
    "Worker",
    "upsert_invoice",
    "Crashed",
    "NoResponse",
    "JOB",
    "LEASE",
    "Event",
    "Violation",
    "check",
]
