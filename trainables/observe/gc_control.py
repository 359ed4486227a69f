"""How long Python's garbage collector ran during a run's steps: ``gc_ms`` and
``gc_collections`` per window; and the collector paused while a process imports
(``collector_paused``).

An automatic collection can come at any step, and a full one walks every tracked object: a
worker that imported torch, transformers and Ray holds about half a million of them before its
model (0.2 s per full collection on a 2-core CPU). On the H100 the mb160 crop-bucket case's
collections took at most 1.8 ms per 20-step window, fresh or resident
(benchmarks/results/time_to_answer_1xh100/tails/); the columns say when that stops being true.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["CollectorClock", "collector_paused"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic collection inside (then as before): for a process's big imports (torch,
    transformers, Ray Train), which make hundreds of thousands of long-lived objects and hardly
    any garbage, while the collector's full passes walk all of them again and again. Importing
    torch, Ray Train and the model code, then one full collection, took 2.92 s with it paused
    against 3.41 s without on the 2-core CPU machine (medians of 5:
    benchmarks/probes/import_collector.py, issue 40)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


class CollectorClock:
    """Around a run's steps (a context manager): the time of every collection, whichever
    thread started it (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.ms = 0.0
        self.collections = 0
        self._started: float | None = None

    def __enter__(self) -> CollectorClock:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def take(self) -> dict[str, Any]:
        """The collections since the last take: their total milliseconds and count."""
        out = {"gc_ms": self.ms, "gc_collections": self.collections}
        self.ms, self.collections = 0.0, 0
        return out

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.ms += (time.perf_counter() - self._started) * 1e3
            self.collections += 1
            self._started = None
