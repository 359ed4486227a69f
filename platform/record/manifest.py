"""What the run manifest and each planned run's record say: ``run_manifest.tsv`` (one row per
run: its status, key figures from timing.parquet, the git facts and every config value; the
recorder keeps it current through the sweep) and ``runs/<run>/config.json`` (what the analysis
and promotion read of a planned run).
"""

from __future__ import annotations

from typing import Any

from platform.analysis import stats
from platform.analysis.verdicts import cliffs
from platform.record.provenance import GIT_KEYS
from platform.spaces.expand import RunSpec
from platform.storage import results
from stage1_common.output_root import OutputRoot
from trainables.config import field_names

__all__ = ["MANIFEST_COLUMNS", "run_record", "write_manifest", "write_run_record"]

MANIFEST_COLUMNS = [
    "run",
    "group",
    "repeat",
    "status",
    "failure_reason",
    "exit_code",
    "duration_sec",
    "last_step",
    "tail_samples_per_sec_mean",
    "tail_mean_iter_p50_ms",
    "cliff",
    "startup_s",
    "gpu_telemetry_rows",
    "gpu_telemetry_empty_flag",
    "host_telemetry_rows",
    "stall_alerts",
    *results.PLACEMENT_KEYS,
    *results.STARTUP_KEYS,
    *results.TRAINING_KEYS,
    *results.EFFECTIVE_KEYS,
    *GIT_KEYS,
    *field_names(),
]


def write_run_record(root: OutputRoot, run: RunSpec, space: str) -> None:
    """``runs/<run>/config.json``: what the analysis and promotion read of a planned run."""
    path = root.run_folder(run.name).config
    results.write_json(path, run_record(run, space))


def run_record(run: RunSpec, space: str) -> dict[str, Any]:
    return {
        "space": space,
        "run": run.name,
        "group": run.group,
        "repeat": run.repeat,
        "swept": run.swept,
        "baseline": run.baseline,
        "config": run.config.to_dict(),
    }


def write_manifest(
    root: OutputRoot,
    runs: list[RunSpec],
    status: dict[str, dict[str, Any]],
    facts: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One row per run: its status and key figures (from timing.parquet), its cliff verdict
    (platform/analysis/verdicts/cliffs.py) and every config value."""
    timing = results.read_dataset(root.timing, results.TIMING_SCHEMA)
    figures = stats.run_figures(timing, {r.name: r.config.tail_timing_points for r in runs})
    rows = []
    for run in runs:
        st = status.get(run.name, {"status": "pending"})
        rows.append(
            {
                "run": run.name,
                "group": run.group,
                "repeat": run.repeat,
                "status": st["status"],
                "failure_reason": st.get("failure_reason", ""),
                "exit_code": st.get("exit_code"),
                "duration_sec": st.get("duration_sec"),
                **_telemetry_counts(run, st),
                **st.get("effective", {}),
                **(facts or {}),
                **figures.get(run.name, {}),
                "cliff": cliffs.verdict_line(figures.get(run.name), run.config),
                **run.config.to_dict(),
            }
        )
    results.write_tsv(root.manifest, rows, MANIFEST_COLUMNS)
    return rows


def _telemetry_counts(run: RunSpec, st: dict[str, Any]) -> dict[str, Any]:
    gpu_rows = st.get("gpu_telemetry_rows", 0)
    finished = st["status"] not in ("pending", "running")
    return {
        "gpu_telemetry_rows": gpu_rows,
        # A GPU run that sampled nothing: NVML missing or broken on its nodes.
        "gpu_telemetry_empty_flag": bool(
            finished and run.config.use_gpu is True and run.config.telemetry and gpu_rows == 0
        ),
        "host_telemetry_rows": st.get("host_telemetry_rows", 0),
        "stall_alerts": st.get("stall_alerts", 0),
        **{
            k: st[k]
            for k in (*results.PLACEMENT_KEYS, *results.STARTUP_KEYS, *results.TRAINING_KEYS)
            if k in st
        },
    }
