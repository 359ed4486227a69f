"""Python's garbage collector during a run's steps: the time its collections took in each
window (``gc_ms``), and, with ``gc_every``, collections at fixed steps instead of whenever
allocations cross Python's thresholds.

An automatic collection can come at any step, and a full one walks every tracked object: a
worker that imported torch, transformers and Ray holds about half a million before its model
(0.2 s per full collection on a 2-core CPU), and a resident worker froze most of them out of
the collector (trainables/serve.py) where a fresh one did not. With ``gc_every=N`` the
collector is off during the steps and the young generations are collected every N steps, a
full collection every ``FULL_EVERY`` of those, so every executor pays the same at the same
steps (torchtitan's ``gc_freq`` and Megatron-LM's ``--manual-gc`` do the same).
"""

from __future__ import annotations

import gc
import time
from typing import Any

__all__ = ["FULL_EVERY", "StepCollector"]

FULL_EVERY = 20  # with gc_every: every 20th collection is a full one (cycles that got old)


class StepCollector:
    """Around a run's steps (a context manager): times every collection, whichever thread
    started it (``gc.callbacks``), and with ``every`` > 0 collects by step number only."""

    def __init__(self, every: int):
        self.every = every
        self.ms = 0.0
        self.collections = 0
        self._started: float | None = None
        self._manual = 0
        self._was_enabled = True

    def __enter__(self) -> StepCollector:
        gc.callbacks.append(self._callback)
        self._was_enabled = gc.isenabled()
        if self.every:
            gc.collect(1)  # start-up's young garbage, before the first step
            gc.disable()
        self.take()  # that collection is start-up's, not the first window's
        return self

    def __exit__(self, *exc: object) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
        if self._was_enabled:
            gc.enable()

    def after_step(self, step: int) -> None:
        """With ``every``: the collection due at this step (timed into the step)."""
        if self.every and step % self.every == 0:
            self._manual += 1
            gc.collect(2 if self._manual % FULL_EVERY == 0 else 1)

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
