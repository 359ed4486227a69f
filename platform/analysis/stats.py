"""Per-run figures, group statistics over repeats and the ranking, as pure functions of the
timing rows and the run manifest (platform/analysis/analyze.py writes them to files).

Definitions (docs/reading-results.md, "The ranking"; docs/internals/analysis.md):

- a run's *tail* is its last ``tail_timing_points`` windows of rank 0 after its first (which
  holds what the compile warm-up did not compile ahead; a run of one window: that window), as
  stage1_common/tail.py defines it for every user of a tail;
- ``iter_p90_over_p50`` (and data, step) is the mean over the tail windows of each window's
  p90 / p50, the p50 floored at ``P50_FLOOR_MS`` (a prefetched batch waits ~0 ms);
- a run is jittery (``unstable_run_flag``; the CSV columns keep the seeds' names) when its
  ``iter_p90_over_p50`` exceeds ``unstable_ratio``;
- a group's figures use its ok runs (in a warm race's pooled ranking, a confirmed group's runs
  here and its catalogue runs: platform/analysis/pooled.py); with 3 or more,
  ``tail_samples_per_sec_robust`` drops the fastest and the slowest; the 95 % interval is
  Student's t over the ok runs' means;
- a group is jittery (``unstable_group``) when more than half of its ok runs are: the
  ranking's flag, not the Phase B acceptance check (platform/analysis/verdicts/stability.py, which
  judges the median, max and CV over repeats against its own limits);
- a run's ``cliff``: recompiles or CUDA graph re-recordings in its tail, or CUDA graph skips
  (platform/analysis/verdicts/cliffs.py), with torch's reason and what to change;
- ranking: groups with ok runs first, jittery ones after the others, groups the race stopped
  as slower after the groups still in it, then the robust (else plain) mean of tail samples/s,
  higher first, then tail iter p50, lower first; groups without an ok run last, by the mean
  tail samples/s of their runs the scheduler stopped early (partial runs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from platform.analysis.verdicts import cliffs
from stage1_common.tail import tail_start

__all__ = [
    "BOTTLENECK_LIMITS",
    "P50_FLOOR_MS",
    "bottlenecks",
    "UNSTABLE_RATIO",
    "group_summary",
    "in_order_and_tail",
    "per_run_metrics",
    "rank",
    "run_figures",
    "stall_alert",
    "tail_points",
    "t_quantile",
    "tail_ratio",
    "window_ratio",
]

P50_FLOOR_MS = 1.0
UNSTABLE_RATIO = 1.5

PER_RUN_COLUMNS = [
    "run",
    "group",
    "repeat",
    "status",
    "exit_code",
    "duration_sec",
    "last_step",
    "windows",
    "tail_windows",
    "tail_samples_per_sec_mean",
    "tail_audio_s_per_s",
    "tail_mean_iter_p50_ms",
    "iter_p90_over_p50",
    "data_p90_over_p50",
    "step_p90_over_p50",
    "unstable_run_flag",
    "data_share",
    "rank_skew_max",
    "peak_mem_gib",
    "mfu",
    "bottlenecks",
    "cliff",
]

GROUP_COLUMNS = [
    "group",
    "runs",
    "runs_ok",
    "tail_samples_per_sec_mean",
    "tail_samples_per_sec_std",
    "tail_samples_per_sec_robust",
    "ci95_low",
    "ci95_high",
    "tail_mean_iter_p50_ms",
    "iter_p50_cv",
    "iter_ratio_median",
    "iter_ratio_max",
    "unstable_run_ratio",
    "unstable_group",
    "runs_stopped",
    "partial_samples_per_sec",
    "runs_catalogue",
    "catalogue_sweeps",
]


def window_ratio(p90: float, p50: float) -> float:
    """One window's p90 / p50, the p50 floored at ``P50_FLOOR_MS``: what the tail's
    ``*_p90_over_p50`` figures average (``tail_ratio``), and what the race judges windows by."""
    return p90 / max(p50, P50_FLOOR_MS)


def tail_ratio(p90: Sequence[float], p50: Sequence[float]) -> float:
    """A tail's ``*_p90_over_p50``: the mean over its windows of p90 / p50, each p50 floored at
    ``P50_FLOOR_MS`` (NaN for no window). The run figures and the race's tail both use it."""
    p90, p50 = pd.Series(p90, dtype=float), pd.Series(p50, dtype=float)
    if p90.empty:
        return math.nan
    return float((p90 / p50.clip(lower=P50_FLOOR_MS)).mean())


def stall_alert(history: list[float], value: float | None, ratio: float) -> float | None:
    """The median of ``history`` (a run's earlier window iter p50s) when ``value`` exceeds
    ``ratio`` x that median (from the third window on, so a median exists); else None."""
    import statistics

    if value is None or len(history) < 2:
        return None
    median = statistics.median(history)
    return median if value > ratio * median else None


def tail_points(manifest: pd.DataFrame) -> dict[str, int]:
    """Each run's tail length in windows (its ``tail_timing_points``), from the run manifest."""
    return {r["run"]: int(r.get("tail_timing_points") or 1) for r in manifest.to_dict("records")}


def in_order_and_tail(windows: pd.DataFrame, points: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One run's windows in order, and its tail: the last ``points`` of them after the first
    (stage1_common/tail.py). A training run restarted from a checkpoint numbers its windows
    again per attempt: its tail is the last attempt's last windows."""
    order = ["attempt", "window"] if "attempt" in windows else ["window"]
    ordered = windows.sort_values(order)
    return ordered, ordered.iloc[tail_start(len(ordered), points) :]


def run_figures(timing: pd.DataFrame, tail_points: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Per run, from rank 0's windows: last step, windows, start-up, the figures over its
    tail (its last ``tail_points[run]`` windows after the first), and its last attempt's cliff
    figures (cliffs.figures). The one place tail figures are computed: the run manifest (platform.tune) and
    per_run_metrics.csv both take them from here."""
    rank0 = timing[timing["rank"] == 0] if "rank" in timing else timing
    skew = timing.groupby("run")["rank_skew"].max() if "rank_skew" in timing else pd.Series()
    out: dict[str, dict[str, Any]] = {}
    for run, df in rank0.groupby("run", sort=False):
        df, tail = in_order_and_tail(df, tail_points.get(run, 1))
        last = df[df["attempt"] == df["attempt"].max()] if "attempt" in df else df
        out[run] = {
            "last_step": int(df["step"].max()),
            "windows": len(df),
            "tail_windows": len(tail),
            "startup_s": float(df["startup_s"].iloc[0]),
            "tail_samples_per_sec_mean": float(tail["samples_per_s"].mean()),
            # Seconds of audio trained on per second: the other throughput, which batching
            # duration trades against samples/s (more short utterances per step, or fewer long).
            "tail_audio_s_per_s": _tail_mean(tail, "audio_s_per_s"),
            "tail_mean_iter_p50_ms": float(tail["iter_ms_p50"].mean()),
            "iter_p90_over_p50": tail_ratio(tail["iter_ms_p90"], tail["iter_ms_p50"]),
            "data_p90_over_p50": tail_ratio(tail["data_ms_p90"], tail["data_ms_p50"]),
            "step_p90_over_p50": tail_ratio(tail["step_ms_p90"], tail["step_ms_p50"]),
            "data_share": float(tail["data_ms_mean"].mean() / tail["iter_ms_mean"].mean()),
            "rank_skew_max": float(skew.get(run, math.nan)),
            "peak_mem_gib": float(df["peak_mem_gib"].max()),
            "mfu": float(tail["mfu"].mean()),
            **cliffs.figures(last, int(tail_points.get(run, 1))),
        }
    return out


def _tail_mean(tail: pd.DataFrame, column: str) -> float:
    """The tail's mean of ``column``; NaN where the rows lack it (an older version's)."""
    if column not in tail:
        return math.nan
    return float(pd.to_numeric(tail[column], errors="coerce").mean())


def per_run_metrics(
    manifest: pd.DataFrame, timing: pd.DataFrame, *, unstable_ratio: float = UNSTABLE_RATIO
) -> pd.DataFrame:
    """One row per run of the manifest (in its order), figures over its tail windows and its
    cliff verdict (cliffs.line, as the manifest's)."""
    figures = run_figures(timing, tail_points(manifest))
    rows = []
    for rec in manifest.to_dict("records"):
        row: dict[str, Any] = {k: rec.get(k) for k in ("run", "group", "repeat", "status")}
        row.update(exit_code=rec.get("exit_code"), duration_sec=rec.get("duration_sec"))
        fig = figures.get(rec["run"])
        if fig is None:
            rows.append(
                row | {"windows": 0, "tail_windows": 0, "unstable_run_flag": False, "cliff": ""}
            )
            continue
        flag = bool(fig["iter_p90_over_p50"] > unstable_ratio)
        cliff = cliffs.verdict_line(fig, rec)
        rows.append(row | fig | {"unstable_run_flag": flag, "cliff": cliff})
    return pd.DataFrame(rows, columns=PER_RUN_COLUMNS)


def t_quantile(q: float, dof: int) -> float:
    """Student's t quantile ``q`` with ``dof`` degrees of freedom: the groups' 95 % interval
    (q 0.975) and the race's bounds use it."""
    from scipy.stats import t

    return float(t.ppf(q, dof))


def group_summary(per_run: pd.DataFrame) -> pd.DataFrame:
    """One row per group (in order of first appearance), over its ok runs. A pooled ranking's
    runs (platform/analysis/pooled.py) carry a ``source``: ``runs_catalogue`` counts the ok
    runs from the catalogue, ``catalogue_sweeps`` names their sweeps (0 and empty otherwise)."""
    rows = []
    for group, runs in per_run.groupby("group", sort=False):
        ok = runs[(runs["status"] == "ok") & runs["tail_samples_per_sec_mean"].notna()]
        there = ok[ok["source"] == "catalogue"] if "source" in ok else ok.iloc[:0]
        sps = ok["tail_samples_per_sec_mean"].astype(float).tolist()
        it = ok["tail_mean_iter_p50_ms"].astype(float)
        n = len(sps)
        mean = sum(sps) / n if n else math.nan
        std = float(pd.Series(sps).std(ddof=1)) if n > 1 else (0.0 if n == 1 else math.nan)
        robust = sum(sorted(sps)[1:-1]) / (n - 2) if n >= 3 else mean
        half = t_quantile(0.975, n - 1) * std / math.sqrt(n) if n > 1 else math.nan
        flags = ok["unstable_run_flag"].astype(bool)
        ratio = float(flags.mean()) if n else math.nan
        # Runs the scheduler stopped early (platform/control/race.py): partial, shown, never ranked
        # above a group with a finished run.
        stopped = runs[runs["status"] == "stopped_early"]["tail_samples_per_sec_mean"].dropna()
        rows.append(
            {
                "group": group,
                "runs": len(runs),
                "runs_ok": n,
                "tail_samples_per_sec_mean": mean,
                "tail_samples_per_sec_std": std,
                "tail_samples_per_sec_robust": robust,
                "ci95_low": mean - half,
                "ci95_high": mean + half,
                "tail_mean_iter_p50_ms": float(it.mean()) if n else math.nan,
                "iter_p50_cv": float(it.std(ddof=1) / it.mean()) if n > 1 else math.nan,
                "iter_ratio_median": float(ok["iter_p90_over_p50"].median()) if n else math.nan,
                "iter_ratio_max": float(ok["iter_p90_over_p50"].max()) if n else math.nan,
                "unstable_run_ratio": ratio,
                "unstable_group": bool(n and ratio > 0.5),
                "runs_stopped": int((runs["status"] == "stopped_early").sum()),
                "partial_samples_per_sec": float(stopped.mean()) if len(stopped) else math.nan,
                "runs_catalogue": len(there),
                "catalogue_sweeps": ";".join(dict.fromkeys(there["sweep"])) if len(there) else "",
            }
        )
    return pd.DataFrame(rows, columns=GROUP_COLUMNS)


def rank(groups: pd.DataFrame) -> pd.DataFrame:
    """The groups in ranking order, with a ``rank`` column first."""
    if groups.empty:
        return groups.assign(rank=pd.Series(dtype=int))
    # A group without a finished run ranks after every group with one, by its partial runs.
    score = groups["tail_samples_per_sec_robust"].where(
        groups["runs_ok"] > 0, groups.get("partial_samples_per_sec")
    )
    score = score.fillna(0.0)
    # A group the race stopped as slower (platform/control/race.py) never ranks above a steady
    # group still in it: the leader that beat it is one of those, whatever its own figures say.
    out = groups["left_race"] == "slower" if "left_race" in groups else False
    keyed = groups.assign(
        _none=groups["runs_ok"] == 0,
        _out=out,
        _score=-score,
        _it=groups["tail_mean_iter_p50_ms"].fillna(math.inf),
    )
    order = ["_none", "unstable_group", "_out", "_score", "_it"]
    ranked = keyed.sort_values(order, kind="stable")
    ranked = ranked.drop(columns=["_none", "_out", "_score", "_it"]).reset_index(drop=True)
    ranked.insert(0, "rank", range(1, len(ranked) + 1))
    return ranked


# Bottleneck attribution (a run's tail figures; NVML samples of its GPUs).
BOTTLENECK_LIMITS = {
    "data_share": 0.15,  # data wait above this share of iter time: data-bound
    "rank_skew": 1.2,  # slowest rank's iter p50 over the fastest's: straggler
    "throttled_share": 0.05,  # samples with a thermal/HW-slowdown reason: throttled
    "power_cap_share": 0.5,  # samples at the software power cap: power-capped
    "headroom_low": 0.10,  # free GPU memory below this share of the total: near OOM
    "headroom_high": 0.50,  # free above this: room for a larger micro_batch
}
# NVML clock-event (throttle) reason bits.
SW_POWER_CAP = 0x4
SLOWDOWN = 0x8 | 0x20 | 0x40 | 0x80  # HW slowdown, SW thermal, HW thermal, HW power brake
THROTTLE_NAMES = {  # nvmlClocksEventReason* bits
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clock",
}


def throttle_names(mask: int) -> list[str]:
    """The reasons set in one NVML throttle bitmask."""
    return [name for bit, name in THROTTLE_NAMES.items() if mask & bit]


def bottlenecks(
    row: dict[str, Any], throttle: pd.Series | None = None, gpu_memory_gib: float | None = None
) -> list[dict[str, str]]:
    """What limits one run, each with the setting to try next. ``row``: its per_run_metrics
    row; ``throttle``: the throttle_reasons bitmasks of its GPUs' NVML samples;
    ``gpu_memory_gib``: the smallest total memory of its GPUs (env.json)."""
    lim, out = BOTTLENECK_LIMITS, []
    share = row.get("data_share")
    if _finite(share) and share > lim["data_share"]:
        out.append(
            {
                "kind": "data-bound",
                "detail": f"the data wait is {share:.0%} of iter time",
                "try": "raise num_workers or prefetch_factor (or length_bucketing for padding)",
            }
        )
    skew = row.get("rank_skew_max")
    if _finite(skew) and skew > lim["rank_skew"]:
        out.append(
            {
                "kind": "straggler",
                "detail": f"the slowest rank's iter p50 is {skew:.2f}x the fastest's",
                "try": "run rank_straggler_diag; check that rank's GPU clocks, PCIe/NVLink and host load",
            }
        )
    if throttle is not None and len(throttle.dropna()):
        bits = throttle.dropna().astype("int64")
        slowed = float(((bits & SLOWDOWN) != 0).mean())
        capped = float(((bits & SW_POWER_CAP) != 0).mean())
        if slowed > lim["throttled_share"]:
            out.append(
                {
                    "kind": "throttled",
                    "detail": f"thermal or hardware slowdown in {slowed:.0%} of GPU samples",
                    "try": "check cooling and power delivery; compare with another node",
                }
            )
        if capped > lim["power_cap_share"]:
            out.append(
                {
                    "kind": "power-capped",
                    "detail": f"at the software power cap in {capped:.0%} of GPU samples",
                    "try": "expected under full load; raise the power limit only if the site allows",
                }
            )
    peak = row.get("peak_mem_gib")
    if _finite(peak) and gpu_memory_gib:
        free = 1.0 - peak / gpu_memory_gib
        if free < lim["headroom_low"]:
            out.append(
                {
                    "kind": "memory-tight",
                    "detail": f"peak {peak:.1f} of {gpu_memory_gib:.0f} GiB ({free:.0%} free)",
                    "try": "lower micro_batch, or ZeRO stage 2/3 to shard optimizer state",
                }
            )
        elif free > lim["headroom_high"]:
            out.append(
                {
                    "kind": "memory-headroom",
                    "detail": f"peak {peak:.1f} of {gpu_memory_gib:.0f} GiB ({free:.0%} free)",
                    "try": "a larger micro_batch may raise throughput",
                }
            )
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def finite(value: Any) -> float | None:
    """``value`` as a float, or None for a missing, unparsable or NaN one (a CSV cell, a JSON
    field)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value
