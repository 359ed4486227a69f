"""The figures of each run that the run manifest carries, computed from the timing windows
(the full analysis is platform/stats.py and platform/analyze.py)."""

from __future__ import annotations

from typing import Any

import pandas as pd

__all__ = ["run_figures", "RUN_FIGURES"]

RUN_FIGURES = (
    "last_step",
    "windows",
    "tail_samples_per_sec_mean",
    "tail_mean_iter_p50_ms",
    "startup_s",
)


def run_figures(timing: pd.DataFrame, tail_points: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Per run: last step reached, number of windows, and the means over its last
    ``tail_points[run]`` windows of samples/s and iter_ms p50 (rank 0's windows)."""
    out: dict[str, dict[str, Any]] = {}
    if timing.empty:
        return out
    rows = timing[timing["rank"] == 0] if "rank" in timing else timing
    for run, df in rows.groupby("run", sort=False):
        df = df.sort_values("window")
        tail = df.tail(max(1, int(tail_points.get(run, 1))))
        out[run] = {
            "last_step": int(df["step"].max()),
            "windows": int(len(df)),
            "tail_samples_per_sec_mean": float(tail["samples_per_s"].mean()),
            "tail_mean_iter_p50_ms": float(tail["iter_ms_p50"].mean()),
            "startup_s": float(df["startup_s"].iloc[0]),
        }
    return out
