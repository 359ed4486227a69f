"""Attention over short sequences in one tile of keys (the ``triton_short`` attention kind,
issue 56).

Both encoders attend over short sequences: about 99 frames for 2 s of speech, 149 for 3 s, and
64 text tokens, with 12 heads of 64. At these lengths the general kernels run far below what
the work needs. On an H200 at mb 512, cuDNN's attention took 17.4 ms of a 193 ms step, for
1.3 % of the step's FLOPs (benchmarks/results/folded_layer_1xh200/sweep_call3_kernels.md). One
layer's forward and backward at mb 256 took 0.60 ms, while its memory floor (q, k, v, o and
their gradients read or written once) is about 0.1 ms (benchmarks/results/mfu_levers_1xh200/).

Here every key of a (batch, head) fits in one tile of ``BN`` rows (the next power of two of
the length, at most 256). So no running maximum or rescaling is needed, as it is in a flash
kernel that walks key blocks:
- forward: each program takes ``BM`` queries of one (batch, head); it scores them against all
  keys, takes the softmax in float32 and multiplies by the values. It writes the output in
  (batch, length, heads, head size), the layout the encoder's output projection reads, so no
  transpose copy follows. It keeps the log-sum-exp of each row for the backward.
- backward: one program a (batch, head) loads its keys and values once, then walks its query
  blocks. For each it recomputes the probabilities from the log-sum-exp, writes the queries'
  gradient, and adds to the keys' and values' gradients in float32 registers, stored once at
  the end: no atomics, and no second pass.

The products run on tensor cores (``tl.dot``) in the inputs' dtype with float32 accumulation,
and the softmax in float32: the same arithmetic as a flash kernel, equal to float rounding. No
mask, no dropout, no causal attention: the kind sends calls with any of them to transformers'
SDPA (crop buckets pad nothing, and dropout 0 is the fastest point's). Registered as
``torch.library.triton_op``, so torch.compile keeps the kernels in its graph and its CUDA
graphs. The CPU test suite runs them under Triton's interpreter.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton: the kind falls back to SDPA
    triton = None

__all__ = ["MAX_LENGTH", "fits", "short_attention"]

MAX_LENGTH = 256  # the longest sequence whose keys fit one tile
HEAD_SIZES = (16, 32, 64, 128)  # tl.dot's dimensions: powers of two, at least 16
BLOCK_M = 64  # queries a forward program, and a backward program's step
LOG2E = 1.4426950408889634


def fits(query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether a (batch, heads, length, head size) call can run here: the same length for
    queries and keys, at most MAX_LENGTH, a head size of HEAD_SIZES, fp16 or bf16 (or float32
    under the interpreter, for the tests)."""
    length, head = query.shape[-2], query.shape[-1]
    return (
        query.dim() == 4
        and key.shape == query.shape
        and 0 < length <= MAX_LENGTH
        and head in HEAD_SIZES
        and query.dtype in (torch.float16, torch.bfloat16, torch.float32)
    )


def short_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """softmax(q k' * scale) v for (batch, heads, length, head size) inputs, returned as
    (batch, length, heads, head size). ``scale``: head size ** -0.5 when None."""
    if scale is None:
        scale = query.shape[-1] ** -0.5
    out = torch.ops.stage1.short_attention(query, key, value, float(scale))[0]
    return out.transpose(1, 2)  # a view: its memory is (batch, length, heads, head size)


def _block_n(length: int) -> int:
    return max(16, triton.next_power_of_2(length))


def _warps(block_n: int) -> int:
    return 4 if block_n <= 64 else 8


if triton is not None:

    @triton.jit
    def _forward_kernel(
        Q, K, V, OUT, LSE,
        sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos,
        H, S, scale,
        BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
    ):  # fmt: skip
        bh = tl.program_id(0)
        b, h = bh // H, bh % H
        rows = tl.program_id(1) * BM + tl.arange(0, BM)
        keys = tl.arange(0, BN)
        d = tl.arange(0, D)
        row_ok, key_ok = rows < S, keys < S
        q = tl.load(
            Q + b * sqb + h * sqh + rows[:, None] * sqs + d[None, :],
            mask=row_ok[:, None], other=0.0,
        )  # fmt: skip
        k = tl.load(
            K + b * skb + h * skh + keys[:, None] * sks + d[None, :],
            mask=key_ok[:, None], other=0.0,
        )  # fmt: skip
        v = tl.load(
            V + b * svb + h * svh + keys[:, None] * svs + d[None, :],
            mask=key_ok[:, None], other=0.0,
        )  # fmt: skip
        s = tl.dot(q, tl.trans(k)) * (scale * 1.4426950408889634)  # base-2 logits
        s = tl.where(key_ok[None, :], s, float("-inf"))
        m = tl.max(s, 1)
        p = tl.exp2(s - m[:, None])
        total = tl.sum(p, 1)
        o = tl.dot(p.to(v.dtype), v) / total[:, None]
        tl.store(
            OUT + b * sob + h * soh + rows[:, None] * sos + d[None, :],
            o.to(OUT.dtype.element_ty), mask=row_ok[:, None],
        )  # fmt: skip
        tl.store(LSE + bh * BN + rows, m + tl.log2(total), mask=row_ok)

    @triton.jit
    def _backward_kernel(
        Q, K, V, OUT, DO, LSE, DQ, DK, DV,
        sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos, sdb, sdh, sds,
        H, S, scale,
        BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
    ):  # fmt: skip
        bh = tl.program_id(0)
        b, h = bh // H, bh % H
        keys = tl.arange(0, BN)
        d = tl.arange(0, D)
        key_ok = keys < S
        k = tl.load(
            K + b * skb + h * skh + keys[:, None] * sks + d[None, :],
            mask=key_ok[:, None], other=0.0,
        )  # fmt: skip
        v = tl.load(
            V + b * svb + h * svh + keys[:, None] * svs + d[None, :],
            mask=key_ok[:, None], other=0.0,
        )  # fmt: skip
        dk = tl.zeros((BN, D), dtype=tl.float32)
        dv = tl.zeros((BN, D), dtype=tl.float32)
        # The gradients are stored as (batch, length, heads, head size), like the output.
        grad_at = b * sob + h * soh + d[None, :]
        for start in range(0, BN, BM):
            rows = start + tl.arange(0, BM)
            row_ok = rows < S
            q = tl.load(
                Q + b * sqb + h * sqh + rows[:, None] * sqs + d[None, :],
                mask=row_ok[:, None], other=0.0,
            )  # fmt: skip
            o = tl.load(
                OUT + b * sob + h * soh + rows[:, None] * sos + d[None, :],
                mask=row_ok[:, None], other=0.0,
            )  # fmt: skip
            do = tl.load(
                DO + b * sdb + h * sdh + rows[:, None] * sds + d[None, :],
                mask=row_ok[:, None], other=0.0,
            )  # fmt: skip
            lse = tl.load(LSE + bh * BN + rows, mask=row_ok, other=0.0)
            s = tl.dot(q, tl.trans(k)) * (scale * 1.4426950408889634)
            p = tl.exp2(s - lse[:, None])
            p = tl.where(row_ok[:, None] & key_ok[None, :], p, 0.0)
            dv += tl.dot(tl.trans(p.to(do.dtype)), do)
            dp = tl.dot(do, tl.trans(v))
            delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
            ds = (p * (dp - delta[:, None])).to(q.dtype)
            dq = tl.dot(ds, k) * scale
            tl.store(
                DQ + grad_at + rows[:, None] * sos, dq.to(DQ.dtype.element_ty),
                mask=row_ok[:, None],
            )  # fmt: skip
            dk += tl.dot(tl.trans(ds), q)
        tl.store(
            DK + grad_at + keys[:, None] * sos, (dk * scale).to(DK.dtype.element_ty),
            mask=key_ok[:, None],
        )  # fmt: skip
        tl.store(
            DV + grad_at + keys[:, None] * sos, dv.to(DV.dtype.element_ty), mask=key_ok[:, None]
        )

    def _last_dim_dense(*tensors: torch.Tensor) -> list[torch.Tensor]:
        return [t if t.stride(-1) == 1 else t.contiguous() for t in tensors]

    def _strides(t: torch.Tensor) -> tuple[int, int, int]:
        """(batch, head, position) strides of a (batch, heads, length, head size) view."""
        return t.stride(0), t.stride(1), t.stride(2)

    @torch.library.triton_op("stage1::short_attention", mutates_args={})
    def _forward(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not fits(query, key) or value.shape != query.shape:
            raise ValueError(
                f"short_attention: query {tuple(query.shape)}, key {tuple(key.shape)}, value "
                f"{tuple(value.shape)} (same shapes, length <= {MAX_LENGTH}, head size of "
                f"{HEAD_SIZES})"
            )
        q, k, v = _last_dim_dense(query, key, value)
        batch, heads, length, head = q.shape
        block_n = _block_n(length)
        # (batch, length, heads, head size), viewed as (batch, heads, length, head size).
        out = q.new_empty((batch, length, heads, head)).transpose(1, 2)
        lse = q.new_empty((batch * heads, block_n), dtype=torch.float32)
        grid = (batch * heads, triton.cdiv(length, BLOCK_M))
        torch.library.wrap_triton(_forward_kernel)[grid](
            q, k, v, out, lse, *_strides(q), *_strides(k), *_strides(v), *_strides(out),
            heads, length, scale, BM=BLOCK_M, BN=block_n, D=head, num_warps=_warps(block_n),
        )  # fmt: skip
        return out, lse

    @torch.library.triton_op("stage1::short_attention_backward", mutates_args={})
    def _backward(
        grad: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        out: torch.Tensor, lse: torch.Tensor, scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        q, k, v, grad = _last_dim_dense(query, key, value, grad)
        batch, heads, length, head = q.shape
        block_n = _block_n(length)
        grads = [q.new_empty((batch, length, heads, head)).transpose(1, 2) for _ in range(3)]
        torch.library.wrap_triton(_backward_kernel)[(batch * heads,)](
            q, k, v, out, grad, lse, *grads, *_strides(q), *_strides(k), *_strides(v),
            *_strides(out), *_strides(grad), heads, length, scale, BM=BLOCK_M, BN=block_n,
            D=head, num_warps=_warps(block_n),
        )  # fmt: skip
        return grads[0], grads[1], grads[2]

    def _setup_context(ctx, inputs, output) -> None:
        query, key, value, scale = inputs
        out, lse = output
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.scale = scale

    def _grad(ctx, grad_out, _grad_lse):
        query, key, value, out, lse = ctx.saved_tensors
        dq, dk, dv = torch.ops.stage1.short_attention_backward(
            grad_out, query, key, value, out, lse, ctx.scale
        )
        return dq, dk, dv, None

    _forward.register_autograd(_grad, setup_context=_setup_context)
