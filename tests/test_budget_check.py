"""benchmarks/budget_check.py on hand-made output roots: its verdict and exit code, and a
"within noise" pass that proves nothing said so (issue 57's compiled check on 2x H200)."""

import json

import pandas as pd

from benchmarks.budget_check import compare, main

GROUPS = ["mb192_off", "mb160_off", "mb192_on", "mb160_on"]  # the grid's ranking, best first


def _root(path, best, ranking, *, within_noise=(), runs_ok=None):
    """An output root's summary.json and ranked_groups.csv (``ranking``: group -> samples/s,
    in rank order)."""
    path.mkdir()
    summary = {"best_group": best, "confidence": {"within_noise": list(within_noise),
                                                  "p_fastest": 0.37, "line": "how sure"}}  # fmt: skip
    (path / "summary.json").write_text(json.dumps(summary))
    runs_ok = runs_ok or {}
    pd.DataFrame(
        [
            {
                "rank": i + 1,
                "group": g,
                "tail_samples_per_sec_robust": sps,
                "runs_ok": runs_ok.get(g, 2),
                "runs_stopped": 0,
            }
            for i, (g, sps) in enumerate(ranking.items())
        ]  # fmt: skip
    ).to_csv(path / "ranked_groups.csv", index=False)
    return path


def _grid(tmp_path, within_noise):
    sps = dict(zip(GROUPS, [1586.3, 1544.3, 1489.4, 1393.6], strict=True))
    return _root(tmp_path / "grid", GROUPS[0], sps, within_noise=within_noise)


def _budget(tmp_path):
    """The budget ran the two mb160 groups, one run each, and named the compiled one."""
    sps = {"mb160_on": 1773.5, "mb160_off": 1628.5, "mb192_off": 0.0, "mb192_on": 0.0}
    ok = {"mb160_on": 1, "mb160_off": 1, "mb192_off": 0, "mb192_on": 0}
    return _root(tmp_path / "budget", "mb160_on", sps, runs_ok=ok)


def test_a_grid_that_tells_no_group_apart_makes_the_pass_vacuous(tmp_path, capsys):
    grid, budget = _grid(tmp_path, GROUPS[1:]), _budget(tmp_path)
    out = compare(budget, grid)
    assert out["within_noise"] and out["vacuous"]
    assert out["budget_winner_grid_rank"] == 4
    assert out["budget_winner_vs_grid_best"] == 0.879
    assert out["above_never_measured"] == ["mb192_off", "mb192_on"]
    assert main([str(budget), str(grid)]) == 3
    printed = capsys.readouterr().out
    assert "VACUOUS" in printed and "ranks 4 of 4 (0.879x the grid's best)" in printed
    assert "never measured by the budget sweep: mb192_off, mb192_on" in printed


def test_within_noise_of_a_grid_that_tells_groups_apart_passes_and_outside_it_fails(tmp_path):
    grid, budget = _grid(tmp_path, ["mb160_off", "mb160_on"]), _budget(tmp_path)
    out = compare(budget, grid)
    assert out["within_noise"] and not out["vacuous"]
    assert main([str(budget), str(grid)]) == 0
    (tmp_path / "grid").rename(tmp_path / "grid_noise")
    grid = _grid(tmp_path, ["mb160_off"])
    assert not compare(budget, grid)["within_noise"]
    assert main([str(budget), str(grid)]) == 1
