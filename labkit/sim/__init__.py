"""The scenario engine: simulated workers on simpy, each with its own connection to real SQLite.

``engine`` runs scenarios, ``worker`` is one worker and its faults, ``history`` holds the events,
their checker and verdict; ``steps`` and ``files`` serve them."""

from labkit.sim.engine import SCENARIOS, Result, Sim, play, scenario
from labkit.sim.history import Event, TimingWarning, Violation, check, warnings
from labkit.sim.worker import JOB, LEASE, Crashed, NoResponse, Worker, upsert_invoice

__all__ = ["Sim", "Result", "scenario", "play", "SCENARIOS", "Worker", "upsert_invoice"]
__all__ += ["Crashed", "NoResponse", "JOB", "LEASE", "Event", "Violation", "check"]
__all__ += ["TimingWarning", "warnings"]
