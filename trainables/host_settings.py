"""What a training process sets on its host before a run's steps, in one place, each setting
with the measurement behind it (issue 53: the platform is an instrument, and a setting of its
own that a bare ``torchrun`` process would not have makes it read slower than the workload is).

Intra-op threads. Ray gives a worker process ``OMP_NUM_THREADS`` = the CPUs it reserved where
the variable is unset (``ray._private.utils.set_omp_num_threads_if_unset``): 5 for a GPU rank
with 4 loader workers. ``torchrun`` gives each rank 1, and the references
(benchmarks/strategy_reference.py) run so. On a GPU the loop's own CPU ops are few (the loader's
workers are processes of their own, each with one thread), and idle OpenMP threads spin after a
parallel region (the CPU-side cast and sum of the audio mask did that every step before the
count moved to the device). So a GPU rank gets 1, the figure torchrun chose; a CPU rank, whose
compute is the intra-op threads, keeps one per reserved CPU. Measured on 2x H200 at the
references' point: benchmarks/results/reference_compare_2xh200/faithful/README.md.

``intra_op_threads`` set in the config always wins. On a CPU the process's own figure (Ray's,
or a user's ``OMP_NUM_THREADS``) stays the cap.
"""

from __future__ import annotations

import torch

from trainables.config import TrialConfig

__all__ = ["apply_host_settings", "intra_op_threads"]

# The process's intra-op threads before any run changed them (a resident worker serves many).
_STARTED_WITH: list[int] = []


def intra_op_threads(cfg: TrialConfig, on_gpu: bool, started_with: int) -> int:
    """The run's intra-op threads: ``cfg.intra_op_threads`` when set; else 1 on a GPU, and on a
    CPU one per CPU the run reserves, at most what the process started with (Ray's figure for
    a resident group is that of the sweep's most demanding run)."""
    if cfg.intra_op_threads:
        return cfg.intra_op_threads
    if on_gpu:
        return 1
    return max(1, min(started_with, cfg.cpus_per_train_worker))


def apply_host_settings(cfg: TrialConfig, device: torch.device) -> dict[str, int]:
    """Set this process's intra-op threads for the run; returns what was set (the run's
    notes: the manifest's ``intra_op_threads_effective``)."""
    if not _STARTED_WITH:
        _STARTED_WITH.append(torch.get_num_threads())
    threads = intra_op_threads(cfg, device.type == "cuda", _STARTED_WITH[0])
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return {"intra_op_threads_effective": threads}
