"""``python -m platform.leak PATH ...``: does memory grow with steps?

PATH is a sweep's output root (every run) or a run folder ``<root>/runs/<run>``. For each run,
the host samples (RSS of the trainer processes and their DataLoader workers, per node) and the
NVML samples (memory used, per GPU) are placed on the step axis by interpolating between the
timing windows' end times and steps; only samples between the first and the last window count
(start-up allocations are not a leak), and of those the first ``--skip-fraction`` of the steps
are left out too (allocators and caches still warm up after the first window). A least-squares
line through the rest gives MB per 1,000 steps: summed over nodes for the host, the largest over GPUs for GPU memory. A run leaks when
either slope exceeds its limit; it cannot be judged with fewer than ``MIN_SAMPLES`` samples.
Prints one verdict per run; exit 0 when none leaks and all could be judged, 1 otherwise, 2 for
bad input.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from platform.errors import EXIT_USAGE, UsageError
from platform.storage import results

__all__ = ["MIN_SAMPLES", "fit_mb_per_1k_steps", "leak_figures", "main"]

MIN_SAMPLES = 5


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m platform.leak", description=__doc__.split("\n")[0])
    p.add_argument("paths", nargs="+", type=Path, help="output roots or run folders")
    p.add_argument(
        "--max-host-mb-per-1k-steps",
        type=float,
        default=50.0,
        help="host RSS growth above this is a leak (default 50)",
    )
    p.add_argument(
        "--skip-fraction",
        type=float,
        default=0.25,
        help="leave out this first share of the run's steps as warm-up (default 0.25)",
    )
    p.add_argument(
        "--max-gpu-mb-per-1k-steps",
        type=float,
        default=20.0,
        help="GPU memory growth above this is a leak (default 20)",
    )
    return p


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
    timing: pd.DataFrame, host: pd.DataFrame, gpu: pd.DataFrame, skip_fraction: float = 0.25
) -> dict:
    """The figures of one run (its rows of the three datasets)."""
    windows = timing[timing["rank"] == 0]
    out = {"host_samples": 0, "gpu_samples": 0, "host_mb_per_1k_steps": math.nan}
    out["gpu_mb_per_1k_steps"] = math.nan
    if len(windows) < 2:
        return out
    h = _on_steps(host, windows, skip_fraction)
    out["host_samples"] = len(h)
    if len(h) >= MIN_SAMPLES:
        slopes = [
            fit_mb_per_1k_steps(df["step"].to_numpy(), df["trainer_rss_mib"].to_numpy())
            for _, df in h.groupby("node")
        ]
        out["host_mb_per_1k_steps"] = float(np.nansum(slopes))
        out["host_rss_mib_last"] = float(
            h.sort_values("ts").groupby("node")["trainer_rss_mib"].last().sum()
        )
    g = _on_steps(gpu, windows, skip_fraction)
    out["gpu_samples"] = len(g)
    if len(g) >= MIN_SAMPLES:
        slopes = [
            fit_mb_per_1k_steps(df["step"].to_numpy(), df["mem_used_mib"].to_numpy())
            for _, df in g.groupby(["node", "gpu_index"])
        ]
        out["gpu_mb_per_1k_steps"] = float(np.nanmax(slopes))
    out["steps"] = [int(windows["step"].min()), int(windows["step"].max())]
    return out


def _targets(paths: list[Path]) -> list[tuple[Path, list[str] | None]]:
    """(output root, runs or None for all) per PATH."""
    out = []
    for path in paths:
        path = path.expanduser().resolve()
        if (path / results.MANIFEST).is_file():
            out.append((path, None))
        elif path.parent.name == "runs" and (path.parent.parent / results.MANIFEST).is_file():
            out.append((path.parent.parent, [path.name]))
        else:
            raise UsageError(
                f"{path} is neither a sweep's output root nor a run folder <root>/runs/<run>; "
                "give one of those"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if not 0 <= args.skip_fraction < 1:
            raise UsageError(f"--skip-fraction must be within 0-1, got {args.skip_fraction}")
        targets = _targets(args.paths)
    except UsageError as exc:
        print(f"platform.leak: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    verdicts = []
    for root, runs in targets:
        timing = results.read_dataset(root / results.TIMING_DIR, results.TIMING_SCHEMA)
        host = results.read_dataset(
            root / results.HOST_TELEMETRY_DIR, results.HOST_TELEMETRY_SCHEMA
        )
        gpu = results.read_dataset(root / results.GPU_TELEMETRY_DIR, results.GPU_TELEMETRY_SCHEMA)
        for run in runs or sorted(set(timing["run"])):
            f = leak_figures(
                timing[timing["run"] == run],
                host[host["run"] == run],
                gpu[gpu["run"] == run],
                args.skip_fraction,
            )
            verdicts.append(verdict(run, f, args))
    for line, _ in verdicts:
        print(line)
    return 0 if all(ok for _, ok in verdicts) else 1


def verdict(run: str, f: dict, args) -> tuple[str, bool]:
    # round(..) + 0.0: a flat line's slope of -1e-13 prints as +0.0, not -0.0
    host, gpu = (round(f[k], 1) + 0.0 for k in ("host_mb_per_1k_steps", "gpu_mb_per_1k_steps"))
    parts = [
        f"host RSS {host:+.1f} MB per 1,000 steps ({f['host_samples']} samples)"
        if math.isfinite(host)
        else f"host RSS: too few samples ({f['host_samples']}; host telemetry on?)",
        f"GPU memory {gpu:+.1f} MB per 1,000 steps ({f['gpu_samples']} samples)"
        if math.isfinite(gpu)
        else "GPU memory: no samples",
    ]
    if not math.isfinite(host) and not math.isfinite(gpu):
        return f"UNKNOWN {run}: " + "; ".join(parts), False
    leaks = (math.isfinite(host) and host > args.max_host_mb_per_1k_steps) or (
        math.isfinite(gpu) and gpu > args.max_gpu_mb_per_1k_steps
    )
    return f"{'LEAK' if leaks else 'OK'} {run}: " + "; ".join(parts), not leaks


if __name__ == "__main__":
    sys.exit(main())
