"""Real OS processes on one SQLite file: worker processes (:mod:`labkit.processes.workers`),
the team that starts, freezes and reaps them (:mod:`labkit.processes.team`), the instructor's
live demo (:mod:`labkit.processes.live`) and the chaos run (:mod:`labkit.processes.chaos`)."""
