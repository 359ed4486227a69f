"""The optimizer of a run and its learning-rate schedule (linear warm-up, then constant or
cosine decay), as a LambdaLR that DDP steps itself and DeepSpeed at its accumulation
boundaries."""

from __future__ import annotations

import math
import shutil

import torch

from trainables.config import TrialConfig

__all__ = ["build_optimizer", "build_scheduler", "lr_factor"]


def lr_factor(step: int, cfg: TrialConfig) -> float:
    """Learning-rate multiplier after ``step`` optimizer steps: linear warm-up over
    warmup_steps, then constant or a cosine decay to min_lr_ratio at max_steps."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return 1.0
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class _LrFactor:
    """``lr_factor`` bound to a config: a picklable object, so LambdaLR's state_dict keeps it."""

    def __init__(self, cfg: TrialConfig):
        self.cfg = cfg

    def __call__(self, step: int) -> float:
        return lr_factor(step, self.cfg)


def build_scheduler(optimizer, cfg: TrialConfig):
    """The run's schedule over ``optimizer``."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, _LrFactor(cfg))


def build_optimizer(cfg: TrialConfig, params, on_gpu: bool):
    """AdamW of the run's kind: torch's fused (on a GPU) or foreach path, or DeepSpeed's
    FusedAdam (a CUDA extension compiled at start-up, which needs ninja)."""
    if cfg.optimizer == "deepspeed_fused_adam":
        if shutil.which("ninja") is None:
            raise RuntimeError(
                "optimizer deepspeed_fused_adam needs ninja to compile; ninja is missing"
            )
        from deepspeed.ops.adam import FusedAdam

        return FusedAdam(params, lr=cfg.lr, weight_decay=cfg.weight_decay, adam_w_mode=True)
    # torch's fused AdamW (no CUDA extension is compiled at start-up), or its foreach path.
    if cfg.optimizer == "adamw_torch_foreach":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)
    return torch.optim.AdamW(
        params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True if on_gpu else None
    )
