"""Faults with real processes: a rank that hangs (the stall watchdog dumps every rank's stacks
and the collectives time out), a run past run_timeout_s, a run that raises, stop_on_error, and
a manifest row whose audio file is missing (skipped and counted)."""

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


def test_run_timeout_and_stop_on_error(tmp_path, corpus_sets):
    root = tmp_path / "out"
    # Run 1 goes past run_timeout_s, run 2 raises inside step 7 on rank 1, and with
    # stop_on_error run 3 never starts.
    out = run_tune(
        "smoke",
        root,
        *corpus_sets,
        "micro_batch=4",
        "inject_error_at_step=[0, 7, 3]",
        "inject_error_rank=1",
        "max_steps=1000",
        # Long enough for run 2 to start (12-20 s here), report step 5 and raise at step 7.
        "run_timeout_s=30",
        "stop_on_error=true",
        timeout=400,
    )
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False)
    assert list(manifest["status"]) == ["timeout", "failed", "pending"]
    assert list(manifest["exit_code"].astype(str)) == ["124", "1", ""]
    # The missing file: skipped and counted by each run that read the manifest, said once each.
    assert list(manifest["missing_files"].astype(str)) == ["1", "1", ""]
    assert out.stdout.count("skipped 1 manifest rows whose audio file is missing") == 2
    assert not (root / "data").exists()  # the given manifest was used, no corpus made
    assert "run_timeout_s 30 reached at step" in manifest["failure_reason"].iloc[0]
    assert 0 < int(manifest["last_step"].iloc[0]) < 1000
    failed = manifest.iloc[1]
    assert failed["failure_reason"] == (
        "rank 1: RuntimeError: injected error at step 7 on rank 1 (inject_error_at_step)"
    )
    # What it measured before it raised is kept: the window of steps 1-5.
    assert float(failed["duration_sec"]) > 0 and str(failed["last_step"]) == "5"
    timing = pd.read_parquet(root / "timing.parquet")
    assert sorted(timing.loc[timing["run"] == failed["run"], "step"]) == [5]
    # Its workers' log tails: printed and saved, one section per rank and stream.
    tail = (root / "runs" / failed["run"] / "fail_tail.txt").read_text()
    assert tail.count("--- rank 0 ") == 2 and tail.count("--- rank 1 ") == 2
    assert f"{failed['run']}: the last 40 lines of each worker's logs" in out.stdout
    assert not (root / "runs" / manifest["run"].iloc[0] / "fail_tail.txt").exists()
    assert "stopped on error (stop_on_error): 1 run(s) not started" in out.stdout
