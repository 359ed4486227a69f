"""Faults with real processes: a rank that hangs (the stall watchdog dumps every rank's stacks
and the collectives time out), a run past run_timeout_s, and stop_on_error."""

import pandas as pd
import pytest

from tests.integration.helpers import run_tune

pytestmark = pytest.mark.integration


def test_a_hung_rank_is_detected_and_explained_not_waited_out(tmp_path):
    root = tmp_path / "out"
    out = run_tune(
        "smoke",
        root,
        "micro_batch=4",
        "max_steps=30",
        "stall_timeout_s=8",
        # Rank 1 sleeps 10 minutes inside step 12; rank 0 waits for it in the all-reduce.
        "inject_sleep_at_step=12",
        "inject_sleep_rank=1",
        "inject_sleep_s=600",
        timeout=300,
    )
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False)
    row = manifest.iloc[0]
    assert row["status"] == "stalled" and "stacks-rank1.txt" in row["failure_reason"]
    assert float(row["duration_sec"]) < 120  # not the 10-minute sleep, not gloo's 30 minutes
    run_dir = root / "runs" / row["run"]
    stuck = (run_dir / "stacks-rank1.txt").read_text()
    assert stuck.startswith("no progress for ") and "after step 11" in stuck
    assert "trainables/loop.py" in stuck and "_train" in stuck  # where it sleeps
    waiting = (run_dir / "stacks-rank0.txt").read_text()
    # Rank 0 went on to step 13 and waits inside one of DDP's collectives for rank 1.
    assert "after step 12" in waiting and "torch/nn/parallel/distributed.py" in waiting
    timing = pd.read_parquet(root / "timing.parquet")
    assert sorted(timing["step"]) == [5, 10]  # what was measured before the hang is kept


def test_run_timeout_and_stop_on_error(tmp_path):
    root = tmp_path / "out"
    # Run 1 goes past run_timeout_s, run 2 fails (64 per worker cannot be filled), and with
    # stop_on_error run 3 never starts.
    out = run_tune(
        "smoke",
        root,
        "micro_batch=[4, 64, 8]",
        "max_steps=1000",
        "run_timeout_s=15",
        "stop_on_error=true",
        timeout=400,
    )
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False)
    assert list(manifest["status"]) == ["timeout", "failed", "pending"]
    assert "run_timeout_s 15 reached at step" in manifest["failure_reason"].iloc[0]
    assert 0 < int(manifest["last_step"].iloc[0]) < 1000
    assert "stopped on error (stop_on_error): 1 run(s) not started" in out.stdout
