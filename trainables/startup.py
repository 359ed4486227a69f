"""Where a run's start-up time goes: the StartupClock's laps of named parts, from the trial's
start to the end of its first step (the manifest's ``startup_breakdown``)."""

from __future__ import annotations

import time

__all__ = ["StartupClock", "import_model_code", "process_start"]


class StartupClock:
    """Where start-up time goes: laps of named parts, from the trial's start to the end of the
    first step. ``breakdown()`` is the manifest's ``startup_breakdown`` (seconds per part)."""

    def __init__(self, start_ts: float, entry_ts: float, process_ts: float = 0.0):
        self.parts: dict[str, float] = {}
        if start_ts and start_ts < process_ts < entry_ts:
            # Tune's trial actor and Ray Train's controller until this worker's process
            # started, then the worker process itself (Python, Ray, torch, the process group).
            self.parts["ray_controller"] = process_ts - start_ts
            self.parts["ray_worker"] = entry_ts - process_ts
        else:  # a process started before the trial (Ray's pool of idle workers), or no Ray
            self.parts["ray_workers"] = max(0.0, entry_ts - start_ts) if start_ts else 0.0
        self._last = entry_ts

    def lap(self, name: str) -> float:
        now = time.time()
        took = now - self._last
        self.parts[name] = self.parts.get(name, 0.0) + took
        self._last = now
        return took

    def add(self, name: str, seconds: float, out_of: str | None = None) -> None:
        """A part timed elsewhere; ``out_of``: the lap it was inside, which it is taken from."""
        self.parts[name] = self.parts.get(name, 0.0) + seconds
        if out_of is not None:
            self.parts[out_of] -= seconds

    def breakdown(self) -> str:
        return " ".join(f"{k}={v:.2f}" for k, v in self.parts.items())


def process_start() -> float:
    """When this process started (its creation time), or 0 when it cannot be told."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - the breakdown then has one part less
        return 0.0


def import_model_code() -> None:
    """The transformers model modules (a few seconds per process): timed as their own part."""
    import transformers.models.bert.modeling_bert  # noqa: F401
    import transformers.models.wav2vec2.modeling_wav2vec2  # noqa: F401
