"""``profile_steps``: a torch profiler window on rank 0, to see where a step's time goes.

The window is in the run's second timing window (compilation, the first steps' one-off costs
and the loader's start are over, and no race, ASHA or stall alert judges that window): one
warm-up step, then ``profile_steps`` recorded steps, each under its ``ProfilerStep#`` span with
its phases marked (``forward``: the model and the loss; ``backward``; ``optimizer``), written as
a Chrome trace to ``runs/<run>/profile-rank0.json`` (``RunFolder.profile``). ``python -m
benchmarks.step_profile`` splits it into the phases' GPU time, communication (and what of it no
kernel hid) and the GPU's idle time, as it does for the strategies' references
(benchmarks/strategy_reference.py). The config checks keep the window inside the second window
and out of the tail, and give the run processes of its own (the profiler may slow a process's
later launches). The window's bookkeeping (one device sync at its end, the trace's export) is
kept out of the steps' times.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

__all__ = ["StepProfiler", "profile_window"]


def profile_window(log_every: int, profile_steps: int) -> tuple[int, int]:
    """The first and last step the profiler runs over (its warm-up step included)."""
    first = log_every + 1
    return first, first + profile_steps


class StepProfiler:
    """Runs the window (``before_step``/``after_step`` around every step) and marks a step's
    phases inside it (``phase(name)``; a no-op outside it, and on ranks that do not profile)."""

    def __init__(self, profile_steps: int, log_every: int, trace: Path | None):
        """``trace``: where rank 0 writes it (None: this rank does not profile)."""
        self.steps, self.trace = profile_steps, trace
        self.first, self.last = profile_window(log_every, profile_steps)
        self._prof: Any = None
        self._done = not (profile_steps and trace is not None)

    def phase(self, name: str) -> contextlib.AbstractContextManager:
        if self._prof is None:
            return contextlib.nullcontext()
        from torch.profiler import record_function

        return record_function(name)

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

    def after_step(self, step: int) -> bool:
        """The window's bookkeeping after ``step``; whether there was any (the caller keeps
        its time out of the next step's)."""
        if self._prof is None:
            return False
        if step >= self.last:
            import torch

            if torch.cuda.is_available():
                torch.cuda.synchronize()  # note: the window's one sync: its last kernels end
        self._prof.step()
        if step >= self.last:
            self.close()
        return True

    def close(self) -> None:
        """End the window (a run that stops inside it keeps what was recorded). A failure to
        write the trace is said on stderr, never raised: it must not hide the run's own
        error, nor end a run that trains on."""
        self._done = True
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        try:
            prof.__exit__(None, None, None)
        except Exception as exc:  # noqa: BLE001 - the trace is a diagnostic
            print(f"profile_steps: no trace written to {self.trace}: {exc}", file=sys.stderr)
