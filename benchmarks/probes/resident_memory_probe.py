"""What a resident worker keeps on the GPU after a run (issue 24): three runs of the base models
in one process (DDP, world 1), ``serve.release`` after each, then the CUDA memory still
allocated, what the garbage collector sees of it, and whether waiting or one more collective
gives the rest back. ``python -m benchmarks.probes.resident_memory_probe`` on a GPU."""

import gc
import time

import torch
import torch.distributed as dist

from benchmarks.probes.resident_speed_probe import gpu_worker, init_process_group
from trainables.config import TrialConfig
from trainables.loop import run_training
from trainables.resident.serve import leftover_tensors, release


def main() -> None:
    init_process_group(29533)
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
        run_training(cfg, gpu_worker(lambda m, checkpoint=None: None))
        release(cfg)
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
