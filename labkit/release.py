"""The student release's command, ``python -m labkit.release OUT``: see :mod:`labkit.course.release`."""

from labkit.course.release import main

if __name__ == "__main__":
    raise SystemExit(main())
