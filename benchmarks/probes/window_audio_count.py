"""The loop's per-step count of audio that is not padding (Window.add_audio), the way it was
and the way it is, side by side on this machine (issue 42: the platform's DDP ran 16 % behind
its reference on 2x H200, and the loop thread's largest extra op was this count):

    python -m benchmarks.probes.window_audio_count [--micro-batch 128] [--audio-s 2.0] [--threads 5]
        [--steps 50] [--repeats 5] [--json OUT.json]

``cpu_mask``: the sum of the CPU-side boolean mask read back as an int every step (before);
``device_mask``: the mask already copied to the run's device summed there into the window's
counter, read once per window (now). Each variant's host seconds per step (the loop thread's
time, what a launch-bound GPU waits for), medians over repeats, and their ratio. ``--threads``:
the intra-op threads (Ray sets OMP_NUM_THREADS to a train worker's CPUs: num_workers + 1).
On a machine without a GPU both count on the CPU. One mask summed again and again, hot in the
caches, with nothing else on the host: a lower bound of what the count cost inside a run
(7.4-20.6 ms per step in the trace of benchmarks/results/reference_compare_2xh200/ddp_host/).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def _cpu_mask(mask_cpu: torch.Tensor, _mask_dev: torch.Tensor, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        int(mask_cpu.sum())
    return (time.perf_counter() - t0) / steps


def _device_mask(_mask_cpu: torch.Tensor, mask_dev: torch.Tensor, steps: int) -> float:
    from trainables.observe.window_metrics import Window

    window = Window.on(mask_dev.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        window.add_audio({"audio_mask": mask_dev})
    seconds = (time.perf_counter() - t0) / steps
    int(window.audio_valid)  # the window's one read, outside the steps
    return seconds


VARIANTS = {"cpu_mask": _cpu_mask, "device_mask": _device_mask}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--micro-batch", type=int, default=128)
    p.add_argument("--audio-s", type=float, default=2.0)
    p.add_argument("--threads", type=int, default=5)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    # A synthetic batch's mask: every row its full length, as the platform's synthetic data.
    mask_cpu = torch.ones(args.micro_batch, int(args.audio_s * 16_000), dtype=torch.bool)
    mask_dev = mask_cpu.to(device)
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.repeats):  # alternating, after one untimed pass of each
        for name, fn in VARIANTS.items():
            fn(mask_cpu, mask_dev, 2)
            seconds[name].append(fn(mask_cpu, mask_dev, args.steps))
    medians = {name: statistics.median(v) for name, v in seconds.items()}
    where = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    print(f"{where}, mask {tuple(mask_cpu.shape)}, {args.threads} intra-op threads:")
    for name, value in medians.items():
        print(f"  {name:12s} {value * 1e3:8.3f} ms per step (median of {args.repeats})")
    ratio = medians["device_mask"] / medians["cpu_mask"]
    print(f"  device_mask / cpu_mask: {ratio:.3f}")
    if args.json:
        record = {"command": sys.argv, "device": where, "threads": args.threads,
                  "seconds": seconds, "median_s": medians, "ratio": ratio}  # fmt: skip
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
