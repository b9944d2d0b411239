"""labkit: leases, fencing tokens and idempotency on real SQLite, for a hands-on course.

Why it looks like this: three failures, three mechanisms, and they are the core, the modules
beside this one, read in one sitting. A :class:`LeaseAuthority` lets a successor start, a
:class:`Fence` stops an obsolete predecessor at the resource, :func:`run_once` stops the owner
repeating an effect; each write is one ``BEGIN IMMEDIATE`` (the contract is in :mod:`labkit.db`).
Subpackages by role build on the core, never the other way round (``lint-imports`` checks it).
"""

from labkit.clock import Clock, RealClock, VirtualClock
from labkit.db import connect as _on_sqlite
from labkit.errors import BadArgument, BadArgumentType, Busy, KeyNotRecorded, KeyReused
from labkit.errors import LabkitError, LeaseHeld, LeaseLost, StaleGeneration
from labkit.fence import Fence, Tx
from labkit.idempotency import run_once
from labkit.lease import Lease, LeaseAuthority

# the core, its errors and presenter mode: ``import labkit`` loads nothing else. The lessons'
# mechanisms and the checker live in their own namespaces (labkit.mechanisms..., labkit.sim).
__all__ = ["connect", "Clock", "VirtualClock", "RealClock", "Lease", "LeaseAuthority", "Fence"]
__all__ += ["Tx", "run_once", "LabkitError", "BadArgument", "BadArgumentType", "LeaseHeld"]
__all__ += ["LeaseLost", "StaleGeneration", "KeyReused", "KeyNotRecorded", "Busy", "present"]


def connect(path=":memory:", *, busy_timeout_ms: int = 5000):
    """A labkit database on a SQLite file (:func:`labkit.db.connect`) or a ``postgresql://`` URL.

    >>> connect(), connect("postgresql://labkit:PASSWORD@127.0.0.1:5432/postgres")  # doctest: +SKIP
    """
    if isinstance(path, str) and path.startswith(("postgresql:", "postgres:")):
        from labkit.engines.postgres_db import connect as on_postgres

        return on_postgres(path, busy_timeout_ms=busy_timeout_ms)
    return _on_sqlite(path, busy_timeout_ms=busy_timeout_ms)


def present(on: bool = True):
    """Presenter mode for projecting: ``present()`` on, ``present(False)`` off, or a with block."""
    from labkit.views.plot import present as _present

    return _present(on)
