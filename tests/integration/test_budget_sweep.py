"""A sweep within a time budget, end to end (platform/control/budget.py): the known-answer space
search_spaces/cpu_race.yaml (its full grid takes about 2.5 minutes on 2 cores) with --budget 40s
ends within its budget, names the grid's winner, and writes every table with what it left
unrun."""

import json
import time

import pandas as pd
import pytest

from platform.analysis.analyze import FILES
from tests.integration.helpers import run_tune

pytestmark = pytest.mark.integration
FAST = "sweep_z0_mb2_nw0_pf2_slp0p06_every1"  # the fastest stable group of cpu_race


def test_a_budget_sweep_ends_in_time_names_the_winner_and_says_what_it_left(tmp_path):
    root = tmp_path / "budget"
    t0 = time.monotonic()
    out = run_tune("cpu_race", root, flags=("--budget", "40s"))
    wall = time.monotonic() - t0
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert wall <= 40 + 30, wall
    assert "budget plan at " in out.stdout and "budget 40s: the runs ended at " in out.stdout
    for name in FILES:
        assert (root / name).is_file(), name
    summary = json.loads((root / "summary.json").read_text())
    assert summary["best_group"] == FAST
    budget = summary["budget"]
    assert budget["used_s"] <= 40 - 10 + 5  # the runs ended before the sweep's end was due
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False)
    assert set(manifest["status"]) <= {"ok", "skipped"}
    skipped = manifest[manifest["status"] == "skipped"]
    assert set(skipped["run"]) == set(budget["left_unrun"])
    assert all(r.startswith("not run: ") and "budget" in r for r in skipped["failure_reason"])
    # Every run the budget shortened holds its warm-up window and a tail after it.
    ran = manifest[manifest["status"] == "ok"]
    assert (ran["max_steps"] // ran["log_every"] - 1 >= ran["tail_timing_points"]).all()
    assert (pd.to_numeric(ran["last_step"]) == ran["max_steps"]).all()
    assert "## Budget" in (root / "summary.md").read_text()
