"""The course's failures, one function each: ``f(*, protected=True, seed=0, **knobs) -> Result``.

``protected=False`` runs the naive variant; ``f.knobs`` holds the lesson's defaults (six earlier
holders, so A holds generation 7 and B 8). An event's ``key`` names the operation even where
nothing enforced it, so the checker sees an unstopped repeat.

>>> expired_but_alive().verdict
"A's stale write with 7 bounced off the fence at 8: nothing lost"
"""

# Each topic's __all__, re-exported as asyncio's __init__ does, in lesson order (SCENARIOS's).
from labkit.scenarios.fencing import *  # noqa: F403
from labkit.scenarios.issuers import *  # noqa: F403
from labkit.scenarios.delays import *  # noqa: F403
from labkit.scenarios.waiting import *  # noqa: F403
from labkit.scenarios.recovery import *  # noqa: F403
from labkit.scenarios.effects import *  # noqa: F403
from labkit.scenarios import delays, effects, fencing, issuers, recovery, waiting
from labkit.sim.engine import SCENARIOS, Result

_TOPICS = (fencing, issuers, delays, waiting, recovery, effects)
__all__ = ["SCENARIOS", "Result"] + [name for topic in _TOPICS for name in topic.__all__]
