"""The course's failures, one function each, replayed on the engine in :mod:`labkit.sim.engine`.

Every scenario has the form ``f(*, protected=True, seed=0, **knobs) -> Result``.
``protected=False`` runs the naive variant a lesson warns about; the defaults
are the source's numbers: a 10 s lease, a 30 s pause, six earlier holders, so
the stale worker A holds generation 7 and its successor B generation 8.
``f.knobs`` lists a scenario's knobs with their defaults, and ``SCENARIOS``
maps every scenario's name to its function. Every worker acts on real SQLite
files through the real labkit mechanisms, and :func:`labkit.check` judges the
history.

Import every scenario from here. They live in one module per lesson topic:

* :mod:`labkit.scenarios.fencing` (lessons 01-03): ``expired_but_alive``,
  ``raise_then_read``, ``check_then_act``, ``split_databases``,
  ``bypass_writer``, ``lock_wait``, ``same_generation_duplicate``.
* :mod:`labkit.scenarios.issuers` (lesson 04): ``issuer_failover``, ``backup_restore``.
* :mod:`labkit.scenarios.delays` (lessons 05-06): ``late_renewal``, ``late_release``.
* :mod:`labkit.scenarios.waiting` (lesson 06): ``herd``, ``stale_watch``, ``version_wait``.
* :mod:`labkit.scenarios.recovery` (lesson 07): ``crash_after_fence``.
* :mod:`labkit.scenarios.effects` (lesson 08): ``email_transfer``.

The steps several of them share are in :mod:`labkit.sim.steps`. Two conventions
beyond the engine's vocabulary:

* An event's ``key`` names the logical operation ("bill c1", "the report
  email") whether or not the writer enforced it, so the checker can see a
  repeat that nothing stopped (as :func:`same_generation_duplicate` does).
* Informational actions the checker ignores: ``failover`` and ``restore``
  (worker ``ops``), ``sweep`` (worker ``sweeper``), ``notify`` (a watch fired).

Example:
    >>> from labkit.scenarios import expired_but_alive
    >>> sorted(expired_but_alive(protected=False).kinds)
    ['acted_after_expiry', 'lost_update', 'stale_accepted']
    >>> expired_but_alive().verdict
    "A's stale write with 7 bounced off the fence at 8: nothing lost"
"""

from __future__ import annotations

# Imported in lesson order: that is the order of SCENARIOS.
from labkit.scenarios.fencing import (
    bypass_writer,
    check_then_act,
    expired_but_alive,
    lock_wait,
    raise_then_read,
    same_generation_duplicate,
    split_databases,
)
from labkit.scenarios.issuers import backup_restore, issuer_failover
from labkit.scenarios.delays import late_release, late_renewal
from labkit.scenarios.waiting import herd, stale_watch, version_wait
from labkit.scenarios.recovery import crash_after_fence
from labkit.scenarios.effects import email_transfer
from labkit.sim.engine import SCENARIOS, Result

__all__ = [
    "expired_but_alive",
    "raise_then_read",
    "check_then_act",
    "split_databases",
    "bypass_writer",
    "lock_wait",
    "same_generation_duplicate",
    "SCENARIOS",
    "Result",
    "issuer_failover",
    "backup_restore",
    "late_renewal",
    "late_release",
    "herd",
    "stale_watch",
    "version_wait",
    "crash_after_fence",
    "email_transfer",
]
