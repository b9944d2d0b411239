"""Grading checks for the exercises of lessons 01-04 (registered in :mod:`labkit.grading`)."""

from __future__ import annotations

from .grading import Schedule, expect, schedules, task
