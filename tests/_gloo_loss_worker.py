"""Gloo ranks for the multi-process tests: the global contrastive loss, gathered windows."""

import os

import torch
import torch.distributed as dist

from trainables.model.stage1 import contrastive_loss


def run(
    rank: int, world: int, port: int, speech: torch.Tensor, text: torch.Tensor, out: dict
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        rows = speech.shape[0] // world
        s = speech[rank * rows : (rank + 1) * rows].clone().requires_grad_(True)
        t = text[rank * rows : (rank + 1) * rows].clone().requires_grad_(True)
        loss = contrastive_loss(s, t, torch.tensor([10.0]), scope="global")
        loss.backward()
        out[rank] = (loss.item(), s.grad.clone(), t.grad.clone())
    finally:
        dist.destroy_process_group()


def run_uneven(
    rank: int,
    world: int,
    port: int,
    speech: torch.Tensor,
    text: torch.Tensor,
    rows: tuple[int, ...],
    scope: str,
    out: dict,
) -> None:
    """Rank r holds rows[r] of the rows (batching duration's uneven ranks)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        first = sum(rows[:rank])
        s = speech[first : first + rows[rank]].clone().requires_grad_(True)
        t = text[first : first + rows[rank]].clone().requires_grad_(True)
        loss = contrastive_loss(s, t, torch.tensor([10.0]), scope=scope, rows=rows)
        loss.backward()
        out[rank] = (loss.item(), s.grad.clone(), t.grad.clone())
    finally:
        dist.destroy_process_group()


def gather_windows(rank: int, world: int, port: int, out: dict) -> None:
    """Each rank reports a window whose iter_ms_p50 is 10 x (rank + 1); rank 0 gathers them."""
    from trainables.distributed import gather_to_rank0
    from trainables.observe.window_metrics import rank_window_fields

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        window = {"rank": rank, "iter_ms_p50": 10.0 * (rank + 1)}
        gathered = gather_to_rank0(window, rank, world)
        out[rank] = rank_window_fields(gathered) if gathered else {}
    finally:
        dist.destroy_process_group()


def train(rank: int, world: int, port: int, config: dict, run_dir: str, out: dict) -> None:
    """The real training loop on gloo ranks without Ray: windows go to ``out[rank]``, and
    checkpoints to ``run_dir`` (where a rerun resumes from the newest complete one)."""
    import time
    from pathlib import Path

    from trainables.config import TrialConfig
    from trainables.loop import WorkerContext, run_training

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    windows: list[dict] = []

    def report(metrics: dict, checkpoint=None) -> None:
        windows.append({k: v for k, v in metrics.items() if isinstance(v, (int, float, str))})

    try:
        run_training(
            TrialConfig.from_dict(config),
            WorkerContext(
                rank=rank,
                world_size=world,
                device=torch.device("cpu"),
                report=report,
                start_ts=time.time(),
                run_dir=Path(run_dir),
            ),
        )
        out[rank] = windows
    finally:
        dist.destroy_process_group()
