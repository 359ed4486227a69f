"""Faults with real processes: a rank that hangs (the stall watchdog dumps every rank's stacks
and the collectives time out). A run past run_timeout_s, a run that raises, stop_on_error and a
missing audio file are checked on the multi-node cluster (test_multinode.py)."""

import pandas as pd
import pytest

from tests.integration.helpers import run_tune, smoke_manifest

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def corpus_sets(tmp_path_factory):
    """--set values for the smoke space's corpus, prepared here, with one of its 32 audio files
    gone (and allowed: 1 of 32 rows)."""
    path = smoke_manifest(tmp_path_factory.mktemp("corpus"))
    (path.parent / pd.read_csv(path, sep="\t")["path"].iloc[3]).unlink()
    return (f"manifest_path={path}", "max_missing_files_fraction=0.05")


def test_a_hung_rank_is_detected_and_explained_not_waited_out(tmp_path, corpus_sets):
    root = tmp_path / "out"
    out = run_tune(
        "smoke",
        root,
        *corpus_sets,
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
    assert int(row["exit_code"]) == 124
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
