"""Per-step timing, summarised once per window.

Times are taken with ``time.perf_counter`` on the worker, with no device sync unless asked:
on a GPU, ``step_ms`` without ``cuda_sync_timing`` is the time to launch the step's kernels.
"""

from __future__ import annotations

import numpy as np

__all__ = ["WindowTimer", "window_stats", "WINDOW_METRICS"]

WINDOW_METRICS = ("data_ms", "step_ms", "iter_ms")


def window_stats(values: list[float], prefix: str) -> dict[str, float]:
    """p50, p90 (linear interpolation, numpy's default) and mean of one window's values."""
    arr = np.asarray(values, dtype=np.float64)
    p50, p90 = np.percentile(arr, [50, 90])
    return {
        f"{prefix}_p50": float(p50),
        f"{prefix}_p90": float(p90),
        f"{prefix}_mean": float(arr.mean()),
    }


class WindowTimer:
    """Collects data/step/iter times of the steps of the current window."""

    def __init__(self) -> None:
        self._values: dict[str, list[float]] = {name: [] for name in WINDOW_METRICS}

    def add(self, *, data_ms: float, step_ms: float, iter_ms: float) -> None:
        self._values["data_ms"].append(data_ms)
        self._values["step_ms"].append(step_ms)
        self._values["iter_ms"].append(iter_ms)

    def __len__(self) -> int:
        return len(self._values["iter_ms"])

    def summary(self, global_batch: float) -> dict[str, float]:
        """Window statistics and throughput: samples_per_s = global batch (samples of every
        rank per step; batching duration: the window's mean) / mean iter time."""
        if not len(self):
            raise ValueError("empty timing window")
        out: dict[str, float] = {}
        for name in WINDOW_METRICS:
            out.update(window_stats(self._values[name], name))
        out["samples_per_s"] = global_batch / (out["iter_ms_mean"] / 1000.0)
        out["steps_in_window"] = len(self)
        return out

    def reset(self) -> None:
        for values in self._values.values():
            values.clear()
