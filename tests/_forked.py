"""Processes for the multi-process training tests, forked from a server that imported the
training code once.

``mp.spawn`` starts every process from scratch: Python, torch, transformers and DeepSpeed
imports cost ~8 s per call on 2 cores, more than the few steps the tests train. A forkserver
imports them once per test session (``PRELOAD``) and forks each process from that clean,
single-purpose server: every process is still new (nothing of an earlier run is in it, only
imported modules), which is what the resume tests need to prove.
"""

import torch.multiprocessing as mp

from tests import _gloo_loss_worker

__all__ = ["PRELOAD", "start", "train_apart"]

PRELOAD = [
    "tests._gloo_loss_worker",
    "trainables.loop",
    "transformers.models.bert.modeling_bert",
    "transformers.models.wav2vec2.modeling_wav2vec2",
    "torch.distributed.checkpoint",
    "deepspeed",  # a module that fails to import is left out by the server
]


def start(fn, args: tuple, nprocs: int) -> None:
    """``mp.spawn(fn, args, nprocs)`` with processes forked from the preloaded server."""
    # Only the first call of the session starts the server: later preload lists do nothing.
    mp.set_forkserver_preload(PRELOAD)
    mp.start_processes(fn, args=args, nprocs=nprocs, start_method="forkserver")


def _one_of(index: int, jobs: list[tuple]) -> None:
    port, config, run_dir, out = jobs[index]
    _gloo_loss_worker.train(0, 1, port, config, run_dir, out)


def train_apart(jobs: list[tuple]) -> None:
    """Independent one-rank runs at the same time, one process each: ``jobs`` holds
    ``(port, config, run_dir, out)`` per run; a run's windows go to ``out[0]``."""
    start(_one_of, (jobs,), len(jobs))
