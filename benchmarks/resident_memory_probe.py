"""What a resident worker keeps on the GPU after a run (issue 24): three runs of the base models
in one process (DDP, world 1), ``serve.release`` after each, then the CUDA memory still
allocated, what the garbage collector sees of it, and whether waiting or one more collective
gives the rest back. ``python -m benchmarks.resident_memory_probe`` on a GPU."""

import gc
import os
import time

import torch
import torch.distributed as dist

from trainables.config import TrialConfig
from trainables.loop import WorkerContext, run_training
from trainables.serve import leftover_tensors, release


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    for i, mb in enumerate((64, 96, 64)):
        cfg = TrialConfig(
            model_size="base",
            use_gpu=True,
            train_workers=1,
            dataset="synthetic",
            audio_s=2.0,
            micro_batch=mb,
            max_steps=8,
            log_every=4,
            telemetry=False,
            stall_timeout_s=0,
        )
        run_training(
            cfg,
            WorkerContext(
                rank=0,
                world_size=1,
                device=torch.device("cuda", 0),
                report=lambda m, checkpoint=None: None,
                start_ts=time.time(),
                resident=True,
                process_ts=0.0,
            ),
        )
        release(cfg.to_dict())
        alloc = torch.cuda.memory_allocated() / 2**20
        print(f"run {i} mb{mb}: allocated {alloc:.0f} MB; gc sees {leftover_tensors()}", flush=True)
        # Memory no Python object holds: kept by a C++ owner. NCCL's work objects keep the
        # tensors of their collectives until its watchdog thread reaps them, after they
        # completed: does waiting, or one more collective, give it back?
        time.sleep(1.0)
        print(f"  after 1 s: {torch.cuda.memory_allocated() / 2**20:.0f} MB", flush=True)
        dist.barrier()
        torch.cuda.synchronize()
        time.sleep(0.5)
        gc.collect()
        torch.cuda.empty_cache()
        print(f"  after a barrier: {torch.cuda.memory_allocated() / 2**20:.0f} MB", flush=True)
    print(torch.cuda.memory_summary(abbreviated=True)[:3000])


if __name__ == "__main__":
    main()
