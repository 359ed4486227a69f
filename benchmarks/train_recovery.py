"""Final training with a rank killed mid-run, beside a sweep run of the same configuration.

    python -m benchmarks.train_recovery --space h200_train_z1 --manifest M.tsv \
        --output-root OUT [--kill-at-step 300] [--sweep-steps 200] [--set KEY=VALUE ...]

1. ``platform.tune`` runs the space's configuration once as a sweep run (checkpoints and
   validation off, as the runbooks sweep), ``--sweep-steps`` steps: the throughput baseline.
2. ``platform.train`` runs it with checkpoints and validation; when the driver prints the
   window of ``--kill-at-step``, rank 1's process is killed with SIGKILL, and Ray Train restarts
   the worker group from the latest checkpoint.

It prints and writes (``OUT/train_recovery.json`` and ``.md``): kill to training again (the
kill to the first step of the restarted group), checkpoint save time, upload time and size,
validation recall, the share of wall time spent in validation and checkpoints, and tail
samples/s of the training run against the sweep run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def _run(module: str, *args: str, kill_at: int | None = None, pid_file: Path | None = None):
    """Run a CLI, echo its output; with ``kill_at``, SIGKILL the rank whose worker record
    ``pid_file`` reads at that window's line.
    Returns (exit code, kill time or None)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    killed: list[float] = []

    def read():
        for line in proc.stdout:
            print(line, end="", flush=True)
            if kill_at and not killed and f": step {kill_at}/" in line:
                pid = json.loads(pid_file.read_text())["pid"]
                os.kill(pid, signal.SIGKILL)
                killed.append(time.time())
                print(f"train_recovery: killed a rank (pid {pid}) at step {kill_at}", flush=True)

    reader = threading.Thread(target=read)
    reader.start()
    code = proc.wait()
    reader.join()
    return code, (killed[0] if killed else None)


def measure(train_root: Path, sweep_root: Path | None, kill_ts: float | None) -> dict:
    timing = pd.read_parquet(train_root / "timing.parquet")
    rank0 = timing[timing["rank"] == 0].sort_values(["attempt", "step"])
    manifest = pd.read_csv(train_root / "run_manifest.tsv", sep="\t", keep_default_na=False)
    ckpt = pd.read_parquet(train_root / "checkpoints.parquet")
    val = pd.read_parquet(train_root / "validation.parquet").sort_values("step")
    out: dict = {"status": manifest.loc[0, "status"], "attempts": int(rank0["attempt"].max()) + 1}
    if kill_ts is not None and out["attempts"] > 1:
        first = rank0[rank0["attempt"] == 1].iloc[0]
        # The first window of the restarted group ended at window_end_ts after its steps.
        window_s = first["steps_in_window"] * first["iter_ms_mean"] / 1000
        out["kill_to_first_step_s"] = float(first["window_end_ts"] - window_s - kill_ts)
        out["resumed_from_step"] = int(first["step"] - first["steps_in_window"])
    # A checkpoint's report (the barrier at which Ray Train registers it; every rank wrote its
    # part into the run's storage before) shows as the report_ms of the next window of the
    # same attempt.
    window = int(rank0["steps_in_window"].median())
    by_step = rank0.set_index(["attempt", "step"])["report_ms"]
    uploads = [
        float(by_step.get((int(a), int(s) + window), float("nan"))) / 1000
        for a, s in zip(ckpt["attempt"], ckpt["step"], strict=True)
    ]
    out["checkpoints"] = {
        "count": len(ckpt),
        "save_s_median": float(ckpt["checkpoint_save_s"].median()),
        "report_s_median": float(pd.Series(uploads).median()),
        "size_gb": float(ckpt["checkpoint_size_bytes"].median() / 1e9),
    }
    last = val.iloc[-1]
    out["validation"] = {
        "count": len(val),
        "val_s_median": float(val["val_s"].median()),
        "last_step": int(last["step"]),
        "items": int(last["val_items"]),
        "chance_r1": float(last["val_chance_r1"]),
        **{
            k: float(last[k])
            for k in ("val_loss", "val_s2t_r1", "val_s2t_r5", "val_t2s_r1", "val_t2s_r5")
        },
        "best_mean_r1": float(val["val_mean_r1"].max()),
    }
    wall = float(manifest.loc[0, "duration_sec"] or "nan")
    spent = ckpt["checkpoint_save_s"].sum() + pd.Series(uploads).sum() + val["val_s"].sum()
    out["wall_s"] = wall
    out["val_and_checkpoint_share_of_wall"] = float(spent / wall)
    out["train_tail_samples_per_s"] = float(manifest.loc[0, "tail_samples_per_sec_mean"])
    if sweep_root is not None:
        sweep = pd.read_csv(sweep_root / "run_manifest.tsv", sep="\t", keep_default_na=False)
        out["sweep_tail_samples_per_s"] = float(sweep.loc[0, "tail_samples_per_sec_mean"])
        out["train_over_sweep"] = out["train_tail_samples_per_s"] / out["sweep_tail_samples_per_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.train_recovery")
    p.add_argument("--space", required=True)
    p.add_argument("--manifest", required=True, type=Path)
    p.add_argument("--output-root", required=True, type=Path)
    p.add_argument("--kill-at-step", type=int, default=300)
    p.add_argument("--sweep-steps", type=int, default=200)
    p.add_argument("--kill-rank", type=int, default=1, help="the rank to kill (0 on one GPU)")
    p.add_argument("--set", action="append", default=[])
    args = p.parse_args(argv)
    sets = [a for s in [f"manifest_path={args.manifest}", *args.set] for a in ("--set", s)]
    out = args.output_root
    sweep_root = out / "sweep"
    # The sweep run: the same config with validation, checkpoints and restarts off.
    off = ["val_every=0", "checkpoint_every=0", "max_failures=0", "export_model=none"]
    off.append(f"max_steps={args.sweep_steps}")
    code, _ = _run(
        "platform.tune",
        "--space", args.space, "--output-root", str(sweep_root), *sets,
        *[a for s in off for a in ("--set", s)],
    )  # fmt: skip
    if code != 0:
        print(f"train_recovery: the sweep run exited {code}", file=sys.stderr)
    train_root = out / "train"
    run_dir = train_root / "runs"
    code, kill_ts = _train(args, train_root, sets, run_dir)
    result = measure(train_root, sweep_root if sweep_root.is_dir() else None, kill_ts)
    result |= {"exit_code": code, "kill_at_step": args.kill_at_step, "space": args.space}
    text = json.dumps(result, indent=1)
    print(text)
    (out / "train_recovery.json").write_text(text + "\n")
    return 0 if code == 0 else 1


def _train(args, train_root: Path, sets: list[str], run_dir: Path):
    """platform.train, killing rank --kill-rank at the window of --kill-at-step (its pid from
    the worker record the rank writes first)."""

    class _RankRecord:  # the run's name is known only once it started
        def read_text(self) -> str:
            return next(run_dir.glob(f"*/workers/rank{args.kill_rank}.json")).read_text()

    return _run(
        "platform.train", "--space", args.space, "--output-root", str(train_root), *sets,
        kill_at=args.kill_at_step, pid_file=_RankRecord(),
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
