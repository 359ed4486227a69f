"""An MFU budget of one training step (issue 56 item 1): where a rank's step goes against the
GPU's bf16 peak, part by part, so the next lever is chosen by the biggest gap.

Every rank of a DDP step does the same compute, so the budget is measured on one GPU at a
point (model size, micro-batch per GPU, audio seconds, text tokens, precision, attention,
compile mode), the model built from its config as the platform builds it. Parts:

- ``extractor``: wav2vec2's convolutional feature encoder on raw 16 kHz audio (7 convolutions,
  GroupNorm after the first, GELU);
- ``speech_encoder``: the feature projection, the positional convolution and the transformer
  layers at ~50 frames per second;
- ``text_encoder``: BERT at ``text_tokens``;
- ``head``: pooling, the two projections, normalisation and the contrastive loss;
- ``optimizer``: the run's AdamW step over every parameter (fused on a GPU).

Each part runs alone, forward and backward with the gradient its output gets in the model,
timed by CUDA events (median of ``--iters`` after ``--warmup``); its FLOPs are counted by
``torch.utils.flop_counter.FlopCounterMode`` over the same forward and backward (the platform's
MFU convention: matmuls, convolutions and attention). Columns: GPU ms per step, share of the
whole step, TFLOP per step, achieved TFLOP/s, % of peak, and ``gap_ms``: the milliseconds the
part takes beyond what its FLOPs need at peak. The whole step (forward, backward and
optimizer, the same inputs) is timed the same way; ``rest`` is the whole step minus the parts'
sum (launch gaps, the memory traffic between parts, and what isolation misses).
Communication and the GPU idle of a real DDP step are not here: join a platform run's profile
with ``--profile TRACE.json`` (benchmarks.step_profile's columns ``comm_exposed`` and
``gpu_idle`` are added as rows).

    python -m benchmarks.mfu_budget --micro-batch 256 --audio-s 2.0 --text-tokens 64 \\
        [--compile none|default|reduce-overhead] [--pos-conv conv|matmul] \\
        [--extractor-layout channels_first|channels_last] [--json OUT.json] \\
        [--fuse-linears] [--profile TRACE.json]

The analytic FLOP formula the counts are checked against is in docs (``flops_formula``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from trainables.engine.linear_fusion import set_linear_fusion
from trainables.engine.mfu import counter, peak_tflops
from trainables.engine.precision import resolve_precision
from trainables.model.extractor import use_extractor_layout
from trainables.model.pos_conv import use_pos_conv
from trainables.model.stage1 import build_model_with_attention, contrastive_loss

PARTS = ("extractor", "speech_encoder", "text_encoder", "head", "optimizer")
SAMPLE_RATE = 16_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks.mfu_budget", description=__doc__.split("\n")[0])
    p.add_argument("--model-size", default="base", choices=("base", "tiny"))
    p.add_argument("--micro-batch", type=int, default=256, help="samples per GPU")
    p.add_argument("--audio-s", type=float, default=2.0, help="seconds of audio per sample")
    p.add_argument("--text-tokens", type=int, default=64)
    p.add_argument("--proj-dim", type=int, default=256)
    p.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp16", "fp32"))
    p.add_argument("--attention", default="sdpa", help="attention kernel of both encoders")
    p.add_argument("--compile", default="none", choices=("none", "default", "reduce-overhead"))
    p.add_argument(
        "--sdpa",
        default="auto",
        choices=("auto", "flash", "cudnn", "efficient", "math"),
        help="the SDPA backend every attention runs on (auto: torch's choice)",
    )
    p.add_argument(
        "--pos-conv",
        default="conv",
        choices=("conv", "matmul"),
        help="wav2vec2's positional convolution (the pos_conv key; FLOPs counted as the conv)",
    )
    p.add_argument(
        "--extractor-layout",
        default="channels_first",
        choices=("channels_first", "channels_last", "matmul"),
        help="wav2vec2's feature encoder layout (the extractor_layout key)",
    )
    p.add_argument(
        "--extractor-norm",
        default="torch",
        choices=("torch", "triton", "folded", "auto"),
        help="the matmul encoder's first layer's norm (the extractor_norm key)",
    )
    p.add_argument("--cudnn-benchmark", action="store_true", help="cuDNN picks its conv kernels")
    p.add_argument(
        "--fuse-linears",
        action="store_true",
        help="compile_fuse_linears: q, k and v as one GEMM (needs --compile)",
    )
    p.add_argument(
        "--no-masks",
        action="store_true",
        help="no attention masks (none is needed when no row is padded, as under crop buckets)",
    )
    p.add_argument(
        "--dropout",
        type=float,
        help="every dropout of both encoders at this rate (default: transformers' 0.1)",
    )
    p.add_argument(
        "--detail",
        action="store_true",
        help="also time the parts' pieces (rows 'part.piece'; transformers' layers: the "
        "extractor's pieces are channels-first whatever --extractor-layout says)",
    )
    p.add_argument(
        "--step-only", action="store_true", help="time the whole step only (no parts: one compile)"
    )
    p.add_argument(
        "--kernels",
        type=int,
        default=0,
        help="also profile 3 whole steps and list the N kernels with the most GPU time",
    )
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--json", type=Path, help="write the rows here too")
    p.add_argument("--profile", type=Path, help="a platform run's profile trace to join")
    args = p.parse_args(argv)
    if args.micro_batch < 2 or args.audio_s <= 0 or args.text_tokens < 2:
        p.error("--micro-batch >= 2, --audio-s > 0 and --text-tokens >= 2")
    if args.fuse_linears and args.compile == "none":
        p.error("--fuse-linears is an Inductor pass: add --compile default (or reduce-overhead)")
    if args.profile is not None and not args.profile.is_file():
        p.error(f"--profile {args.profile}: no such file (a profile-rank0.json of a run)")
    return args


class Point:
    """The model, its inputs and the optimizer at one point, on one device."""

    def __init__(self, args: argparse.Namespace, device: torch.device):
        self.device = device
        self.precision = resolve_precision(args.precision, device)
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
            self.precision
        ]
        model, self.attention = build_model_with_attention(
            args.model_size,
            args.proj_dim,
            speech=args.attention,
            text=args.attention,
            device=device,
            precision=self.precision,
            dropout=args.dropout,  # built in, as the platform's dropout key does
        )
        self.model = model.to(device).train()
        # transformers' modules, on which FLOPs are counted whatever computes them
        self.plain = (model.speech.encoder.pos_conv_embed, model.speech.feature_extractor)
        use_pos_conv(model.speech, args.pos_conv)
        self.extractor_norm = use_extractor_layout(
            model.speech, args.extractor_layout, args.extractor_norm
        )
        self.model.speech.config.mask_time_prob = 0.0  # the platform trains without SpecAugment
        b, n = args.micro_batch, int(args.audio_s * SAMPLE_RATE)
        gen = torch.Generator(device="cpu").manual_seed(0)
        self.audio = torch.randn(b, n, generator=gen).to(device)
        self.audio_mask = torch.ones(b, n, dtype=torch.long, device=device)
        vocab = self.model.text.config.vocab_size
        self.input_ids = torch.randint(vocab // 10, vocab, (b, args.text_tokens), generator=gen).to(
            device
        )
        self.text_mask = torch.ones_like(self.input_ids)
        if args.no_masks:
            self.audio_mask = self.text_mask = None
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=1e-4, fused=True if device.type == "cuda" else None
        )
        self.compile = args.compile
        set_linear_fusion(args.fuse_linears)

    def autocast(self):
        if self.precision == "fp32":
            return torch.autocast(device_type=self.device.type, enabled=False)
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def compiled(self, fn: Callable) -> Callable:
        if self.compile == "none":
            return fn
        compiled = torch.compile(fn, mode=None if self.compile == "default" else self.compile)
        if self.compile != "reduce-overhead":
            return compiled

        def each_call_a_new_step(*args):
            # As the platform's engine does (trainables/engine/core.py): CUDA graphs may reuse
            # the previous call's output memory. Without the mark, a later part's call read an
            # output a replay had overwritten (torch 2.11, H200).
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(*args)

        return each_call_a_new_step


def part_steps(pt: Point) -> dict[str, Callable[[], None]]:
    """Each part's forward and backward alone, on the inputs it gets in the model; the
    optimizer's step on the gradients the last whole step left."""
    speech, text, m = pt.model.speech, pt.model.text, pt.model
    with torch.no_grad(), pt.autocast():
        feats = speech.feature_extractor(pt.audio).detach()
        frames = feats.shape[-1]
        hidden_dim = speech.config.hidden_size
    frame_mask = (
        None
        if pt.audio_mask is None
        else speech._get_feature_vector_attention_mask(frames, pt.audio_mask)
    )

    def extractor_fwd():
        return speech.feature_extractor(pt.audio)

    def encoder_fwd(f):
        hidden, _ = speech.feature_projection(f.transpose(1, 2))
        return speech.encoder(hidden, attention_mask=frame_mask).last_hidden_state

    def text_fwd():
        return text(pt.input_ids, attention_mask=pt.text_mask).last_hidden_state[:, 0]

    def head_fwd(frames_out, cls):
        if frame_mask is None:
            pooled = frames_out.mean(1)
        else:
            fm = frame_mask.unsqueeze(-1).to(frames_out.dtype)
            pooled = (frames_out * fm).sum(1) / fm.sum(1).clamp(min=1.0)
        s = F.normalize(m.speech_proj(pooled), dim=-1)
        t = F.normalize(m.text_proj(cls), dim=-1)
        return contrastive_loss(s, t, m.logit_scale.exp().clamp(1.0, m.logit_scale_max))

    extractor_c, encoder_c = pt.compiled(extractor_fwd), pt.compiled(encoder_fwd)
    text_c, head_c = pt.compiled(text_fwd), pt.compiled(head_fwd)
    b = pt.audio.shape[0]

    def backward_of(out: torch.Tensor) -> None:
        out.backward(torch.ones_like(out) if out.dim() else None)

    def extractor():
        with pt.autocast():
            out = extractor_c()
        backward_of(out.float().sum())

    def speech_encoder():
        f = feats.clone().requires_grad_(True)
        with pt.autocast():
            out = encoder_c(f)
        backward_of(out.float().sum())

    def text_encoder():
        with pt.autocast():
            out = text_c()
        backward_of(out.float().sum())

    # The transformer keeps the extractor's frame count.
    frames_in = torch.randn(b, frames, hidden_dim, device=pt.device, requires_grad=True)
    cls_in = torch.randn(b, text.config.hidden_size, device=pt.device, requires_grad=True)

    def head():
        with pt.autocast():
            loss = head_c(frames_in, cls_in)
        backward_of(loss)

    def optimizer():
        pt.optimizer.step()

    return {
        "extractor": extractor,
        "speech_encoder": speech_encoder,
        "text_encoder": text_encoder,
        "head": head,
        "optimizer": optimizer,
    }


def piece_steps(pt: Point) -> dict[str, Callable[[], None]]:
    """The pieces of the parts (``--detail``), each alone on its input: the first convolution
    with its GroupNorm, the other six; the feature projection with the positional convolution,
    the speech transformer's layers; BERT's embeddings, its layers (unmasked)."""
    speech, text = pt.model.speech, pt.model.text
    convs = speech.feature_extractor.conv_layers
    enc = speech.encoder
    with torch.no_grad(), pt.autocast():
        h0 = convs[0](pt.audio[:, None]).detach()
        feats = speech.feature_extractor(pt.audio).detach()
        hidden = speech.feature_projection(feats.transpose(1, 2))[0].detach()
        emb = text.embeddings(input_ids=pt.input_ids).detach()

    def conv0():
        return convs[0](pt.audio[:, None])

    def conv_rest(x):
        for layer in convs[1:]:
            x = layer(x)
        return x

    def projection_pos(f):
        h = speech.feature_projection(f.transpose(1, 2))[0]
        return enc.layer_norm(h + enc.pos_conv_embed(h))

    def speech_layers(h):
        for layer in enc.layers:
            h = layer(h, attention_mask=None)[0] if _returns_tuple(layer) else layer(h)
        return h

    def text_embeddings():
        return text.embeddings(input_ids=pt.input_ids)

    def text_layers(e):
        return text.encoder(e).last_hidden_state

    def run(fn, inp=None):
        fn = pt.compiled(fn)

        def step():
            x = None if inp is None else inp.clone().requires_grad_(True)
            with pt.autocast():
                out = fn() if x is None else fn(x)
            out.float().sum().backward()

        return step

    return {
        "extractor.conv0_groupnorm": run(conv0),
        "extractor.conv1_6": run(conv_rest, h0),
        "speech_encoder.projection_posconv": run(projection_pos, feats),
        "speech_encoder.layers": run(speech_layers, hidden),
        "text_encoder.embeddings": run(text_embeddings),
        "text_encoder.layers": run(text_layers, emb),
    }


def _returns_tuple(layer) -> bool:
    """transformers 4 encoder layers return a tuple, transformers 5's a tensor."""
    import inspect

    return "output_attentions" in inspect.signature(layer.forward).parameters


def whole_step(pt: Point) -> Callable[[], None]:
    m = pt.model

    def fwd():
        s, t, scale = m(pt.audio, pt.input_ids, pt.audio_mask, pt.text_mask)
        return contrastive_loss(s, t, scale)

    fwd_c = pt.compiled(fwd)

    def step():
        with pt.autocast():
            loss = fwd_c()
        loss.backward()
        pt.optimizer.step()
        pt.optimizer.zero_grad(set_to_none=False)

    return step


def timed_ms(fn: Callable[[], None], device: torch.device, warmup: int, iters: int) -> float:
    """Median milliseconds of ``fn`` (CUDA events on a GPU, the wall clock on the CPU)."""
    import time

    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def counted_flops(fn: Callable[[], None], pt: Point) -> float:
    """The platform's count (torch's counter with its grouped-convolution correction), of the
    convolutions as transformers computes them whatever computes them here (the documented
    formula)."""
    speech = pt.model.speech
    used = (speech.encoder.pos_conv_embed, speech.feature_extractor)
    speech.encoder.pos_conv_embed, speech.feature_extractor = pt.plain
    try:
        return _counted(fn)
    finally:
        speech.encoder.pos_conv_embed, speech.feature_extractor = used


def _counted(fn: Callable[[], None]) -> float:
    mode = counter()
    with mode:
        fn()
    return float(mode.get_total_flops())


def flops_formula(args: argparse.Namespace, speech_cfg, text_cfg) -> dict[str, float]:
    """FLOPs per step by hand (forward + backward = 3x forward, but for the first convolution,
    whose input needs no gradient: 2x): the check on the counter, and the formula in the docs.

    - a 1-D convolution: 2 x C_in x C_out x kernel x T_out per sample;
    - a transformer layer over T positions of width d with FFN width f: 2 x T x (4 d^2 + 2 d f)
      for its matmuls plus 4 x T^2 x d for attention's scores and weighted sum;
    - the contrastive head: 2 x B_global x d_proj x 2 per sample for the two logit matrices.
    """
    b = args.micro_batch
    t = int(args.audio_s * SAMPLE_RATE)
    conv, c_in = 0.0, 1
    for i, (c_out, k, s) in enumerate(
        zip(speech_cfg.conv_dim, speech_cfg.conv_kernel, speech_cfg.conv_stride, strict=True)
    ):
        t = (t - k) // s + 1
        conv += 2 * c_in * c_out * k * t * (2 if i == 0 else 3)
        c_in = c_out

    def layers(n_layers, positions, d, f):
        return n_layers * 3 * (2 * positions * (4 * d * d + 2 * d * f) + 4 * positions**2 * d)

    speech = layers(
        speech_cfg.num_hidden_layers, t, speech_cfg.hidden_size, speech_cfg.intermediate_size
    )
    # The positional convolution pads kernel // 2 on each side: an even kernel gives T + 1
    # outputs (the last is dropped after it).
    k_pos, groups = speech_cfg.num_conv_pos_embeddings, speech_cfg.num_conv_pos_embedding_groups
    pos_t = t + 2 * (k_pos // 2) - k_pos + 1
    pos_conv = 3 * 2 * pos_t * speech_cfg.hidden_size**2 // groups * k_pos
    proj = 3 * 2 * t * speech_cfg.conv_dim[-1] * speech_cfg.hidden_size
    text = layers(
        text_cfg.num_hidden_layers,
        args.text_tokens,
        text_cfg.hidden_size,
        text_cfg.intermediate_size,
    )
    return {
        "extractor": b * conv,
        "speech_encoder": b * (speech + pos_conv + proj),
        "text_encoder": b * text,
        "frames": t,
    }


def budget(args: argparse.Namespace) -> list[dict]:
    """The rows, under the SDPA backend and cuDNN setting asked for."""
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    if args.sdpa == "auto":
        return _budget(args)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[args.sdpa]
    with sdpa_kernel(backend):
        return _budget(args)


def _own_gradients(model: torch.nn.Module) -> None:
    """Every ``.grad`` as a tensor of its own. The first backward hands a parameter its
    gradient as the backward's output; under reduce-overhead that output lives in the CUDA
    graphs' memory, which the parts' graphs then reuse: the extractor part's backward, adding
    into the first convolution's gradient, read it overwritten and failed (torch 2.11, H200).
    Later backwards add into these copies (the gradients are zeroed, never set to None)."""
    for param in model.parameters():
        if param.grad is not None:
            param.grad = param.grad.clone()


def _budget(args: argparse.Namespace) -> list[dict]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    pt = Point(args, device)
    peak = peak_tflops(device, pt.precision)
    whole = whole_step(pt)
    whole()  # gradients for the optimizer's part, and the compiled whole's first call
    _own_gradients(pt.model)
    steps = {} if args.step_only else part_steps(pt)
    rows = []
    for name in steps:
        fn = steps[name]
        ms = timed_ms(fn, device, args.warmup, args.iters)
        pt.model.zero_grad(set_to_none=False)
        flops = 0.0 if name == "optimizer" else counted_flops(fn, pt)
        pt.model.zero_grad(set_to_none=False)
        rows.append(_row(name, ms, flops, peak))
        print(f"  {name}: {ms:.1f} ms", file=sys.stderr, flush=True)
    whole_ms = timed_ms(whole, device, args.warmup, args.iters)
    if args.kernels:
        KERNELS[:] = kernel_rows(whole, args.kernels)
    whole_flops = counted_flops(whole, pt)
    if rows:
        parts_ms = sum(r["gpu_ms"] for r in rows if r["part"] in PARTS)
        rows.append(_row("rest", whole_ms - parts_ms, 0.0, peak))
    rows.append(_row("step", whole_ms, whole_flops, peak))
    if args.detail:
        for name, fn in piece_steps(pt).items():
            ms = timed_ms(fn, device, args.warmup, args.iters)
            rows.append(_row(name, ms, counted_flops(fn, pt), peak))
            pt.model.zero_grad(set_to_none=False)
            print(f"  {name}: {ms:.1f} ms", file=sys.stderr, flush=True)
    for r in rows:
        r["share"] = r["gpu_ms"] / whole_ms if whole_ms else float("nan")
    formula = flops_formula(args, pt.model.speech.config, pt.model.text.config)
    for r in rows:
        if r["part"] in formula:
            r["formula_tflop"] = formula[r["part"]] / 1e12
    return rows


# --kernels: the whole step's top kernels, filled by _budget.
KERNELS: list[dict] = []


def kernel_rows(step: Callable[[], None], n: int) -> list[dict]:
    """The ``n`` kernels with the most GPU time in 3 profiled whole steps."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    from benchmarks.step_profile import read_trace, top_kernels

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
            prof.step()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        return top_kernels(read_trace(trace), n)


def _row(part: str, ms: float, flops: float, peak: float) -> dict:
    tflops = flops / 1e12
    achieved = tflops / (ms / 1e3) if ms > 0 else float("nan")
    need_ms = tflops / peak * 1e3 if peak == peak else float("nan")
    return {
        "part": part,
        "gpu_ms": ms,
        "tflop": tflops,
        "tflops_per_s": achieved,
        "pct_of_peak": 100 * achieved / peak if peak == peak else float("nan"),
        "gap_ms": ms - need_ms if need_ms == need_ms else float("nan"),
    }


def profile_rows(trace: Path) -> list[dict]:
    """The communication the step waited for and the GPU's idle time, from a platform run's
    trace (median per step), as budget rows without FLOPs."""
    from benchmarks.step_profile import read_trace, summarise

    summary = summarise(read_trace(trace))
    return [
        {"part": f"ddp {key}", "gpu_ms": summary[key], "tflop": 0.0, "gap_ms": summary[key]}
        for key in ("comm_exposed", "gpu_idle")
    ]


def table(rows: list[dict], args: argparse.Namespace, peak: float) -> str:
    head = (
        f"MFU budget: {args.model_size}, micro-batch {args.micro_batch}, {args.audio_s} s audio, "
        f"{args.text_tokens} tokens, compile {args.compile}, sdpa {args.sdpa}, cudnn benchmark "
        f"{args.cudnn_benchmark}, masks {not args.no_masks}, dropout {args.dropout}, pos_conv "
        f"{args.pos_conv}, extractor {args.extractor_layout} (norm {args.extractor_norm}); "
        f"peak {peak:.0f} TFLOP/s"
    )
    cols = (
        "part",
        "gpu_ms",
        "share",
        "tflop",
        "formula_tflop",
        "tflops_per_s",
        "pct_of_peak",
        "gap_ms",
    )
    lines = [head, "| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for r in rows:
        cells = [r["part"]] + [_fmt(r.get(c)) for c in cols[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    step = next(r for r in rows if r["part"] == "step")
    lines.append(
        f"step MFU {step['pct_of_peak'] / 100:.3f}; samples/s per GPU "
        f"{args.micro_batch / (step['gpu_ms'] / 1e3):.1f}"
    )
    return "\n".join(lines)


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if v != v else f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = budget(args)
    if args.profile is not None:
        rows += profile_rows(args.profile)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    peak = peak_tflops(device, resolve_precision(args.precision, device))
    print(table(rows, args, peak), flush=True)
    if KERNELS:
        from benchmarks.step_profile import kernel_table

        print(kernel_table(KERNELS), flush=True)
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"json": str(args.json), "profile": str(args.profile)},
                    "rows": rows,
                    "kernels": KERNELS,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
