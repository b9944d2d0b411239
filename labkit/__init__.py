"""labkit: leases, fencing tokens and idempotency on SQLite, for a hands-on course.

Why labkit looks like this:

* Three failures, three mechanisms. A :class:`LeaseAuthority` lets a successor
  start; a :class:`Fence` stops an obsolete predecessor at the resource;
  :func:`run_once` stops the current owner from repeating an effect.
* Everything is real SQLite. Every write that matters is one ``BEGIN IMMEDIATE``
  transaction whose answer is the row count of one conditional statement
  (see :mod:`labkit.db` for the contract, written once).
* Time is passed in. Library code reads ``clock.now()`` and takes ``rng=``;
  only :class:`RealClock` and the live demos read the machine's clock.
"""

from labkit.clock import Clock, RealClock, VirtualClock
from labkit.db import connect
from labkit.errors import (
    BadArgument,
    BadArgumentType,
    Busy,
    KeyReused,
    LabkitError,
    LeaseHeld,
    LeaseLost,
    StaleGeneration,
)
from labkit.fence import Fence, Tx
from labkit.sim.history import Event, Violation, check
from labkit.idempotency import run_once
from labkit.lease import Lease, LeaseAuthority
from labkit.mechanisms.effects import (
    EmailProvider,
    ETagStore,
    FencedFileStore,
    Outbox,
    PaymentProvider,
)
from labkit.mechanisms.issuers import EpochAuthority, EpochIssuer
from labkit.mechanisms.recovery import Claims
from labkit.mechanisms.timing import LeaseKeeper, VersionLease, backoff, conservative_deadline

__all__ = [
    "connect",
    "Clock",
    "VirtualClock",
    "RealClock",
    "Lease",
    "LeaseAuthority",
    "Fence",
    "Tx",
    "run_once",
    "LabkitError",
    "BadArgument",
    "BadArgumentType",
    "LeaseHeld",
    "LeaseLost",
    "StaleGeneration",
    "KeyReused",
    "Busy",
    "conservative_deadline",
    "LeaseKeeper",
    "backoff",
    "VersionLease",
    "EpochIssuer",
    "EpochAuthority",
    "Claims",
    "FencedFileStore",
    "EmailProvider",
    "PaymentProvider",
    "Outbox",
    "ETagStore",
    "check",
    "Event",
    "Violation",
    "present",
]


def present(on: bool = True):
    """Presenter mode for projecting: larger fonts, thicker lines (see :class:`labkit.views.plot.present`).

    ``present()`` switches it on, ``present(False)`` back off; ``with present(): ...``
    restores the previous settings afterwards. Nothing changes until it is called.
    """
    from labkit.views.plot import present as _present

    return _present(on)
