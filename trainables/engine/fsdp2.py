"""The FSDP2 engine: torch's per-parameter sharding (``torch.distributed.fsdp.fully_shard``) of
the wav2vec2 feature encoder, every transformer layer of both encoders, and the rest of the
model at the root. ``fsdp_reshard_after_forward`` true frees each layer's gathered parameters
after its forward and gathers them again for the backward (what ZeRO-3 does); false keeps them
from the forward to the backward (ZeRO-2's memory for parameters, less communication).

Precision: the sharded parameters stay in their load dtype (fp32 by default, the optimizer's
master weights); a mixed-precision policy gathers them in the compute dtype (bf16 or fp16) and
reduces gradients in fp32. fp16 scales the loss with the sharded gradient scaler, which agrees
across ranks on whether a step overflowed. Accumulation micro-batches skip the reduce-scatter
(``set_requires_gradient_sync``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from trainables.config import TrialConfig
from trainables.engine.compile import compile_regions
from trainables.engine.core import Engine, EngineParts, assemble_engine
from trainables.engine.ddp import optimizer_step, scaled_backward
from trainables.engine.optim import build_optimizer, build_scheduler
from trainables.engine.precision import DTYPES

__all__ = ["shard_model", "wrap_fsdp2"]


def shard_model(cfg: TrialConfig, model: torch.nn.Module, precision: str) -> torch.nn.Module:
    """``model`` sharded in place, region by region (the regions regional compilation uses),
    then at the root; returns it (now an FSDPModule)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(
        param_dtype=None if precision == "fp32" else DTYPES[precision],
        reduce_dtype=torch.float32,
    )
    for region in compile_regions(model):
        fully_shard(region, reshard_after_forward=cfg.fsdp_reshard_after_forward, mp_policy=policy)
    # The root: its own parameters (projections, temperature, embeddings) stay gathered after
    # the forward; the backward needs them at once.
    fully_shard(model, reshard_after_forward=False, mp_policy=policy)
    return model


def wrap_fsdp2(cfg: TrialConfig, parts: EngineParts, lap: Callable[[str], object]) -> Engine:
    """``parts`` sharded with FSDP2 (its regions compiled in place, with torch_compile); the
    optimizer is made again over the sharded parameters; ``lap("wrap")`` when done."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    model, device = shard_model(cfg, parts.model, parts.precision), parts.device
    # The optimizer build_engine made holds the unsharded parameters fully_shard replaced.
    optimizer = build_optimizer(cfg, model.parameters(), device.type == "cuda")
    compiled = dict(parts.compiled)
    if cfg.torch_compile:  # compile_scope layers (config_checks): each region in place
        regions = compile_regions(model, cfg.compile_pos_conv)
        for region in regions:
            region.compile(**parts.compile_kwargs)

        def to_eager() -> torch.nn.Module:
            for region in regions:
                region._compiled_call_impl = None
            return model

        compiled["_to_eager"] = to_eager
    lap("wrap")
    scaler = ShardedGradScaler(device.type, enabled=parts.precision == "fp16")
    scheduler = build_scheduler(optimizer, cfg)

    @contextlib.contextmanager
    def no_sync():
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    return assemble_engine(
        parts,
        kind="fsdp2",
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=scaler,
        no_sync=no_sync,
        backward=scaled_backward(cfg, scaler),
        step=optimizer_step(cfg, model, optimizer, scaler, scheduler),
        # The policy casts the parameters; floating inputs follow the compute dtype.
        inputs_dtype=parts.precision,
        compiled=compiled,
    )
