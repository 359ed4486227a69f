"""Stopping a sweep with real signals, then --resume: nothing measured is lost, nothing is
recorded twice, and exactly the unfinished runs run again."""

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.integration.helpers import run_tune

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def start_sweep(root: Path, *sets: str):
    cmd = [sys.executable, "-m", "platform.tune", "--space", "smoke", "--output-root", str(root)]
    cmd += [a for s in sets for a in ("--set", s)]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    return proc, lines, reader


def wait_for(lines: list[str], fragment: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(fragment in ln for ln in list(lines)):
            return
        time.sleep(0.2)
    raise AssertionError(f"no line with {fragment!r}:\n" + "".join(lines[-40:]))


def stop(proc, reader, sig) -> float:
    t0 = time.monotonic()
    proc.send_signal(sig)
    proc.wait(timeout=60)
    reader.join(timeout=10)
    return time.monotonic() - t0


def test_sigterm_keeps_every_window_and_resume_runs_exactly_the_rest(tmp_path):
    root = tmp_path / "out"
    sets = ("max_steps=60", "log_every=5")
    proc, lines, reader = start_sweep(root, *sets)
    wait_for(lines, "[2/2] sweep_z0_mb8_nw0_pf2_r1: step 5/60")
    took = stop(proc, reader, signal.SIGTERM)
    out = "".join(lines)
    assert proc.returncode == 143, out[-3000:]
    assert took < 15, took
    assert "interrupted by SIGTERM" in out and "--resume" in out
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False)
    assert list(manifest["status"]) == ["ok", "interrupted"]
    before = pd.read_parquet(root / "timing.parquet")
    first, second = manifest["run"]
    assert sorted(before.loc[before["run"] == first, "window"]) == list(range(12))
    assert len(before[before["run"] == second]) >= 1  # printed windows were flushed

    resumed = run_tune("smoke", root, *sets, flags=("--resume",))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming: 1 runs finished ok are kept, 1 run again" in resumed.stdout
    assert f"[1/2] {first}: started" not in resumed.stdout
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False)
    assert list(manifest["status"]) == ["ok", "ok"]
    after = pd.read_parquet(root / "timing.parquet")
    assert not after.duplicated(["run", "rank", "window"]).any()
    assert sorted(after.loc[after["run"] == second, "window"]) == list(range(12))
    kept = after[after["run"] == first].sort_values("window").reset_index(drop=True)
    then = before[before["run"] == first].sort_values("window").reset_index(drop=True)
    pd.testing.assert_frame_equal(kept[then.columns], then)  # the ok run was not touched


def test_ctrl_c_stops_the_running_trial_and_writes_what_it_measured(tmp_path):
    root = tmp_path / "out"
    proc, lines, reader = start_sweep(root, "micro_batch=4", "max_steps=400", "log_every=5")
    wait_for(lines, "sweep_z0_mb4_nw0_pf2_r1: step 10/400")
    took = stop(proc, reader, signal.SIGINT)
    out = "".join(lines)
    assert proc.returncode == 130, out[-3000:]
    assert took < 15, took
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False)
    assert list(manifest["status"]) == ["interrupted"]
    assert float(manifest["duration_sec"].iloc[0]) > 0
    timing = pd.read_parquet(root / "timing.parquet")
    printed = sum(": step " in ln for ln in lines)
    assert len(timing) == printed >= 2  # every window the driver saw is on disk
