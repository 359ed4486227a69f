"""The ranking's confidence (platform/analysis/confidence.py): the probability that each group
is the fastest and which groups are within noise of the winner, from a two-level bootstrap over
runs and their tail windows."""

import numpy as np
import pandas as pd
import pytest

from platform.analysis.confidence import confidence, sentence, tail_windows


def runs(center: float, n_runs: int, seed: int, spread: float = 2.0, windows: int = 5):
    rng = np.random.default_rng(seed)
    return [center + rng.normal(0, spread, windows) + rng.normal(0, spread) for _ in range(n_runs)]


def test_a_clear_winner_is_near_certain_and_alone():
    table = confidence({"slow": runs(100, 3, 1), "fast": runs(110, 3, 2)}, best="fast")
    assert list(table["group"]) == ["fast", "slow"]
    fast, slow = table.iloc[0], table.iloc[1]
    assert fast.p_best > 0.99 and slow.p_best < 0.01
    assert not slow.within_noise_of_best and slow.vs_best_high < 0.97
    assert (fast.runs, fast.windows, fast.noise) == (3, 15, "runs and windows")
    assert sentence(table) == "P(fastest) 1.00; no other group within noise"


def test_two_equal_groups_are_each_fastest_about_half_the_time():
    same = runs(100, 2, 3)
    table = confidence({"a": same, "b": [w.copy() for w in same]}, best="a")
    assert table["p_best"].to_numpy() == pytest.approx([0.5, 0.5], abs=0.05)
    b = table.iloc[1]
    assert b.within_noise_of_best and b.vs_best_low < 1.0 < b.vs_best_high
    assert sentence(table).startswith("P(fastest) 0.")
    assert "within noise of it: b (0." in sentence(table)


def test_a_close_second_measured_twice_is_within_noise_and_the_interval_holds_both_levels():
    """Run-to-run noise counts: two runs that differ by 10 % with quiet windows give a wide
    interval; the same windows as one run give the windows' narrow one."""
    quiet = [np.full(5, 100.0) + np.arange(5) * 0.01, np.full(5, 110.0) + np.arange(5) * 0.01]
    table = confidence({"w": [np.full(5, 106.0)], "two": quiet}, best="w")
    two = table.set_index("group").loc["two"]
    assert two.vs_best_low < 0.95 and two.vs_best_high > 1.03 and two.within_noise_of_best
    single = confidence({"w": [np.full(5, 106.0)], "one": [quiet[0]]}, best="w")
    one = single.set_index("group").loc["one"]
    assert one.noise == "windows only" and one.vs_best_high < 0.95
    assert "run 2 or more repeats" in sentence(single)


def test_the_same_measurements_give_the_same_numbers_and_a_winner_must_be_measured():
    groups = {"a": runs(100, 2, 4), "b": runs(101, 2, 5)}
    pd.testing.assert_frame_equal(confidence(groups, "b"), confidence(groups, "b"))
    with pytest.raises(ValueError, match="the winner 'c' has no measured run"):
        confidence(groups, "c")


def test_tail_windows_are_rank_0s_last_windows_of_the_last_attempt():
    rows = [
        {"run": "r", "rank": rank, "attempt": attempt, "window": w, "samples_per_s": v}
        for rank in (0, 1)
        for attempt, values in ((0, [1.0, 2.0, 3.0]), (1, [10.0, 20.0, 30.0]))
        for w, v in enumerate(values)
    ] + [{"run": "x", "rank": 0, "attempt": 0, "window": 0, "samples_per_s": 5.0}]
    timing = pd.DataFrame(rows)
    timing.loc[timing["rank"] == 1, "samples_per_s"] *= 100  # rank 1's windows never count
    found = tail_windows(timing, {"r": 2}, ["r"])
    assert list(found) == ["r"] and found["r"].tolist() == [20.0, 30.0]


def test_the_analysis_writes_how_sure_in_the_ranking_the_summary_and_the_verdict(tmp_path):
    """analyze: ranked_groups.csv's p_fastest and the interval against the winner,
    summary.json's confidence, summary.md's 'How sure:' line, and the report's verdict."""
    import json

    from platform.analysis.analyze import analyze
    from platform.analysis.answer import verdict
    from tests.test_stats import make_root

    root = make_root(tmp_path)  # fast: 2 ok runs at 200 and 220; slow: 1 ok run at 100
    summary = analyze(root)
    ranked = pd.read_csv(root / "ranked_groups.csv").set_index("group")
    assert ranked.loc["fast", "p_fastest"] == 1.0 and ranked.loc["slow", "p_fastest"] == 0.0
    assert ranked.loc["slow", "vs_best_high"] < 0.55 and ranked.loc["fast", "vs_best_low"] == 1.0
    whole = json.loads((root / "summary.json").read_text())
    saved = whole["confidence"]
    assert saved["best_group"] == "fast" and saved["within_noise"] == [] and saved["runs_min"] == 1
    assert (
        "How sure: P(fastest) 1.00; no other group within noise; a group measured by one run"
        in (summary["text"])
    )
    best = json.loads((root / "best_config.json").read_text())
    line = verdict(whole, summary["ranking"], best)
    assert "P(fastest) 1.00 (window noise only: a group has one run)" in line
