"""A simulation's SQLite files: a throwaway folder of real files, started from templates.

Every :class:`~labkit.sim.engine.Sim` works on real SQLite files with real locks, in
a folder of its own. The folder is made in ``/dev/shm`` when the machine has
it (memory-backed, still real files with real locks), so a run never waits
for a disk; else in the system's temporary folder. Its files start as copies
of template files made once per process: copying two closed files is much
cheaper than building them for every run, so a whole run takes milliseconds.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from labkit.clock import VirtualClock
from labkit.db import connect, execute
from labkit.fence import Fence
from labkit.lease import LeaseAuthority
from labkit.sim.worker import JOB, LEASE

__all__ = ["new_folder", "connect_file"]

_TEMPLATES: dict[int, Path] = {}


def new_folder(earlier_holders: int) -> Path:
    """Make a new folder holding ``authority.db`` and ``resource.db``, copied from the templates.

    ``authority.db`` has issued ``earlier_holders`` generations of the lease;
    ``resource.db`` has the job's fence row at 0. The caller deletes the folder.
    """
    start = _template(earlier_holders)
    folder = Path(tempfile.mkdtemp(prefix="labkit-sim-", dir=_root()))
    for name in ("authority", "resource"):
        shutil.copyfile(start / f"{name}.db", folder / f"{name}.db")
    return folder


def connect_file(path: str):
    """``labkit.connect(path, busy_timeout_ms=0)``, with ``synchronous=OFF``.

    The files live in a throwaway temp folder, so durability across a power cut
    does not matter; locking (what the scenarios show) is unchanged.
    """
    db = connect(path, busy_timeout_ms=0)
    execute(db, "PRAGMA synchronous = OFF")
    return db


def _template(earlier_holders: int) -> Path:
    """A folder with the starting files, made once per process and copied by every Sim.

    ``authority.db`` has issued ``earlier_holders`` generations of the lease (each
    acquired and released at t=0); ``resource.db`` has the job's fence row at 0.
    """
    if earlier_holders not in _TEMPLATES:
        folder = Path(tempfile.mkdtemp(prefix="labkit-sim-template-", dir=_root()))
        atexit.register(shutil.rmtree, folder, True)
        authority_db = connect_file(str(folder / "authority.db"))
        resource_db = connect_file(str(folder / "resource.db"))
        authority = LeaseAuthority(authority_db, VirtualClock())
        for n in range(earlier_holders):
            authority.release(authority.acquire(LEASE, f"earlier-{n + 1}", 1.0))
        Fence(resource_db, JOB)
        authority_db.conn.close()  # the last connection to close checkpoints the WAL away
        resource_db.conn.close()
        _TEMPLATES[earlier_holders] = folder
    return _TEMPLATES[earlier_holders]


def _root() -> str | None:
    """Where the folders go: ``/dev/shm`` when there is one (and we may write there), else the temp dir."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None
