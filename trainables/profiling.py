"""``profile_steps``: a torch profiler window on rank 0, to see where a step's time goes.

The window opens after the run's first timing window (compilation, the first steps' one-off
costs and the loader's start are over): one warm-up step, then ``profile_steps`` recorded steps,
each under its ``ProfilerStep#`` span with its phases marked (``forward``: the model and the
loss; ``backward``; ``optimizer``), written as a Chrome trace to ``runs/<run>/profile-rank0.json``
(``RunFolder.profile``). ``python -m benchmarks.step_profile`` splits it into the phases' GPU
time, communication (and what of it no kernel hid) and the GPU's idle time, as it does for the
strategies' references (benchmarks/strategy_reference.py). The config check keeps the window
out of the tail windows, whose figures it would slow.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["StepProfiler", "profile_window"]


def profile_window(log_every: int, profile_steps: int) -> tuple[int, int]:
    """The first and last step the profiler runs over (its warm-up step included)."""
    first = log_every + 1
    return first, first + profile_steps


class StepProfiler:
    """Marks a step's phases (``phase(name)``, a no-op context when not profiling) and runs the
    window (``after_step(step)`` after every step)."""

    PHASES = ("forward", "backward", "optimizer")

    def __init__(self, profile_steps: int, log_every: int, trace: Path | None):
        """``trace``: where rank 0 writes it (None: this rank does not profile)."""
        self.steps, self.trace = profile_steps, trace
        self.first, self.last = profile_window(log_every, profile_steps)
        self._prof: Any = None
        self._done = not (profile_steps and trace is not None)
        self.phase: Callable[[str], contextlib.AbstractContextManager] = _no_phase
        if not self._done:
            from torch.profiler import record_function

            self.phase = record_function

    def before_step(self, step: int) -> None:
        if self._done or step != self.first:
            return
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self.trace.parent.mkdir(parents=True, exist_ok=True)
        # Steps are marked (ProfilerStep#) only under a schedule.
        self._prof = profile(
            activities=activities,
            schedule=schedule(wait=0, warmup=1, active=self.steps, repeat=1),
            on_trace_ready=lambda prof: prof.export_chrome_trace(str(self.trace)),
        )
        self._prof.__enter__()

    def after_step(self, step: int) -> None:
        if self._prof is None:
            return
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()  # note: a sync per profiled step (their kernels end in it)
        self._prof.step()
        if step >= self.last:
            self.close()

    def close(self) -> None:
        """End the window (a run that stops inside it keeps what was recorded)."""
        if self._prof is not None:
            prof, self._prof = self._prof, None
            prof.__exit__(None, None, None)
        self._done = True


@contextlib.contextmanager
def _no_phase(name: str):
    yield
