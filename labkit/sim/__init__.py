"""The scenario engine: simulated workers on simpy, each with its own connection to real SQLite.

:mod:`~labkit.sim.engine` runs scenarios, :mod:`~labkit.sim.worker` is one worker and its
faults, :mod:`~labkit.sim.history` the events, their checker and verdict;
:mod:`~labkit.sim.steps` and :mod:`~labkit.sim.files` serve them.
"""

from labkit.sim.engine import SCENARIOS, Result, Sim, play, scenario
from labkit.sim.history import Event, Violation, check
from labkit.sim.worker import JOB, LEASE, Crashed, NoResponse, Worker, upsert_invoice

__all__ = ["Sim", "Result", "scenario", "play", "SCENARIOS", "Worker", "upsert_invoice"]
__all__ += ["Crashed", "NoResponse", "JOB", "LEASE", "Event", "Violation", "check"]
