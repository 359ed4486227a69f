"""Two gloo ranks compute the global contrastive loss on their halves of a fixed batch."""

import os

import torch
import torch.distributed as dist

from trainables.model import contrastive_loss


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
