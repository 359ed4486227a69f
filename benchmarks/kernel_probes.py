"""Small probes of the kernels an MFU budget names (issue 56), each variant timed alone on the
GPU, forward and backward, by CUDA events (median of ``--iters``), variants alternated:

- ``attention``: scaled_dot_product_attention at the encoders' shapes (speech frames at 2 s and
  3 s, text tokens) on each SDPA backend (flash, cuDNN, efficient, math) and math compiled;
- ``groupnorm``: the GEMM feature encoder's first-layer GroupNorm + GELU (per item and channel,
  over time, on (batch, rows, channels)) as ``trainables.model.extractor`` runs it with torch
  ops (eager, compiled) and as ``trainables.model.norm_gelu``'s Triton kernels (eager,
  compiled), each checked against eager, beside the time its memory traffic needs at the copy
  bandwidth measured here; ``--trace N`` lists each form's top kernels;
- ``tiles``: the Triton kernels' tiles, each reduction tile, then each apply tile, timed;
- ``posconv``: wav2vec2's positional convolution, cuDNN's against the block-Toeplitz products
  at block lengths 4, 8 and 16, the matrix built by the skew trick and by ``unfold``;
- ``firstlayer``: the feature encoder's whole first layer (convolution, GroupNorm, GELU),
  unfolded (torch ops; norm_gelu's kernels) and folded (folded_layer), beside the folded form's
  floor; ``--tiles`` times folded_layer's tiles;
- ``extractor``: the whole GEMM feature encoder, its strided convolutions as strided_conv's ops
  against the torch form they replaced (at mb 256 and ``--micro-batch``);
- ``autotune``: a speech layer, a text layer and the GEMM feature encoder compiled by default
  and with max-autotune-no-cudagraphs (the ``compile_mode`` lever), q, k and v fused.
  Forms measured no faster, so not kept (2026-11-29, one H200, mb 256, 2 s / 3 s, compiled,
  ms): as built 12.82 / 25.55; the sums in two stages over blocks of 64 rows 17.47 / 30.72; on
  a transposed copy (time contiguous) 12.76 / 25.50; one autograd function keeping only its
  bfloat16 input and the statistics, its backward written out, 12.53 / 26.72 (eager 80.9
  against 57.9 at 2 s) (benchmarks/results/mfu_levers_1xh200/).

    python -m benchmarks.kernel_probes [attention] [groupnorm] [tiles] [posconv] [autotune]
        [firstlayer] [extractor] [--micro-batch 256] [--frames 99 149] [--iters 20] [--trace N] [--tiles]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from benchmarks.mfu_budget import timed_ms
from trainables.model.extractor import _first_conv, _group_norm_over_time
from trainables.model.norm_gelu import Tile, group_norm_gelu

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
    with torch.no_grad():  # trained-looking affine parameters, so a wrong gradient shows
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    bandwidth = _bandwidth()
    forms = ("eager", "compiled", "triton", "triton compiled")
    print(f"| GroupNorm + GELU, first layer (fwd+bwd), ms | {' | '.join(forms)} | floor |")
    print("| --- |" + " --- |" * (len(forms) + 1))
    for name, frames in {"2 s": 6399, "3 s": 9599}.items():
        rows = -(-frames // 64) * 64
        cells = _groupnorm_cells(norm, args.micro_batch, rows, frames, args.iters, args.trace)
        # The floor: forward reads x twice (statistics, normalisation) and writes y; backward
        # reads x and the gradient twice (sums, input gradient) and writes it; in bfloat16.
        floor = 8 * args.micro_batch * rows * 512 * 2 / bandwidth * 1e3
        print(f"| {name} ({args.micro_batch} x {rows} x 512) | {' | '.join(cells)} | {floor:.2f} |")


def _groupnorm_cells(
    norm: nn.GroupNorm, batch: int, rows: int, frames: int, iters: int, trace: int
):
    x = torch.randn(batch, rows, 512, device="cuda", dtype=torch.bfloat16) * 3 + 5
    x.requires_grad_(True)
    grad = torch.randn_like(x)

    def eager(h):
        return _group_norm_gelu(h, frames, norm)

    def fused(h):
        return group_norm_gelu(h, norm.weight, norm.bias, frames, norm.eps)

    fns = {
        "eager": eager,
        "compiled": torch.compile(eager),
        "triton": fused,
        "triton compiled": torch.compile(fused),
    }
    _agree(fns, x, grad, norm)
    ms: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(3):  # alternated
        for k, fn in fns.items():
            ms[k].append(timed_ms(lambda fn=fn: fn(x).backward(grad), CUDA, 3, iters))
    if trace:
        for k in ("compiled", "triton"):
            _kernels(lambda fn=fns[k]: fn(x).backward(grad), f"{k}, {batch} x {rows}", trace)
    return [f"{statistics.median(ms[k]):.3f}" for k in fns]


def _agree(fns, x, grad, norm) -> None:
    """Each form's output and gradients against eager's, as the largest difference over the
    largest value (a wrong kernel shows here, before its time is printed)."""
    results = {}
    for k, fn in fns.items():
        for p in (x, norm.weight, norm.bias):
            p.grad = None
        y = fn(x)
        y.backward(grad)
        results[k] = [y.detach(), x.grad.clone(), norm.weight.grad.clone(), norm.bias.grad.clone()]
    ref = results["eager"]
    for k, got in results.items():
        diffs = [
            f"{n} {(a.float() - b.float()).abs().max().item() / b.float().abs().max().item():.1e}"
            for n, a, b in zip(("y", "dx", "dw", "db"), got, ref, strict=True)
        ]
        print(f"<!-- {k} vs eager (max diff / max): {', '.join(diffs)} -->")
    for p in (x, norm.weight, norm.bias):
        p.grad = None


def _kernels(step, label: str, top: int) -> None:
    """The kernels of ``step`` by GPU time, per call (torch.profiler over 5 calls)."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    from torch.autograd import DeviceType

    rows = [e for e in prof.key_averages() if getattr(e, "device_type", None) == DeviceType.CUDA]
    rows.sort(key=lambda e: -e.device_time_total)
    print(f"\n{label}: kernels, ms per call of the step")
    for e in rows[:top]:
        print(f"  {e.device_time_total / 5 / 1e3:7.3f}  x{e.count // 5:<3} {e.key[:110]}")
    print()


FOLD_TILES = {  # (rows, cols, warps[, programs]) of folded_layer's forward / backward kernel
    "forward": ((128, 64, 4), (64, 64, 4), (64, 128, 4), (128, 32, 4), (256, 64, 8), (128, 64, 8)),
    "backward": ((64, 64, 4, 8192), (32, 64, 4, 8192), (64, 32, 4, 16384), (128, 64, 4, 8192),
                 (64, 64, 4, 16384), (64, 64, 2, 8192), (32, 32, 2, 16384), (64, 128, 4, 4096)),
}  # fmt: skip


def firstlayer(args: argparse.Namespace) -> None:
    """The GEMM feature encoder's whole first layer (convolution, GroupNorm, GELU), forward and
    backward, at mb ``--micro-batch`` on 2 s and 3 s of audio: unfolded as the encoder runs it
    with torch ops (compiled) and with norm_gelu's kernels (compiled), and folded
    (folded_layer's kernels; eager, compiled), each checked against the unfolded form in
    float32 first; beside the folded form's floor (one bfloat16 write of the output forward, one
    read of its gradient backward, at the copy bandwidth measured here). ``--tiles``: each of
    folded_layer's tiles (FOLD_TILES) in turn, the others fixed."""
    from trainables.model import folded_layer

    conv = nn.Conv1d(1, 512, 10, 5, bias=False).cuda()
    norm = nn.GroupNorm(512, 512).cuda()
    with torch.no_grad():  # trained-looking affine parameters, so a wrong gradient shows
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    params = [conv.weight, norm.weight, norm.bias]
    bandwidth = _bandwidth()
    bf16 = torch.bfloat16

    def unfolded(audio, rows, frames, dtype=bf16):
        hidden = _first_conv(audio.to(dtype), conv, rows)
        return F.gelu(_group_norm_over_time(hidden, frames, norm)).to(dtype)

    def triton_norm(audio, rows, frames):
        hidden = _first_conv(audio.to(bf16), conv, rows)
        return group_norm_gelu(hidden, norm.weight, norm.bias, frames, norm.eps)

    def folded(audio, rows, frames):
        return folded_layer.folded_conv_norm_gelu(audio, conv, norm, rows, frames, bf16)

    fns = {
        "unfolded compiled": torch.compile(unfolded, dynamic=False),
        "triton compiled": torch.compile(triton_norm, dynamic=False),
        "folded": folded,
        "folded compiled": torch.compile(folded, dynamic=False),
    }
    print(f"| first layer (fwd+bwd), ms, mb {args.micro_batch} | {' | '.join(fns)} | floor |")
    print("| --- |" + " --- |" * (len(fns) + 1))
    for name, seconds in {"2 s": 2, "3 s": 3}.items():
        samples = 16000 * seconds
        frames = (samples - 10) // 5 + 1
        rows = -(-frames // 64) * 64
        audio = torch.randn(args.micro_batch, samples, device="cuda") * 0.1
        grad = torch.randn(args.micro_batch, rows, 512, device="cuda", dtype=bf16)
        steps = {k: _first_layer_step(fn, audio, rows, frames, grad) for k, fn in fns.items()}
        want = [unfolded(audio, rows, frames, torch.float32)]
        want += torch.autograd.grad(want[0], params, grad.float())
        for k, fn in fns.items():
            got = [fn(audio, rows, frames)]
            got += torch.autograd.grad(got[0], params, grad)
            diffs = [
                f"{n} {(a.float() - b).abs().max().item() / b.abs().max().item():.1e}"
                for n, a, b in zip(("y", "dw", "dgamma", "dbeta"), got, want, strict=True)
            ]
            print(f"<!-- {k} vs float32 unfolded (max diff / max): {', '.join(diffs)} -->")
        del want
        ms: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(3):  # alternated
            for k, step in steps.items():
                ms[k].append(timed_ms(step, CUDA, 3, args.iters))
        floor = 2 * args.micro_batch * rows * 512 * 2 / bandwidth * 1e3
        cells = " | ".join(f"{statistics.median(ms[k]):.3f}" for k in fns)
        print(f"| {name} ({args.micro_batch} x {rows} x 512) | {cells} | {floor:.2f} |", flush=True)
        if args.trace:
            for k in ("triton compiled", "folded compiled"):
                _kernels(steps[k], f"{k}, {name}", args.trace)
        if args.tiles:
            _fold_tiles(steps["folded"], args.iters)
        torch._dynamo.reset()


def _first_layer_step(fn, audio, *args):
    """One forward and backward of a form on these inputs (the output's gradient last)."""
    *inputs, grad = args
    return lambda: fn(audio, *inputs).backward(grad)


def _fold_tiles(step, iters: int) -> None:
    """Each forward tile, then each backward tile (the other kernel's as built), eager."""
    from trainables.model import folded_layer

    built = dict(folded_layer.TILES)
    for kind, options in FOLD_TILES.items():
        for tile in options:
            folded_layer.TILES[kind] = Tile(*tile)
            print(
                f"<!-- tile {kind} {tile}: {timed_ms(step, CUDA, 3, iters):.3f} ms -->", flush=True
            )
        folded_layer.TILES.update(built)


def _strided_conv_torch(hidden: torch.Tensor, conv: nn.Conv1d, dtype: torch.dtype) -> torch.Tensor:
    """The strided convolution as the GEMM encoder ran it before strided_conv's ops: torch ops,
    the later tap groups added into the output by ``out[:-q] +=`` (compiled: a functional copy,
    and a scatter into a zero-filled buffer backward)."""
    kernel, stride = conv.kernel_size[0], conv.stride[0]
    batch, rows, channels = hidden.shape
    flat = hidden.reshape(batch * rows // stride, stride * channels)
    weight = conv.weight.to(dtype)
    out = None
    for q in range(-(-kernel // stride)):
        taps = min(stride, kernel - q * stride)
        w = (
            weight[:, :, q * stride : q * stride + taps]
            .permute(2, 1, 0)
            .reshape(-1, weight.shape[0])
        )
        if q == 0:
            out = torch.matmul(flat[:, : taps * channels], w)
        else:
            out[:-q] += torch.matmul(flat[q:, : taps * channels], w)
    return out.view(batch, rows // stride, -1)


def extractor(args: argparse.Namespace) -> None:
    """wav2vec2-base's GEMM feature encoder whole (its first layer folded where it can run),
    compiled, forward and backward on 2 s of audio: its strided convolutions as strided_conv's
    ops (accumulating in place) against the torch form they replaced; ``--trace N`` lists each
    form's top kernels."""
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    from trainables.model.extractor import MatmulFeatureEncoder

    class TorchStrided(MatmulFeatureEncoder):
        strided = staticmethod(_strided_conv_torch)

    original = Wav2Vec2Model(Wav2Vec2Config()).feature_extractor.cuda()
    forms = {"ops": MatmulFeatureEncoder(original), "torch form": TorchStrided(original)}
    norms = {k: m.use_norm("folded", CUDA) for k, m in forms.items()}
    print(f"<!-- first layer: {norms} -->")
    print(f"| feature encoder (fwd+bwd, compiled), ms | {' | '.join(forms)} | ratio |")
    print("| --- | --- | --- | --- |")
    for mb in sorted({256, args.micro_batch}):
        audio = torch.randn(mb, 32000, device="cuda") * 0.1
        fns = {}
        for name, module in forms.items():

            def fn(x, module=module):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    return module(x)

            fns[name] = torch.compile(fn, dynamic=False)
        grad = torch.randn_like(fns["ops"](audio))
        a = [fns["ops"](audio)]
        b = [fns["torch form"](audio)]
        params = list(original.parameters())
        a += torch.autograd.grad(a[0], params, grad)
        b += torch.autograd.grad(b[0], params, grad)
        worst = max((x.float() - y.float()).abs().max().item() / y.float().abs().max().item()
                    for x, y in zip(a, b, strict=True))  # fmt: skip
        print(
            f"<!-- mb {mb}: ops vs torch form, largest difference / largest value {worst:.1e} -->"
        )
        steps = {k: _first_layer_step(f, audio, grad) for k, f in fns.items()}
        ms: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(3):  # alternated
            for k, step in steps.items():
                ms[k].append(timed_ms(step, CUDA, 3, args.iters))
        x, y = (statistics.median(ms[k]) for k in fns)
        print(f"| mb {mb}, 2 s | {x:.3f} | {y:.3f} | {y / x:.3f} |", flush=True)
        if args.trace:
            for k, step in steps.items():
                _kernels(step, f"{k}, mb {mb}", args.trace)
        torch._dynamo.reset()


POSCONV_BLOCKS = (4, 8, 16)  # block_for picks 8 at the best point; 16 was its old choice


def _toeplitz_unfold(weight: torch.Tensor, block: int, window: int, left: int) -> torch.Tensor:
    """The block-Toeplitz matrix as pos_conv built it before the skew trick: sliding windows
    of the padded kernel (``unfold``), whose backward scatters into the taps."""
    kernel = weight.shape[-1]
    before = left * block - kernel // 2 + block - 1
    after = block - 1 + window - before - kernel
    return F.pad(weight, (before, after)).unfold(-1, window, 1).flip(-2)


def posconv(args: argparse.Namespace) -> None:
    """wav2vec2-base's positional convolution (768 channels, 16 groups, kernel 128), compiled,
    forward and backward at ``--frames``: transformers' convolution (cuDNN) and the
    block-Toeplitz products at block lengths 4, 8, 16, with the matrix built by the skew trick
    (as pos_conv does) and by ``unfold`` (as it did). (A dense form, one block holding every
    frame and reading no neighbour, measured 46.6 / 142.6 ms against block 16's 4.8 / 5.7: its
    Toeplitz matrix of every frame costs far more than its products save;
    benchmarks/results/extractor_norm_1xh200/posconv_call7.md.)"""
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    from trainables.model.pos_conv import MatmulPositionalConv, block_for

    class UnfoldPositionalConv(MatmulPositionalConv):
        toeplitz = staticmethod(_toeplitz_unfold)

    conv = Wav2Vec2Model(Wav2Vec2Config()).encoder.pos_conv_embed.cuda()
    forms: dict[str, nn.Module] = {"conv": conv}
    for block in POSCONV_BLOCKS:
        for form, cls in (("skew", MatmulPositionalConv), ("unfold", UnfoldPositionalConv)):
            forms[f"{block} {form}"] = module = cls(conv)  # the same parameters
            module.block = block
    head = f"| pos conv (fwd+bwd, compiled), ms, mb {args.micro_batch} | {' | '.join(forms)} |"
    print(head + " block_for |")
    print("| --- |" + " --- |" * (len(forms) + 1))
    for frames in args.frames:
        x = torch.randn(args.micro_batch, frames, 768, device="cuda", dtype=torch.bfloat16)
        x.requires_grad_(True)
        grad = torch.randn_like(x)
        fns = {}
        for name, module in forms.items():

            def fn(h, module=module):
                with torch.autocast("cuda", dtype=torch.bfloat16):  # as the model runs it
                    return module(h)

            fns[name] = torch.compile(fn, dynamic=False)
        ms: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(3):  # alternated
            for k, fn in fns.items():
                step = lambda fn=fn, x=x, grad=grad: fn(x).backward(grad)  # noqa: E731
                ms[k].append(timed_ms(step, CUDA, 3, args.iters))
        cells = [f"{statistics.median(ms[k]):.3f}" for k in fns]
        chosen = block_for(args.micro_batch, frames, 128, 768, 16)
        print(f"| {frames} frames | {' | '.join(cells)} | {chosen} |", flush=True)
        torch._dynamo.reset()


def autotune(args: argparse.Namespace) -> None:
    """Each part of the best point (a speech layer at ``--frames[0]`` frames, a text layer at 64
    tokens, the GEMM feature encoder on that much audio; q, k and v fused), compiled by default
    and with max-autotune-no-cudagraphs (Inductor times Triton GEMM templates against cuBLAS for
    every GEMM shape and can fuse pointwise work into them), forward and backward, ms,
    alternated; each line as soon as its part is measured, with both compile times."""
    import time

    from trainables.engine.linear_fusion import set_linear_fusion
    from trainables.model.extractor import use_extractor_layout
    from trainables.model.stage1 import build_model

    set_linear_fusion(True)
    model = build_model("base", 256, dropout=0.0).cuda()
    use_extractor_layout(model.speech, "matmul", "auto")
    mb, frames = args.micro_batch, args.frames[0]
    audio_samples = (frames + 1) * 320
    parts = {
        "speech layer": (model.speech.encoder.layers[0], (mb, frames, 768)),
        "text layer": (model.text.encoder.layer[0], (mb, 64, 768)),
        "feature encoder": (model.speech.feature_extractor, (mb, audio_samples)),
    }
    print(
        f"| part, mb {mb} (fwd+bwd, ms) | default | max-autotune-no-cudagraphs | ratio | compile s |"
    )
    print("| --- | --- | --- | --- | --- |")
    for name, (module, shape) in parts.items():
        x = torch.randn(*shape, device="cuda")
        x.requires_grad_(name != "feature encoder")

        def fn(h, module=module):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = module(h)
            return out[0] if isinstance(out, tuple) else out

        fns, compile_s = {}, {}
        for mode in ("default", "max-autotune-no-cudagraphs"):
            fns[mode] = torch.compile(fn, mode=None if mode == "default" else mode, dynamic=False)
            t0 = time.perf_counter()
            fns[mode](x).float().square().mean().backward()
            torch.cuda.synchronize()
            compile_s[mode] = time.perf_counter() - t0
        ms: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(3):  # alternated
            for k, f in fns.items():
                step = lambda f=f, x=x: f(x).float().square().mean().backward()  # noqa: E731
                ms[k].append(timed_ms(step, CUDA, 3, args.iters))
        a, b = (statistics.median(ms[k]) for k in fns)
        seconds = " / ".join(f"{compile_s[k]:.0f}" for k in fns)
        print(f"| {name} | {a:.3f} | {b:.3f} | {a / b:.3f} | {seconds} |", flush=True)
        torch._dynamo.reset()


REDUCE_TILES = (
    (32, 128, 4, 2048),
    (32, 64, 4, 4096),
    (32, 128, 8, 4096),
    (16, 128, 4, 4096),
    (32, 128, 8, 8192),
    (16, 128, 8, 8192),
    (32, 64, 4, 8192),
    (64, 128, 8, 4096),
)
APPLY_TILES = (
    (32, 128, 4),
    (64, 64, 4),
    (16, 128, 4),
    (32, 128, 2),
    (16, 128, 2),
    (32, 64, 2),
    (16, 256, 4),
    (8, 256, 2),
)


def tiles(args: argparse.Namespace) -> None:
    """norm_gelu's tiles: each reduction tile with the apply tile fixed, then each apply tile
    with the best reduction tile, forward and backward at 2 s and 3 s (sum of the two)."""
    from trainables.model import norm_gelu

    norm = nn.GroupNorm(512, 512).cuda()
    shapes = {}
    for frames in (6399, 9599):
        x = (
            torch.randn(
                args.micro_batch, -(-frames // 64) * 64, 512, device="cuda", dtype=torch.bfloat16
            )
            * 3
            + 5
        )
        shapes[frames] = (x.requires_grad_(True), torch.randn_like(x))

    def run(frames):
        x, grad = shapes[frames]
        x.grad = None
        y = group_norm_gelu(x, norm.weight, norm.bias, frames, norm.eps)
        y.backward(grad)
        return y.detach(), x.grad

    def measure(label):
        cells, diffs = [], []
        for frames in shapes:
            y, dx = run(frames)
            ref = reference.setdefault(frames, (y.float(), dx.float()))
            diffs.append(
                max(
                    (y.float() - ref[0]).abs().max().item(),
                    (dx.float() - ref[1]).abs().max().item(),
                )
            )
            cells.append(timed_ms(lambda f=frames: run(f), CUDA, 3, args.iters))
        print(
            f"| {label} | {cells[0]:.3f} | {cells[1]:.3f} | {sum(cells):.3f} | {max(diffs):.1e} |"
        )
        return sum(cells)

    reference: dict = {}
    print("| tile (rows, cols, warps[, programs]) | 2 s ms | 3 s ms | sum | max diff |")
    print("| --- | --- | --- | --- | --- |")
    found = {}
    for tile in REDUCE_TILES:
        norm_gelu.TILES["reduce"] = norm_gelu.Tile(*tile)
        found[tile] = measure(f"reduce {tile}")
    best_reduce = min(found, key=found.get)
    norm_gelu.TILES["reduce"] = norm_gelu.Tile(*best_reduce)
    found = {}
    for tile in APPLY_TILES:
        norm_gelu.TILES["apply"] = norm_gelu.Tile(*tile)
        found[tile] = measure(f"apply {tile}")
    best_apply = min(found, key=found.get)
    print(f"\nbest: reduce {best_reduce}, apply {best_apply}: {found[best_apply]:.3f} ms")


def _bandwidth() -> float:
    """The GPU's memory bandwidth in bytes per second, by a large device-to-device copy."""
    a = torch.empty(2**30, device="cuda", dtype=torch.uint8)
    b = torch.empty_like(a)
    ms = timed_ms(lambda: b.copy_(a), CUDA, 3, 10)
    return 2 * a.numel() / (ms / 1e3)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.kernel_probes", description=__doc__.split("\n")[0])
    p.add_argument(
        "probes",
        nargs="*",
        help="attention, groupnorm, tiles, posconv, autotune, firstlayer, extractor (default: "
        "the first two)",
    )
    p.add_argument("--micro-batch", type=int, default=256)
    p.add_argument(
        "--frames",
        type=int,
        nargs="+",
        default=[99, 149],
        help="posconv: speech frames (99: 2 s, 149: 3 s); autotune: the first",
    )
    p.add_argument("--iters", type=int, default=20)
    p.add_argument(
        "--trace", type=int, default=0, help="groupnorm, firstlayer: list each form's N top kernels"
    )
    p.add_argument("--tiles", action="store_true", help="firstlayer: time folded_layer's tiles")
    args = p.parse_args(argv)
    probes = {
        "attention": attention,
        "groupnorm": groupnorm,
        "tiles": tiles,
        "posconv": posconv,
        "autotune": autotune,
        "firstlayer": firstlayer,
        "extractor": extractor,
    }
    unknown = [name for name in args.probes if name not in probes]
    if unknown:
        p.error(f"probes: {', '.join(unknown)} unknown; choose from {', '.join(probes)}")
    if not torch.cuda.is_available():
        print("kernel_probes: no CUDA device; run it on a GPU")
        return 2
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name in args.probes or ["attention", "groupnorm"]:
        probes[name](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
