"""Analysis figures on hand-made timing rows, checked against values worked out by hand."""

import json
import math

import pandas as pd
import pytest

from platform.analysis import stats
from platform.analysis.analyze import analyze, group_ranks
from platform.storage import results
from stage1_common.output_root import OutputRoot
from tests.cli import run_module


def windows(run, iter_p50, iter_p90, *, sps=None, data=(1.0, 1.0), step=(5.0, 6.0), rank=0):
    """Timing rows of one run: one window per iter_p50 value."""
    sps = sps or [100.0] * len(iter_p50)
    return [
        {
            "run": run,
            "rank": rank,
            "window": i,
            "step": 5 * (i + 1),
            "iter_ms_p50": p50,
            "iter_ms_p90": p90,
            "iter_ms_mean": p50,
            "data_ms_p50": data[0],
            "data_ms_p90": data[1],
            "data_ms_mean": data[0],
            "step_ms_p50": step[0],
            "step_ms_p90": step[1],
            "samples_per_s": s,
            "peak_mem_gib": 1.0 + i,
            "mfu": 0.1,
            "startup_s": 5.0,
        }
        for i, (p50, p90, s) in enumerate(zip(iter_p50, iter_p90, sps, strict=True))
    ]


def test_tail_figures_use_the_last_n_windows_after_the_first_of_rank_0():
    def rows(run, sps, iter_p50, rank=0, startup=5.0):
        out = windows(run, iter_p50, [2 * p for p in iter_p50], sps=sps, rank=rank)
        return [r | {"step": 10 * (r["window"] + 1), "startup_s": startup} for r in out]

    timing = pd.DataFrame(
        rows("a", [10, 100, 200, 300], [9, 8, 7, 6])
        + rows("a", [1, 1, 1, 1], [1, 1, 1, 1], rank=1)
        + rows("b", [50, 60], [20, 30], startup=7.5)
        + rows("c", [40], [25])
        # 6 windows, tail 10 (issue 57's 300 steps): the first window's compile stays out
        + rows("d", [200, 1600, 1600, 1500, 1700, 1600], [900, 90, 90, 90, 90, 90])
    ).sample(frac=1.0, random_state=0)  # order on disk must not matter
    figs = stats.run_figures(timing, {"a": 2, "b": 5, "c": 3, "d": 10})
    assert figs["a"]["tail_samples_per_sec_mean"] == pytest.approx(250.0)
    assert figs["a"]["tail_mean_iter_p50_ms"] == pytest.approx(6.5)
    assert figs["a"]["last_step"] == 40 and figs["a"]["windows"] == 4
    # fewer windows than n: every window after the first
    assert figs["b"]["tail_samples_per_sec_mean"] == pytest.approx(60.0)
    assert figs["b"]["tail_windows"] == 1 and figs["b"]["startup_s"] == 7.5
    assert figs["c"]["tail_samples_per_sec_mean"] == pytest.approx(40.0)  # one window: that one
    assert figs["d"]["tail_windows"] == 5
    assert figs["d"]["tail_samples_per_sec_mean"] == pytest.approx(1600.0)
    assert figs["d"]["tail_mean_iter_p50_ms"] == pytest.approx(90.0)


def manifest(*runs, tail=2):
    return pd.DataFrame(
        [
            {"run": r, "group": g, "repeat": i, "status": st, "tail_timing_points": tail}
            for r, g, i, st in runs
        ]
    )


def test_per_run_tail_ratios_floors_and_the_unstable_flag():
    timing = pd.DataFrame(
        # tail = windows 2 and 3: iter p90/p50 = (30/20 + 100/40) / 2 = 2.0 -> unstable
        windows("a_r1", [10, 10, 20, 40], [15, 15, 30, 100], sps=[1, 1, 90, 110], data=(0.2, 3.0))
        # tail ratios 1.5 and 1.5: exactly at the threshold -> stable (the flag is strict)
        + windows("b_r1", [10, 10], [15, 15])
        + windows("a_r1", [99, 99, 99, 99], [999, 999, 999, 999], rank=1)  # rank 1: not used
    )
    m = manifest(("a_r1", "a", 1, "ok"), ("b_r1", "b", 1, "ok"), ("c_r1", "c", 1, "failed"))
    per_run = stats.per_run_metrics(m, timing).set_index("run")
    a = per_run.loc["a_r1"]
    assert a["iter_p90_over_p50"] == pytest.approx(2.0) and bool(a["unstable_run_flag"])
    assert a["tail_samples_per_sec_mean"] == pytest.approx(100.0)
    assert a["tail_mean_iter_p50_ms"] == pytest.approx(30.0)
    assert a["data_p90_over_p50"] == pytest.approx(3.0)  # 3.0 / max(0.2, 1 ms)
    assert a["step_p90_over_p50"] == pytest.approx(1.2)
    assert a["data_share"] == pytest.approx(0.2 / 30.0)
    assert a["peak_mem_gib"] == 4.0 and a["last_step"] == 20 and a["tail_windows"] == 2
    b = per_run.loc["b_r1"]
    assert b["iter_p90_over_p50"] == pytest.approx(1.5) and not bool(b["unstable_run_flag"])
    assert per_run.loc["c_r1", "windows"] == 0  # a run that measured nothing still has a row
    assert list(per_run.index) == ["a_r1", "b_r1", "c_r1"]


def per_run_rows(group, sps, *, unstable=(), failed=0):
    rows = [
        {
            "run": f"{group}_r{i + 1}",
            "group": group,
            "status": "ok",
            "tail_samples_per_sec_mean": s,
            "tail_mean_iter_p50_ms": 1000.0 / s,
            "iter_p90_over_p50": 2.0 if i in unstable else 1.1,
            "unstable_run_flag": i in unstable,
        }
        for i, s in enumerate(sps)
    ]
    rows += [
        {"run": f"{group}_f{i}", "group": group, "status": "failed", "unstable_run_flag": False}
        for i in range(failed)
    ]
    return rows


def test_group_statistics_robust_mean_and_interval_by_hand():
    per_run = pd.DataFrame(per_run_rows("g", [100.0, 110.0, 130.0], failed=1))
    (g,) = stats.group_summary(per_run).to_dict("records")
    assert g["runs"] == 4 and g["runs_ok"] == 3
    assert g["tail_samples_per_sec_mean"] == pytest.approx(340 / 3)
    std = math.sqrt(((100 - 340 / 3) ** 2 + (110 - 340 / 3) ** 2 + (130 - 340 / 3) ** 2) / 2)
    assert g["tail_samples_per_sec_std"] == pytest.approx(std)  # 15.275
    assert g["tail_samples_per_sec_robust"] == pytest.approx(110.0)  # 100 and 130 dropped
    half = 4.302653 * std / math.sqrt(3)  # Student's t, 2 degrees of freedom
    assert g["ci95_low"] == pytest.approx(340 / 3 - half, rel=1e-5)
    assert g["ci95_high"] == pytest.approx(340 / 3 + half, rel=1e-5)
    iters = pd.Series([10.0, 1000 / 110, 1000 / 130])
    assert g["iter_p50_cv"] == pytest.approx(iters.std() / iters.mean())
    assert g["unstable_run_ratio"] == 0.0 and not g["unstable_group"]
    # Two runs: no robust trimming; one run: std 0, no interval.
    (two,) = stats.group_summary(pd.DataFrame(per_run_rows("h", [90.0, 110.0]))).to_dict("records")
    assert two["tail_samples_per_sec_robust"] == 100.0
    assert two["ci95_low"] == pytest.approx(100 - 12.706205 * math.sqrt(200) / math.sqrt(2))
    (one,) = stats.group_summary(pd.DataFrame(per_run_rows("i", [90.0]))).to_dict("records")
    assert one["tail_samples_per_sec_std"] == 0.0 and math.isnan(one["ci95_low"])


def test_ranking_puts_unstable_groups_after_stable_ones_and_empty_groups_last():
    per_run = pd.DataFrame(
        per_run_rows("fast_but_unstable", [200.0, 210.0], unstable=(0, 1))
        + per_run_rows("half_unstable", [150.0, 150.0], unstable=(0,))  # 0.5: not > half
        + per_run_rows("slow", [100.0, 100.0])
        + per_run_rows("tie_slower_iter", [100.0, 100.0])
        + per_run_rows("never_ok", [], failed=2)
    )
    per_run.loc[per_run["group"] == "tie_slower_iter", "tail_mean_iter_p50_ms"] = 50.0
    ranked = stats.rank(stats.group_summary(per_run))
    assert list(ranked["group"]) == [
        "half_unstable",
        "slow",
        "tie_slower_iter",
        "fast_but_unstable",
        "never_ok",
    ]
    assert list(ranked["rank"]) == [1, 2, 3, 4, 5]


def make_root(tmp_path):
    """An output root by hand: 2 groups x 2 repeats, one failed run."""
    root = OutputRoot(tmp_path / "smoke_20261121-120000")
    rows = [
        ("fast_r1", "fast", 1, "ok"),
        ("fast_r2", "fast", 2, "ok"),
        ("slow_r1", "slow", 1, "ok"),
        ("slow_r2", "slow", 2, "failed"),
    ]
    m = manifest(*rows)
    m["failure_reason"] = ["", "", "", "rank 1: RuntimeError: boom"]
    results.write_tsv(root / results.MANIFEST, m.to_dict("records"), list(m.columns))
    speeds = {"fast_r1": 200.0, "fast_r2": 220.0, "slow_r1": 100.0}
    for run, sps in speeds.items():
        data = (5.0, 6.0) if run == "slow_r1" else (1.0, 1.0)  # slow_r1 waits for data
        part = windows(run, [10, 10, 10], [11, 11, 11], sps=[1.0, sps, sps], data=data)
        for row in part:
            row.update(group=run[:-3], repeat=int(run[-1]))
        results.write_part(root / results.TIMING_DIR, f"{run}-00000", part, results.TIMING_SCHEMA)
    for run, group, _, _ in rows:
        swept = {"micro_batch": 16 if group == "fast" else 8, "ddp_static_graph": True}
        record = {"space": "smoke", "run": run, "swept": swept, "config": {**swept, "seed": 0}}
        results.write_json(root / "runs" / run / "config.json", record)
    return root


def test_analyze_writes_every_file_and_agrees_with_the_rows(tmp_path):
    root = make_root(tmp_path)
    summary = analyze(root)
    for name in ("per_run_metrics.csv", "group_summary.csv", "ranked_groups.csv", "summary.md"):
        assert (root / name).is_file(), name
    ranked = pd.read_csv(root / "ranked_groups.csv")
    assert list(ranked["group"]) == ["fast", "slow"]
    assert group_ranks(root) == {"fast": 1, "slow": 2}  # what the catalogue keeps
    assert ranked.loc[0, "tail_samples_per_sec_mean"] == pytest.approx(210.0)
    best = json.loads((root / "best_config.json").read_text())
    assert best["group"] == "fast" and best["config"]["micro_batch"] == 16
    assert best["sweep_command"] == (
        "python -m platform.tune --space smoke --set micro_batch=16 "
        "--set ddp_static_graph=true --set repeats=1"
    )
    assert best["command"] == f"python -m platform.train --config {root / 'best_config.json'}"
    saved = json.loads((root / "summary.json").read_text())
    assert saved["status_counts"] == {"ok": 3, "failed": 1} and saved["best_group"] == "fast"
    # The code that wrote the files: summary.json's written_by, summary.md's last line.
    assert saved["written_by"].startswith("stage1-platform ")
    assert (
        summary["text"]
        .rstrip()
        .endswith(f"Written by python -m platform.analyze, {saved['written_by']}.")
    )
    assert saved["top_two_within_noise"] is None  # slow has one ok run
    assert saved["not_ok_runs"] == [
        {"run": "slow_r2", "status": "failed", "reason": "rank 1: RuntimeError: boom"}
    ]
    assert "Best: **fast**" in summary["text"] and "slow_r2: failed" in summary["text"]
    assert "- slow_r1: **data-bound**: the data wait is 50% of iter time" in summary["text"]
    assert saved["bottlenecks"] == {"slow_r1": summary["bottlenecks"]["slow_r1"]}
    per_run = pd.read_csv(root / "per_run_metrics.csv", keep_default_na=False)
    assert list(per_run["bottlenecks"]) == ["", "", "data-bound", ""]
    assert not list(root.path.rglob(".*.tmp"))


def test_the_cli_refuses_a_folder_without_a_sweep(tmp_path):
    out = run_module("platform.analyze", tmp_path)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("platform.analyze: error: ") and "holds no sweep" in line
    assert list(tmp_path.iterdir()) == []  # nothing written
    root = make_root(tmp_path)
    ok = run_module("platform.analyze", root)
    assert ok.returncode == 0 and "Best: **fast**" in ok.stdout
    # The README's promise: the winner's training command, before the report's line.
    train = f"train with it: python -m platform.train --config {root / 'best_config.json'}"
    assert ok.stdout.rstrip().splitlines()[-2:][0] == train


@pytest.mark.parametrize(
    "run, throttle, total, kinds",
    [
        ({"data_share": 0.15, "rank_skew_max": 1.2}, None, None, []),  # at the limits: nothing
        ({"data_share": 0.2}, None, None, ["data-bound"]),
        ({"rank_skew_max": 1.3}, None, None, ["straggler"]),
        # 0x40 (HW thermal) in 2 of 20 samples = 10 % > 5 %; 0x4 (power cap) in 12 = 60 % > 50 %
        ({}, [0x40] * 2 + [0x4] * 12 + [0] * 6, None, ["throttled", "power-capped"]),
        ({}, [0x4] * 10 + [0] * 10, None, []),  # power cap in 50 %: not above the limit
        ({"peak_mem_gib": 75.0}, None, 80.0, ["memory-tight"]),  # 6 % free
        ({"peak_mem_gib": 30.0}, None, 80.0, ["memory-headroom"]),  # 62 % free
        ({"peak_mem_gib": 50.0}, None, 80.0, []),  # 38 % free
        ({"peak_mem_gib": float("nan")}, None, 80.0, []),  # CPU run: no peak memory
    ],
)
def test_bottleneck_attribution(run, throttle, total, kinds):
    found = stats.bottlenecks(run, None if throttle is None else pd.Series(throttle), total)
    assert [b["kind"] for b in found] == kinds
    assert all(b["try"] for b in found)


def test_the_winners_command_carries_the_sweeps_own_settings(tmp_path):
    from platform.analysis.analyze import _overrides
    from platform.spaces.load import load_space

    root = OutputRoot(tmp_path / "out")
    fixed = load_space("smoke").fixed
    config = {**fixed, "micro_batch": 8, "max_steps": 1000, "use_gpu": False}
    config["manifest_path"] = "/data/ls16k/manifest_16k_trim.tsv"  # given with --set
    assert _overrides("smoke", {"micro_batch": 8}, config, root) == {
        "max_steps": 1000,
        "manifest_path": "/data/ls16k/manifest_16k_trim.tsv",
    }
    # The space's generated corpus is made again by the command: not an override.
    config["manifest_path"] = str(root / "data" / "prepared" / "manifest_16k_trim.tsv")
    assert _overrides("smoke", {"micro_batch": 8}, config, root) == {"max_steps": 1000}
    assert _overrides("no_such_space", {}, config, root) == {}


def test_summary_and_console_name_the_ranking_flag_for_what_it_is(tmp_path):
    """The ranking's unstable_group is "jittery" in summary.md and on the console, and said to
    be not the Phase B check (platform.stability): the report's stability part can FAIL a
    group this flag leaves alone, and the two once both read "unstable"."""
    from platform.analysis.analyze import format_ranked

    root = make_root(tmp_path)  # fast: iter p90/p50 1.1 in both ok runs
    summary = analyze(root, unstable_ratio=1.05)
    text = (root / "summary.md").read_text()
    assert summary["unstable_groups"] == ["fast", "slow"]
    assert "Jittery (iter p90/p50 > 1.05 in most ok runs" in text
    assert "not the Phase B check: python -m platform.stability judges that" in text
    assert "Unstable" not in text and "| unstable runs |" not in text
    assert "| share of runs p90/p50 > 1.05 |" in text
    header = format_ranked(summary["ranking"]).splitlines()[0]
    assert header.endswith("jittery") and "unstable" not in header
