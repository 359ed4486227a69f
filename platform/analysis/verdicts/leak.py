"""Does memory grow with steps? The figures and verdicts of ``python -m platform.leak``.

For each run, the host samples (RSS of the trainer processes and their DataLoader workers, per
node) and the NVML samples (memory used, per GPU) are placed on the step axis by interpolating
between the timing windows' end times and steps; only samples between the first and the last
window count (start-up allocations are not a leak), and of those the first ``skip_fraction`` of
the steps are left out too (allocators and caches still warm up after the first window). A
least-squares line through each node's (each GPU's) remaining samples gives MB per 1,000 steps:
summed over nodes for the host, the largest over GPUs for GPU memory. A node or GPU is judged
only with at least ``MIN_SAMPLES`` samples of its own left and a fit (samples spread over more
than one step); the host's sum needs every node judged. A run's verdict:

- ``LEAK``: a judged slope above its limit (``LeakLimits``; equality passes): the host's sum,
  or any one judged GPU;
- ``OK``: every node judged and the sum within its limit, and every GPU judged within its limit
  or no GPU sampled (a CPU run);
- ``NOT JUDGED``: otherwise (a node, or a sampled GPU, not judged: the line names which and
  why): never OK on a growth nobody judged.

``python -m platform.leak`` prints one line per run and then its limits
(platform/analysis/verdicts/limits.py); the report calls ``root_verdicts`` as the command does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from platform.analysis.verdicts import limits as limit_lines
from platform.errors import UsageError
from platform.storage import results
from stage1_common.output_root import OutputRoot

__all__ = [
    "LEAK",
    "MIN_SAMPLES",
    "NOT_JUDGED",
    "OK",
    "LeakLimits",
    "folder_limits",
    "fit_mb_per_1k_steps",
    "leak_figures",
    "root_verdicts",
    "verdict",
    "verdicts",
]

MIN_SAMPLES = 5  # per node, per GPU
OK, LEAK, NOT_JUDGED = "OK", "LEAK", "NOT JUDGED"
COMMAND = "python -m platform.leak"


@dataclass(frozen=True, kw_only=True)
class LeakLimits:
    """The leak check's limits. Each field is the flag of the same name of platform.leak
    (``skip_fraction`` is ``--skip-fraction``), which takes its default from here."""

    max_host_mb_per_1k_steps: float = 50.0
    """Host RSS growth (summed over nodes) above this is a leak."""
    max_gpu_mb_per_1k_steps: float = 20.0
    """GPU memory growth (the worst GPU) above this is a leak."""
    skip_fraction: float = 0.25
    """The first share of a run's steps left out as warm-up."""

    def __post_init__(self) -> None:
        if not 0 <= self.skip_fraction < 1:
            raise UsageError(f"--skip-fraction must be within 0-1, got {self.skip_fraction}")


def fit_mb_per_1k_steps(steps: np.ndarray, mib: np.ndarray) -> float:
    """Slope of the least-squares line through (step, MiB), per 1,000 steps."""
    if len(steps) < 2 or np.ptp(steps) == 0:
        return math.nan
    slope, _ = np.polyfit(steps.astype(float), mib.astype(float), 1)
    return float(slope * 1000.0)


def _on_steps(samples: pd.DataFrame, windows: pd.DataFrame, skip_fraction: float) -> pd.DataFrame:
    """Samples within the run's windows after the warm-up share, with the step each was taken
    at."""
    w = windows.sort_values("window_end_ts")
    ts, steps = w["window_end_ts"].to_numpy(), w["step"].to_numpy()
    inside = samples[(samples["ts"] >= ts[0]) & (samples["ts"] <= ts[-1])]
    inside = inside.assign(step=np.interp(inside["ts"], ts, steps))
    first = steps[0] + skip_fraction * (steps[-1] - steps[0])
    return inside[inside["step"] >= first]


def leak_figures(
    timing: pd.DataFrame,
    host: pd.DataFrame,
    gpu: pd.DataFrame,
    skip_fraction: float = LeakLimits.skip_fraction,
) -> dict:
    """The figures of one run (its rows of the three datasets): per memory its samples after
    warm-up (all nodes or GPUs), its slope (NaN unless judged: for the host, every node) and
    ``*_unjudged``, why a node or GPU was not judged ("" when all were)."""
    windows = timing[timing["rank"] == 0]
    out = {"host_samples": 0, "gpu_samples": 0, "host_mb_per_1k_steps": math.nan}
    out |= {"gpu_mb_per_1k_steps": math.nan, "host_unjudged": "", "gpu_unjudged": ""}
    if len(windows) < 2:
        return out
    h = _on_steps(host, windows, skip_fraction)
    slopes, out["host_unjudged"] = _fits(h, ["node"], "trainer_rss_mib", "node {}")
    out["host_samples"] = len(h)
    if slopes and not out["host_unjudged"]:
        out["host_mb_per_1k_steps"] = float(sum(slopes))
        out["host_rss_mib_last"] = float(
            h.sort_values("ts").groupby("node")["trainer_rss_mib"].last().sum()
        )
    g = _on_steps(gpu, windows, skip_fraction)
    slopes, out["gpu_unjudged"] = _fits(
        g, ["node", "gpu_index"], "mem_used_mib", "GPU {1} of node {0}"
    )
    out["gpu_samples"] = len(g)
    if slopes:  # the worst judged GPU: one over the limit is a leak whatever the others show
        out["gpu_mb_per_1k_steps"] = float(max(slopes))
    out["steps"] = [int(windows["step"].min()), int(windows["step"].max())]
    return out


def _fits(samples: pd.DataFrame, by: list[str], column: str, unit: str) -> tuple[list, str]:
    """The slope of each node or GPU (``by``) judged, and why the others were not (their
    ``unit`` name first, where there are several)."""
    slopes, why = [], []
    groups = list(samples.groupby(by, dropna=False))  # a sample without a node counts too
    for key, df in groups:
        slope = fit_mb_per_1k_steps(df["step"].to_numpy(), df[column].to_numpy())
        if len(df) < MIN_SAMPLES:
            reason = f"too few samples: {len(df)} after warm-up, {MIN_SAMPLES} needed"
        elif not math.isfinite(slope):
            reason = f"no fit: its {len(df)} samples after warm-up are all at one step"
        else:
            slopes.append(slope)
            continue
        why.append(reason if len(groups) == 1 else f"{unit.format(*key)}: {reason}")
    return slopes, "; ".join(why)


def folder_limits(root: OutputRoot) -> tuple[LeakLimits, str]:
    """The limits to judge a folder by, and where they come from: those its leak.log states
    (so the report agrees with the folder's own check), else the defaults, saying why
    (limits.folder_limits)."""
    return limit_lines.folder_limits(LeakLimits, root / root.LEAK_LOG, COMMAND)


def root_verdicts(root: OutputRoot, runs: list[str] | None, limits: LeakLimits) -> list[dict]:
    """The verdicts of ``runs`` (None: every run with timing rows) of one output root; for a
    root without timing rows (no run recorded a window), one NOT JUDGED verdict naming the
    root instead of none."""
    timing = results.read_dataset(root.timing, results.TIMING_SCHEMA)
    if runs is None and timing.empty:
        return [_no_rows(root.shown)]
    host = results.read_dataset(root / root.HOST_TELEMETRY, results.HOST_TELEMETRY_SCHEMA)
    gpu = results.read_dataset(root / root.GPU_TELEMETRY, results.GPU_TELEMETRY_SCHEMA)
    return verdicts(timing, host, gpu, limits, runs)


def _no_rows(name: str) -> dict:
    line = (
        f"{NOT_JUDGED} {name}: no run could be judged: no timing rows (no run recorded a "
        "window), so no memory sample can be placed on steps"
    )
    return {"run": None, "verdict": NOT_JUDGED, "passed": False, "line": line}


def verdicts(
    timing: pd.DataFrame,
    host: pd.DataFrame,
    gpu: pd.DataFrame,
    limits: LeakLimits,
    runs: list[str] | None = None,
) -> list[dict]:
    """``verdict``'s answer per run of the three datasets (``runs``: None for every run with
    timing rows, in name order)."""
    out = []
    for run in runs or sorted(set(timing["run"])):
        f = leak_figures(
            timing[timing["run"] == run],
            host[host["run"] == run],
            gpu[gpu["run"] == run],
            limits.skip_fraction,
        )
        out.append(verdict(run, f, limits))
    return out


def verdict(run: str, f: dict, limits: LeakLimits) -> dict:
    """One run's verdict from its figures (``leak_figures``): ``verdict`` (OK, LEAK or NOT
    JUDGED), ``passed`` (OK), ``host`` and ``gpu`` (each memory's part of the line, its slope
    and samples), and ``line``, what platform.leak prints."""
    # round(..) + 0.0: a flat line's slope of -1e-13 prints as +0.0, not -0.0
    host, gpu = (round(f[k], 1) + 0.0 for k in ("host_mb_per_1k_steps", "gpu_mb_per_1k_steps"))
    host_part, host_state = _part(
        "host RSS",
        host,
        f["host_samples"],
        f.get("host_unjudged", ""),
        limits.max_host_mb_per_1k_steps,
    )
    gpu_part, gpu_state = _part(
        "GPU memory",
        gpu,
        f["gpu_samples"],
        f.get("gpu_unjudged", ""),
        limits.max_gpu_mb_per_1k_steps,
    )
    if LEAK in (host_state, gpu_state):
        word = LEAK
    elif host_state == OK and gpu_state in (OK, "no samples"):
        word = OK
    else:
        word = NOT_JUDGED
    return {
        "run": run,
        "verdict": word,
        "passed": word == OK,
        "host": host_part,
        "gpu": gpu_part,
        "host_mb_per_1k_steps": host,
        "gpu_mb_per_1k_steps": gpu,
        "host_samples": f["host_samples"],
        "gpu_samples": f["gpu_samples"],
        "line": f"{word} {run}: {host_part}; {gpu_part}",
    }


def _part(what: str, slope: float, samples: int, unjudged: str, limit: float) -> tuple[str, str]:
    """One memory's part of the line and its state (OK, LEAK, NOT JUDGED, or "no samples");
    ``unjudged``: why a node or GPU of it was not judged ("" when all were)."""
    if math.isfinite(slope):
        text = f"{what} {slope:+.1f} MB per 1,000 steps ({samples} samples)"
        if slope > limit:
            return text, LEAK
        if unjudged:  # a GPU judged within its limit, another not judged
            return f"{text}, not judged on {unjudged}", NOT_JUDGED
        return text, OK
    if samples == 0 and what == "GPU memory":
        return f"{what}: no samples", "no samples"
    hint = "; host telemetry on?" if what == "host RSS" and samples == 0 else ""
    why = unjudged or f"too few samples: {samples} after warm-up, {MIN_SAMPLES} needed"
    return f"{what} not judged ({why}{hint})", NOT_JUDGED
