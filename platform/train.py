"""``python -m platform.train --config OUTPUT_ROOT/best_config.json``: train with a configuration.

One Ray Train ``TorchTrainer`` run of the same loop a sweep runs (DDP or DeepSpeed ZeRO 0-3),
launched and recorded the same way (platform/execution/launch.py: timing windows, telemetry,
heartbeats, stall watchdog, manifest), with what a real run adds: lr schedule, gradient clipping
and accumulation, checkpoints through Ray Train, automatic restarts from the latest checkpoint,
validation with retrieval recall, TensorBoard event files, a loss/recall plot and an export of
the model. ``--resume`` continues a run whose driver died from its latest complete checkpoint.

    python -m platform.train --config outputs/4090_mainline_<stamp>/best_config.json
    python -m platform.train --space train_smoke --set max_steps=200
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from platform.analysis.verdicts.cliffs import known_cliff_notes
from platform.errors import EXIT_USAGE, UsageError
from platform.execution.inputs import check_inputs_only, prepare_inputs
from platform.execution.launch import LaunchRequest, launch
from platform.execution.signals import interrupted_at_start
from platform.record.cli import cli_parser
from platform.record.loggers import add_logger_argument, check_loggers
from platform.spaces.expand import RunSpec, expand_runs
from platform.spaces.keys import format_grouped
from platform.spaces.load import load_space
from platform.spaces.preflight import train_crop_lengths
from platform.spaces.space import SearchSpace
from platform.storage import results
from platform.storage.mirror import exported_model_line
from platform.storage.open_root import output_root_arg
from stage1_common.output_root import OutputRoot
from stage1_common.storage import StorageError, read_text
from trainables.config import ConfigError, TrialConfig, global_batch

__all__ = ["main", "training_defaults"]

PROG = "platform.train"  # the name its error lines start with


def build_parser() -> argparse.ArgumentParser:
    p = cli_parser(
        f"python -m {PROG}",
        "Train one stage-1 configuration with checkpoints, recovery and validation.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--config",
        help="a best_config.json written by platform.tune (a path or s3://bucket/prefix/...)",
    )
    src.add_argument(
        "--space", help="a search space without sweeps: NAME (search_spaces/NAME.yaml) or PATH.yaml"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key (YAML value); repeatable; python -m platform.tune --keys lists them",
    )
    p.add_argument(
        "--output-root",
        type=output_root_arg,
        help="default: outputs/<space>_<timestamp>, with --config outputs/<sweep's space>_winner_"
        "<timestamp>",
    )
    add_logger_argument(p, default="tensorboard")
    p.add_argument("--resume", action="store_true", help="continue the run in --output-root")
    p.add_argument("--address", help="connect to this Ray cluster instead of starting one")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the run and check its inputs as a real run would (exit 2 on a problem); "
        "starts no Ray and writes nothing",
    )
    return p


def space_from_config(path: str | Path) -> SearchSpace:
    """A one-run space from a best_config.json: its resolved config, fixed."""
    try:
        record = json.loads(read_text(path))
        config = dict(record["config"])
        # Where the sweep's run trained (a resident group) is no instruction for the training:
        # it gets processes of its own (execution/resources.py: resolve_executors).
        config.pop("executor", None)
    except StorageError as exc:
        raise UsageError(f"--config: {exc}") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(
            f"--config {path}: not a best_config.json ({type(exc).__name__}: {exc}); pass the "
            "one platform.tune wrote in its output root"
        ) from None
    return SearchSpace(
        # "<space>_winner": its default root (outputs/<space>_winner_<stamp>) is not taken for
        # a space's own (train_smoke is a space)
        name=f"{record.get('space', 'config')}_winner",
        description=f"training of {record.get('group', 'a configuration')} from {path}",
        fixed=config,
        source=str(path),
    )


def training_defaults(cfg: TrialConfig, explicit: set[str]) -> dict[str, Any]:
    """What a final run turns on that sweeps keep off, for keys the user did not set:
    restarts, a checkpoint (and, with a held-out split, a validation) about every fifth of the
    run, warm-up and cosine decay, and an export of the best (or final) model."""
    every = max(1, round(cfg.max_steps / 5 / cfg.log_every)) * cfg.log_every
    out: dict[str, Any] = {
        "max_failures": 3,
        "checkpoint_every": every,
        "lr_schedule": "cosine",
        "warmup_steps": min(cfg.max_steps // 20, 500),
    }
    if cfg.val_manifest_path or cfg.val_speakers:
        out["val_every"] = every
    validating = out.get("val_every", cfg.val_every) and out.get(
        "checkpoint_every", cfg.checkpoint_every
    )
    out["export_model"] = "best" if validating else "final"
    return {k: v for k, v in out.items() if k not in explicit}


def plan(args) -> tuple[SearchSpace, list[RunSpec]]:
    if args.config is not None:
        space = space_from_config(args.config)
    elif args.space:
        space = load_space(args.space)
    else:
        raise UsageError("pass --config OUTPUT_ROOT/best_config.json or --space NAME")
    explicit = {item.partition("=")[0].strip() for item in args.set}
    if args.space:
        explicit |= set(space.fixed) | set(space.grid)
    space = dataclasses.replace(space, repeats=1).with_overrides(args.set)
    if space.swept_keys:
        keys = ", ".join(space.swept_keys)
        raise UsageError(
            f"platform.train trains one configuration, but {keys} is swept; pin it with "
            f"--set KEY=VALUE (or run the sweep with platform.tune)"
        )
    runs = expand_runs(space, prefix="train")
    defaults = training_defaults(runs[0].config, explicit)
    space = space.with_overrides([f"{k}={v}" for k, v in defaults.items()])
    return space, expand_runs(space, prefix="train")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # What the dry run checks and the real run prepares: the same inputs, the same refusals.
    inputs = dict(
        address=args.address, resume=args.resume, output_root=args.output_root, what="run"
    )
    try:
        space, runs = plan(args)
        loggers = check_loggers(args.logger, default=("tensorboard",))
        if args.dry_run:
            # The run's name, then its keys by family (fault injection only when set).
            print(f"{runs[0].name}:\n{format_grouped(runs[0].config.to_dict())}", flush=True)
        for note in known_cliff_notes(runs):  # runs anyway: its end-of-run line says what torch did
            print(note, flush=True)
        if args.dry_run:
            check_inputs_only(space, runs, **inputs)
            return 0
        root, done = prepare_inputs(space, runs, **inputs)
    except (UsageError, ConfigError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if done:
        print(f"{root.shown}: the run finished already; nothing to resume")
        return 0
    request = LaunchRequest(
        prog=PROG,
        space=space,
        runs=runs,
        root=root,
        report=report,
        address=args.address,
        done=done,
        resume=args.resume,
        training=True,
        before_trials=epochs_to_steps,
        loggers=loggers,
    )
    try:
        return launch(request)
    except KeyboardInterrupt as stop:  # before the first trial: nothing was measured yet
        return interrupted_at_start(PROG, request.root, stop, "the run")


def epochs_to_steps(runs: list[RunSpec]) -> list[RunSpec]:
    """``epochs``: max_steps from the training split's size, once the corpus exists."""
    out = []
    for run in runs:
        cfg = run.config
        if cfg.epochs:
            from trainables.data.manifest_table import read_manifest_table, speaker_split

            table = read_manifest_table(Path(cfg.manifest_path))
            rows = table.num_rows
            held_out = 0 if cfg.val_manifest_path else cfg.val_speakers
            if held_out:
                rows -= int(speaker_split(table, cfg.val_speakers).sum())
            if cfg.batching == "duration":  # the sampler's own count (data/durations.py)
                from trainables.data.durations import duration_bins, steps_per_epoch

                lengths = train_crop_lengths(cfg, held_out)
                micro_steps = steps_per_epoch(lengths, duration_bins(cfg), cfg.train_workers)
                per_epoch = micro_steps // cfg.grad_accum_steps
            else:
                per_epoch = rows // global_batch(
                    micro_batch=cfg.micro_batch,
                    world_size=cfg.train_workers,
                    grad_accum_steps=cfg.grad_accum_steps,
                )
            if per_epoch < 1:
                lower = "grad_accum_steps" if cfg.batching == "duration" else "micro_batch"
                raise UsageError(
                    f"epochs: the manifest's {rows} training rows fill no global batch; "
                    f"lower {lower} or use a larger manifest"
                )
            given = cfg.max_steps
            cfg = dataclasses.replace(cfg, max_steps=cfg.epochs * per_epoch)
            print(
                f"epochs {cfg.epochs} x {per_epoch} steps = max_steps {cfg.max_steps} "
                f"(epochs wins over max_steps {given})"
            )
        out.append(dataclasses.replace(run, config=cfg))
    return out


def report(manifest: list[dict[str, Any]], root: OutputRoot, wall_s: float) -> int:
    """The run's outcome, validation and checkpoints, the plot, the export."""
    row = manifest[0]
    run = row["run"]
    print(
        f"\n{run}: {row['status']}"
        + (f" ({row['failure_reason']})" if row.get("failure_reason") else "")
    )
    val = results.read_dataset(root.validation, results.VALIDATION_SCHEMA)
    if len(val):
        last = val.sort_values(["step", "attempt"]).iloc[-1]
        print(
            f"validation at step {int(last['step'])}: speech->text R@1 {last['val_s2t_r1']:.3f}, "
            f"text->speech R@1 {last['val_t2s_r1']:.3f}, loss {last['val_loss']:.3f} "
            f"(chance R@1 {last['val_chance_r1']:.4f})"
        )
    ckpts = results.read_dataset(root.checkpoints, results.CHECKPOINTS_SCHEMA)
    if len(ckpts):
        share = row.get("ckpt_overhead_share")
        held = f" ({float(share):.2%} of the time in steps)" if share not in (None, "") else ""
        print(
            f"checkpoints: {len(ckpts)} saved, median {ckpts['checkpoint_save_s'].median():.2f} s "
            f"and {ckpts['checkpoint_size_bytes'].median() / 1e6:.1f} MB each, training held "
            f"{ckpts['checkpoint_block_s'].sum():.2f} s in all{held}; restarts "
            f"{row.get('restarts') or 0}"
        )
    plot = write_plot(root, run)
    if plot:
        print(f"plot: {root.where(OutputRoot.RUNS, run, plot.name)}")
    model = exported_model_line(root, run)
    if model:
        print(model)
    if root.tensorboard.is_dir():  # --logger tensorboard (the default)
        print(f"TensorBoard: tensorboard --logdir {root.where(OutputRoot.TENSORBOARD)}")
    print(f"wall time {wall_s:.1f} s; results in {root.shown}")
    return 0 if row["status"] == "ok" else 1


def write_plot(root: OutputRoot, run: str) -> Path | None:
    """Loss and learning rate over steps, and validation recall, in runs/<run>/curves.png."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot skipped: matplotlib is not installed")
        return None
    timing = results.read_dataset(root.timing, results.TIMING_SCHEMA)
    timing = timing[(timing["run"] == run) & (timing["rank"] == 0)].sort_values("step")
    if timing.empty:
        return None
    val = results.read_dataset(root.validation, results.VALIDATION_SCHEMA)
    val = val[val["run"] == run].sort_values("step")
    fig, (ax_loss, ax_val) = plt.subplots(1, 2, figsize=(11, 4))
    for attempt, df in timing.groupby("attempt"):
        ax_loss.plot(df["step"], df["loss"], label=f"train loss (attempt {attempt + 1})")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("contrastive loss")
    ax_lr = ax_loss.twinx()
    ax_lr.plot(timing["step"], timing["lr"], color="grey", linestyle=":", label="lr")
    ax_lr.set_ylabel("learning rate")
    ax_loss.legend(loc="upper right")
    if len(val):
        for key in ("val_s2t_r1", "val_t2s_r1", "val_s2t_r5", "val_t2s_r5"):
            ax_val.plot(val["step"], val[key], marker="o", label=key[4:])
        ax_val.plot(
            val["step"], val["val_chance_r1"], color="grey", linestyle="--", label="chance R@1"
        )
        ax_val.legend()
    ax_val.set_xlabel("step")
    ax_val.set_ylabel("validation recall")
    fig.suptitle(run)
    fig.tight_layout()
    path = root.run_folder(run).curves
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
    return path


if __name__ == "__main__":
    sys.exit(main())
