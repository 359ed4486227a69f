"""benchmarks/time_to_answer.py's figures that need no sweep: a run's NVML summary read from the
recorder's GPU telemetry (real Parquet parts, the recorder's schema), and the repeat spread."""

import pytest

from benchmarks.time_to_answer import gpu_by_run, spread_of
from platform.storage.results import GPU_TELEMETRY_DIR, GPU_TELEMETRY_SCHEMA, write_part


def row(run: str, rank: int, ts: float, sm: float, power: float, util: float) -> dict:
    return {
        "run": run,
        "group": "g",
        "repeat": 1,
        "rank": rank,
        "ts": ts,
        "sm_clock_mhz": sm,
        "power_w": power,
        "temp_c": 50.0 + ts,
        "util_gpu_pct": util,
    }


def test_gpu_by_run_summarises_rank_0s_samples_per_run(tmp_path):
    assert gpu_by_run(tmp_path) == {}  # a CPU sweep: no GPU telemetry at all
    rows = [row("a", 0, t, sm, 400.0 + t, 50.0) for t, sm in enumerate((1980, 1700, 1980))]
    rows += [row("a", 1, 9.0, 100.0, 9999.0, 0.0)]  # another rank's GPU: not rank 0's figure
    rows += [row("b", 0, 0.0, 1500.0, 300.0, 70.0)]
    write_part(tmp_path / GPU_TELEMETRY_DIR, "part-0", rows, GPU_TELEMETRY_SCHEMA)
    got = gpu_by_run(tmp_path)
    assert got["a"] == {"sm_mhz": 1980.0, "power_w": 401.0, "temp_c": 51.0, "util_pct": 50.0}
    assert got["b"]["sm_mhz"] == 1500.0 and got["b"]["util_pct"] == 70.0


def test_spread_needs_two_runs():
    assert spread_of([100.0]) is None and spread_of([100.0, None]) is None
    assert spread_of([100.0, 110.0, 105.0]) == pytest.approx(0.10)
