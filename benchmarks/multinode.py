"""The same sweep on a multi-node Ray cluster and on one raylet, side by side in one run.

    python -m benchmarks.multinode --gpus 0,1 --out DIR [--max-steps 100] [--strategies ddp,z1]

``--gpus 0,1``: a 2-node cluster of one GPU each (a head raylet without GPU or CPU for work,
and one worker raylet per listed GPU, each a separate ``ray start`` with its own
CUDA_VISIBLE_DEVICES, in a mount namespace that hides this checkout where unshare is
permitted), against one local raylet with all of those GPUs. Each variant runs
``multinode_smoke`` shortened to the listed GPUs (DDP and ZeRO-1, mb128) on a synthetic
LibriSpeech corpus prepared once. Prints a table (samples/s, iter p50, start-up from launch to
the first step) and writes ``table.md`` and ``results.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.sweeps import prepared_synth_corpus  # noqa: E402
from tests.integration.cluster import LocalCluster, can_unshare  # noqa: E402


def make_corpus(out: Path, utts: int) -> Path:
    """A synthetic corpus prepared with data_prep on a local Ray (once, for every variant)."""
    t0 = time.time()
    manifest = prepared_synth_corpus(
        out, "--speakers", "16", "--chapters", "2", "--utts", str(utts // 32), "--seed", "0",
        "--max-s", "6",
    )  # fmt: skip
    print(f"corpus: {utts} utterances in {time.time() - t0:.0f} s", flush=True)
    return manifest


def sweep(label: str, root: Path, sets: list[str], env: dict, address: str | None) -> dict:
    args = [sys.executable, "-m", "platform.tune", "--space", "multinode_smoke"]
    args += ["--output-root", str(root)] + (["--address", address] if address else [])
    for item in sets:
        args += ["--set", item]
    t0 = time.time()
    with open(root.parent / f"{label}.log", "w") as log:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        for line in proc.stdout:  # live progress, and a copy for the results
            print(f"[{label}] {line}", end="", flush=True)
            log.write(line)
        code = proc.wait()
    wall = time.time() - t0
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False)
    rows = []
    for _, r in manifest.iterrows():
        rows.append(
            {
                "variant": label,
                "run": r["run"],
                "status": r["status"],
                "strategy": f"{r['strategy']} z{r['zero_stage']}",
                "rank_nodes": r.get("rank_nodes", ""),
                "nodes_used": r.get("nodes_used", ""),
                "samples_per_s": _num(r["tail_samples_per_sec_mean"]),
                "iter_p50_ms": _num(r["tail_mean_iter_p50_ms"]),
                "startup_s": _num(r["startup_s"]),
                "telemetry": r.get("telemetry_effective", ""),
                "gpu_rows": r.get("gpu_telemetry_rows", ""),
                "gpu_nodes": _gpu_nodes(root, r["run"]),
            }
        )
    return {"label": label, "exit_code": code, "wall_s": wall, "runs": rows}


def markdown(table: pd.DataFrame) -> str:
    def cell(v) -> str:
        return f"{v:.1f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(table.columns) + " |", "|" + " --- |" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(False)]
    return "\n".join(lines)


def _gpu_nodes(root: Path, run: str) -> str:
    """The nodes the run's GPU telemetry rows name (IP and the start of Ray's node id)."""
    path = root / "gpu_telemetry.parquet"
    if not path.exists():
        return ""
    gpu = pd.read_parquet(path, columns=["run", "node", "node_id"])
    gpu = gpu[gpu["run"] == run]
    return " ".join(
        sorted({f"{n}/{i[:8]}" for n, i in zip(gpu["node"], gpu["node_id"], strict=True)})
    )


def _num(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", default="0,1", help="one worker node per listed GPU")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--max-steps", type=int, default=100)
    p.add_argument("--utts", type=int, default=1280)
    p.add_argument(
        "--cpu", action="store_true", help="try the script on the CPU: gloo, tiny models, mb 4"
    )
    args = p.parse_args()
    gpus = args.gpus.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = make_corpus(args.out / "corpus", args.utts)
    n = len(gpus)
    common = [
        f"manifest_path={manifest}",
        f"train_workers={n}",
        f"max_steps={args.max_steps}",
        "log_every=25",
        "tail_timing_points=2",
        "num_workers=4",
    ]
    if args.cpu:
        common += ["use_gpu=false", "model_size=tiny", "micro_batch=4", "num_workers=0"]
    why = can_unshare()
    print(f"worker raylets isolated in mount namespaces: {why or 'yes'}", flush=True)
    results = []
    with LocalCluster(
        args.out / "cluster",
        workers=n,
        worker_cpus=1 if args.cpu else 8,
        worker_gpus=None if args.cpu else gpus,
        isolate=why is None,
    ) as cluster:
        placement = [f"nodes={n}"] + (["placement_strategy=STRICT_SPREAD"] if n > 1 else [])
        results.append(
            sweep(
                f"{n}-node",
                args.out / f"{n}-node",
                common + placement,
                cluster.env,
                cluster.address,
            )
        )
    local_env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if not args.cpu:
        local_env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    results.append(sweep("1-raylet", args.out / "1-raylet", common + ["nodes=1"], local_env, None))

    rows = [r for res in results for r in res["runs"]]
    table = pd.DataFrame(rows)
    md = markdown(table)
    print("\n" + md)
    for strategy in table["strategy"].unique():
        sub = table[table["strategy"] == strategy].set_index("variant")
        if len(sub) == 2:
            multi, single = sub.iloc[0], sub.iloc[1]
            print(
                f"{strategy}: {multi.name} / {single.name} samples/s "
                f"{multi['samples_per_s'] / single['samples_per_s']:.3f}, start-up "
                f"{multi['startup_s']:.1f} s vs {single['startup_s']:.1f} s"
            )
    (args.out / "table.md").write_text(md + "\n")
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    return 0 if all(r["exit_code"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
