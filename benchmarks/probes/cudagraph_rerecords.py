"""CUDA graphs (compile_mode reduce-overhead) of compiled layers, plain against FSDP2, with
what trainables/engine/compile_watch.py counts per window (issue 53: FSDP2 with regional
compile and reduce-overhead ran at 107 samples/s on 2x H200, against 1,030 with compile_mode
default):

    python -m benchmarks.probes.cudagraph_rerecords [plain fsdp2 fsdp2_keep] [--windows 3] \
        [--steps 5]

Four transformer layers, each compiled on its own (the platform's compile_scope layers), in one
process on one GPU (a process group of one: FSDP2 gathers and frees as it does on more).
``plain``: the layers as they are; ``fsdp2``: each layer and the root sharded with bf16
parameters, each layer's gathered parameters freed after its forward; ``fsdp2_keep``: kept
until after the backward (fsdp_reshard_after_forward false). Like the platform: a warm-up of
three forward and backward passes (CUDA graph trees warm up, record, replay), then windows of
optimizer steps. Each window prints its ms per step and the watch's counts: the plain layers
should replay (no recording after the warm-up); FSDP2 frees and gathers its parameters into
new memory, so cudagraph trees would record the layers again at every step
(pytorch/pytorch#183451). Not yet measured on a GPU.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from trainables.engine.compile_watch import CompileWatch

VARIANTS = ("plain", "fsdp2", "fsdp2_keep")


def _model(variant: str) -> nn.Module:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    layers = [nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True) for _ in range(4)]
    model = nn.Sequential(*layers).cuda()
    if variant != "plain":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in layers:
            fully_shard(layer, mp_policy=policy, reshard_after_forward=variant == "fsdp2")
        fully_shard(model, mp_policy=policy, reshard_after_forward=False)
    for layer in layers:
        layer.compile(mode="reduce-overhead", dynamic=False)
    return model


def run(variant: str, windows: int, steps: int) -> None:
    import torch._dynamo

    torch._dynamo.reset()
    model = _model(variant)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8, 128, 256, device="cuda")

    def forward_backward() -> None:
        torch.compiler.cudagraph_mark_step_begin()
        model(x).float().pow(2).mean().backward()

    with CompileWatch(cudagraphs=True) as watch:
        for _ in range(3):  # the platform's compile warm-up: three passes, no optimizer step
            forward_backward()
            model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        watch.forget(skips=False)
        for window in range(windows):
            t0 = time.perf_counter()
            for _ in range(steps):
                forward_backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) / steps * 1e3
            print(f"{variant} window {window}: {ms:.1f} ms/step {watch.take()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="*", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}", flush=True)
    try:
        for variant in args.variants:
            run(variant, args.windows, args.steps)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
