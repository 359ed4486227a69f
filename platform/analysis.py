"""Figures per run and the ranking of groups, computed from the timing windows."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

__all__ = ["run_figures", "rank_groups", "format_ranking", "RUN_FIGURES"]

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


def rank_groups(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Groups ordered by mean tail samples/s over their ok runs (higher first), ties broken by
    tail iter_ms p50 (lower first); groups without an ok run come last."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault(run["group"], []).append(run)
    ranked = []
    for group, members in groups.items():
        ok = [
            r
            for r in members
            if r.get("status") == "ok" and _finite(r.get("tail_samples_per_sec_mean"))
        ]
        sps = [float(r["tail_samples_per_sec_mean"]) for r in ok]
        it = [float(r["tail_mean_iter_p50_ms"]) for r in ok]
        ranked.append(
            {
                "group": group,
                "runs": len(members),
                "runs_ok": len(ok),
                "tail_samples_per_sec_mean": _mean(sps),
                "tail_samples_per_sec_std": _std(sps),
                "tail_mean_iter_p50_ms": _mean(it),
            }
        )
    ranked.sort(
        key=lambda g: (
            g["runs_ok"] == 0,
            -(g["tail_samples_per_sec_mean"] if g["runs_ok"] else 0.0),
            g["tail_mean_iter_p50_ms"] if g["runs_ok"] else 0.0,
        )
    )
    for i, g in enumerate(ranked, start=1):
        g["rank"] = i
    return ranked


def format_ranking(ranked: list[dict[str, Any]]) -> str:
    header = f"{'rank':>4}  {'group':<40} {'ok/runs':>7} {'samples/s':>10} {'+-std':>8} {'iter p50 ms':>11}"
    lines = [header, "-" * len(header)]
    for g in ranked:
        lines.append(
            f"{g['rank']:>4}  {g['group']:<40} {g['runs_ok']:>3}/{g['runs']:<3} "
            f"{_num(g['tail_samples_per_sec_mean'], 10, 1)} {_num(g['tail_samples_per_sec_std'], 8, 1)} "
            f"{_num(g['tail_mean_iter_p50_ms'], 11, 1)}"
        )
    return "\n".join(lines)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _std(values: list[float]) -> float:
    """Sample standard deviation (n - 1); 0 for a single run, NaN for none."""
    if not values:
        return math.nan
    if len(values) == 1:
        return 0.0
    m = _mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def _num(value: float, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if not _finite(value) else f"{value:>{width}.{digits}f}"
