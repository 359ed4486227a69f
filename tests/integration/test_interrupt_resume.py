"""Faults with real processes and signals on one sweep, each followed by --resume: a Ray Train
worker killed with SIGKILL, then the driver stopped by Ctrl-C, by SIGKILL, and by a batch
scheduler's SIGTERM to its whole process group (issue 43 item 13: ``timeout``, Slurm's
``scancel`` and a job's time limit send it, and it reaches Ray's own processes too; a SIGTERM to
the driver alone, which becomes the same graceful stop as Ctrl-C, is tested in
tests/test_resume.py). Nothing measured is lost, nothing is recorded twice, every file reads
back, and each --resume runs exactly the runs that did not finish ok.

The sweep's output root is a bucket on a real S3-compatible server (moto in a subprocess,
issue 26): the driver stages it and mirrors it there, the workers upload their run folders from
their scratch folders, and each --resume starts from what the bucket holds. Every check reads
the bucket (a fresh copy of it), never the driver's staging folder. The corpus is the space's
own ``data:`` section, made in the staging folder: when the sweep ends whole in the bucket the
staging copy goes but for that corpus, and the printed training command still finds it
(issue 54 item 7)."""

import json
import os
import signal
import time
from pathlib import Path

import pandas as pd
import pytest

from stage1_common.storage import Location
from tests.cli import run_module
from tests.integration.helpers import LiveCli
from tests.s3server import bucket_env

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
SETS = ("max_steps=30", "log_every=5")
FIRST, SECOND = "sweep_z0_mb4_nw0_pf2_r1", "sweep_z0_mb8_nw0_pf2_r1"


@pytest.fixture
def bucket(tmp_path, monkeypatch):
    """A fresh bucket; the CLIs reach it through the standard AWS variables. The driver's
    staging and the workers' scratch folders are this test's own."""
    with bucket_env(monkeypatch, tmp_path / "driver-staging", "sweeps"):
        yield "s3://sweeps/smoke-interrupted"


class Bucket:
    """What the bucket holds now, read through a fresh local copy of it."""

    def __init__(self, uri: str, tmp: Path):
        self.uri, self.tmp, self.n = uri, tmp, 0

    def copy(self) -> Path:
        self.n += 1
        return Location.of(self.uri).download(self.tmp / f"copy{self.n}")

    def read(self, rel: str) -> str:
        return Location.of(self.uri).join(rel).read_text()

    def caught_up(self, done, timeout_s: float = 60) -> None:
        """Wait until a copy of the bucket satisfies ``done`` (the driver mirrors the root every
        STAGE1_SYNC_INTERVAL_S, 2 s, file by file: a pass takes longer on a loaded machine)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if done(self.copy()):
                    return
            except (OSError, ValueError, KeyError):  # a file not uploaded yet
                pass
            time.sleep(0.5)


class Sweep(LiveCli):
    """``python -m platform.tune --space smoke`` in a subprocess, its output read as it comes
    (``own_group``: leading a process group of its own, as a batch job's command does)."""

    def __init__(self, root: str, *flags: str, own_group: bool = False):
        args = ["--space", "smoke", "--output-root", str(root)]
        sets = [a for s in SETS for a in ("--set", s)]
        super().__init__("platform.tune", *args, *sets, *flags, own_group=own_group)


def manifest(root: Path) -> pd.DataFrame:
    return pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False).set_index("run")


def timing(root: Path) -> pd.DataFrame:
    return pd.read_parquet(root / "timing.parquet")


def windows(df: pd.DataFrame, run: str) -> list[int]:
    return sorted(df.loc[df["run"] == run, "window"])


def test_killed_worker_ctrl_c_sigkill_and_group_sigterm_each_resumed_without_loss(tmp_path, bucket):
    remote = Bucket(bucket, tmp_path)
    full = list(range(6))  # 30 steps / 5

    # 1. kill -9 of rank 1's Ray Train worker: that run fails, the sweep goes on; Ctrl-C in the
    #    next run stops the sweep within 15 s with exit 130.
    sweep = Sweep(bucket)
    sweep.wait_for(f"[1/2] {FIRST}: step 10/30")
    # Uploaded by the rank from its node as soon as it registered.
    worker = json.loads(remote.read(f"runs/{FIRST}/workers/rank1.json"))
    os.kill(worker["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    sweep.wait_for(f"[1/2] {FIRST}: failed")
    detected_s = time.monotonic() - killed_at
    sweep.wait_for(f"[2/2] {SECOND}: step 10/30")
    took = sweep.stop(signal.SIGINT)
    out = sweep.out
    assert sweep.proc.returncode == 130 and took < 15, (took, out[-4000:])
    assert detected_s < 60, detected_s
    assert f"output root: {bucket} (staged in " in out
    root = remote.copy()
    m = manifest(root)
    assert list(m["status"]) == ["failed", "interrupted"]
    assert m.loc[FIRST, "failure_reason"].startswith("rank 1: ")
    assert "worker process has died" in m.loc[FIRST, "failure_reason"]
    assert list(m["exit_code"]) == [137, 130]
    assert int(m.loc[FIRST, "last_step"]) >= 10 and float(m.loc[FIRST, "duration_sec"]) > 0
    tail = (root / "runs" / FIRST / "fail_tail.txt").read_text()
    assert f"rank 1 (pid {worker['pid']}" in tail and worker["stderr"] in tail
    assert f"details in runs/{FIRST}/" in out and "fail_tail.txt" in out  # where, not the text
    first_attempt = timing(root)
    assert windows(first_attempt, FIRST)[:2] == [0, 1]  # measured before the kill: kept
    printed = sum(f"{SECOND}: step " in ln for ln in sweep.lines)
    assert len(windows(first_attempt, SECOND)) == printed >= 2  # every printed window on disk

    # 2. --resume reruns both: the first to the end; a SIGKILL of the driver in the second. No
    #    handler runs, yet every file on disk reads back and the finished run is complete.
    sweep = Sweep(bucket, "--resume")
    sweep.wait_for(f"[2/2] {SECOND}: step 10/30")
    remote.caught_up(  # the first run's end is in the bucket: its manifest row and windows
        lambda root: (
            list(manifest(root)["status"]) == ["ok", "running"]
            and windows(timing(root), FIRST) == full
        )
    )
    sweep.crash()
    assert sweep.proc.returncode == -signal.SIGKILL
    assert "resuming: 0 runs finished ok are kept, 2 run again" in sweep.out
    root = remote.copy()
    m = manifest(root)
    assert list(m["status"]) == ["ok", "running"]  # as the manifest stood at the kill
    assert not (root / "runs" / FIRST / "fail_tail.txt").exists()  # the failed attempt's
    ok_rows = timing(root).query("run == @FIRST").sort_values("window").reset_index(drop=True)
    assert list(ok_rows["window"]) == full
    for dataset in ("timing.parquet", "host_telemetry.parquet"):
        for part in (root / dataset).glob("*.parquet"):
            pd.read_parquet(part)  # no part file is truncated

    # 3. --resume in a process group of its own, and SIGTERM to that whole group once the
    #    missing run started: the driver still writes the rows, ranking, summary and report of
    #    what finished, mirrors them to the bucket within seconds, and exits 143.
    sweep = Sweep(bucket, "--resume", own_group=True)
    sweep.wait_for(f"[2/2] {SECOND}: started", timeout_s=120)
    os.killpg(sweep.proc.pid, signal.SIGTERM)
    t0 = time.monotonic()
    sweep.finish(timeout_s=120)
    took = time.monotonic() - t0
    assert sweep.proc.returncode == 143, sweep.out[-3000:]
    assert took < 15, (took, sweep.out[-3000:])  # not Tune's minute of waiting on a dead GCS
    print(f"SIGTERM to exit: {took:.1f} s")
    assert "resuming: 1 runs finished ok are kept, 1 run again" in sweep.out
    assert "interrupted by SIGTERM: 1 of 2 run(s) finished, 1 cut short" in sweep.out
    root = remote.copy()
    ranked = pd.read_csv(root / "ranked_groups.csv").set_index("group")
    assert ranked.loc[FIRST.removesuffix("_r1"), "rank"] == 1  # the finished run, ranked
    assert ranked.loc[FIRST.removesuffix("_r1"), "runs_ok"] == 1
    assert ranked.loc[SECOND.removesuffix("_r1"), "runs_ok"] == 0
    # This stop's summary and report, not the ones the Ctrl-C of step 1 left in the bucket.
    assert "2 runs (1 ok, 1 interrupted)" in (root / "summary.md").read_text()
    assert "1 of 2 groups measured" in (root / "report.html").read_text()
    assert list(manifest(root)["status"]) == ["ok", "interrupted"]

    # 4. --resume finishes exactly the missing run: complete, no duplicate rows.
    sweep = Sweep(bucket, "--resume")
    sweep.finish()
    assert sweep.proc.returncode == 0, sweep.out[-4000:]
    assert "resuming: 1 runs finished ok are kept, 1 run again" in sweep.out
    assert f"report: {bucket}/report.html" in sweep.out
    # Whole in the bucket and exit 0: the driver's staging copy is gone (issue 43 item 10) but
    # for the corpus the runs read, and the printed training command runs (issue 54 item 7).
    from platform.storage.mirror import staging_folder

    staged = staging_folder(bucket)
    assert [p.name for p in staged.iterdir()] == ["data"], sorted(staged.rglob("*"))
    assert f"the space's corpus stays in {staged / 'data'}" in sweep.out
    (command,) = [
        ln.split("train with it: ", 1)[1].strip() for ln in sweep.lines if "train with it: " in ln
    ]
    assert command == f"python -m platform.train --config {bucket}/best_config.json", command
    dry = run_module(*command.split()[2:], "--dry-run")
    assert dry.returncode == 0, dry.stderr
    (manifest_path,) = [
        w.split("=", 1)[1] for w in dry.stdout.split() if w.startswith("manifest_path=")
    ]
    assert Path(manifest_path).is_file() and Path(manifest_path).is_relative_to(staged)
    root = remote.copy()
    m = manifest(root)
    assert list(m["status"]) == ["ok", "ok"] and list(m["exit_code"]) == [0, 0]
    final = timing(root)
    assert not final.duplicated(["run", "rank", "window"]).any()
    assert windows(final, FIRST) == windows(final, SECOND) == full
    kept = final.query("run == @FIRST").sort_values("window").reset_index(drop=True)
    pd.testing.assert_frame_equal(kept, ok_rows)  # the ok run was not touched
    host = pd.read_parquet(root / "host_telemetry.parquet")
    assert not host.duplicated(["run", "rank", "ts"]).any()
