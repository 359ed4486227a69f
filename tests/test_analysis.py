"""Run figures and the group ranking on hand-made timing rows."""

import math

import pandas as pd
import pytest

from platform.analysis import format_ranking, rank_groups, run_figures


def rows(run, sps, iter_p50, rank=0, startup=5.0):
    return [
        {
            "run": run,
            "rank": rank,
            "window": i,
            "step": 10 * (i + 1),
            "samples_per_s": s,
            "iter_ms_p50": it,
            "startup_s": startup,
        }
        for i, (s, it) in enumerate(zip(sps, iter_p50, strict=True))
    ]


def test_tail_figures_use_the_last_n_windows_of_rank_0():
    timing = pd.DataFrame(
        rows("a", [10, 100, 200, 300], [9, 8, 7, 6])
        + rows("a", [1, 1, 1, 1], [1, 1, 1, 1], rank=1)
        + rows("b", [50, 60], [20, 30], startup=7.5)
    ).sample(frac=1.0, random_state=0)  # order on disk must not matter
    figs = run_figures(timing, {"a": 2, "b": 5})
    assert figs["a"]["tail_samples_per_sec_mean"] == pytest.approx(250.0)
    assert figs["a"]["tail_mean_iter_p50_ms"] == pytest.approx(6.5)
    assert figs["a"]["last_step"] == 40 and figs["a"]["windows"] == 4
    assert figs["b"]["tail_samples_per_sec_mean"] == pytest.approx(55.0)  # fewer windows than n
    assert figs["b"]["startup_s"] == 7.5


def manifest_row(run, group, status, sps, it):
    return {
        "run": run,
        "group": group,
        "status": status,
        "tail_samples_per_sec_mean": sps,
        "tail_mean_iter_p50_ms": it,
    }


def test_ranking_orders_by_throughput_then_iter_time_failed_last():
    ranked = rank_groups(
        [
            manifest_row("a_r1", "a", "ok", 100.0, 10.0),
            manifest_row("a_r2", "a", "ok", 120.0, 12.0),
            manifest_row("b_r1", "b", "ok", 110.0, 9.0),
            manifest_row("c_r1", "c", "failed", None, None),
            manifest_row("d_r1", "d", "ok", 110.0, 8.0),
            manifest_row("a_r3", "a", "failed", 500.0, 1.0),  # a failed run never counts
        ]
    )
    assert [g["group"] for g in ranked] == ["d", "b", "a", "c"]
    a = ranked[2]
    assert a["runs"] == 3 and a["runs_ok"] == 2
    assert a["tail_samples_per_sec_mean"] == pytest.approx(110.0)
    assert a["tail_samples_per_sec_std"] == pytest.approx(math.sqrt(200.0))
    assert ranked[-1]["runs_ok"] == 0 and math.isnan(ranked[-1]["tail_samples_per_sec_mean"])
    table = format_ranking(ranked)
    assert table.splitlines()[2].split()[:2] == ["1", "d"]
    assert "  -" in table.splitlines()[-1]
