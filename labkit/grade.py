"""The grader's command, ``python -m labkit.grade``: see :mod:`labkit.grading.grader`."""

from labkit.grading.grader import main

if __name__ == "__main__":
    raise SystemExit(main())
