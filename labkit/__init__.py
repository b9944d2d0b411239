"""labkit: leases, fencing tokens and idempotency on real SQLite, for a hands-on course.

Why it looks like this: three failures, three mechanisms, and they are the core, the modules
beside this one, read in one sitting. A :class:`LeaseAuthority` lets a successor start, a
:class:`Fence` stops an obsolete predecessor at the resource, :func:`run_once` stops the owner
repeating an effect; each write is one ``BEGIN IMMEDIATE`` (the contract is in :mod:`labkit.db`).
Subpackages by role build on the core, never the other way round: commands -> grading,
processes -> views -> scenarios -> sim -> mechanisms -> engines -> the core (idempotency ->
fence, lease -> db, clock -> errors), as ``lint-imports`` checks.
"""

from labkit.clock import Clock, RealClock, VirtualClock
from labkit.db import connect
from labkit.errors import BadArgument, BadArgumentType, Busy, KeyReused, LabkitError
from labkit.errors import LeaseHeld, LeaseLost, StaleGeneration
from labkit.fence import Fence, Tx
from labkit.idempotency import run_once
from labkit.lease import Lease, LeaseAuthority
from labkit.mechanisms.effects import EmailProvider, ETagStore, FencedFileStore, Outbox
from labkit.mechanisms.effects import PaymentProvider
from labkit.mechanisms.issuers import EpochAuthority, EpochIssuer
from labkit.mechanisms.recovery import Claims
from labkit.mechanisms.timing import LeaseKeeper, VersionLease, backoff, conservative_deadline
from labkit.sim.history import Event, Violation, check

# fmt: off
__all__ = [
    # the core
    "connect", "Clock", "VirtualClock", "RealClock", "Lease", "LeaseAuthority", "Fence", "Tx",
    "run_once",
    # its errors
    "LabkitError", "BadArgument", "BadArgumentType", "LeaseHeld", "LeaseLost", "StaleGeneration",
    "KeyReused", "Busy",
    # the mechanisms of lessons 04-08
    "conservative_deadline", "LeaseKeeper", "backoff", "VersionLease", "EpochIssuer",
    "EpochAuthority", "Claims", "FencedFileStore", "EmailProvider", "PaymentProvider", "Outbox",
    "ETagStore",
    # histories and their checker, and presenter mode
    "check", "Event", "Violation", "present",
]
# fmt: on


def present(on: bool = True):
    """Presenter mode for projecting (larger fonts, thicker lines): on, ``present(False)`` off.

    ``with present(): ...`` restores the previous settings afterwards; nothing changes until it
    is called. See :class:`labkit.views.plot.present`.
    """
    from labkit.views.plot import present as _present

    return _present(on)
