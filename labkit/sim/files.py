"""A simulation's SQLite files: a throwaway folder of real files, written from templates.

The folder is in ``/dev/shm`` when there is one (real files and locks, in memory). Each process
builds a template once and keeps its bytes in memory. A folder's name carries the pid that made
it, so the next process removes the folders that killed processes left."""

import os
import tempfile
from pathlib import Path

from labkit.clock import VirtualClock
from labkit.db import connect, execute
from labkit.engines.servers import sweep
from labkit.fence import Fence
from labkit.lease import LeaseAuthority
from labkit.sim.worker import JOB, LEASE

__all__ = ["new_folder", "connect_file", "scratch_folder"]

_TEMPLATES: dict[int, dict[str, bytes]] = {}  # earlier holders -> file name -> its bytes
_SWEPT: set[str] = set()  # the prefixes this process has swept


def new_folder(earlier_holders: int) -> Path:
    """A new folder whose ``authority.db`` has issued ``earlier_holders`` generations (released at
    t=0) and whose ``resource.db`` has the job's fence row at 0; the caller deletes it."""
    folder = scratch_folder("sim")
    if earlier_holders not in _TEMPLATES:
        _TEMPLATES[earlier_holders] = _build(folder, earlier_holders)
        return folder
    for name, data in _TEMPLATES[earlier_holders].items():
        (folder / name).write_bytes(data)
    return folder


def _build(folder: Path, earlier_holders: int) -> dict[str, bytes]:
    """Build the two files in ``folder`` and return their bytes."""
    authority_db = connect_file(str(folder / "authority.db"))
    resource_db = connect_file(str(folder / "resource.db"))
    authority = LeaseAuthority(authority_db, VirtualClock())
    for n in range(earlier_holders):
        authority.release(authority.acquire(LEASE, f"earlier-{n + 1}", 1.0))
    Fence(resource_db, JOB)
    authority_db.conn.close()  # the last connection to close checkpoints the WAL away
    resource_db.conn.close()
    return {name: (folder / name).read_bytes() for name in ("authority.db", "resource.db")}


def connect_file(path: str):
    """``labkit.connect(path, busy_timeout_ms=0)`` with ``synchronous=OFF``: throwaway files
    need no durability across a power cut, and locking (what the scenarios show) is unchanged."""
    db = connect(path, busy_timeout_ms=0)
    execute(db, "PRAGMA synchronous = OFF")
    return db


def scratch_folder(kind: str) -> Path:
    """A new folder ``labkit-{kind}-{pid}-...`` the caller deletes, in ``$LABKIT_SCRATCH`` (a
    team member's), else ``/dev/shm`` if writable, else the temp dir; the first of a kind a
    process makes removes those that killed processes left."""
    shm, prefix = os.environ.get("LABKIT_SCRATCH") or "/dev/shm", f"labkit-{kind}-"
    root = shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None
    if prefix not in _SWEPT:
        _SWEPT.add(prefix)
        sweep(prefix, root)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=root))
