"""The same training loop without Ray, under ``torchrun``: the baseline that tells what Ray
Train costs.

    torchrun --nproc_per_node=N -m trainables.torchrun_main --config OUTPUT_ROOT/best_config.json \
        --out DIR [--set key=value ...]

``--config`` takes a ``best_config.json`` or a ``runs/<run>/config.json`` (both hold the
resolved ``config``). Rank 0 writes every window to ``DIR/torchrun_timing.jsonl`` and the run's
tail figures to ``DIR/torchrun_summary.json``. Reports are not synchronised across ranks here:
that barrier is part of what the comparison measures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from stage1_common.fileio import atomic_write_text, write_json
from stage1_common.tail import tail_start
from trainables.config import TrialConfig
from trainables.loop import WorkerContext, run_training
from trainables.observe.watchdog import pg_timeout_for

__all__ = ["main"]


def _config(path: Path, overrides: list[str], world_size: int, on_gpu: bool) -> TrialConfig:
    """The run's config: the file's (a record, not a run ticket: nothing crosses Ray here) with
    ``overrides`` and this launch's workers and device, parsed once."""
    values = dict(json.loads(path.read_text())["config"])
    for item in overrides:
        key, _, raw = item.partition("=")
        values[key.strip()] = yaml.safe_load(raw)
    values.update(train_workers=world_size, use_gpu=on_gpu)
    return TrialConfig.from_dict(values, where=str(path))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="torchrun ... -m trainables.torchrun_main", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    start_ts = time.time()
    on_gpu = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    # torchrun's WORLD_SIZE: the process group's size, known before it exists (its timeout is
    # the config's).
    cfg = _config(args.config, args.set, int(os.environ.get("WORLD_SIZE", 1)), on_gpu)
    dist.init_process_group(
        "nccl" if on_gpu else "gloo",
        timeout=dt.timedelta(seconds=pg_timeout_for(cfg.stall_timeout_s, cfg.pg_timeout_s)),
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    rows: list[dict] = []

    def report(metrics: dict, checkpoint: tuple[Path, str] | None = None) -> None:
        # A checkpoint is written into its folder under --out already (run_dir).
        if rank == 0:
            rows.append(dict(metrics))
            print(
                f"torchrun: step {metrics['step']}/{metrics['max_steps']}  iter p50 "
                f"{metrics['iter_ms_p50']:.1f} ms  {metrics['samples_per_s']:.1f} samples/s",
                flush=True,
            )

    try:
        run_training(
            cfg,
            WorkerContext(
                rank=rank,
                world_size=world,
                device=device,
                report=report,
                start_ts=start_ts,
                local_rank=local_rank,
                run_dir=args.out,
            ),
        )
    finally:
        dist.destroy_process_group()
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(
            args.out / "torchrun_timing.jsonl", "".join(json.dumps(r) + "\n" for r in rows)
        )
        tail = rows[tail_start(len(rows), cfg.tail_timing_points) :]  # the sweeps' tail
        summary = {
            "config": str(args.config),
            "world_size": world,
            "windows": len(rows),
            "tail_samples_per_sec_mean": sum(r["samples_per_s"] for r in tail) / len(tail),
            "tail_mean_iter_p50_ms": sum(r["iter_ms_p50"] for r in tail) / len(tail),
        }
        write_json(args.out / "torchrun_summary.json", summary)
        print(f"torchrun: tail {summary['tail_samples_per_sec_mean']:.1f} samples/s", flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    # Everything is written (atomically) and the process group destroyed: end here, without
    # the interpreter's teardown, where a rank's gloo and loader threads can abort the process
    # (SIGABRT after the run finished: torchrun then fails the whole launch; seen once in CI).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
