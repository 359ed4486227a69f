"""A warm race's pooled ranking (``--history confirm``: platform/control/race.py decides,
platform/analysis/pooled.py and the analysis rank): a race fed recorded windows writes its
schedule.json into a real output root, the run manifest and timing rows are written as the
recorder writes them, and ``analyze`` ranks the groups, pooled with the catalogue runs of the
groups whose prior this host confirmed, and says so everywhere."""

from __future__ import annotations

import html
import json

import pandas as pd
import pytest

from platform.analysis.analyze import analyze, format_ranked
from platform.analysis.report.page import write_report
from platform.control.race import Race, Schedule
from platform.record.manifest import write_run_record
from platform.spaces.expand import expand_runs
from platform.storage import results
from stage1_common.output_root import OutputRoot
from tests.test_race import priors_of, space_from, window
from tests.test_stats import windows as timing_rows


def warm_sweep(tmp_path, here: dict[str, list[float]], history: str = "confirm",
               spread=(0.0, 0.0), **means):  # fmt: skip
    """The race fixture's groups A, B, C warm-started from ``priors_of(spread, **means)`` (two
    runs of each in the catalogue, sweep ``old``), each group's first run fed ``here[group]`` (its
    windows' samples/s, one at a time, as the searcher hands the runs out: a group's later
    repeats only if the race still wants them, fed the same windows), then analysed."""
    space = space_from(tmp_path)
    runs = expand_runs(space)
    names = list(dict.fromkeys(r.group for r in runs))
    group = {k: names["ABC".index(k)] for k in "ABC"}
    root = OutputRoot(tmp_path / "root")
    schedule = Schedule(root, space, runs)
    priors = priors_of(spread, **{group[k]: v for k, v in means.items()})
    race = Race(runs, space, schedule, lambda _: None, priors, history)
    fed: dict[str, list[float]] = {}
    for run in runs:
        letter = "ABC"[names.index(run.group)]
        if letter not in here:
            continue
        if not race.runnable(run.name):
            race.skip(run.name)
            continue
        fed[run.name] = []
        for i, sps in enumerate(here[letter]):
            fed[run.name].append(sps)
            if race.observe(run.name, window(3 * (i + 1), sps)):
                break
        race.complete(run.name, "ok")
    _write_root(root, runs, fed, schedule, space.ref)
    return root, analyze(root), group


def _write_root(root, runs, fed, schedule, space_ref):
    """The manifest and timing rows of the runs fed, as the recorder leaves them."""
    stops, skipped = schedule.stops, schedule.state["skipped"]
    manifest = []
    for spec in runs:
        status = ("stopped_early" if spec.name in stops else "skipped" if spec.name in skipped
                  else "ok" if spec.name in fed else "pending")  # fmt: skip
        manifest.append({"run": spec.name, "group": spec.group, "repeat": spec.repeat,
                         "status": status, "tail_timing_points": 4})  # fmt: skip
        write_run_record(root, spec, space_ref)
        if spec.name in fed:
            values = fed[spec.name]
            part = timing_rows(spec.name, [10.0] * len(values), [11.0] * len(values), sps=values)
            for row in part:
                row.update(group=spec.group, repeat=spec.repeat)
            results.write_part(root.timing, f"{spec.name}-0", part, results.TIMING_SCHEMA)
    results.write_tsv(root.manifest, manifest, list(manifest[0]))


def test_a_clear_winner_confirmed_on_both_sides_ranks_on_its_pooled_runs(tmp_path):
    """A (100 in the catalogue) and B (80) both confirm on their first 2 judged windows: each
    ran once, to step 12, and ranks on 1 run here + 2 from the catalogue. A wins with
    P(fastest) 1; the files, the console and the summary say the ranking is pooled."""
    root, summary, g = warm_sweep(tmp_path, {"A": [90, 98, 100, 101] + [100] * 6,
                                             "B": [70, 78, 80, 79] + [80] * 6}, A=100, B=80)  # fmt: skip
    manifest = pd.read_csv(root.manifest, sep="\t").set_index("run")
    assert manifest["status"].value_counts().to_dict() == {"stopped_early": 2, "skipped": 2,
                                                           "pending": 2}  # fmt: skip
    ranked = pd.read_csv(root / "ranked_groups.csv").set_index("group")
    a, b = ranked.loc[g["A"]], ranked.loc[g["B"]]
    assert (a["rank"], a["runs_ok"], a["runs_catalogue"], a["catalogue_sweeps"]) == (1, 3, 2, "old")
    assert (b["runs_ok"], b["runs_catalogue"]) == (3, 2)
    # The mean of its run here (its tail as the ranking counts a run stopped once confirmed:
    # its windows after the race's 2 warm-up windows, 100 and 101; never the warm-up's 98,
    # which the ordinary cut, the last 4 after the first, would take) and its two catalogue
    # runs' (100.2 each), scaled by the shift this host shows: the median of A's and B's
    # ratios here over the catalogue (1.005 and 0.994).
    scale = summary["pooled"]["scale"]
    assert scale == pytest.approx((100.5 / 100 + 79.5 / 80) / 2)
    assert summary["pooled"]["judged"] == 2
    assert a["tail_samples_per_sec_mean"] == pytest.approx((2 * 100.2 * scale + 100.5) / 3)
    assert a["p_fastest"] == 1.0 and b["vs_best_high"] < 0.85
    best = json.loads((root / "best_config.json").read_text())
    assert best["group"] == g["A"] and (best["runs_ok"], best["runs_catalogue"]) == (3, 2)
    pooled = summary["pooled"]
    assert pooled["groups"][g["A"]]["runs_catalogue"] == [f"old/{g['A']}_old_r1",
                                                          f"old/{g['A']}_old_r2"]  # fmt: skip
    assert pooled["line"].startswith("ranking pooled (--history confirm): 2 group(s)")
    assert "2 run(s) here" in pooled["line"] and "4 earlier run(s)" in pooled["line"]
    assert f"**{pooled['line'][0].upper()}{pooled['line'][1:]}.**" in summary["text"]
    # Not "3/4": the repeat not run is the catalogue's to stand in for, not a failure.
    assert "| 1/2 here + 2 from the catalogue (standing in for 1 repeat(s) not run) |" in (
        summary["text"])  # fmt: skip
    assert "2 confirmed here" in summary["early_stopping"]["line"]
    table = format_ranked(summary["ranking"])
    assert "of them from the catalogue" in table.splitlines()[0] and "2 (old)" in table
    page = write_report(root).read_text()
    assert html.escape(pooled["line"]) in page and "of them from the catalogue" in page
    assert "(pooled: 1 run(s) here and 2 earlier run(s) on this host from the catalogue" in page


def test_two_equal_groups_pooled_are_within_noise_of_each_other(tmp_path):
    """A and B both at 100 in the catalogue and here: neither is sure to be the fastest."""
    _, summary, g = warm_sweep(tmp_path, {"A": [90, 98, 100, 100.5] + [100] * 6,
                                          "B": [90, 98, 100, 99.5] + [100] * 6}, A=100, B=100)  # fmt: skip
    sure = summary["confidence"]
    assert 0.2 < sure["p_fastest"] < 0.8 and sure["runs_min"] == 3
    assert sure["within_noise"] == [g["B"] if sure["best_group"] == g["A"] else g["A"]]


def test_a_dropped_prior_ranks_on_this_sweeps_runs_alone(tmp_path):
    """A and B confirm; C was 120 in the catalogue and is 100 here: dropped (the median of the
    three ratios is 1: no shift all groups share), and within noise of A it runs both repeats
    and ranks on them alone (no catalogue run in its row); the ranking is still said to be
    pooled, for A and B."""
    same = [90, 98, 100, 100] + [100] * 6
    root, summary, g = warm_sweep(tmp_path, {"A": same, "B": same, "C": [90, 98] + [100] * 8},
                                  A=100, B=100, C=120)  # fmt: skip
    ranked = pd.read_csv(root / "ranked_groups.csv").set_index("group")
    assert (ranked.loc[g["C"], "runs_ok"], ranked.loc[g["C"], "runs_catalogue"]) == (2, 0)
    assert ranked.loc[g["A"], "runs_catalogue"] == 2
    assert list(summary["pooled"]["groups"]) == [g["A"], g["B"]]


def test_the_catalogue_runs_are_scaled_by_the_shift_this_host_shows(tmp_path):
    """This host runs every group 2.5 % slower today than the catalogue knew it (inside the
    3 % shift tolerance): A (prior 100, its runs 3 % apart) confirms at 0.975x and settles; C
    (no prior), truly as fast as A, races cold at 97.5. Scaled by the shift (A's own ratio,
    the one judged group), A's pooled mean sits at this host's level and the two are within
    noise; the factor is in the schedule, summary.json and the pooled line. The same sweep
    ranked unscaled (a schedule without the factor) puts A first, its pooled mean ~2 % above
    C's (its catalogue runs 2.8 % above)."""
    same = [87.5, 95.5] + [97.0, 98.0] * 4
    root, summary, g = warm_sweep(tmp_path, {"A": same, "C": same}, spread=(-0.03, 0.03), A=100)
    schedule = json.loads(root.schedule.read_text())
    assert schedule["priors"][g["A"]]["state"] == "confirmed"
    assert schedule["history"]["scale"] == {"factor": pytest.approx(0.975), "judged": 1}
    assert schedule["priors"][g["A"]]["scale"] == pytest.approx(0.975)
    pooled = summary["pooled"]
    assert (pooled["scale"], pooled["judged"]) == (pytest.approx(0.975), 1)
    assert pooled["line"].endswith(
        "catalogue runs scaled by 0.975, the shift this host shows "
        "(the one judged group's ratio here over its catalogue runs)"
    )
    assert f"{pooled['line'][1:]}.**" in summary["text"]
    ranked = pd.read_csv(root / "ranked_groups.csv").set_index("group")
    a, c = ranked.loc[g["A"]], ranked.loc[g["C"]]
    assert (a["runs_catalogue"], c["runs_catalogue"], c["runs_ok"]) == (2, 0, 2)
    assert a["tail_samples_per_sec_mean"] == pytest.approx(97.5, rel=0.005)
    assert a["tail_samples_per_sec_mean"] == pytest.approx(
        c["tail_samples_per_sec_mean"], rel=0.005
    )
    sure = summary["confidence"]
    assert sure["within_noise"] and 0.1 < sure["p_fastest"] < 0.9
    # The catalogue's rows and the per-run figures stay as measured.
    assert schedule["priors"][g["A"]]["catalogue_runs"][0]["samples_per_s"] == pytest.approx(97.2)
    per_run = pd.read_csv(root / "per_run_metrics.csv")
    assert not per_run["run"].str.startswith("old/").any()
    # Unscaled (a schedule of an earlier version): A ranks first, ~2 % above C.
    del schedule["history"]["scale"]
    results.write_json(root.schedule, schedule)
    unscaled = analyze(root)
    first, second = unscaled["ranking"][:2]
    assert first["group"] == g["A"] and second["group"] == g["C"]
    assert first["tail_samples_per_sec_mean"] / second["tail_samples_per_sec_mean"] > 1.015
    assert unscaled["pooled"]["scale"] == 1.0 and "unscaled" in unscaled["pooled"]["line"]


def test_history_order_and_a_cold_race_rank_on_their_own_runs(tmp_path):
    """--history order: the same confirming windows stop nothing (A is the prior leader, B
    within its noise), every repeat runs, nothing is pooled; the summary has no pooled line."""
    root, summary, g = warm_sweep(tmp_path, {"A": [90, 98] + [100] * 8, "B": [90, 98] + [99.5] * 8},
                                  history="order", A=100, B=99.5)  # fmt: skip
    ranked = pd.read_csv(root / "ranked_groups.csv").set_index("group")
    assert set(ranked["runs_catalogue"]) == {0} and ranked.loc[g["A"], "runs_ok"] == 2
    assert summary["pooled"] is None and "ranking pooled" not in summary["text"].lower()


def test_a_confirmed_group_without_a_measured_run_here_is_not_pooled():
    """A schedule says A confirmed, but A's one run here failed: A ranks on this sweep's runs
    (none ok), never on its two catalogue runs alone; with nothing left to pool, no pooling."""
    from platform.analysis.pooled import pool

    per_run = pd.DataFrame([
        {"run": "a_r1", "group": "a", "status": "error", "tail_samples_per_sec_mean": 100.0,
         "tail_mean_iter_p50_ms": 10.0, "iter_p90_over_p50": 1.1, "unstable_run_flag": False},
        {"run": "b_r1", "group": "b", "status": "stopped_early", "tail_samples_per_sec_mean": 90.0,
         "tail_mean_iter_p50_ms": 10.0, "iter_p90_over_p50": 1.1, "unstable_run_flag": False},
    ])  # fmt: skip
    runs = [{"sweep": "old", "run": f"r{i}", "samples_per_s": 100.0, "iter_p50_ms": 10.0,
             "iter_ratio": 1.1, "tail": [100.0, 100.0]} for i in (1, 2)]  # fmt: skip
    schedule = {"history": {"mode": "confirm"},
                "priors": {"a": {"state": "confirmed", "catalogue_runs": runs}}}  # fmt: skip
    assert pool(per_run, schedule) is None
    schedule["priors"]["b"] = {"state": "confirmed", "catalogue_runs": runs}
    pooling = pool(per_run, schedule)
    assert list(pooling.groups) == ["b"] and set(pooling.per_run["run"]) == {
        "a_r1", "b_r1", "old/r1", "old/r2"}  # fmt: skip
    assert list(pooling.per_run.loc[pooling.per_run["group"] == "a", "run"]) == ["a_r1"]
