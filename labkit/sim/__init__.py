"""The scenario engine: simulated workers on simpy, each with its own connection to real SQLite.

:mod:`~labkit.sim.engine` runs scenarios, :mod:`~labkit.sim.worker` is one worker and its
faults, :mod:`~labkit.sim.history` the events and their checker; :mod:`~labkit.sim.steps`,
:mod:`~labkit.sim.files` and :mod:`~labkit.sim.verdict` serve them.
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
