"""The GEMM feature encoder's first GroupNorm and GELU as four Triton kernels (issue 56).

wav2vec2-base normalises its first convolution's output per item and channel over time (a
``GroupNorm`` with one group per channel), then applies GELU. On the GEMM encoder's
(batch, rows, channels) activations that is a reduction over the strided axis; compiled by
Inductor, forward and backward took 12.8 ms at mb 256 and 2 s on an H200 for memory traffic the
copy bandwidth moves in about 3 ms (benchmarks/results/mfu_levers_1xh200/). Here each pass reads
tiles of (rows, channels), channels contiguous, and the statistics are partial sums:

- forward: ``_stats`` sums ``x - shift`` and its square per item and channel over a slice of the
  kept rows (``shift``: the item's first row, so the float32 variance ``E[d^2] - E[d]^2`` does not
  cancel where the mean is large beside the spread); ``_apply`` writes ``gelu(xhat * w + b)`` in
  the input's dtype, zero on the rows past ``frames``;
- backward: ``_grad_sums`` sums ``g = dy * gelu'(z)`` and ``g * xhat`` per item and channel (the
  weight's and bias's gradients are their sums over the batch); ``_grad_apply`` writes
  ``dx = rstd * w * (g - mean(g) - xhat * mean(g * xhat))``, zero past ``frames``.

Two reads and a write forward, four reads and a write backward, in the input's dtype; the
statistics stay in float32 (as autocast runs group_norm). The kernels are registered as
``torch.library.triton_op`` so torch.compile keeps them in its graph (and its CUDA graphs).
``available(device)`` says where they run: a CUDA tensor and Triton installed; the CPU test suite runs
them under Triton's interpreter (``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton: the encoder keeps its compiled torch form
    triton = None

__all__ = ["TILES", "Tile", "available", "group_norm_gelu"]


@dataclass(frozen=True)
class Tile:
    """A kernel's tile (rows x channels, channels contiguous) and warps; the reductions also
    the programs they aim for (each item's rows split in slices where the batch is small)."""

    rows: int
    cols: int
    warps: int
    programs: int = 0


# Measured on an H200 at mb 256, 2 s and 3 s (benchmarks.kernel_probes groupnorm --tiles).
TILES = {"reduce": Tile(32, 128, 8, programs=4096), "apply": Tile(32, 128, 4)}


def available(device: torch.device) -> bool:
    """Whether the kernels can run on ``device``: Triton installed, and a CUDA device or
    Triton's interpreter."""
    if triton is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def group_norm_gelu(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, frames: int, eps: float
) -> torch.Tensor:
    """``gelu(group_norm(x))`` per item and channel over the first ``frames`` rows of ``x``
    (batch, rows, channels), in ``x``'s dtype, zero on the rows past ``frames``."""
    return torch.ops.stage1.group_norm_gelu(x, weight, bias, frames, eps)[0]


if triton is not None:

    @triton.jit
    def _gelu_parts(z):
        """GELU (exact, erf) of ``z`` and its derivative."""
        cdf = 0.5 * (1.0 + tl.erf(z * 0.7071067811865476))
        pdf = tl.exp(-0.5 * z * z) * 0.3989422804014327
        return z * cdf, cdf + z * pdf

    @triton.jit
    def _stats(
        x_ptr,
        sum_ptr,
        sq_ptr,
        rows,
        frames,
        per_split,
        splits,
        C: tl.constexpr,
        BR: tl.constexpr,
        BC: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BC + tl.arange(0, BC)
        ok = cols < C
        split = tl.program_id(2)
        base = x_ptr + b * rows * C
        shift = tl.load(base + cols, mask=ok).to(tl.float32)[None, :]
        acc = tl.zeros([BR, BC], dtype=tl.float32)
        acc2 = tl.zeros([BR, BC], dtype=tl.float32)
        start = split * per_split
        end = tl.minimum(start + per_split, frames)
        for r0 in range(start, end, BR):
            r = r0 + tl.arange(0, BR)
            keep = (r < end)[:, None] & ok[None, :]
            x = tl.load(base + r[:, None].to(tl.int64) * C + cols[None, :], mask=keep)
            d = tl.where(keep, x.to(tl.float32) - shift, 0.0)
            acc += d
            acc2 += d * d
        out = (b * splits + split) * C + cols
        tl.store(sum_ptr + out, tl.sum(acc, axis=0), mask=ok)
        tl.store(sq_ptr + out, tl.sum(acc2, axis=0), mask=ok)

    @triton.jit
    def _apply(
        x_ptr,
        y_ptr,
        mean_ptr,
        rstd_ptr,
        w_ptr,
        bias_ptr,
        rows,
        frames,
        C: tl.constexpr,
        BR: tl.constexpr,
        BC: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        r = tl.program_id(1) * BR + tl.arange(0, BR)
        cols = tl.program_id(2) * BC + tl.arange(0, BC)
        ok = cols < C
        inside = (r < rows)[:, None] & ok[None, :]
        at = b * rows * C + r[:, None].to(tl.int64) * C + cols[None, :]
        x = tl.load(x_ptr + at, mask=inside).to(tl.float32)
        mean = tl.load(mean_ptr + b * C + cols, mask=ok)[None, :]
        rstd = tl.load(rstd_ptr + b * C + cols, mask=ok)[None, :]
        w = tl.load(w_ptr + cols, mask=ok)[None, :]
        y, _ = _gelu_parts((x - mean) * rstd * w + tl.load(bias_ptr + cols, mask=ok)[None, :])
        y = tl.where((r < frames)[:, None], y, 0.0)
        tl.store(y_ptr + at, y.to(y_ptr.dtype.element_ty), mask=inside)

    @triton.jit
    def _grad_sums(
        dy_ptr,
        x_ptr,
        mean_ptr,
        rstd_ptr,
        w_ptr,
        bias_ptr,
        g_ptr,
        gx_ptr,
        rows,
        frames,
        per_split,
        splits,
        C: tl.constexpr,
        BR: tl.constexpr,
        BC: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BC + tl.arange(0, BC)
        ok = cols < C
        split = tl.program_id(2)
        mean = tl.load(mean_ptr + b * C + cols, mask=ok)[None, :]
        rstd = tl.load(rstd_ptr + b * C + cols, mask=ok)[None, :]
        w = tl.load(w_ptr + cols, mask=ok)[None, :]
        bias = tl.load(bias_ptr + cols, mask=ok)[None, :]
        acc = tl.zeros([BR, BC], dtype=tl.float32)
        acc2 = tl.zeros([BR, BC], dtype=tl.float32)
        start = split * per_split
        end = tl.minimum(start + per_split, frames)
        for r0 in range(start, end, BR):
            r = r0 + tl.arange(0, BR)
            keep = (r < end)[:, None] & ok[None, :]
            at = b * rows * C + r[:, None].to(tl.int64) * C + cols[None, :]
            x = tl.load(x_ptr + at, mask=keep).to(tl.float32)
            dy = tl.load(dy_ptr + at, mask=keep).to(tl.float32)
            xhat = (x - mean) * rstd
            _, slope = _gelu_parts(xhat * w + bias)
            g = tl.where(keep, dy * slope, 0.0)
            acc += g
            acc2 += g * xhat
        out = (b * splits + split) * C + cols
        tl.store(g_ptr + out, tl.sum(acc, axis=0), mask=ok)
        tl.store(gx_ptr + out, tl.sum(acc2, axis=0), mask=ok)

    @triton.jit
    def _grad_apply(
        dy_ptr,
        x_ptr,
        dx_ptr,
        mean_ptr,
        rstd_ptr,
        w_ptr,
        bias_ptr,
        mg_ptr,
        mgx_ptr,
        rows,
        frames,
        C: tl.constexpr,
        BR: tl.constexpr,
        BC: tl.constexpr,
    ):
        b = tl.program_id(0).to(tl.int64)
        r = tl.program_id(1) * BR + tl.arange(0, BR)
        cols = tl.program_id(2) * BC + tl.arange(0, BC)
        ok = cols < C
        inside = (r < rows)[:, None] & ok[None, :]
        at = b * rows * C + r[:, None].to(tl.int64) * C + cols[None, :]
        x = tl.load(x_ptr + at, mask=inside).to(tl.float32)
        dy = tl.load(dy_ptr + at, mask=inside).to(tl.float32)
        stat = b * C + cols
        mean = tl.load(mean_ptr + stat, mask=ok)[None, :]
        rstd = tl.load(rstd_ptr + stat, mask=ok)[None, :]
        w = tl.load(w_ptr + cols, mask=ok)[None, :]
        xhat = (x - mean) * rstd
        _, slope = _gelu_parts(xhat * w + tl.load(bias_ptr + cols, mask=ok)[None, :])
        mg = tl.load(mg_ptr + stat, mask=ok)[None, :]
        mgx = tl.load(mgx_ptr + stat, mask=ok)[None, :]
        dx = tl.where((r < frames)[:, None], rstd * w * (dy * slope - mg - xhat * mgx), 0.0)
        tl.store(dx_ptr + at, dx.to(dx_ptr.dtype.element_ty), mask=inside)

    def reduce_grid(batch: int, channels: int, frames: int, t: Tile) -> tuple[tuple, int, int]:
        """A reduction over each item's rows in tiles ``t``: its grid (item, channel block,
        slice), the row slices per item (enough programs to fill the GPU, at least four tiles a
        slice) and the rows each slice holds (a multiple of the tile). folded_layer's backward
        shares it."""
        per_item = triton.cdiv(channels, t.cols)
        splits = max(
            1, min(triton.cdiv(t.programs, batch * per_item), triton.cdiv(frames, 4 * t.rows))
        )
        per_split = triton.cdiv(triton.cdiv(frames, splits), t.rows) * t.rows
        splits = triton.cdiv(frames, per_split)
        return (batch, per_item, splits), splits, per_split

    def _apply_grid(batch: int, rows: int, channels: int) -> tuple:
        t = TILES["apply"]
        return (batch, triton.cdiv(rows, t.rows), triton.cdiv(channels, t.cols))

    def _check(x: torch.Tensor, frames: int) -> None:
        if x.dim() != 3 or not 0 < frames <= x.shape[1] or not x.is_contiguous():
            raise ValueError(
                f"group_norm_gelu: x must be (batch, rows, channels) and contiguous, with "
                f"0 < frames <= rows; got {tuple(x.shape)}, frames {frames}"
            )

    @torch.library.triton_op("stage1::group_norm_gelu", mutates_args={})
    def _forward(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, frames: int, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        _check(x, frames)
        batch, rows, channels = x.shape
        grid, splits, per_split = reduce_grid(batch, channels, frames, TILES["reduce"])
        part = x.new_empty((2, batch, splits, channels), dtype=torch.float32)
        t = TILES["reduce"]
        torch.library.wrap_triton(_stats)[grid](
            x,
            part[0],
            part[1],
            rows,
            frames,
            per_split,
            splits,
            C=channels,
            BR=t.rows,
            BC=t.cols,
            num_warps=t.warps,
        )
        sums = part.sum(dim=2)
        d_mean = sums[0] / frames
        var = (sums[1] / frames - d_mean * d_mean).clamp_min(0.0)
        mean = x[:, 0].float() + d_mean
        rstd = torch.rsqrt(var + eps)
        y = torch.empty_like(x)
        t = TILES["apply"]
        torch.library.wrap_triton(_apply)[_apply_grid(batch, rows, channels)](
            x,
            y,
            mean,
            rstd,
            weight.float().contiguous(),
            bias.float().contiguous(),
            rows,
            frames,
            C=channels,
            BR=t.rows,
            BC=t.cols,
            num_warps=t.warps,
        )
        return y, mean, rstd

    @torch.library.triton_op("stage1::group_norm_gelu_backward", mutates_args={})
    def _backward(
        dy: torch.Tensor,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        mean: torch.Tensor,
        rstd: torch.Tensor,
        frames: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, rows, channels = x.shape
        dy = dy.contiguous()
        w = weight.float().contiguous()
        b = bias.float().contiguous()
        grid, splits, per_split = reduce_grid(batch, channels, frames, TILES["reduce"])
        part = x.new_empty((2, batch, splits, channels), dtype=torch.float32)
        t = TILES["reduce"]
        torch.library.wrap_triton(_grad_sums)[grid](
            dy,
            x,
            mean,
            rstd,
            w,
            b,
            part[0],
            part[1],
            rows,
            frames,
            per_split,
            splits,
            C=channels,
            BR=t.rows,
            BC=t.cols,
            num_warps=t.warps,
        )
        sums = part.sum(dim=2)  # (2, batch, channels): sum g, sum g * xhat
        dx = torch.empty_like(x)
        t = TILES["apply"]
        torch.library.wrap_triton(_grad_apply)[_apply_grid(batch, rows, channels)](
            dy,
            x,
            dx,
            mean,
            rstd,
            w,
            b,
            sums[0] / frames,
            sums[1] / frames,
            rows,
            frames,
            C=channels,
            BR=t.rows,
            BC=t.cols,
            num_warps=t.warps,
        )
        totals = sums.sum(dim=1)
        return dx, totals[1].to(weight.dtype, copy=True), totals[0].to(bias.dtype, copy=True)

    def _setup_context(ctx, inputs, output) -> None:
        x, weight, bias, frames, _ = inputs
        _, mean, rstd = output
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.frames = frames

    def _grad(ctx, dy, _dmean, _drstd):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        dx, dw, db = torch.ops.stage1.group_norm_gelu_backward(
            dy, x, weight, bias, mean, rstd, ctx.frames
        )
        return dx, dw, db, None, None

    _forward.register_autograd(_grad, setup_context=_setup_context)
