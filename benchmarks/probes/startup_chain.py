"""Where a sweep's first run waits before its first step, process by process (issue 40):

    python -m benchmarks.probes.startup_chain [--space smoke] [--set KEY=VALUE ...]
        [--json OUT.json] [--importtime] [--tree DIR]

Runs the space once (a new output root under the system's temporary folder) and reads its Ray
session: each worker process's start (its core worker log's first line) and the actor it
became (its .out file's first line), in order, against the command's launch; then the first
run's trial start, first step and manifest breakdown. What it shows is the chain a new worker
group is: the trial's actor, the group's host, Ray Train's controller, its placement-group
cleaner and synchronisation actor, the train workers, each a process started on demand, most
after the one before has imported what it needs. ``--importtime`` runs the sweep with
``PYTHONPROFILEIMPORTTIME=1`` (every Ray process inherits it) and adds, per process, the seconds
its imports took and the slowest top-level ones (from its .err log). ``--tree`` runs the sweep
from another checkout (a baseline's ``git archive``), for a before and after on one host.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pandas as pd

_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


def _started(log: Path) -> float | None:
    """The Unix time of a core worker log's first line."""
    with open(log, errors="replace") as fh:
        match = _STAMP.match(fh.readline())
    if match is None:
        return None
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _actor(logs: Path, worker_id: str) -> str:
    for out in logs.glob(f"worker-{worker_id}-*.out"):
        names = re.findall(r":actor_name:([^\s:]+)", out.read_text(errors="replace")[:2000])
        if names:
            return names[0]
    return "(idle or task worker)"


_IMPORT = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)")


def imports(logs: Path, worker_id: str, top: int = 4) -> dict | None:
    """A process's imports under ``PYTHONPROFILEIMPORTTIME``: the seconds of its top-level
    imports together, and the slowest of them (None without import lines)."""
    found: list[tuple[float, str]] = []
    for err in logs.glob(f"worker-{worker_id}-*.err"):
        for line in err.read_text(errors="replace").splitlines():
            match = _IMPORT.match(line)
            if match and not match.group(3):  # top level: what the process itself asked for
                found.append((int(match.group(2)) / 1e6, match.group(4)))
    if not found:
        return None
    found.sort(reverse=True)
    return {
        "imports_s": round(sum(s for s, _ in found), 2),
        "slowest": {name: round(s, 2) for s, name in found[:top]},
    }


def chain(logs: Path, launched: float) -> list[dict]:
    """Every worker process of the session: seconds after launch, and the actor it became
    (with its imports, when the session profiled them)."""
    rows = []
    for log in logs.glob("python-core-worker-*.log"):
        started = _started(log)
        worker_id = log.stem.removeprefix("python-core-worker-").split("_")[0]
        if started is not None:
            row = {"s": round(started - launched, 2), "process": _actor(logs, worker_id)}
            row.update(imports(logs, worker_id) or {})
            rows.append(row)
    return sorted(rows, key=lambda r: r["s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--space", default="smoke")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", type=Path, help="write the chain and the breakdown here")
    parser.add_argument(
        "--importtime", action="store_true", help="profile every process's imports (slower)"
    )
    parser.add_argument("--tree", type=Path, help="run the sweep from this checkout")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="startup-chain-")) / "out"
    cmd = [sys.executable, "-m", "platform.tune", "--space", args.space, "--output-root", str(root)]
    cmd += [a for kv in args.set for a in ("--set", kv)]
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1") if args.importtime else None
    launched = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=args.tree)
    if done.returncode:
        print(done.stdout[-2000:] + done.stderr[-2000:])
        return done.returncode
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False)
    first = manifest.iloc[0]
    record = json.loads((root / "runs" / first["run"] / "workers" / "rank0.json").read_text())
    rows = chain(Path(record["stderr"]).parent, launched)
    timing = pd.read_parquet(root / "timing.parquet")
    w = timing[(timing["run"] == first["run"]) & (timing["rank"] == 0)].sort_values("step")
    w = w.iloc[0]  # its first window's start: its end less its steps
    first_step = w["window_end_ts"] - w["steps_in_window"] * w["iter_ms_mean"] / 1e3 - launched
    print(f"{'s after launch':>14}  process")
    for row in rows:
        took = row.get("slowest")
        took = (
            f"  imports {row['imports_s']:.1f} s: "
            + ", ".join(f"{name} {s:.1f}" for name, s in took.items())
            if took
            else ""
        )
        print(f"{row['s']:>14.2f}  {row['process']}{took}")
    print(f"{first_step:>14.2f}  first timed window of {first['run']} starts")
    print(f"first run: startup_s {float(first['startup_s']):.1f} ({first['startup_breakdown']})")
    if args.json:
        result = {
            "command": " ".join(
                ["python -m benchmarks.probes.startup_chain", *(argv or sys.argv[1:])]
            ),
            "chain": rows,
            "first_window_s": round(float(first_step), 2),
            "startup_s": float(first["startup_s"]),
            "startup_breakdown": first["startup_breakdown"],
            "wall_s": round(time.time() - launched, 1),
        }
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
