"""A team of real worker processes on one SQLite file, and the hands to hurt them.

:class:`Team` starts, freezes (SIGSTOP), thaws, kills (SIGKILL) and restarts its workers and
reads back what happened. Workers stop with :meth:`Team.stop`, at exit, or when the parent dies
(``PR_SET_PDEATHSIG`` is tied to the starting thread: start teams from a long-lived one).
Real time is read on purpose."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path
from random import Random

from labkit.clock import RealClock
from labkit.db import connect, execute, transaction
from labkit.engines.etcd_leases import authority
from labkit.engines.servers import as_user, held_interrupts, proc_state, reap, sweep
from labkit.errors import BadArgument, Busy, LabkitError, check_number
from labkit.fence import Fence
from labkit.processes.workers import (
    END,
    IDLE,
    IN_TX,
    LINES,
    WORKING,
    WorkerSpec,
    append,
    board,
    deadline,
    journal,
)
from labkit.sim import JOB, Event, check

__all__ = ["STOP_TIMEOUT", "Team", "proc_state"]

STOP_TIMEOUT = 2.0  # seconds for a SIGSTOPped process to show state T before it is SIGKILLed
_CLOCK = RealClock()
_TEAMS: weakref.WeakSet[Team] = weakref.WeakSet()
KNOBS = ("ttl", "work", "hold", "rest", "redeliver", "busy_timeout_ms", "seconds", "etcd")


def _locked(method):
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    wrapper.__name__, wrapper.__doc__ = method.__name__, method.__doc__
    return wrapper


class Team:
    """Worker processes (1 to 26, ``"A"``, ``"B"``, ...) on ``lab.db`` in a run folder kept in
    ``root`` (else a temp one, swept once this process is gone); ``knobs`` are :class:`~labkit.processes.workers.WorkerSpec` fields, and
    ``seed`` seeds them all. ``counts`` has ``freezes``, ``freezes_past_lease`` (a holder thawed
    after its lease expired), ``kills``, ``kills_in_tx`` and ``restarts``."""

    def __init__(self, workers=2, *, protected=True, seed=0, root=None, **knobs):
        n = check_number(workers, "workers", integer=True, low=1, high=26)
        if unknown := sorted(set(knobs) - set(KNOBS)):
            raise BadArgument(unknown[0], f"is not a knob of Team; its knobs are {list(KNOBS)}")
        knobs["ttl"] = check_number(knobs.get("ttl", 1.0), "ttl", positive=True)
        spec = WorkerSpec("", "", 0.0, protected=bool(protected), **knobs)
        if root is None:
            sweep("labkit-run-")
        self.run_dir = tempfile.mkdtemp(prefix=f"labkit-run-{os.getpid()}-", dir=root)
        for folder in ("journal", "logs"):
            os.makedirs(os.path.join(self.run_dir, folder))
        self.path = os.path.join(self.run_dir, "lab.db")
        self.names, self.seed = [chr(65 + i) for i in range(n)], seed
        self.run, self.t0 = uuid.uuid4().hex[:12], _CLOCK.now()
        self.spec = replace(spec, run_dir=self.run_dir, run=self.run, t0=self.t0)
        self.board = board(os.path.join(self.run_dir, "board"), n)
        ends = float("inf") if self.spec.seconds is None else self.spec.seconds
        self.end = deadline(os.path.join(self.run_dir, "end"), ends)
        self.db = connect(self.path, busy_timeout_ms=self.spec.busy_timeout_ms)
        with transaction(self.db):
            execute(self.db, LINES)
        Fence(self.db, JOB)  # makes the job's fence row
        self._probe = connect(self.path, busy_timeout_ms=0)
        self.leases = authority(self.db, _CLOCK, self.spec.etcd, looking=True)
        self.journal = journal(os.path.join(self.run_dir, "journal", "team.jsonl"))
        self.procs: dict[str, subprocess.Popen] = {}
        self.incarnation, self.counts = Counter(), Counter()
        self._frozen: dict[str, int | None] = {}  # name -> the generation it held, if any
        self._lock, self._closed = threading.RLock(), False
        _TEAMS.add(self)

    def now(self) -> float:
        """Seconds since the team was made (the time axis of its history)."""
        return _CLOCK.now() - self.t0

    def pid(self, name: str) -> int | None:
        """The pid of ``name``'s current process, or None if it never started."""
        if name not in self.names:
            raise BadArgument("worker", f"must be one of {self.names}, got {name!r}")
        proc = self.procs.get(name)
        return proc.pid if proc else None

    def alive(self, name: str) -> bool:
        """True while ``name``'s current process has not exited."""
        return self.pid(name) is not None and self.procs[name].poll() is None

    def phase(self, name: str) -> int:
        """``name``'s phase on the board (``IDLE``, ``LEASED``, ``WORKING`` or ``IN_TX``)."""
        return self.board[self.names.index(name)]

    @_locked
    def holder(self):
        """``(name, lease)`` if a running worker holds the unexpired lease, else None."""
        lease = self.leases.current(JOB)
        name, _, number = lease.owner.rpartition(".") if lease else ("", "", "")
        current = name in self.names and number == str(self.incarnation[name])
        return (name, lease) if current and self.alive(name) else None

    @_locked
    def lock_held(self) -> bool:
        """True if some connection holds the write lock now (probed with ``BEGIN IMMEDIATE``)."""
        try:
            with transaction(self._probe):
                return False
        except Busy:
            return True

    def overtaken(self, generation: int) -> bool:
        """True once a write with a generation above ``generation`` has committed."""
        sql = "SELECT max(generation) > $1 FROM invoice_lines WHERE run = $2"
        return bool(self.query(sql, (generation, self.run))[0][0])

    def start(self, *names: str) -> Team:
        """Start the named workers (default: all that are not running); a dead one restarts."""
        if self._closed:
            raise LabkitError("this team was stopped: make a new one to start workers")
        for name in names or self.names:
            if not self.alive(name):
                self._reap(name)
                self._spawn(name)
        return self

    @_locked
    def freeze(self, name: str) -> int | None:
        """SIGSTOP ``name``, wait until the kernel reports it stopped; return its phase then."""
        if not self.alive(name) or name in self._frozen or not self._stop_now(name):
            return None
        held = self.holder()
        self._frozen[name] = held[1].generation if held and held[0] == name else None
        self.counts["freezes"] += 1
        self._note(name, "pause", "ok", self._frozen[name])
        return self.phase(name)

    @_locked
    def thaw(self, name: str) -> bool | None:
        """SIGCONT a frozen ``name``; return whether it had held a lease that expired meanwhile."""
        if name not in self._frozen:
            return None
        generation, past = self._frozen.pop(name), None
        if self.alive(name):
            os.kill(self.pid(name), signal.SIGCONT)
        if generation is not None:
            held = self.holder()
            past = held is None or (held[0], held[1].generation) != (name, generation)
            self.counts["freezes_past_lease"] += past
        self._note(name, "resume", "past_lease" if past else "ok")
        return past

    @_locked
    def freeze_holder(self, name: str | None = None):
        """Freeze the lease holder (if it is ``name``, when given) while it works, outside any
        transaction. Return ``(name, generation)``, or None and let it run."""
        held = self.holder()
        who = held[0] if held and held[0] not in self._frozen else None
        if who is None or name not in (None, who) or self.phase(who) != WORKING:
            return None
        if self.freeze(who) == WORKING and not self.lock_held():  # and the same lease still:
            if (again := self.holder()) and again[1].generation == held[1].generation:
                return who, held[1].generation
        self.thaw(who)
        return None

    @_locked
    def kill(self, name: str) -> bool | None:
        """SIGKILL ``name``; return True if it died inside ``BEGIN IMMEDIATE`` (None if it was not
        running). It is stopped first, and ``IN_TX`` is confirmed by finding the lock held."""
        if not self.alive(name) or (name not in self._frozen and not self._stop_now(name)):
            return None
        in_tx = self.phase(name) == IN_TX
        if in_tx and not self.lock_held():
            raise LabkitError(f"{name} is marked inside a transaction but the write lock is free")
        self._reap(name)
        self.counts["kills"] += 1
        self.counts["kills_in_tx"] += in_tx
        self._note(name, "crash", "in_tx" if in_tx else "outside_tx")
        return in_tx

    @_locked
    def kill_if_in_tx(self, name: str) -> bool:
        """SIGKILL ``name`` if it runs inside ``BEGIN IMMEDIATE`` (True), else let it go on."""
        if not self.alive(name) or name in self._frozen or not self._stop_now(name):
            return False
        if self.phase(name) == IN_TX:
            return bool(self.kill(name))
        os.kill(self.pid(name), signal.SIGCONT)
        return False

    def exited(self) -> dict[str, int]:
        """Workers whose process exited by itself (not through :meth:`kill`), with exit codes."""
        codes = {name: proc.poll() for name, proc in self.procs.items()}
        return {name: code for name, code in codes.items() if code not in (None, -signal.SIGKILL)}

    def extend(self, seconds: float) -> None:
        """Move the workers' end later, to ``seconds`` since the team's start."""
        END.pack_into(self.end, 0, max(seconds, END.unpack_from(self.end)[0]))

    @_locked
    def stop(self) -> None:
        """SIGKILL and reap every process, close the team's files; the history stays readable."""
        for name in list(self.procs):
            self._reap(name)
        if not self._closed:
            self._closed = True
            for db in (self.db, self._probe):
                db.conn.close()
            self.board.close()
            self.end.close()
            os.close(self.journal)

    def __enter__(self) -> Team:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def history(self) -> list[Event]:
        """Every event so far, in time order: the journals plus the committed writes."""
        events = []
        for file in sorted(Path(self.run_dir, "journal").glob("*.jsonl")):  # whole lines only
            events += [Event(**json.loads(line)) for line in file.read_bytes().split(b"\n")[:-1]]
        columns = "time, worker, 'write', 'ok', generation, key, invoice_id"
        rows = self.query(f"SELECT {columns} FROM invoice_lines WHERE run = $1", (self.run,))
        return sorted(events + [Event(*row) for row in rows], key=lambda e: e.time)

    def final(self) -> dict[str, int]:
        """The committed state: ``{invoice: generation}``."""
        sql = "SELECT invoice_id, generation FROM invoices WHERE job_id = $1"
        return dict(self.query(sql, (JOB,)))

    def ledger(self) -> list[tuple[str, int, int]]:
        """Invoices whose amount is not the sum of their committed lines: (invoice, amount, sum)."""
        sql = """SELECT i.invoice_id, i.amount, COALESCE(SUM(l.amount), 0) FROM invoices AS i
            LEFT JOIN invoice_lines AS l ON l.invoice_id = i.invoice_id WHERE i.job_id = $1
            GROUP BY i.invoice_id HAVING i.amount != COALESCE(SUM(l.amount), 0) ORDER BY 1"""
        return self.query(sql, (JOB,))

    def check(self):
        """Run :func:`labkit.sim.check` over the history and the final state."""
        return check(self.history(), final=self.final())

    def query(self, sql: str, params) -> list[tuple]:
        """Run one read on a connection of its own (from any thread, even after :meth:`stop`)."""
        db = connect(self.path)
        try:
            return execute(db, sql, params)
        finally:
            db.conn.close()

    def _note(self, name, action, outcome, generation=None) -> None:
        if not self._closed:  # after stop, the journal's descriptor is closed
            append(self.journal, Event(self.now(), name, action, outcome, generation))

    def _stop_now(self, name: str) -> bool:
        """SIGSTOP ``name`` and wait for state ``T``: False if it died or did not stop in time."""
        pid, deadline = self.pid(name), _CLOCK.now() + STOP_TIMEOUT
        os.kill(pid, signal.SIGSTOP)
        while (state := proc_state(pid)) not in ("T", "t"):
            if state in ("gone", "Z", "X"):
                return False
            if _CLOCK.now() > deadline:
                self._reap(name)
                self._note(name, "crash", "unstoppable")
                return False
            time.sleep(0.0005)
        return True

    def _reap(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is not None:
            proc.kill()  # a no-op if it has exited
            reap(proc)  # not proc.wait(): an interrupt inside poll() can leave its lock held
            self._frozen.pop(name, None)
            if not self._closed:
                self.board[self.names.index(name)] = IDLE
        shutil.rmtree(self._scratch(name), ignore_errors=True)

    def _scratch(self, name: str) -> str:
        """The scratch folder of ``name``'s current process, removed when it is reaped."""
        return os.path.join(self.run_dir, "scratch", f"{name}.{self.incarnation[name]}")

    def _spawn(self, name: str) -> None:
        self.incarnation[name] += 1
        number, slot = self.incarnation[name], self.names.index(name)
        self.counts["restarts"] += number > 1
        seed = Random(f"{self.seed}/{name}/{number}").randrange(2**32)
        spec = replace(self.spec, slot=slot, name=name, incarnation=number, seed=seed)
        os.makedirs(self._scratch(name))
        log_path = os.path.join(self.run_dir, "logs", f"{name}.{number}.err")
        with open(log_path, "wb") as log, held_interrupts():  # recorded before a Ctrl-C acts
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "labkit.processes.workers", json.dumps(asdict(spec))],
                env={**os.environ, "LABKIT_SCRATCH": self._scratch(name)},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,  # a Ctrl-C or kernel interrupt is the parent's to handle
                preexec_fn=as_user(None),  # PR_SET_PDEATHSIG: it dies with us
            )


@atexit.register
def _stop_all() -> None:
    for team in list(_TEAMS):
        team.stop()
