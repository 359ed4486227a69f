"""What this GPU's bf16 GEMMs reach at the model's own shapes: the ceiling an MFU budget's parts
can be held against (issue 56). A transformer layer at ``tokens`` rows is its four GEMM shapes
(q/k/v/o at hidden x hidden, the FFN's two at hidden x 4 hidden), each timed forward
(``x @ W.T``) and as its two backward GEMMs (input gradient and weight gradient), by CUDA events,
median of ``--iters``; the extractor's strided GEMMs likewise, and q/k/v as one GEMM of three
times the width (compile_fuse_linears). The last lines weigh the shapes by their FLOPs per
layer, as built and with q/k/v fused: the TFLOP/s a layer's GEMMs would reach if nothing else
ran.

    python -m benchmarks.gemm_ceiling [--micro-batch 256] [--audio-s 2.0] [--text-tokens 64]
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.mfu_budget import timed_ms
from trainables.engine.mfu import peak_tflops

CUDA = torch.device("cuda")


def gemm_rows(name: str, m: int, k: int, n: int, iters: int, dtype) -> list[tuple]:
    """Forward y[m,n] = x[m,k] @ w[n,k].T, input gradient dx = dy @ w, weight gradient dw = dy.T @ x."""
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    w = torch.randn(n, k, device="cuda", dtype=dtype)
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    flops = 2 * m * k * n
    rows = []
    for kind, fn in (
        ("fwd", lambda: x @ w.t()),
        ("dgrad", lambda: dy @ w),
        ("wgrad", lambda: dy.t() @ x),
    ):
        ms = timed_ms(fn, CUDA, 3, iters)
        rows.append((f"{name} {kind}", m, k, n, ms, flops / ms / 1e9))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.gemm_ceiling", description=__doc__.split("\n")[0])
    p.add_argument("--micro-batch", type=int, default=256)
    p.add_argument("--audio-s", type=float, default=2.0)
    p.add_argument("--text-tokens", type=int, default=64)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gemm_ceiling: no CUDA device; run it on a GPU")
        return 2
    dtype = torch.bfloat16
    peak = peak_tflops(torch.device("cuda"), "bf16")
    h = args.hidden
    frames = int(args.audio_s * 50) - 1
    speech, text = args.micro_batch * frames, args.micro_batch * args.text_tokens
    samples = int(args.audio_s * 16_000)
    shapes = [
        ("speech qkvo", speech, h, h),
        ("speech ffn_in", speech, h, 4 * h),
        ("speech ffn_out", speech, 4 * h, h),
        ("speech qkv_fused", speech, h, 3 * h),
        ("text qkvo", text, h, h),
        ("text ffn_in", text, h, 4 * h),
        ("text ffn_out", text, 4 * h, h),
        ("text qkv_fused", text, h, 3 * h),
        ("extractor conv0 (k10)", args.micro_batch * (samples // 5), 10, 512),
        ("extractor k3 s2 tap", args.micro_batch * (samples // 10), 1024, 512),
        ("extractor k2 s2 tap", args.micro_batch * frames, 1024, 512),
        ("feature projection", speech, 512, h),
    ]
    print(
        f"GPU {torch.cuda.get_device_name()}, bf16 peak {peak:.0f} TFLOP/s, torch {torch.__version__}"
    )
    print("| GEMM | M | K | N | ms | TFLOP/s | % of peak |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    passes: dict[str, tuple[float, float]] = {}  # a shape's three passes: FLOPs, ms
    for name, m, k, n in shapes:
        flops = ms = 0.0
        for row in gemm_rows(name, m, k, n, args.iters, dtype):
            label, m_, k_, n_, ms_, tflops = row
            share = 100 * tflops / peak
            print(f"| {label} | {m_} | {k_} | {n_} | {ms_:.3f} | {tflops:.0f} | {share:.1f} |")
            flops, ms = flops + 2 * m_ * k_ * n_, ms + ms_
        passes[name] = (flops, ms)
    # A layer: q, k, v and o (4 x the qkvo GEMMs) and the FFN's two; with compile_fuse_linears,
    # q, k and v as one GEMM of 3 x the width (trainables/engine/linear_fusion.py), o alone.
    layers = {
        "": {"qkvo": 4, "ffn_in": 1, "ffn_out": 1},
        ", q/k/v fused": {"qkv_fused": 1, "qkvo": 1, "ffn_in": 1, "ffn_out": 1},
    }
    for enc in ("speech", "text"):
        for label, counts in layers.items():
            flops = sum(c * passes[f"{enc} {part}"][0] for part, c in counts.items())
            ms = sum(c * passes[f"{enc} {part}"][1] for part, c in counts.items())
            print(
                f"{enc} layer's GEMMs{label}: {flops / 1e9:.0f} GFLOP in {ms:.3f} ms, "
                f"{flops / ms / 1e9:.0f} TFLOP/s, {100 * flops / ms / 1e9 / peak:.1f} % of peak"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
