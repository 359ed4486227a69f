"""How long one small torch op takes to dispatch in a plain process and in a Ray Train worker's
training thread, alternating, in one command (issue 53): the platform's eager steps are bound
by the host's kernel launches, and on 2x H200 its loop waits longer per step under Ray than
under torchrun with the same CPU time per step.

    python -m benchmarks.probes.dispatch_probe [--turns 3] [--blocks 2000] [--ops 500] [--json OUT]

Each side times ``--blocks`` blocks of ``--ops`` in-place adds on a CPU tensor (each releases
and takes back the GIL, as every op the loop launches does; one intra-op thread) and prints the
per-op microseconds of the median block, the mean, the 10th and 99th percentile blocks and the
slowest. A median that agrees with a mean that does not means rare interruptions (another
thread holding the GIL, or the core taken away); a median that moves means every op costs more.
``--spy`` records the Ray side with ``py-spy --gil`` (only the thread holding the GIL is
sampled) and prints which threads held it.

On the 2-core CPU machine, shared with other work at the time (three turns): per-op medians
1.82-1.84 us plain against 1.82-1.93 in the Ray Train worker; means 1.83-1.97 against 1.92-3.04
and p99 blocks 1.9-6.2 against 3.5-14.5 us (two turns of three: rare long interruptions on the
Ray side). A hand-run ``py-spy --gil`` record of one such worker saw only the training thread
hold the GIL. Too noisy a machine to conclude: run it on the GPU host (it needs no GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def blocks(n_blocks: int, ops: int) -> dict[str, float]:
    """Per-op microseconds over ``n_blocks`` blocks of ``ops`` in-place adds."""
    import torch

    torch.set_num_threads(1)
    x = torch.zeros(8)
    for _ in range(20 * ops):  # warm
        x.add_(1)
    per_op = []
    for _ in range(n_blocks):
        t = time.perf_counter()
        for _ in range(ops):
            x.add_(1)
        per_op.append((time.perf_counter() - t) / ops * 1e6)
    per_op.sort()
    return {
        "median_us": round(statistics.median(per_op), 3),
        "mean_us": round(statistics.mean(per_op), 3),
        "p10_us": round(per_op[len(per_op) // 10], 3),
        "p99_us": round(per_op[int(len(per_op) * 0.99)], 3),
        "max_us": round(per_op[-1], 2),
    }


def _plain(args) -> dict[str, float]:
    code = (
        "import json, sys; from benchmarks.probes.dispatch_probe import blocks; "
        f"print(json.dumps(blocks({args.blocks}, {args.ops})))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _ray_side(args, result: Path, spy: Path | None) -> dict[str, float]:
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    n_blocks, ops = args.blocks, args.ops

    def train_fn(_config) -> None:
        sys.path.insert(0, str(ROOT))
        from benchmarks.probes.dispatch_probe import blocks as run_blocks

        recorder = None
        if spy is not None:
            recorder = subprocess.Popen(
                ["py-spy", "record", "--pid", str(os.getpid()), "--threads", "--gil",
                 "--format", "raw", "-o", str(spy), "--rate", "500", "--nonblocking"]
            )  # fmt: skip
            time.sleep(1.0)
        figures = run_blocks(n_blocks, ops)
        if recorder is not None:
            recorder.terminate()
            recorder.wait()
        result.write_text(json.dumps(figures))

    TorchTrainer(train_fn, scaling_config=ScalingConfig(num_workers=1, use_gpu=False)).fit()
    return json.loads(result.read_text())


def _gil_holders(spy: Path) -> dict[str, int]:
    """Samples per thread in a py-spy raw record."""
    held: dict[str, int] = {}
    for line in spy.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit():
            thread = stack.split(";")[0]
            held[thread] = held.get(thread, 0) + int(count)
    return held


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--blocks", type=int, default=2000)
    p.add_argument("--ops", type=int, default=500)
    p.add_argument("--spy", action="store_true", help="py-spy --gil on the Ray side's last turn")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    import tempfile

    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    rows: dict[str, list[dict]] = {"plain process": [], "Ray Train worker": []}
    with tempfile.TemporaryDirectory() as tmp:
        for turn in range(args.turns):
            rows["plain process"].append(_plain(args))
            spy = Path(tmp) / "spy.txt" if args.spy and turn == args.turns - 1 else None
            rows["Ray Train worker"].append(_ray_side(args, Path(tmp) / "ray.json", spy))
            print(f"turn {turn + 1}: {rows['plain process'][-1]} | {rows['Ray Train worker'][-1]}")
        held = _gil_holders(spy) if spy is not None and spy.is_file() else {}
    ray.shutdown()
    print("| side | median us (per turn) | mean us | p99 us |\n| --- | --- | --- | --- |")
    for side, figures in rows.items():
        cells = [
            ", ".join(f"{f[k]:.3f}" for f in figures) for k in ("median_us", "mean_us", "p99_us")
        ]
        print(f"| {side} | {' | '.join(cells)} |")
    if held:
        print("GIL held (py-spy samples):", held)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "gil_held": held}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
