"""Where a run's start-up time goes: the StartupClock's laps of named parts, from the trial's
start to the end of its first step (the manifest's ``startup_breakdown``)."""

from __future__ import annotations

import threading
import time

from trainables.observe.gc_control import collector_paused

__all__ = ["DeviceWarmUp", "StartupClock", "import_model_code", "process_start"]


class StartupClock:
    """Where start-up time goes: laps of named parts, from the trial's start to the end of the
    first step. ``breakdown()`` is the manifest's ``startup_breakdown`` (seconds per part)."""

    def __init__(self, start_ts: float, entry_ts: float, process_ts: float = 0.0):
        self.parts: dict[str, float] = {}
        if start_ts and start_ts < process_ts < entry_ts:
            # Tune's trial actor and Ray Train's controller until this worker's process
            # started, then the worker process itself (Python, Ray, torch, the process group).
            self.parts["ray_controller"] = process_ts - start_ts
            self.parts["ray_worker"] = entry_ts - process_ts
        else:  # a process started before the trial (Ray's pool of idle workers), or no Ray
            self.parts["ray_workers"] = max(0.0, entry_ts - start_ts) if start_ts else 0.0
        self._last = entry_ts

    def lap(self, name: str) -> float:
        now = time.time()
        took = now - self._last
        self.parts[name] = self.parts.get(name, 0.0) + took
        self._last = now
        return took

    def add(self, name: str, seconds: float, out_of: str | None = None) -> None:
        """A part timed elsewhere; ``out_of``: the lap it was inside, which it is taken from."""
        self.parts[name] = self.parts.get(name, 0.0) + seconds
        if out_of is not None:
            self.parts[out_of] -= seconds

    def breakdown(self) -> str:
        return " ".join(f"{k}={v:.2f}" for k, v in self.parts.items())


def process_start() -> float:
    """When this process started (its creation time), or 0 when it cannot be told."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - the breakdown then has one part less
        return 0.0


def import_model_code() -> None:
    """The transformers model modules (a few seconds per process, the collector paused):
    timed as their own part."""
    with collector_paused():
        import transformers.models.bert.modeling_bert  # noqa: F401
        import transformers.models.wav2vec2.modeling_wav2vec2  # noqa: F401


class DeviceWarmUp:
    """A GPU's first-use costs, paid on a thread of their own while the main thread imports
    the model code: the CUDA context, the cuBLAS(Lt) and cuDNN handles (their libraries load on
    first use) and the kernels of the step's kinds of ops (lazily loaded), each run once on
    tiny tensors in the run's precision, forward and backward, with a fused AdamW step. Those
    run in C++ with the GIL released, so they overlap the imports (pure Python) instead of
    following them inside the first step. ``join`` waits for it; an error is said on stderr
    (the worker's log), never raised (the real step meets a real problem itself). Nothing on a
    CPU."""

    _warmed: set[str] = set()  # this process's devices warmed already (a resident worker's)

    def __init__(self, device, precision: str = "auto"):
        """``precision``: the run's (``auto``: bf16 where the GPU has it, else fp16)."""
        self.error = ""
        self.seconds = 0.0
        self._thread = None
        if getattr(device, "type", "cpu") != "cuda" or str(device) in self._warmed:
            return
        self._warmed.add(str(device))
        self._thread = threading.Thread(
            target=self._run, args=(device, precision), name="device-warm-up", daemon=True
        )
        self._thread.start()

    def _run(self, device, precision: str) -> None:
        t0 = time.perf_counter()
        try:
            import torch

            from trainables.engine.precision import resolve_precision

            dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
            _first_uses(device, dtypes.get(resolve_precision(precision, device)))
        except Exception as exc:  # noqa: BLE001 - a note; the first step meets it for real
            self.error = f"{type(exc).__name__}: {exc}"[:200]
        self.seconds = time.perf_counter() - t0

    def join(self) -> float:
        """Wait for the warm-up; the seconds waited."""
        if self._thread is None:
            return 0.0
        t0 = time.perf_counter()
        self._thread.join()
        if self.error:
            import sys

            print(f"device warm-up failed (the first step pays it): {self.error}", file=sys.stderr)
        return time.perf_counter() - t0


def _first_uses(device, dtype) -> None:
    """(On a CPU too, for its test.) One forward and backward of small tensors through the ops
    the stage-1 step runs, in its shapes' kinds: the wav2vec2 feature encoder's strided
    convolutions and group norm, its grouped positional convolution, layer norm, GELU, linear
    layers, attention as transformers calls it (SDPA with a padding mask and dropout: on a GPU
    the memory-efficient kernels, whose first use cost the eager first step about 3 s on an
    H100; and without a mask), embeddings and the contrastive loss, under autocast to
    ``dtype`` (None: fp32), then a fused AdamW step; synchronised, and the caching allocator's
    blocks given back."""
    import torch
    import torch.nn.functional as F

    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.set_device(device)

    def param(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, device=device) * 0.02).requires_grad_(True)

    params = {
        "conv0": param(64, 1, 10),
        "conv1": param(64, 64, 3),
        "positional": param(64, 4, 16),
        "norm": torch.ones(64, device=device, requires_grad=True),
        "qkv": param(3 * 128, 64),
        "embed": param(32, 64),
    }
    audio = torch.randn(2, 1, 800, device=device)
    heads, width = 2, 64  # the base encoders' head width
    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        x = F.conv1d(audio, params["conv0"], stride=5)
        x = F.gelu(F.group_norm(x, 64, params["norm"]))
        x = F.gelu(F.conv1d(x, params["conv1"], stride=2))
        x = x + F.conv1d(x, params["positional"], padding=8, groups=16)[..., : x.shape[-1]]
        x = F.layer_norm(x.transpose(1, 2), (64,), params["norm"])
        n = x.shape[1]
        q, k, v = F.linear(x, params["qkv"]).view(2, n, 3, heads, width).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        mask = torch.ones(2, 1, n, n, dtype=torch.bool, device=device)
        mask[1, ..., n // 2 :] = False  # a padded row, as a batch of unequal lengths has
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.1)
        a = a + F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
        a = a.transpose(1, 2).reshape(2, n, heads * width)
        t = F.embedding(torch.arange(4, device=device).view(1, 4), params["embed"])
        s = F.normalize(a.mean(1)[:, :64], dim=-1)
        u = F.normalize(t.mean(1).expand(2, 64), dim=-1)
        logits = s.float() @ u.float().t()
        labels = torch.arange(2, device=device)
        loss = F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)
    loss.backward()
    optimizer = torch.optim.AdamW(list(params.values()), lr=1e-3, fused=on_gpu)
    optimizer.step()
    if on_gpu:
        torch.cuda.synchronize(device)
    del optimizer, params, audio, x, q, k, v, mask, a, t, s, u, logits, loss
    if on_gpu:
        torch.cuda.empty_cache()
