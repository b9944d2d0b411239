"""A team of real worker processes on one SQLite file, and the hands to hurt them.

:class:`Team` starts the invoice workers of :mod:`labkit.processes.workers` as OS processes
and gives you the hands to freeze (``SIGSTOP``), thaw (``SIGCONT``), kill
(``SIGKILL``) and restart them, and to switch the write path between protected
and unprotected while they run. :mod:`labkit.processes.live` builds the lecture-hall
demo on it, and :mod:`labkit.processes.chaos` the fault run.

Every process a team starts is stopped by :meth:`Team.stop`, by leaving a
``with`` block (a kernel interrupt included), at interpreter exit, and, if the
kernel itself dies (a kernel restart), by Linux: each worker asks for
``PR_SET_PDEATHSIG``. Start teams from a long-lived thread (a notebook's main
thread is one): Linux ties that signal to the thread that started the child.

This module reads the real clock on purpose (it is the parent side of
:mod:`labkit.processes.live`).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from random import Random
import weakref
from collections import Counter
from dataclasses import asdict

from labkit.clock import RealClock
from labkit.db import connect, execute, transaction
from labkit.errors import BadArgument, BadArgumentType, Busy, LabkitError
from labkit.sim.history import Event, check
from labkit.lease import LeaseAuthority
from labkit.errors import check_number
from labkit.processes.workers import (
    IDLE,
    IN_TX,
    JOB,
    Board,
    Journal,
    WorkerSpec,
    prepare,
    read_journals,
)

_CLOCK = RealClock()  # a team of real processes runs on the machine's monotonic clock

__all__ = ["Team", "proc_state"]

_TEAMS: "weakref.WeakSet[Team]" = weakref.WeakSet()


def _locked(method):
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    wrapper.__name__, wrapper.__doc__ = method.__name__, method.__doc__
    return wrapper


def proc_state(pid: int) -> str | None:
    """Return the kernel's state letter for ``pid`` (``R``, ``S``, ``T``, ``Z``...), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


class Team:
    """Worker processes running the invoice job on one SQLite file.

    Args:
        workers: how many (1 to 26), named ``"A"``, ``"B"``, ...
        path: the SQLite file (default: a new file in a temporary folder).
        protected: start on the protected write path.
        seed: seeds every worker's random numbers (with its name and incarnation).
        ttl, work, hold, rest, invoices, redeliver, busy_timeout_ms, seconds:
            passed to each worker (see :class:`labkit.processes.workers.WorkerSpec`).
        root: where the run's folder (board, journals, logs, default database) is
            made (default: the system's temporary folder). It is kept afterwards.

    Counts (``team.counts``): ``freezes``, ``freezes_past_lease`` (a lease holder
    thawed after its lease had expired), ``kills``, ``kills_in_tx`` (killed while
    inside ``BEGIN IMMEDIATE``, checked against the write lock itself), ``restarts``.

    Example:
        >>> with Team(2, ttl=0.5, seconds=1.0) as team:   # doctest: +SKIP
        ...     team.start(); time.sleep(1.5); team.check()
        []
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        path: str | None = None,
        protected: bool = True,
        seed: int = 0,
        ttl: float = 1.0,
        work=(0.1, 0.3),
        hold=(0.005, 0.02),
        rest=(0.0, 0.1),
        invoices: int = 3,
        redeliver: float = 0.0,
        busy_timeout_ms: int = 200,
        seconds: float | None = None,
        root: str | None = None,
    ) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int):
            raise BadArgumentType("workers", f"must be an int, got {type(workers).__name__}")
        if not 1 <= workers <= 26:
            raise BadArgument("workers", f"must be 1 to 26, got {workers}")
        ttl = check_number(ttl, "ttl", positive=True)
        self.run_dir = tempfile.mkdtemp(prefix="labkit-run-", dir=root)
        for folder in ("journal", "logs"):
            os.makedirs(os.path.join(self.run_dir, folder))
        self.path = os.fspath(path) if path is not None else os.path.join(self.run_dir, "lab.db")
        prepare(self.path)
        self.names = [chr(ord("A") + i) for i in range(workers)]
        self.board = Board(os.path.join(self.run_dir, "board"), workers, protected)
        self.run, self.seed, self.t0 = uuid.uuid4().hex[:12], seed, _CLOCK.now()
        self.options = dict(
            ttl=ttl,
            work=tuple(work),
            hold=tuple(hold),
            rest=tuple(rest),
            invoices=invoices,
            redeliver=redeliver,
            busy_timeout_ms=busy_timeout_ms,
            seconds=seconds,
        )
        self.db = connect(self.path, busy_timeout_ms=busy_timeout_ms)
        self._probe = connect(self.path, busy_timeout_ms=0)
        self.leases = LeaseAuthority(self.db, RealClock())
        self.journal = Journal(os.path.join(self.run_dir, "journal", "team.jsonl"))
        self.procs: dict[str, subprocess.Popen] = {}
        self.incarnation: Counter = Counter()
        self.counts: Counter = Counter()
        self._frozen: dict[str, tuple | None] = {}
        self._lock = threading.RLock()
        _TEAMS.add(self)

    # -- time, state ---------------------------------------------------------------
    def now(self) -> float:
        """Seconds since the team was made (the time axis of its history)."""
        return _CLOCK.now() - self.t0

    @property
    def protected(self) -> bool:
        """True while workers take the protected write path; assign to switch it live."""
        return self.board.protected

    @protected.setter
    def protected(self, value: bool) -> None:
        self.board.protected = value
        self._note("", "mode", "protected" if value else "unprotected")

    def pid(self, name: str) -> int | None:
        """The pid of ``name``'s current process, or None if it never started."""
        proc = self.procs.get(self._check(name))
        return proc.pid if proc else None

    def alive(self, name: str) -> bool:
        """True while ``name``'s current process has not exited."""
        proc = self.procs.get(self._check(name))
        return proc is not None and proc.poll() is None

    def state(self, name: str) -> str | None:
        """The kernel's state letter of ``name``'s process (``T`` while frozen)."""
        return proc_state(self.pid(name)) if self.alive(name) else None

    def phase(self, name: str) -> int:
        """``name``'s phase on the board (``procs.IDLE``, ``LEASED``, ``WORKING``, ``IN_TX``)."""
        return self.board.phase(self.names.index(self._check(name)))

    def holder(self):
        """``(name, lease)`` if a running worker process holds the unexpired lease, else None.

        A lease left behind by a killed process (until it expires) has no holder here.
        """
        with self._lock:
            lease = self.leases.current(JOB)
        if lease is not None:
            name, _, number = lease.owner.rpartition(".")
            if name in self.names and number == str(self.incarnation[name]) and self.alive(name):
                return name, lease
        return None

    def lock_held(self) -> bool:
        """True if some connection holds the write lock right now (probed with ``BEGIN IMMEDIATE``)."""
        with self._lock:
            try:
                with transaction(self._probe):
                    return False
            except Busy:
                return True

    # -- hands -----------------------------------------------------------------------
    def start(self, *names: str) -> "Team":
        """Start the named workers (default: every worker not running); a dead one is restarted."""
        for name in names or self.names:
            if not self.alive(name):
                self._spawn(name)
        return self

    @_locked
    def freeze(self, name: str) -> int | None:
        """SIGSTOP ``name`` and wait until the kernel reports it stopped; return its phase then."""
        if not self.alive(name) or name in self._frozen:
            return None
        if not self._stop_now(name):
            return None
        held = self.holder()
        lease = held[1] if held is not None and held[0] == name else None
        self._frozen[name] = None if lease is None else (lease.generation,)
        self.counts["freezes"] += 1
        self._note(name, "pause", "ok", None if lease is None else lease.generation)
        return self.phase(name)

    @_locked
    def thaw(self, name: str) -> bool | None:
        """SIGCONT a frozen ``name``; return whether it had held a lease that expired meanwhile."""
        if name not in self._frozen:
            return None
        lease = self._frozen.pop(name)
        if self.alive(name):
            os.kill(self.pid(name), signal.SIGCONT)
        past = None
        if lease is not None:
            held = self.holder()
            past = held is None or (held[0], held[1].generation) != (name, lease[0])
            self.counts["freezes_past_lease"] += past
        self._note(name, "resume", "past_lease" if past else "ok")
        return past

    @_locked
    def kill(self, name: str) -> bool | None:
        """SIGKILL ``name``; return True if it died inside ``BEGIN IMMEDIATE`` (None if not running).

        The process is stopped first, so its phase can be read while it cannot
        change; a phase of ``IN_TX`` is then confirmed by finding the write lock
        held. The killed transaction rolls back, and the lock is free at once.
        """
        if not self.alive(name) or (name not in self._frozen and not self._stop_now(name)):
            return None
        slot = self.names.index(name)
        in_tx = self.board.phase(slot) == IN_TX
        if in_tx and not self.lock_held():
            raise LabkitError(f"{name} is marked inside a transaction but the write lock is free")
        self.procs[name].kill()
        self.procs[name].wait()
        self._frozen.pop(name, None)
        self.board.set_phase(slot, IDLE)
        self.counts["kills"] += 1
        self.counts["kills_in_tx"] += in_tx
        self._note(name, "crash", "in_tx" if in_tx else "outside_tx")
        return in_tx

    @_locked
    def kill_if_in_tx(self, name: str) -> bool:
        """Stop ``name`` for an instant: if it is inside ``BEGIN IMMEDIATE``, SIGKILL it (True);
        otherwise let it continue (False). Frozen or dead workers are left alone (False)."""
        if not self.alive(name) or name in self._frozen or not self._stop_now(name):
            return False
        if self.phase(name) == IN_TX:
            return bool(self.kill(name))
        os.kill(self.pid(name), signal.SIGCONT)
        return False

    def exited(self) -> dict[str, int]:
        """Workers whose process exited by itself (not through :meth:`kill`), with exit codes."""
        return {
            name: proc.returncode
            for name, proc in self.procs.items()
            if proc.poll() is not None and proc.returncode != -signal.SIGKILL
        }

    def finish(self, timeout: float = 5.0) -> None:
        """Thaw everyone, let workers end on their own (``seconds``) for up to ``timeout``, then stop."""
        for name in list(self._frozen):
            self.thaw(name)
        deadline = _CLOCK.now() + timeout
        while any(self.alive(n) for n in self.procs) and _CLOCK.now() < deadline:
            time.sleep(0.02)
        self.stop()

    def stop(self) -> None:
        """SIGKILL every process this team started and reap them. Safe to call twice."""
        self._frozen.clear()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def __enter__(self) -> "Team":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- what happened ---------------------------------------------------------------
    def history(self) -> list[Event]:
        """Every event so far, in time order: the journals plus the committed writes."""
        with self._lock:
            rows = execute(
                self.db,
                "SELECT time, worker, action, outcome, generation, key, target, "
                "until FROM history WHERE run = ?",
                (self.run,),
            )
        events = read_journals(os.path.join(self.run_dir, "journal")) + [
            Event(*row) for row in rows
        ]
        return sorted(events, key=lambda e: e.time)

    def final(self) -> dict[str, int]:
        """The committed state: ``{invoice: generation}``."""
        with self._lock:
            return dict(
                execute(
                    self.db, "SELECT invoice_id, generation FROM invoices WHERE job_id = ?", (JOB,)
                )
            )

    def ledger(self) -> list[tuple[str, int, int]]:
        """Invoices whose amount is not the sum of their committed charge lines: (invoice, amount, lines)."""
        with self._lock:
            return execute(
                self.db,
                """
                SELECT i.invoice_id, i.amount, COALESCE(SUM(l.amount), 0) FROM invoices AS i
                LEFT JOIN invoice_lines AS l ON l.invoice_id = i.invoice_id
                WHERE i.job_id = ? GROUP BY i.invoice_id
                HAVING i.amount != COALESCE(SUM(l.amount), 0) ORDER BY i.invoice_id""",
                (JOB,),
            )

    def check(self):
        """Run :func:`labkit.sim.history.check` over the history and the final state."""
        return check(self.history(), final=self.final())

    # -- inside ------------------------------------------------------------------------
    def _check(self, name: str) -> str:
        if name not in self.names:
            raise BadArgument("worker", f"must be one of {self.names}, got {name!r}")
        return name

    def _note(self, name, action, outcome, generation=None) -> None:
        self.journal.append(Event(self.now(), name, action, outcome, generation))

    def _stop_now(self, name: str) -> bool:
        pid = self.pid(name)
        os.kill(pid, signal.SIGSTOP)
        while (state := proc_state(pid)) not in ("T", "t"):
            if state in (None, "Z", "X"):
                return False
            time.sleep(0.0005)
        return True

    def _spawn(self, name: str) -> None:
        self.incarnation[name] += 1
        number = self.incarnation[name]
        self.counts["restarts"] += number > 1
        seed = Random(f"{self.seed}/{name}/{number}").randrange(2**32)
        spec = WorkerSpec(
            path=self.path,
            run_dir=self.run_dir,
            run=self.run,
            slot=self.names.index(name),
            name=name,
            incarnation=number,
            seed=seed,
            t0=self.t0,
            parent=os.getpid(),
            **self.options,
        )
        self.board.set_phase(spec.slot, IDLE)
        with open(os.path.join(self.run_dir, "logs", f"{name}.{number}.err"), "wb") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "labkit.processes.workers", json.dumps(asdict(spec))],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )  # a Ctrl-C or kernel interrupt is the parent's to handle

    def __repr__(self) -> str:
        running = [n for n in self.procs if self.alive(n)]
        return f"{type(self).__name__}(workers={self.names}, running={running}, path={self.path!r})"


@atexit.register
def _stop_all() -> None:
    for team in list(_TEAMS):
        team.stop()
