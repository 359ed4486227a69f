"""Issue 56 item 4 on the CPU: do the levers that touch the math keep learning? Tiny models on
the learnable corpus (``data_prep.synth --mode learnable``; 16 speakers, 2 held out), trained by
the real loop (one gloo rank per run, no Ray), each variant at the same seeds, the same steps and
the same batches, so the same audio seconds seen; printed per variant: validation recall@1 (mean
of both directions), validation loss and the last training loss, as mean +- sd over the seeds,
and each variant against the first with the seeds' spread as its noise.

    python -m benchmarks.learning_check [--seeds 0,1,2] [--steps 240] [--json OUT.json]

Variants (``--variants``, comma-separated names): ``base`` (transformers' dropout 0.1, the
convolution), ``dropout0`` (every dropout 0), ``dropout0_matmul`` (and ``pos_conv: matmul``),
``matmul`` (``pos_conv: matmul`` alone: the same math, so its figures equal base's up to float
rounding), ``extractor_matmul`` (``extractor_layout: matmul`` alone: the same math too),
``dropout0_both_matmul`` (dropout 0 and both GEMM convolutions: the new best's math),
``dropout0_both_matmul_mb2x`` (the same at twice the micro-batch, as mb 256 -> 512: twice the
contrastive loss's negatives; it runs half the steps, and half the learning rate's warm-up, so
that it sees the same audio seconds), ``dropout0_both_matmul_mb4x`` (four times, as mb 256 ->
1024: a quarter of the steps), ``dropout0_both_matmul_mb2x_lr`` (and the learning rate times
sqrt 2), ``dropout0_both_matmul_bf16`` (the new best's math under bf16 autocast, as a GPU runs
it: the residual stream float32) and ``dropout0_both_matmul_bf16_residual`` (the stream bf16,
``residual_dtype: bf16``). Runs go two at a time (one process and one thread each).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = {
    "base": {},
    "matmul": {"pos_conv": "matmul"},
    "dropout0": {"dropout": 0.0},
    "dropout0_matmul": {"dropout": 0.0, "pos_conv": "matmul"},
    "extractor_matmul": {"extractor_layout": "matmul"},
    "dropout0_both_matmul": {"dropout": 0.0, "pos_conv": "matmul", "extractor_layout": "matmul"},
    "dropout0_both_matmul_mb2x": {
        "dropout": 0.0,
        "pos_conv": "matmul",
        "extractor_layout": "matmul",
        "micro_batch": 2 * 32,
    },
    # Four times the micro-batch, as mb 256 -> 1024 (twice today's best's 512): a quarter of
    # the steps for the same audio seconds.
    "dropout0_both_matmul_mb4x": {
        "dropout": 0.0,
        "pos_conv": "matmul",
        "extractor_layout": "matmul",
        "micro_batch": 4 * 32,
    },
    # The same with the learning rate scaled by the square root of the batch's growth (the
    # usual rule for Adam-type optimizers): half the updates, each a larger one.
    "dropout0_both_matmul_mb2x_lr": {
        "dropout": 0.0,
        "pos_conv": "matmul",
        "extractor_layout": "matmul",
        "micro_batch": 2 * 32,
        "lr": 3e-3 * 2**0.5,
    },
    # The new best's math as a GPU computes it: bf16 autocast, the residual stream float32
    # (trainables/model/residual.py makes the CPU's autocast give LayerNorm float32 inputs,
    # as CUDA's does) ...
    "dropout0_both_matmul_bf16": {
        "dropout": 0.0,
        "pos_conv": "matmul",
        "extractor_layout": "matmul",
        "precision": "bf16",
    },
    # ... and with the stream in bf16 (residual_dtype: bf16).
    "dropout0_both_matmul_bf16_residual": {
        "dropout": 0.0,
        "pos_conv": "matmul",
        "extractor_layout": "matmul",
        "precision": "bf16",
        "residual_dtype": "bf16",
    },
}
MICRO_BATCH = 32


def corpus(root: Path) -> Path:
    """The learnable corpus, prepared (trimmed, 16 kHz, manifest) in this process."""
    from data_prep import synth
    from data_prep.librispeech import prepare_serial

    synth.make_corpus(root / "raw", speakers=16, chapters=2, utts=40, seed=0, mode="learnable")
    return prepare_serial(root / "raw", root / "prepared")


def config(manifest: Path, steps: int, seed: int, keys: dict) -> dict:
    """The learning test's run (tests/test_learning.py uses it): 32 utterances a step, cosine
    lr, 2 of the 16 speakers (160 utterances) held out. A variant of another micro_batch
    runs ``steps x 32 / micro_batch`` steps (its warm-up likewise): the same audio seconds."""
    scale = MICRO_BATCH / keys.get("micro_batch", MICRO_BATCH)
    steps = round(steps * scale)
    cfg = dict(
        model_size="tiny",
        proj_dim=64,
        use_gpu=False,
        train_workers=1,
        dataset="manifest",
        manifest_path=str(manifest),
        micro_batch=MICRO_BATCH,
        lr=3e-3,
        lr_schedule="cosine",
        warmup_steps=max(1, round(10 * scale)),
        max_steps=steps,
        log_every=min(10, steps),
        val_every=steps,
        val_speakers=2,
        telemetry=False,
        stall_timeout_s=0,
        seed=seed,
    )
    return {**cfg, **keys}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _train(config: dict, run_dir: str, out) -> None:
    import torch
    import torch.distributed as dist

    from trainables.config import TrialConfig
    from trainables.loop import WorkerContext, run_training

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1)
    windows: list[dict] = []

    def report(metrics: dict, checkpoint=None) -> None:
        windows.append({k: v for k, v in metrics.items() if isinstance(v, (int, float, str))})

    try:
        context = WorkerContext(
            rank=0,
            world_size=1,
            device=torch.device("cpu"),
            report=report,
            start_ts=time.time(),
            run_dir=Path(run_dir),
        )
        run_training(TrialConfig.from_dict(config), context)
        out.put(windows)
    finally:
        dist.destroy_process_group()


def run_all(jobs: list[tuple[str, int, dict]], workdir: Path, parallel: int) -> dict:
    """Each (variant, seed, config) in a fresh process, ``parallel`` at once: the final
    validation window and the last training loss of each."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    results: dict[tuple[str, int], dict] = {}
    for start in range(0, len(jobs), parallel):
        batch = jobs[start : start + parallel]
        running = []
        for variant, seed, cfg in batch:
            queue = ctx.Queue()
            run_dir = workdir / f"{variant}_s{seed}"
            proc = ctx.Process(target=_train, args=(cfg, str(run_dir), queue))
            proc.start()
            running.append((variant, seed, proc, queue))
        for variant, seed, proc, queue in running:
            windows = queue.get()
            proc.join()
            val = next(w for w in reversed(windows) if "val_mean_r1" in w)
            train = [w for w in windows if "loss" in w]
            results[(variant, seed)] = {
                "val_mean_r1": val["val_mean_r1"],
                "val_loss": val["val_loss"],
                "val_chance_r1": val["val_chance_r1"],
                "last_loss": train[-1]["loss"],
            }
            print(
                f"  {variant} seed {seed}: val R@1 {val['val_mean_r1']:.4f}, val loss "
                f"{val['val_loss']:.3f}, last train loss {train[-1]['loss']:.3f}",
                file=sys.stderr,
                flush=True,
            )
    return results


def summary(results: dict, variants: list[str], seeds: list[int]) -> list[dict]:
    """Per variant: mean and sd over the seeds, and the paired difference to the first."""
    rows = []
    first = variants[0]
    for v in variants:
        row = {"variant": v}
        for key in ("val_mean_r1", "val_loss", "last_loss"):
            values = [results[(v, s)][key] for s in seeds]
            row[key] = statistics.mean(values)
            row[f"{key}_sd"] = statistics.stdev(values) if len(values) > 1 else float("nan")
            diffs = [results[(v, s)][key] - results[(first, s)][key] for s in seeds]
            row[f"{key}_diff"] = statistics.mean(diffs)
            row[f"{key}_diff_sd"] = statistics.stdev(diffs) if len(diffs) > 1 else float("nan")
        row["chance_r1"] = results[(v, seeds[0])]["val_chance_r1"]
        rows.append(row)
    return rows


def table(rows: list[dict], seeds: list[int], steps: int) -> str:
    lines = [
        f"Learnable corpus, tiny model, {steps} steps of 32 utterances (the same audio seconds "
        f"for every variant: one of micro-batch m runs {steps} x 32 / m steps), seeds {','.join(map(str, seeds))}; mean +- sd over the seeds; "
        f"diff: the paired difference to {rows[0]['variant']} (mean +- sd of the seeds' "
        "differences); chance R@1 "
        f"{rows[0]['chance_r1']:.4f}",
        "| variant | val R@1 | diff | val loss | diff | last train loss |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['val_mean_r1']:.4f} +- {r['val_mean_r1_sd']:.4f} | "
            f"{r['val_mean_r1_diff']:+.4f} +- {r['val_mean_r1_diff_sd']:.4f} | "
            f"{r['val_loss']:.3f} +- {r['val_loss_sd']:.3f} | "
            f"{r['val_loss_diff']:+.3f} +- {r['val_loss_diff_sd']:.3f} | "
            f"{r['last_loss']:.3f} +- {r['last_loss_sd']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=240)
    p.add_argument("--variants", default="base,matmul,dropout0,dropout0_matmul")
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {unknown}; choose from {sorted(VARIANTS)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds: {args.seeds} is not a comma-separated list of integers")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        print("preparing the learnable corpus", file=sys.stderr, flush=True)
        manifest = corpus(root)
        jobs = [
            (v, s, config(manifest, args.steps, s, VARIANTS[v])) for s in seeds for v in variants
        ]
        results = run_all(jobs, root / "runs", args.parallel)
    rows = summary(results, variants, seeds)
    print(table(rows, seeds, args.steps))
    if args.json:
        args.json.write_text(
            json.dumps(
                {"rows": rows, "runs": {f"{v}_s{s}": r for (v, s), r in results.items()}},
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
