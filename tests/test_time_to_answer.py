"""benchmarks/time_to_answer.py's figures that need no sweep: a run's NVML summary read from the
recorder's GPU telemetry (real Parquet parts, the recorder's schema), and the repeat spread."""

import pytest

from benchmarks.time_to_answer import gpu_by_run
from benchmarks.time_to_answer_compare import compare, spread_of
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


def block(executor: str, robust: float, tails: list[float], wall: float = 100.0) -> dict:
    return {
        "scheduler": "fifo",
        "executor": executor,
        "exit_code": 0,
        "wall_s": wall,
        "groups": {"g": {"robust": robust, "run_tails": tails, "run_tail_median": None}},
    }


def test_one_block_each_compares_the_robust_figures():
    variants = {
        "fifo_fresh": block("fresh", 100.0, [98.0, 102.0]),
        "fifo_resident": block("resident", 95.0, [95.0, 97.0], wall=50.0),
    }
    got = compare(variants, ["fifo"], ["fresh", "resident"])
    t = got["tail_samples_per_s"]["g"]
    assert t["basis"] == "robust" and t["ratio"] == pytest.approx(0.95)
    assert t["within_3pct"] is False
    assert t["repeat_spread"] == pytest.approx(102 / 98 - 1) and t["within_spread"] is False
    assert got["wall_ratio_resident_over_fresh"] == pytest.approx(0.5)


def test_blocks_of_one_executor_are_pooled_in_the_order_they_ran(tmp_path):
    import json

    from benchmarks.time_to_answer import combined

    # resident, fresh, resident: the second resident block ran slower (a drifting host).
    paths = []
    for i, v in enumerate(
        [
            block("resident", 0, [110.0, 112.0]),
            block("fresh", 0, [100.0, 104.0]),
            block("resident", 0, [90.0, 92.0]),
        ]
    ):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps({"space": "s", "variants": {"x": v}}))
    variants, schedulers, executors = combined(paths)
    assert list(variants) == ["fifo_resident", "fifo_fresh", "fifo_resident_2"]
    assert schedulers == ["fifo"] and executors == ["resident", "fresh"]
    t = compare(variants, schedulers, executors)["tail_samples_per_s"]["g"]
    assert t["basis"] == "median of pooled run tails"
    assert (t["fresh"], t["resident"]) == (102.0, 101.0)  # medians of 2 and of 4 runs
    assert t["resident_runs"] == 4 and t["ratio"] == pytest.approx(101 / 102)
    assert t["repeat_spread"] == pytest.approx(112 / 90 - 1) and t["within_3pct"] is True
    text = __import__("benchmarks.time_to_answer_compare", fromlist=["markdown"]).markdown(
        "s", variants, compare(variants, schedulers, executors)
    )
    assert "110.0, 112.0 / 90.0, 92.0" in text  # the resident blocks, each in its order
