"""Stopping a sweep by signal: SIGTERM stops it the way Ctrl-C does, and the exit code says which
signal ended it (130 for SIGINT, 143 for SIGTERM)."""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["StopSignals"]


class StopSignals:
    """Inside the block, SIGTERM stops the sweep the way Ctrl-C does: Tune's own SIGINT handler
    ends the experiment gracefully (trials stopped, state saved), and the driver then writes
    every buffered row, the manifest and the summary."""

    EXIT = {"SIGINT": 130, "SIGTERM": 143}

    def __init__(self) -> None:
        self.received: str | None = None
        self.previous: dict[int, Any] = {}

    @property
    def exit_code(self) -> int:
        return self.EXIT.get(self.received or "", 1)

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.getsignal(sig)
        signal.signal(signal.SIGTERM, self._on_term)
        # SIGINT stays Tune's: fit() installs its own handler for the graceful stop.
        return self

    def _on_term(self, signum, frame) -> None:
        self.received = self.received or "SIGTERM"
        signal.raise_signal(signal.SIGINT)  # Tune's graceful stop

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
