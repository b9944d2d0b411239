"""The judge: runs a notebook's answers in a sandboxed worker, and every trial in its own process.

:class:`Sandbox` runs the worker (:mod:`labkit.grading.sandbox`) and speaks to it with
:mod:`labkit.grading.wire`. :meth:`Sandbox.answer` gives the trial of one schedule a
:class:`~labkit.grading.forks.RemoteAnswer`: each worker's calls go to a fresh process of its
own, forked from the answer's (:mod:`labkit.grading.forks`), and each call serves the answer's
requests on the judge's own objects until the answer returns. What comes back is plain values
of the task's declared types; anything else fails the task.
"""

from __future__ import annotations

import contextlib
import socket
import sqlite3
import sys
import threading

from labkit.clock import RealClock
from labkit.grading import lab, wire
from labkit.grading.forks import Killed, RemoteAnswer, Workers
from labkit.grading.policy import SQL, allow, authorizer
from labkit.grading.sandbox import Jail, sandboxed
from labkit.grading.verdicts import Refused

__all__ = ["Sandbox", "RemoteAnswer", "Killed", "Refused", "judge", "attempt", "sandboxed"]


#: a whole task may take this many times the per-message timeout (real time: a grader must end)
TASK_LIMIT, CLOCK = 3, RealClock()
#: one statement of the answer's may run this long (s) before SQLite interrupts it
STATEMENT_LIMIT = 2.0


class Sandbox(wire.Peer):
    """One worker process for one notebook (in a :class:`~labkit.grading.sandbox.Jail`): run
    its cells, then fork it per worker of each schedule. ``hide`` lists more folders the answer
    must not see (submissions, outputs, solutions). ``broken`` once the worker stopped answering.
    """

    def __init__(self, *, hide=(), timeout: float = 30.0, warn=None) -> None:
        self.timeout, self.broken = timeout, False
        self.deadline: float | None = None  # when the task being judged must be done by
        self.lent: set = set()  # the connections lent to the answer in this schedule
        self.served: list[tuple] = []  # its requests: (the object's class, what, the arguments)
        self.errors: list[str] = []  # what the cells that raised said, in order
        self.jail = Jail(hide=hide, warn=warn)
        super().__init__(wire.Channel(self.jail.rfd, self.jail.wfd, CLOCK.now))

    __enter__ = contextlib.AbstractContextManager.__enter__

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):  # a worker that stopped reading is killed with its jail
            self.channel.send({"op": "quit"}, 1.0)
        self.jail.close()

    def left(self) -> float:
        """How long the next message may take: the per-message timeout, or less if the task has
        less left."""
        left = self.timeout if self.deadline is None else self.deadline - CLOCK.now()
        return max(0.0, min(self.timeout, left))

    def wait(self, channel: wire.Channel | None = None) -> dict:
        """The next message on ``channel`` (a worker's; None: the notebook's process's)."""
        allowed = self.left()
        try:
            try:
                message = (channel or self.channel).recv(allowed)
            except TimeoutError:
                if allowed >= self.timeout:
                    raise
                raise TimeoutError(f"the task took more than {TASK_LIMIT * self.timeout:g} s")
        except wire.ChannelClosed as exc:
            if channel is None:
                self.broken = True
                raise Refused(f"the answer's process stopped answering ({exc})") from None
            raise Refused("the answer's process exited in the middle of a call") from None
        except (OSError, TimeoutError) as exc:
            self.broken = True
            raise Refused(f"the answer's process stopped answering ({exc})") from None
        return message

    def send(self, message: dict, channel: wire.Channel | None = None) -> None:
        """Send on ``channel`` (None: the notebook's process's) within :meth:`left`: a worker
        that stops reading breaks the sandbox, as one that stops answering does."""
        try:
            (channel or self.channel).send(message, self.left())
        except OSError as exc:  # TimeoutError among them
            self.broken = True
            raise Refused(f"the answer's process stopped reading ({exc})") from None

    def unexpected(self, message: dict) -> None:
        self.broken = True
        raise Refused(f"the answer's process sent {str(message.get('op'))[:40]!r} out of turn")

    def _ask(self, message: dict, reply: str | None) -> dict | None:
        """Send ``message`` to the notebook's process; its answer, which must be a ``reply``."""
        self.send(message)
        if reply is None:
            return None
        if (answer := self.wait())["op"] != reply:  # a cell's own write to the channel, say
            self.unexpected(answer)
        return answer

    def cell(self, source: str, number: int) -> str | None:
        """Run one code cell in the worker; its error in words (also kept in ``errors``), or None."""
        error = self._ask({"op": "cell", "source": source, "number": number}, "ran").get("error")
        if error:
            first = next((line for line in source.splitlines() if line.strip()), "")
            self.errors.append(f"the cell that begins {first.strip()[:60]!r} raised {error}")
        return error

    def allow(self, target, what: str, args: list) -> None:
        """Record the request in :attr:`served` (its arguments decoded once, by the caller), then
        apply the lending policy."""
        self.served.append((type(target).__name__, what, list(args)))
        allow(target, what, args)

    def fork(self, number: int, seed, channel: socket.socket) -> None:
        """Fork the worker ``number`` of this schedule, speaking on ``channel`` (its end)."""
        self._ask({"op": "fork", "worker": number, "seed": seed}, None)
        try:
            socket.send_fds(self.jail.door, [b"."], [channel.fileno()])
        except OSError as exc:
            self.broken = True
            raise Refused(f"the answer's process is gone ({exc})") from None

    def kill(self, number: int) -> None:
        """Kill the worker ``number`` of this schedule at once (SIGKILL), as a crash does."""
        self._ask({"op": "kill", "worker": number}, "killed")

    def perform(self, target, what: str, args: list):
        """Run the answer's SQL under the allow-list of :func:`~labkit.grading.policy.authorizer`
        (it runs in the judge: it may reach only the trial's tables) and a progress handler that
        stops a statement after :data:`STATEMENT_LIMIT` s, or when the task's time is up. Either
        ends the answer's trial: it raises Refused, which the answer never sees."""
        if not isinstance(target, sqlite3.Connection) or what not in SQL:
            return wire.perform(target, what, args)
        refused, end = [], CLOCK.now() + STATEMENT_LIMIT
        end = end if self.deadline is None else min(end, self.deadline)
        dying = lab.DYING.get(id(target))  # a worker dying at a statement (lab.process; read
        # through the module: a reload of the checks makes a new DYING)

        def tick() -> int:
            if CLOCK.now() > end:
                refused.append("slow")
            return 1 if refused or dying and dying() else 0

        target.set_authorizer(authorizer(refused, lab.TRIGGERS.get(id(target), frozenset())))
        target.set_progress_handler(tick, 1 if dying else 1000)
        try:
            return wire.perform(target, what, args)
        except sqlite3.DatabaseError:
            if not refused:
                raise
        finally:
            target.set_authorizer(None)
            target.set_progress_handler((lambda: 1 if dying() else 0) if dying else None, 1)
        self.broken = True  # the answer's process still waits for this reply: it is done for
        if refused[0] == "slow":
            raise Refused(
                f"an SQL statement took too long (over {STATEMENT_LIMIT:g} s, or past "
                "the task's time)"
            )
        raise Refused(f"the judge does not run that SQL ({refused[0]}): a task needs none of it")

    @contextlib.contextmanager
    def answer(self, name: str, returns: tuple):
        """Yield ``name`` for one schedule as a RemoteAnswer, whose workers' calls each go to a
        process of their own (Refused if the notebook defines no such function)."""
        if self.broken:
            raise Refused("the answer's process stopped answering")
        self.lent, self.served = set(), []
        workers = Workers(self, name, lab.LUCK[-1] if lab.LUCK else None)
        try:
            if workers.start() is None:
                why = (
                    f"{self.errors[-1]}: fix it, and {name!r} can be judged" if self.errors else ""
                )
                raise Refused(why or f"the notebook defines no function {name!r}")
            yield RemoteAnswer(workers, name, returns)
        finally:
            workers.close()
            if not self.broken:
                with contextlib.suppress(Refused):
                    self._ask({"op": "end"}, "done")


def judge(items: list[tuple], tasks=None, *, hide=(), timeout=30.0, run=None, box=None) -> dict:
    """Judge a program (:func:`labkit.grading.notebooks.program`): run its code in one
    sandbox (``box``, a fresh one made ahead, or a new one), and each task (of ``tasks``; None:
    all) at its last check, every task in the run seeded ``run`` (None: a seed drawn from the
    operating system, recorded in each Report). Returns ``{task: Report}``. A sandbox an answer
    broke is replaced and the cells run again; after a cell that does not finish within
    ``timeout``, every later task fails."""
    from labkit.grading.verdicts import draw_seed, refused, tasks_loaded

    run = draw_seed() if run is None else run
    last = {item[1]: i for i, item in enumerate(items) if item[0] == "check"}
    wanted = [t for t in last if tasks is None or t in tasks]
    results, hung = {}, None
    # the checks load while the first cells run; never while a worker is started (its preexec
    # runs in the forked child, which must not inherit a lock another thread holds)
    loading = threading.Thread(target=tasks_loaded)
    try:
        for i, item in enumerate(items):
            if not any(last[t] >= i for t in wanted):
                break
            if hung is None and (box is None or box.broken):
                if box is not None:
                    if loading.ident:
                        loading.join()
                    box.close()
                box = Sandbox(hide=hide, timeout=timeout)
                if not loading.ident:
                    loading.start()
                for j, code in enumerate(items[:i]):
                    if code[0] == "code" and hung is None and not _cell(box, code[1], j):
                        hung = j
            if item[0] == "code" and hung is None:
                hung = None if _cell(box, item[1], i) else i
            elif item[0] == "check" and item[1] in wanted and last[item[1]] == i:
                loading.join() if loading.ident else tasks_loaded()
                why = f"task {item[1]}: code cell {hung} did not finish within {timeout:g} s"
                done = refused(item[1], why, item[2]) if hung is not None else None
                results[item[1]] = done or attempt(box, *item[1:], run=run)
    finally:
        if loading.ident:
            loading.join()
        if box is not None:
            box.close()
    for t in wanted:
        results.setdefault(t, refused(t, "its check never ran"))
    return results


def _cell(box: Sandbox, source: str, number: int) -> bool:
    """Run a cell; False if it did not finish (the sandbox is then broken)."""
    try:
        box.cell(source, number)
    except Refused:
        return False
    return True


def attempt(box: Sandbox, task_id: str, name: str, *, run=None):
    """Judge the answer ``name`` in ``box`` (its cells run) for ``task_id`` in the run seeded
    ``run``: its Report."""
    from labkit.grading.verdicts import refused, tasks_loaded, verdict

    task = tasks_loaded().get(task_id)
    if task is None:
        return refused(task_id, "no such task", name)
    box.deadline = CLOCK.now() + TASK_LIMIT * box.timeout
    try:
        return verdict(task.id, lambda: box.answer(name, task.returns), name, run=run)
    except Refused as exc:
        return refused(task.id, str(exc), name)
    finally:
        box.deadline = None


def main(argv: list[str] | None = None) -> int:
    """``python -m labkit.grading.judge TASK [NAME [SEED]]`` < a JSON list of the kernel's cell
    sources: print its Report as JSON. With NAME (a check called from any cell), the check comes
    last; SEED (an int) is the run's seed, by default one drawn from the operating system.

    ``--ready`` is a check cell's judge started before the check is called: it loads the
    checks and starts its (fresh) sandbox, prints ``ready``, then reads ``{"argv": [TASK, NAME,
    SEED?], "cells": [...]}``, so that a check pays only for its cells and schedules."""
    import json

    from labkit.grading.notebooks import program
    from labkit.grading.verdicts import refused, tasks_loaded

    argv, box = sys.argv[1:] if argv is None else argv, None
    if argv == ["--ready"]:
        tasks_loaded()  # before the worker starts: its preexec must not meet a held lock
        box = Sandbox()
        with contextlib.suppress(BrokenPipeError):  # the kernel may be gone already
            print("ready", flush=True)
    # a ready judge reads one line: a process the kernel forked later may hold its stdin open
    request = json.loads((sys.stdin.readline() if box is not None else sys.stdin.read()) or "null")
    if box is not None:
        if request is None:  # the kernel went away before it checked anything
            box.close()
            return 0
        argv, request = request["argv"], request["cells"]
    task, *name = argv
    run = int(name.pop()) if len(name) > 1 else None
    items = program(request)
    if name and (not items or items[-1][:2] != ("check", task)):
        items.append(("check", task, name[0]))
    found = judge(items, {task}, run=run, box=box)
    report = found.get(task) or refused(task, f"no check of {task}")
    print(json.dumps(report.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
