"""The chaos run's command, ``python -m labkit.chaos``: see :mod:`labkit.processes.chaos`."""

from labkit.processes.chaos import main

if __name__ == "__main__":
    raise SystemExit(main())
