"""Classroom mode: ``python -m labkit.classroom serve`` (see :mod:`labkit.engines.room`)."""

from labkit.engines.room import Room, Watchdog, lan_warning, main, serve
from labkit.engines.student import join, register
from labkit.processes.room_view import draw, history, watch

__all__ = ["Room", "Watchdog", "draw", "history", "join", "lan_warning", "main", "register"]
__all__ += ["serve", "watch"]

if __name__ == "__main__":
    raise SystemExit(main())
