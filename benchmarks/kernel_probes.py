"""Small probes of the kernels an MFU budget names (issue 56), each variant timed alone on the
GPU, forward and backward, by CUDA events (median of ``--iters``), variants alternated:

- ``attention``: scaled_dot_product_attention at the encoders' shapes (speech frames at 2 s and
  3 s, text tokens) on each SDPA backend (flash, cuDNN, efficient, math) and math compiled;
- ``groupnorm``: the GEMM feature encoder's first-layer GroupNorm + GELU (per item and channel,
  over time, on (batch, rows, channels)) as ``trainables.model.extractor`` runs it, eager and
  compiled, beside the time its memory traffic needs at the copy bandwidth measured here.
  Forms measured no faster, so not kept (2026-11-29, one H200, mb 256, 2 s / 3 s, compiled,
  ms): as built 12.82 / 25.55; the sums in two stages over blocks of 64 rows 17.47 / 30.72; on
  a transposed copy (time contiguous) 12.76 / 25.50; one autograd function keeping only its
  bfloat16 input and the statistics, its backward written out, 12.53 / 26.72 (eager 80.9
  against 57.9 at 2 s) (benchmarks/results/mfu_levers_1xh200/).

    python -m benchmarks.kernel_probes [attention] [groupnorm] [--micro-batch 256] [--iters 20]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.mfu_budget import timed_ms
from trainables.model.extractor import _group_norm_over_time

CUDA = torch.device("cuda")


BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


def attention(args: argparse.Namespace) -> None:
    print("| attention (fwd+bwd, one layer), ms | " + " | ".join(BACKENDS) + " | math compiled |")
    print("| --- |" + " --- |" * (len(BACKENDS) + 1))
    for name, seq in {"speech 2 s": 99, "speech 3 s": 149, "text": 64}.items():
        cells = _attention_cells(args.micro_batch, seq, args.iters)
        print(f"| {name} ({seq}) | " + " | ".join(cells) + " |")


def _attention_cells(batch: int, seq: int, iters: int) -> list[str]:
    """One shape (batch, 12 heads, seq, 64) on each backend, then math compiled."""
    shape = (batch, 12, seq, 64)
    q, k, v = (
        torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    cells = []
    for backend in BACKENDS.values():

        def step(backend=backend):
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k, v)
            out.backward(grad)

        try:
            cells.append(f"{timed_ms(step, CUDA, 3, iters):.3f}")
        except RuntimeError as exc:  # a backend that does not take this shape
            cells.append(f"n/a ({str(exc).splitlines()[0][:40]})")

    def math(q, k, v):
        scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
        return scores.softmax(-1) @ v

    compiled = torch.compile(math)
    cells.append(f"{timed_ms(lambda: compiled(q, k, v).backward(grad), CUDA, 3, iters):.3f}")
    return cells


def _group_norm_gelu(hidden: torch.Tensor, frames: int, norm: nn.GroupNorm) -> torch.Tensor:
    """The first layer's GroupNorm and GELU as the GEMM feature encoder runs them."""
    return F.gelu(_group_norm_over_time(hidden, frames, norm)).to(hidden.dtype)


def groupnorm(args: argparse.Namespace) -> None:
    norm = nn.GroupNorm(512, 512).cuda()
    bandwidth = _bandwidth()
    print("| GroupNorm + GELU, first layer (fwd+bwd) | eager ms | compiled ms | floor ms |")
    print("| --- | --- | --- | --- |")
    for name, frames in {"2 s": 6399, "3 s": 9599}.items():
        rows = -(-frames // 64) * 64
        cells = _groupnorm_cells(norm, args.micro_batch, rows, frames, args.iters)
        # The floor: forward reads x twice (statistics, normalisation) and writes y; backward
        # reads x and the gradient twice (sums, input gradient) and writes it; in bfloat16.
        floor = 9 * args.micro_batch * rows * 512 * 2 / bandwidth * 1e3
        print(f"| {name} ({args.micro_batch} x {rows} x 512) | {' | '.join(cells)} | {floor:.2f} |")


def _groupnorm_cells(norm: nn.GroupNorm, batch: int, rows: int, frames: int, iters: int):
    x = torch.randn(batch, rows, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn_like(x)

    def eager(h):
        return _group_norm_gelu(h, frames, norm)

    fns = {"eager": eager, "compiled": torch.compile(eager)}
    ms: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(3):  # alternated
        for k, fn in fns.items():
            ms[k].append(timed_ms(lambda fn=fn: fn(x).backward(grad), CUDA, 3, iters))
    return [f"{statistics.median(ms[k]):.3f}" for k in fns]


def _bandwidth() -> float:
    """The GPU's memory bandwidth in bytes per second, by a large device-to-device copy."""
    a = torch.empty(2**30, device="cuda", dtype=torch.uint8)
    b = torch.empty_like(a)
    ms = timed_ms(lambda: b.copy_(a), CUDA, 3, 10)
    return 2 * a.numel() / (ms / 1e3)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.kernel_probes", description=__doc__.split("\n")[0])
    p.add_argument("probes", nargs="*", help="attention, groupnorm (default: both)")
    p.add_argument("--micro-batch", type=int, default=256)
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args(argv)
    probes = {"attention": attention, "groupnorm": groupnorm}
    unknown = [name for name in args.probes if name not in probes]
    if unknown:
        p.error(f"probes: {', '.join(unknown)} unknown; choose from {', '.join(probes)}")
    if not torch.cuda.is_available():
        print("kernel_probes: no CUDA device; run it on a GPU")
        return 2
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name in args.probes or list(probes):
        probes[name](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
