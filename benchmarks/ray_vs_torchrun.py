"""Ray Train against plain torchrun, same loop, same config, one command, one machine.

    python -m benchmarks.ray_vs_torchrun --output-root OUTPUT_ROOT [--nproc N] [--set KEY=VALUE ...]

Takes a finished sweep's ``best_config.json`` (its tail samples/s were measured under Ray Train
in that sweep), runs the same configuration with ``torchrun --nproc_per_node N -m
trainables.torchrun_main``, and prints both tail figures and their ratio (Ray / torchrun; the
goal is 0.97 or more). Run it in the same command as the sweep: timings from two machines, or
two sessions, do not compare.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from stage1_common.fileio import write_json


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output-root", type=Path, required=True)
    p.add_argument(
        "--nproc", type=int, help="processes (GPUs); default: the config's train_workers"
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    best_path = args.output_root / "best_config.json"
    if not best_path.is_file():
        print(
            f"ray_vs_torchrun: error: {best_path} does not exist; run a sweep first",
            file=sys.stderr,
        )
        return 2
    best = json.loads(best_path.read_text())
    nproc = args.nproc or int(best["config"]["train_workers"])
    out = args.output_root / "torchrun"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "trainables.torchrun_main",
        "--config",
        str(best_path),
        "--out",
        str(out),
    ]
    for item in args.set:
        cmd += ["--set", item]
    print("running:", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, check=False)
    if done.returncode != 0:
        print(f"ray_vs_torchrun: torchrun failed with exit code {done.returncode}", file=sys.stderr)
        return 1
    summary = json.loads((out / "torchrun_summary.json").read_text())
    ray_sps, torch_sps = best["tail_samples_per_sec_mean"], summary["tail_samples_per_sec_mean"]
    result = {
        "group": best["group"],
        "nproc": nproc,
        "ray_tail_samples_per_s": ray_sps,
        "torchrun_tail_samples_per_s": torch_sps,
        "ray_over_torchrun": ray_sps / torch_sps,
    }
    write_json(args.output_root / "ray_vs_torchrun.json", result)
    print(
        f"{best['group']}: Ray Train {ray_sps:.1f} samples/s, torchrun {torch_sps:.1f} samples/s, "
        f"ratio {ray_sps / torch_sps:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
