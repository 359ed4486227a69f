"""A batch scheduler's stop (issue 43 item 13): SIGTERM to the sweep's whole process group, as
``timeout``, Slurm's ``scancel`` and a job's time limit send it, reaches Ray's own processes too.
The driver still writes the ranking, summary and report of what finished, within seconds, exits
143, and ``--resume`` finishes the rest."""

import os
import signal
import time

import pandas as pd
import pytest

from tests.integration.helpers import LiveCli, run_tune

pytestmark = pytest.mark.integration
FIRST, SECOND = "sweep_z0_mb4_nw0_pf2_r1", "sweep_z0_mb8_nw0_pf2_r1"


def test_sigterm_to_the_process_group_keeps_what_finished_and_resume_completes(tmp_path):
    root = tmp_path / "out"
    sweep = LiveCli("platform.tune", "--space", "smoke", "--output-root", root, own_group=True)
    sweep.wait_for(f"[1/2] {FIRST}: ok in", timeout_s=400)
    sweep.wait_for(f"[2/2] {SECOND}: started", timeout_s=120)
    os.killpg(sweep.proc.pid, signal.SIGTERM)
    t0 = time.monotonic()
    sweep.finish(timeout_s=120)
    took = time.monotonic() - t0
    assert sweep.proc.returncode == 143, sweep.out[-3000:]
    assert took < 15, (took, sweep.out[-3000:])  # not Tune's minute of waiting on a dead GCS
    assert "interrupted by SIGTERM: 1 of 2 run(s) finished, 1 cut short" in sweep.out
    print(f"SIGTERM to exit: {took:.1f} s")
    ranked = pd.read_csv(root / "ranked_groups.csv").set_index("group")
    assert ranked.loc[FIRST.removesuffix("_r1"), "rank"] == 1  # the finished run, ranked
    assert ranked.loc[FIRST.removesuffix("_r1"), "runs_ok"] == 1
    assert ranked.loc[SECOND.removesuffix("_r1"), "runs_ok"] == 0
    assert (root / "summary.md").is_file() and (root / "report.html").is_file()
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t").set_index("run")
    assert list(manifest["status"]) == ["ok", "interrupted"]

    resumed = run_tune("smoke", root, flags=("--resume",), timeout=400)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming: 1 runs finished ok are kept, 1 run again" in resumed.stdout
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t")
    assert list(manifest["status"]) == ["ok", "ok"]
