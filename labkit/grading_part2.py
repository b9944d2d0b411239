"""Grading checks for the exercises of lessons 05-08 (registered in :mod:`labkit.grading`)."""

from __future__ import annotations

from .grading import Schedule, expect, schedules, task
