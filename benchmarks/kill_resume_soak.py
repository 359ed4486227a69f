"""Soak test of crash safety: SIGKILL the sweep driver at random moments, --resume each time, and
check that the sweep still ends complete and duplicate-free.

    python -m benchmarks.kill_resume_soak --kills 20 --output-root /tmp/soak

Each round starts ``python -m platform.tune`` (``--resume`` from the second round on), waits a
random time and kills the driver with SIGKILL, so no handler of ours runs. After every kill it
reads every file of the output root back (Parquet parts, the manifest) and records the rows of the
runs the manifest calls ok. A last --resume then finishes the sweep. It prints:

- kills survived: kills after which every file read back and the next --resume started (a
  driver that ends by itself first, because a run failed, is logged and not counted),
- runs completed: ok runs at the end, of the sweep's runs,
- rows lost: rows of runs recorded ok after some kill that are missing or changed at the end,
  plus windows missing from the final result (expected 0), and duplicates (expected 0).

Windows of a run that was still running at a kill are dropped by design: --resume measures that
run again from its start. Their count is printed as ``windows of cut runs re-measured``.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
STEP_LINE = re.compile(r"\] (\S+): step \d+/")
DATASETS = ("timing.parquet", "gpu_telemetry.parquet", "host_telemetry.parquet")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kill_resume_soak", description=__doc__)
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--output-root", type=Path, required=True, help="a new folder")
    p.add_argument("--space", default="smoke")
    p.add_argument(
        "--set",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="sweep overrides (default: repeats=15 max_steps=40 log_every=5: 30 runs, enough "
        "that 20 kills land before the sweep is done)",
    )
    p.add_argument("--min-s", type=float, default=2.0, help="earliest kill after start, s")
    p.add_argument("--max-s", type=float, default=90.0, help="latest kill after start, s")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.set is None:
        args.set = ["repeats=15", "max_steps=40", "log_every=5"]
    if args.kills < 0 or not 0 <= args.min_s <= args.max_s:
        p.error("need --kills >= 0 and 0 <= --min-s <= --max-s")
    if args.output_root.exists() and any(args.output_root.iterdir()):
        p.error(f"--output-root {args.output_root} is not empty; choose a new folder")
    return args


def start(args, resume: bool) -> tuple[subprocess.Popen, list[str], threading.Thread]:
    cmd = [sys.executable, "-m", "platform.tune", "--space", args.space]
    cmd += ["--output-root", str(args.output_root)]
    cmd += [a for s in args.set for a in ("--set", s)] + (["--resume"] if resume else [])
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    return proc, lines, reader


def read_back(root: Path) -> tuple[list[dict], dict[str, pd.DataFrame]]:
    """Every file of the output root that matters, read back (raises if one is unreadable)."""
    manifest = []
    if (root / "run_manifest.tsv").is_file():
        with (root / "run_manifest.tsv").open(newline="") as fh:
            manifest = list(csv.DictReader(fh, delimiter="\t"))
    frames = {}
    for name in DATASETS:
        parts = sorted((root / name).glob("*.parquet"))
        for part in parts:
            pd.read_parquet(part)  # each part on its own: a truncated one raises here
        frames[name] = pd.read_parquet(root / name) if parts else pd.DataFrame()
    return manifest, frames


def main(argv=None) -> int:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    root = args.output_root
    ok_rows: dict[str, pd.DataFrame] = {}  # run -> its timing rows when first seen ok
    survived, remeasured, t_start = 0, 0, time.monotonic()
    driver_exits: list[int] = []  # drivers that ended by themselves before their kill
    for kill in range(1, args.kills + 1):
        proc, lines, reader = start(args, resume=kill > 1)
        delay = rng.uniform(args.min_s, args.max_s)
        t0 = time.monotonic()
        while time.monotonic() - t0 < delay and proc.poll() is None:
            time.sleep(0.05)
        finished = proc.poll() is not None
        if not finished:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        reader.join(timeout=10)
        logs = root / "soak_logs"
        logs.mkdir(parents=True, exist_ok=True)
        (logs / f"attempt-{kill:02d}.log").write_text("".join(lines))
        try:
            manifest, frames = read_back(root)
        except Exception as exc:  # noqa: BLE001 - the finding this benchmark looks for
            print(f"kill {kill}: output root unreadable after the kill: {exc}", flush=True)
            break
        timing = frames["timing.parquet"]
        status = {r["run"]: r["status"] for r in manifest}
        for run, st in status.items():
            if st == "ok" and run not in ok_rows:
                ok_rows[run] = timing[timing["run"] == run].sort_values(["rank", "window"])
        if finished and proc.returncode == 0:
            print(f"kill {kill}: the sweep finished before the kill at {delay:.1f} s", flush=True)
            break
        if finished:  # a run failed (exit 1): --resume reruns it; not a kill
            print(
                f"kill {kill}: the driver exited with code {proc.returncode} before the kill at "
                f"{delay:.1f} s (soak_logs/attempt-{kill:02d}.log); going on",
                flush=True,
            )
            driver_exits.append(proc.returncode)
            continue
        # Windows the killed driver printed for runs it had not finished: measured again.
        for line in lines:
            match = STEP_LINE.search(line)
            remeasured += bool(match and status.get(match.group(1)) != "ok")
        survived += 1
        counts = {s: list(status.values()).count(s) for s in sorted(set(status.values()))}
        elapsed = time.monotonic() - t_start
        eta = elapsed / kill * (args.kills - kill)
        print(
            f"kill {kill}/{args.kills} at {delay:5.1f} s: files read back; manifest {counts or 'not yet written'}; "
            f"{len(timing)} timing rows; elapsed {elapsed:.0f} s, ETA {eta:.0f} s",
            flush=True,
        )

    proc, lines, reader = start(args, resume=True)
    proc.wait()
    reader.join(timeout=10)
    manifest, frames = read_back(root)
    timing = frames["timing.parquet"]
    ok = [r for r in manifest if r["status"] == "ok"]
    lost = 0
    for run, then in ok_rows.items():
        now = timing[timing["run"] == run].sort_values(["rank", "window"])
        merged = then.merge(now, how="left", indicator=True)
        lost += int((merged["_merge"] == "left_only").sum())
    expected = {r["run"]: int(r["max_steps"]) // int(r["log_every"]) for r in manifest}
    for run, n in expected.items():
        have = set(timing.loc[(timing["run"] == run) & (timing["rank"] == 0), "window"])
        lost += len(set(range(n)) - have)
    duplicates = int(timing.duplicated(["run", "rank", "window"]).sum())
    result = {
        "kills": args.kills,
        "kills_survived": survived,
        "runs_completed": len(ok),
        "runs": len(manifest),
        "rows_lost": lost,
        "duplicate_rows": duplicates,
        "cut_run_windows_remeasured": remeasured,
        "final_exit_code": proc.returncode,
        "drivers_exited_before_kill": driver_exits,
        "wall_s": round(time.monotonic() - t_start, 1),
        "sets": args.set,
        "kill_window_s": [args.min_s, args.max_s],
    }
    print(
        f"\nkills survived {survived}/{args.kills - len(driver_exits)}; runs completed {len(ok)}/{len(manifest)}; "
        f"rows lost {lost}; duplicate rows {duplicates}; windows of cut runs re-measured "
        f"{remeasured}; final --resume exit {proc.returncode}; {result['wall_s']:.0f} s",
        flush=True,
    )
    (root / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    good = (
        survived + len(driver_exits) == args.kills
        and len(ok) == len(manifest)
        and lost == 0
        and duplicates == 0
    )
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
