"""A new worker process's way to its first step, with and without the device warm-up (issue 40):

    python -m benchmarks.probes.first_step [--repeats 2] [--json OUT.json]

Each run is a new process that does what a train worker does before its first step, outside
Ray: import torch, the process group (a world of one), the model code's imports, the engine
(trainables.engine.build_engine: the runbooks' mainline point, DDP, base model, mb 160, eager,
FLOPs counted as on a new machine), then two steps of a made-up 3 s batch, each part
synchronised and timed. ``plain`` imports the model code, then builds; ``warm`` runs
trainables.observe.startup.DeviceWarmUp (the CUDA context, cuBLAS and cuDNN, the step's kinds of
kernels, on a thread) while it imports, as the platform's workers do. The batch's rows have
unequal lengths (padding masks), as the loader's have. The variants alternate,
``--repeats`` times each; the table gives each run and the medians. On a machine without a GPU
it runs the tiny model (a smoke check of the script: there is nothing to warm).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = ("plain", "warm")
PARTS = (
    "torch",
    "process_group",
    "imports",
    "warm_wait",
    "model_build",
    "flops",
    "wrap",
    "fwd",
    "bwd",
    "opt",
    "second_step",
)


def child(variant: str) -> dict:
    t = time.perf_counter()
    times: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        times[name] = round(times.get(name, 0.0) + now - t, 3)
        t = now

    import torch
    import torch.distributed as dist

    lap("torch")
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    dist.init_process_group("nccl" if on_gpu else "gloo", store=store, rank=0, world_size=1)
    lap("process_group")
    from trainables.observe.startup import DeviceWarmUp, import_model_code

    warm = DeviceWarmUp(device, "auto") if variant == "warm" else None
    import_model_code()
    lap("imports")
    if warm is not None:
        warm.join()
    lap("warm_wait")
    import tempfile

    from trainables.config import TrialConfig
    from trainables.engine.build import build_engine
    from trainables.engine.shapes import shape_batch
    from trainables.model.stage1 import contrastive_loss

    cfg = TrialConfig.from_dict(
        {
            "strategy": "ddp",
            "dataset": "manifest",
            "manifest_path": "unused.tsv",
            "crop_policy": "limit_longest",
            "model_size": "base" if on_gpu else "tiny",
            "micro_batch": 160 if on_gpu else 4,
            "text_tokens": 64 if on_gpu else 8,
            "use_gpu": on_gpu,
        }
    )

    class Clock:  # build_engine's laps, into this run's parts
        def lap(self, name: str) -> None:
            lap({"to_device": "model_build"}.get(name, name))

    engine = build_engine(cfg, device, clock=Clock(), flops_cache=Path(tempfile.mkdtemp()))
    batch = shape_batch(cfg.micro_batch, int(3.0 * 16_000), cfg.text_tokens, device)
    # Rows of unequal lengths, as the loader's batches are (limit_longest pads to the longest):
    # the padding masks decide which attention kernels run.
    rows = torch.arange(cfg.micro_batch, device=device) % 4
    for key in ("audio_mask", "text_mask"):
        width = batch[key].shape[1]
        keep = width - (rows * width // 8).unsqueeze(1)
        mask = torch.arange(width, device=device) < keep
        batch[key] = mask if key == "audio_mask" else mask.long()  # as collate_padded makes them

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize(device)

    sync()
    t = time.perf_counter()
    speech, text, scale = engine(batch)
    sync()
    lap("fwd")
    engine.backward(contrastive_loss(speech.float(), text.float(), scale.float()))
    sync()
    lap("bwd")
    engine.step()
    sync()
    lap("opt")
    speech, text, scale = engine(batch)
    engine.backward(contrastive_loss(speech.float(), text.float(), scale.float()))
    engine.step()
    sync()
    lap("second_step")
    dist.destroy_process_group()
    return {
        "variant": variant,
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
        "parts": times,
        "warm_s": round(warm.seconds, 3) if warm is not None else 0.0,
        "warm_error": warm.error if warm is not None else "",
        "to_first_step_s": round(sum(v for k, v in times.items() if k != "second_step"), 2),
    }


def _run_child(variant: str, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.probes.first_step", "--child", variant]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"variant": variant, "error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        return {"variant": variant, "error": " | ".join(done.stderr.strip().splitlines()[-8:])}
    return {**json.loads(lines[-1]), "wall_s": round(time.perf_counter() - t0, 1)}


def _row(label: str, parts: dict, total: float, warm_s: float) -> str:
    cells = " | ".join(f"{parts.get(p, 0.0):.2f}" for p in PARTS)
    return f"| {label} | {cells} | {warm_s:.2f} | **{total:.2f}** |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--timeout", type=float, default=240.0)
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)), flush=True)
        return 0
    print(f"| run | {' | '.join(PARTS)} | warm-up s | to first step s |")
    print("| --- " * (len(PARTS) + 3) + "|")
    records = []
    for i in range(args.repeats):
        for variant in VARIANTS:
            r = _run_child(variant, args.timeout)
            records.append(r)
            if "error" in r:
                print(f"| {variant} {i + 1} | error: {r['error'][:300]} |", flush=True)
                continue
            print(_row(f"{variant} {i + 1}", r["parts"], r["to_first_step_s"], r["warm_s"]))
            if args.json:  # after every run: nothing measured is lost to a timeout
                args.json.write_text(json.dumps({"command": sys.argv, "runs": records}, indent=1))
    medians = {}
    for variant in VARIANTS:
        ok = [r for r in records if r["variant"] == variant and "error" not in r]
        if ok:
            parts = {p: statistics.median(r["parts"].get(p, 0.0) for r in ok) for p in PARTS}
            total = statistics.median(r["to_first_step_s"] for r in ok)
            medians[variant] = total
            warm_s = statistics.median(r["warm_s"] for r in ok)
            print(_row(f"{variant} median", parts, total, warm_s))
    if len(medians) == 2:
        print(f"\nto the first step, warm / plain: {medians['warm'] / medians['plain']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
