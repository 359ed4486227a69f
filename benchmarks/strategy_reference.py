"""The stage-1 workload trained the way each strategy's own authors show it, outside the platform
(issue 42): a reference to hold the platform's DDP, FSDP2 and DeepSpeed ZeRO engines against.

    torchrun --standalone --nproc_per_node N -m benchmarks.strategy_reference --strategy ddp
    torchrun --standalone --nproc_per_node N -m benchmarks.strategy_reference --strategy fsdp2
    deepspeed --num_gpus N --module benchmarks.strategy_reference --strategy zero1   # or zero2

It imports nothing of this project (no ``platform``, no ``trainables``): the two encoders are
built here from transformers' configs (wav2vec2-base and bert-base, LayerDrop and SpecAugment
off, SDPA attention), mean-pooled speech frames and the text [CLS] state are projected into one
space and trained with a CLIP loss over the global batch (an all-gather with a gradient).
The batch is one made-up batch of the given shape (every row full length, so wav2vec2 gets no
padding mask, as the platform's loader leaves it out of such a batch; BERT's mask of ones),
made on the device once (no DataLoader: the
strategy's own cost, not the input pipeline's). Each strategy as its documentation sets it up:

- ``ddp``: ``DistributedDataParallel`` (25 MB buckets), fp32 weights, autocast to bf16, fused
  AdamW.
- ``fsdp2``: torchtitan's way: ``fully_shard`` per transformer block and on the wav2vec2 feature
  encoder, the root last; bf16 parameters, fp32 gradient reduction (``MixedPrecisionPolicy``);
  ``reshard_after_forward`` per block except the last of each encoder (``--reshard-after-forward
  false``: none); ``--prefetch N``: explicit forward and backward prefetch of N blocks.
- ``zero1``, ``zero2``: ``deepspeed.initialize`` with DeepSpeed's bf16 config and its ZeRO
  defaults for the stage (overlapped, contiguous gradients, 5e8-element buckets), the optimizer
  made by DeepSpeed from the config (torch's AdamW: ``torch_adam``, no CUDA op to build).

Rank 0 prints one JSON line: samples/s of each timed window (a device sync at each window's end
only), their median and tail mean, step time, peak memory; ``--json PATH`` writes it too.
``--compile MODE`` compiles each block (the modules ``blocks`` lists) with ``torch.compile`` in
that mode before any wrapping, as torchtitan does (regional compile); ``reduce-overhead`` adds
CUDA graphs, each step marked with ``torch.compiler.cudagraph_mark_step_begin``.

``--loader N`` feeds the steps from a torch ``DataLoader`` instead (as torch's documentation
trains): a dataset that makes each utterance in ``__getitem__`` (seeded random audio and ids),
a collate that stacks them with their masks, ``N`` workers, ``--prefetch-factor``, pinned
memory, each batch copied to the device with ``non_blocking``: the input pipeline's own cost
on the host, which the platform's runs also pay.

``--profile PATH`` adds a torch profiler window of ``--profile-steps`` steps (after one warm-up
step) on rank 0 after the timed ones: a Chrome trace with each step's forward, backward and
optimizer marked, which benchmarks/step_profile.py summarises.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

STRATEGIES = ("ddp", "fsdp2", "zero1", "zero2")


def build_model(size: str, proj_dim: int = 256):
    import math

    import torch
    from torch import nn
    from transformers import BertConfig, BertModel, Wav2Vec2Config, Wav2Vec2Model

    tiny_speech = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(32,) * 7,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
    )
    tiny_text = dict(
        vocab_size=1000,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    speech = Wav2Vec2Model(
        Wav2Vec2Config(
            **(tiny_speech if size == "tiny" else {}),
            layerdrop=0.0,
            mask_time_prob=0.0,
            mask_feature_prob=0.0,
            attn_implementation="sdpa",
        )
    )
    text = BertModel(
        BertConfig(**(tiny_text if size == "tiny" else {}), attn_implementation="sdpa"),
        add_pooling_layer=False,
    )

    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.speech, self.text = speech, text
            self.speech_proj = nn.Linear(speech.config.hidden_size, proj_dim)
            self.text_proj = nn.Linear(text.config.hidden_size, proj_dim)
            self.logit_scale = nn.Parameter(torch.full((1,), math.log(1 / 0.07)))

        def forward(self, audio, audio_mask, input_ids, text_mask):
            del audio_mask  # every row full length (module docstring)
            frames = self.speech(audio).last_hidden_state.mean(1)
            cls = self.text(input_ids, attention_mask=text_mask).last_hidden_state[:, 0]
            return (
                nn.functional.normalize(self.speech_proj(frames), dim=-1),
                nn.functional.normalize(self.text_proj(cls), dim=-1),
                self.logit_scale.exp().clamp(max=100.0),
            )

    return Pair()


def clip_loss(speech, text, scale):
    """Symmetric InfoNCE over the global batch: the local rows against every rank's."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    class Gather(torch.autograd.Function):
        """all_gather whose backward gives each rank the summed gradient of its own rows."""

        @staticmethod
        def forward(ctx, x):
            parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
            dist.all_gather(parts, x.contiguous())
            return torch.cat(parts)

        @staticmethod
        def backward(ctx, grad):
            grad = grad.contiguous()
            dist.all_reduce(grad)
            rows = grad.shape[0] // dist.get_world_size()
            return grad[dist.get_rank() * rows : (dist.get_rank() + 1) * rows]

    speech, text, scale = speech.float(), text.float(), scale.float()
    every_speech, every_text = Gather.apply(speech), Gather.apply(text)
    labels = torch.arange(speech.shape[0], device=speech.device) + dist.get_rank() * len(speech)
    return (
        F.cross_entropy(scale * speech @ every_text.T, labels)
        + F.cross_entropy(scale * text @ every_speech.T, labels)
    ) / 2


def blocks(model) -> list:
    """The modules torchtitan shards one by one: each transformer block of both encoders, and
    the wav2vec2 feature encoder (its 7 convolutions: a block of their own)."""
    return [model.speech.feature_extractor, *model.speech.encoder.layers, *model.text.encoder.layer]


def setup(args, device):
    """(model callable, backward, step) of the strategy, as its documentation does it."""
    import torch

    dtype = torch.bfloat16 if device.type == "cuda" else None
    model = build_model(args.model_size).to(device)
    if args.compile:  # torchtitan's regional compile: block by block, before any wrapping
        for unit in blocks(model):
            unit.compile(mode=None if args.compile == "default" else args.compile)
    if args.strategy == "ddp":
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=25
        )
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4, fused=device.type == "cuda")

        def forward(*batch):
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                return ddp(*batch)

        return forward, lambda loss: loss.backward(), _torch_step(opt)
    if args.strategy == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        units = blocks(model)
        last = {model.speech.encoder.layers[-1], model.text.encoder.layer[-1]}
        for unit in units:
            reshard = args.reshard_after_forward and unit not in last
            fully_shard(unit, mp_policy=policy, reshard_after_forward=reshard)
        fully_shard(model, mp_policy=policy, reshard_after_forward=args.reshard_after_forward)
        if args.prefetch:
            for i, unit in enumerate(units):
                unit.set_modules_to_forward_prefetch(units[i + 1 : i + 1 + args.prefetch])
                unit.set_modules_to_backward_prefetch(units[max(0, i - args.prefetch) : i][::-1])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
        return model, lambda loss: loss.backward(), _torch_step(opt)
    import deepspeed

    config = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": dtype is not None},
        "zero_optimization": {
            "stage": int(args.strategy[-1]),
            "overlap_comm": True,
            "contiguous_gradients": True,
            "reduce_scatter": True,
            "reduce_bucket_size": 5e8,
            "allgather_bucket_size": 5e8,
        },
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 1e-4, "weight_decay": 0.01, "torch_adam": True},
        },
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )

    def forward(audio, *rest):
        return engine(audio.to(dtype) if dtype is not None else audio, *rest)

    return forward, engine.backward, engine.step


def _torch_step(opt):
    def step() -> None:
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


class SyntheticItems:
    """Seeded random utterances made per item (a map-style dataset: ``__getitem__`` and
    ``__len__``), like a real corpus' decoding in a loader's workers."""

    def __init__(self, n: int, audio: int, tokens: int, vocab: int):
        self.n, self.audio, self.tokens, self.vocab = n, audio, tokens, vocab

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch

        g = torch.Generator().manual_seed(i)
        return (
            0.1 * torch.randn(self.audio, generator=g),
            torch.randint(
                1000 if self.vocab > 2000 else 1, self.vocab, (self.tokens,), generator=g
            ),
        )


def collate(items):
    import torch

    audio = torch.stack([a for a, _ in items])
    ids = torch.stack([t for _, t in items])
    return audio, torch.ones_like(audio, dtype=torch.bool), ids, torch.ones_like(ids)


def loader_batches(args, device, vocab: int):
    """Batches forever from a DataLoader of ``args.loader`` workers, copied to ``device``."""
    from torch.utils.data import DataLoader

    data = SyntheticItems(
        args.micro_batch * 64, int(args.audio_s * 16_000), args.text_tokens, vocab
    )
    loader = DataLoader(
        data,
        batch_size=args.micro_batch,
        shuffle=True,
        drop_last=True,
        num_workers=args.loader,
        prefetch_factor=args.prefetch_factor,
        persistent_workers=True,
        pin_memory=device.type == "cuda",
        collate_fn=collate,
    )
    while True:
        for cpu_batch in loader:
            yield tuple(t.to(device, non_blocking=True) for t in cpu_batch)


def init(args):
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", args.local_rank or 0))
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    if args.strategy.startswith("zero"):
        import deepspeed

        deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    else:
        dist.init_process_group("nccl" if on_gpu else "gloo")
    return device


def train(args) -> dict | None:
    import torch
    import torch.distributed as dist

    device = init(args)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    forward, backward, step = setup(args, device)
    g = torch.Generator(device="cpu").manual_seed(rank)
    audio = (0.1 * torch.randn(args.micro_batch, int(args.audio_s * 16_000), generator=g)).to(
        device
    )
    vocab = 1000 if args.model_size == "tiny" else 30522
    ids = torch.randint(1000 if vocab > 2000 else 1, vocab, (args.micro_batch, args.text_tokens))
    ids = ids.to(device)
    # Masks of ones, as the platform's synthetic dataset gives them (every row full length).
    batch = (audio, torch.ones_like(audio, dtype=torch.bool), ids, torch.ones_like(ids))
    feed = loader_batches(args, device, vocab) if args.loader else None

    from torch.profiler import record_function

    cudagraphs = args.compile == "reduce-overhead" and device.type == "cuda"

    def one_step() -> None:
        nonlocal batch
        if cudagraphs:  # a new step: the graphs' outputs of the last one may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        if feed is not None:
            batch = next(feed)
        # The phases benchmarks/step_profile.py splits a profiled step into.
        with record_function("forward"):
            loss = clip_loss(*forward(*batch))
        with record_function("backward"):
            backward(loss)
        with record_function("optimizer"):
            step()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(args.warmup_steps):
        one_step()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    windows = []
    for _ in range(args.steps // args.window):
        t0 = time.perf_counter()
        for _ in range(args.window):
            one_step()
        sync()  # note: the one device sync of a window
        windows.append(args.window * args.micro_batch * world / (time.perf_counter() - t0))
    if args.profile and rank == 0:
        _profile(one_step, sync, args.profile_steps, args.profile)
    elif args.profile:
        for _ in range(args.profile_steps + 1):  # the collectives rank 0's profiled steps wait on
            one_step()
        sync()
    dist.barrier()
    result = None
    if rank == 0:
        tail = windows[-args.tail :]
        median = statistics.median(windows)
        result = {
            "strategy": args.strategy,
            "world_size": world,
            "micro_batch": args.micro_batch,
            "audio_s": args.audio_s,
            "text_tokens": args.text_tokens,
            "model_size": args.model_size,
            "reshard_after_forward": args.reshard_after_forward,
            "prefetch": args.prefetch,
            "loader_workers": args.loader,
            "compile": args.compile or "eager",
            "samples_per_s_windows": [round(w, 1) for w in windows],
            "samples_per_s_median": round(median, 1),
            "tail_samples_per_s": round(sum(tail) / len(tail), 1),
            "step_ms_median": round(1e3 * args.micro_batch * world / median, 1),
            "peak_mem_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
            if device.type == "cuda"
            else 0.0,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
        }
    dist.destroy_process_group()
    return result


def _profile(one_step, sync, steps: int, path: Path) -> None:
    """A torch profiler window of ``steps`` steps after one warm-up step, each under its
    ``ProfilerStep#`` span (steps are marked only under a schedule): a Chrome trace."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    path.parent.mkdir(parents=True, exist_ok=True)
    with profile(
        activities=activities,
        schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),
    ) as prof:
        for i in range(steps + 1):
            one_step()
            if i == steps:
                sync()  # one sync, at the end: the steps run as they do unprofiled
            prof.step()


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--strategy", choices=STRATEGIES, required=True)
    p.add_argument("--model-size", choices=("base", "tiny"), default="base")
    p.add_argument("--micro-batch", type=int, default=128, help="rows per GPU")
    p.add_argument("--audio-s", type=float, default=2.0)
    p.add_argument("--text-tokens", type=int, default=48)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--steps", type=int, default=60, help="timed steps")
    p.add_argument("--window", type=int, default=10, help="steps per timed window")
    p.add_argument("--tail", type=int, default=3, help="windows in the tail mean")
    p.add_argument(
        "--reshard-after-forward",
        type=lambda v: v.lower() in ("1", "true", "yes"),
        default=True,
        help="fsdp2: free gathered parameters after each block's forward (true|false)",
    )
    p.add_argument("--prefetch", type=int, default=0, help="fsdp2: blocks prefetched explicitly")
    p.add_argument(
        "--compile",
        choices=("default", "reduce-overhead"),
        help="regional torch.compile of every block in this mode (default: eager)",
    )
    p.add_argument("--loader", type=int, default=0, help="DataLoader workers (0: one batch)")
    p.add_argument("--prefetch-factor", type=int, default=4, help="with --loader")
    p.add_argument("--profile", type=Path, help="rank 0: a profiler trace of extra steps here")
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--json", type=Path, help="rank 0: write the result here")
    p.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)  # DeepSpeed's launcher
    args = p.parse_args(argv)
    if args.steps < args.window or args.steps % args.window:
        p.error(f"--steps {args.steps} must be a positive multiple of --window {args.window}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    result = train(args)
    if result is not None:
        print(json.dumps(result), flush=True)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
