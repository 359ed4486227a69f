"""A sweep's fixed costs at two revisions of the code, side by side: the CPU smoke sweep (two
runs in one resident group of 2 gloo workers) started alternately from this checkout and from a
git worktree of ``--baseline``, ``--repeats`` times each, on one corpus prepared once. Prints
the medians of the sweep's wall time (command start to exit), of the time from its launch to
its first timed window, and of its first run's start-up (trial start to first step, with its
``ray_workers`` and ``imports`` parts), and their ratios.

    python -m benchmarks.probes.sweep_startup --baseline 2ff22b5 --repeats 4 \\
        --json benchmarks/results/sweep_startup_cpu2.json

Both revisions run with this Python and its installed packages; Ray's workers import the
workload from the revision's own folder (the driver's ``sys.path``, local cluster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from benchmarks.sweeps import prepared_synth_corpus
from stage1_common.fileio import write_json
from stage1_common.version import git

ROOT = Path(__file__).resolve().parents[2]


def run(argv: list, cwd: Path) -> float:
    """Seconds ``argv`` took; raises with its output when it fails."""
    t0 = time.monotonic()
    out = subprocess.run(list(map(str, argv)), cwd=cwd, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(
            f"{argv[:4]} exited {out.returncode}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}"
        )
    return time.monotonic() - t0


def sweep(checkout: Path, manifest: Path, root: Path) -> dict:
    launched = time.time()
    wall = run(
        [
            sys.executable,
            "-m",
            "platform.tune",
            "--space",
            "smoke",
            "--output-root",
            root,
            "--set",
            f"manifest_path={manifest}",
        ],
        checkout,
    )
    first = pd.read_csv(root / "run_manifest.tsv", sep="\t").iloc[0]
    parts = dict(p.split("=") for p in first["startup_breakdown"].split())
    timing = pd.read_parquet(root / "timing.parquet")
    w = timing[(timing["run"] == first["run"]) & (timing["rank"] == 0)]
    w = w.sort_values("window_end_ts").iloc[0]
    first_window = w["window_end_ts"] - w["steps_in_window"] * w["iter_ms_mean"] / 1000
    return {
        "wall_s": round(wall, 2),
        # the command's launch to the start of its first timed window: what a user waits for
        "launch_to_first_window_s": round(float(first_window - launched), 2),
        "first_startup_s": round(float(first["startup_s"]), 2),
        "ray_workers_s": float(parts["ray_workers"]),
        "imports_s": float(parts["imports"]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", required=True, help="the git revision to compare with")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, help="write the runs and medians here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sweep-startup-") as tmp:
        tmp = Path(tmp)
        base = tmp / "baseline"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(base), args.baseline],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        try:
            # The smoke space's corpus (its ``data:`` section), generated and prepared once.
            manifest = prepared_synth_corpus(
                tmp / "corpus", "--speakers", "2", "--chapters", "2", "--utts", "8", "--seed", "0"
            )
            rows = []
            for i in range(args.repeats):
                for variant, checkout in (("baseline", base), ("current", ROOT)):
                    row = {"variant": variant, "repeat": i}
                    row |= sweep(checkout, manifest, tmp / f"{variant}{i}")
                    print(json.dumps(row), flush=True)
                    rows.append(row)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT)
    keys = ("wall_s", "launch_to_first_window_s", "first_startup_s", "ray_workers_s", "imports_s")
    medians = {
        v: {k: statistics.median(r[k] for r in rows if r["variant"] == v) for k in keys}
        for v in ("baseline", "current")
    }
    ratios = {k: round(medians["current"][k] / medians["baseline"][k], 3) for k in keys}
    for k in keys:
        print(
            f"{k:<16} baseline {medians['baseline'][k]:6.2f}  current {medians['current'][k]:6.2f}"
            f"  current/baseline {ratios[k]:.3f}"
        )
    if args.json:
        write_json(
            args.json,
            {
                "command": "python -m benchmarks.probes.sweep_startup " + " ".join(sys.argv[1:]),
                "baseline": args.baseline,
                "current": git("rev-parse", "--short", "HEAD", checkout=ROOT),
                "runs": rows,
                "medians": medians,
                "ratios": ratios,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
