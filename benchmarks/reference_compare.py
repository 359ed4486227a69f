"""Each strategy in the platform against its reference outside it, at one point, in one command
(issue 42): is "ZeRO-1 at 0.6x of DDP" DeepSpeed's cost or the platform's?

    python -m benchmarks.reference_compare [--strategies ddp,fsdp2,zero1,zero2] [--nproc N]
        [--model-size base] [--micro-batch 128] [--audio-s 2.0] [--text-tokens 48]
        [--profile-steps 5] [--output-root DIR] [--set KEY=VALUE ...]

1. Every strategy's reference (benchmarks/strategy_reference.py: the workload as torch's and
   DeepSpeed's own documentation trains it, importing nothing of the project) under its
   launcher: ``torchrun`` for ddp and fsdp2, DeepSpeed's ``deepspeed`` for zero1 and zero2
   (``--launcher torchrun`` for all: a machine without DeepSpeed's launcher).
2. The platform at the same point: one ``platform.tune`` sweep of
   benchmarks/spaces/strategy_references.yaml (a case per strategy asked for, synthetic data of
   the same shape, the same steps and windows), ``--set`` passed on (on a CPU:
   ``--set num_workers=0 --set cpus_per_worker=1``).
3. One table: each side's tail samples/s (the mean of the last ``--tail`` windows after
   ``--warmup-steps``), platform / reference, and each side against its own DDP; with
   ``--profile-steps``, each side's profiled step (benchmarks/step_profile.py: the phases' GPU
   time, communication, the communication no kernel hid, the GPU's idle time).

Writes DIR/reference_compare.json and .md. Both sides run on the same machine in one command:
compare nothing across commands.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from stage1_common.output_root import OutputRoot, RunFolder

ROOT = Path(__file__).resolve().parents[1]
SPACE = ROOT / "benchmarks" / "spaces" / "strategy_references.yaml"
# The platform's case of each reference strategy.
CASES = {
    "ddp": ("ddp", 0),
    "fsdp2": ("fsdp2", 0),
    "zero1": ("deepspeed", 1),
    "zero2": ("deepspeed", 2),
}


def reference_cmd(args, strategy: str, out: Path) -> list[str]:
    """The reference's command under its launcher."""
    script = [
        "--strategy", strategy, "--model-size", args.model_size,
        "--micro-batch", str(args.micro_batch), "--audio-s", str(args.audio_s),
        "--text-tokens", str(args.text_tokens), "--warmup-steps", str(args.warmup_steps),
        "--steps", str(args.steps), "--window", str(args.window), "--tail", str(args.tail),
        "--json", str(out / f"{strategy}.json"),
    ]  # fmt: skip
    if args.profile_steps:
        script += ["--profile", str(out / f"{strategy}.trace.json")]
        script += ["--profile-steps", str(args.profile_steps)]
    module = "benchmarks.strategy_reference"
    deepspeed = shutil.which("deepspeed")
    if strategy.startswith("zero") and args.launcher == "auto" and deepspeed:
        return [deepspeed, "--num_gpus", str(args.nproc), "--module", module, *script]
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*launch, f"--nproc_per_node={args.nproc}", "-m", module, *script]


def platform_sets(args) -> list[str]:
    """The sweep's --set values: the references' point, steps and windows (more steps where a
    profiler window after the first window must end before the tail windows)."""
    steps = args.warmup_steps + args.steps
    if args.profile_steps:
        steps = max(steps, args.window + 1 + args.profile_steps + args.tail * args.window)
    steps = -(-steps // args.window) * args.window  # whole windows
    sets = [
        f"train_workers={args.nproc}",
        f"model_size={args.model_size}",
        f"micro_batch={args.micro_batch}",
        f"audio_s={args.audio_s}",
        f"text_tokens={args.text_tokens}",
        f"max_steps={steps}",
        f"log_every={args.window}",
        f"tail_timing_points={args.tail}",
    ]
    if args.profile_steps:
        sets.append(f"profile_steps={args.profile_steps}")
    return sets + list(args.set)


def compare(references: dict[str, dict], platform: dict[str, float | None]) -> list[dict]:
    """One row per strategy: each side's tail samples/s, platform / reference, and each side
    against its own DDP (None where a side has no figure)."""

    def ratio(a, b):
        return a / b if a and b else None

    ref_ddp = (references.get("ddp") or {}).get("tail_samples_per_s")
    plat_ddp = platform.get("ddp")
    rows = []
    for strategy, ref in references.items():
        ref_sps = (ref or {}).get("tail_samples_per_s")
        plat_sps = platform.get(strategy)
        rows.append(
            {
                "strategy": strategy,
                "platform_samples_per_s": plat_sps,
                "reference_samples_per_s": ref_sps,
                "platform_over_reference": ratio(plat_sps, ref_sps),
                "platform_vs_ddp": ratio(plat_sps, plat_ddp),
                "reference_vs_ddp": ratio(ref_sps, ref_ddp),
            }
        )
    return rows


def markdown(rows: list[dict]) -> str:
    f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    out = [
        "| strategy | platform samples/s | reference samples/s | platform / reference | "
        "platform vs its ddp | reference vs its ddp |",
        "|" + " --- |" * 6,
    ]
    for r in rows:
        out.append(
            f"| {r['strategy']} | {f(r['platform_samples_per_s'], '.1f')} | "
            f"{f(r['reference_samples_per_s'], '.1f')} | {f(r['platform_over_reference'], '.3f')} "
            f"| {f(r['platform_vs_ddp'], '.3f')} | {f(r['reference_vs_ddp'], '.3f')} |"
        )
    return "\n".join(out) + "\n"


def _space_of(strategies: list[str], path: Path) -> Path:
    """benchmarks/spaces/strategy_references.yaml with the cases of ``strategies`` only."""
    import yaml

    space = yaml.safe_load(SPACE.read_text())
    wanted = {CASES[s] for s in strategies}
    space["cases"] = [c for c in space["cases"] if (c["strategy"], c["zero_stage"]) in wanted]
    if "ddp" not in strategies:
        space.pop("baseline", None)
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def _platform_tails(root: Path, strategies: list[str]) -> dict[str, float | None]:
    from benchmarks.strategy_sweep import table

    tails: dict[str, float | None] = {}
    for row in table(root):
        for strategy in strategies:
            if CASES[strategy] == (row["strategy"], row["zero_stage"]) and row["status"] == "ok":
                tails[strategy] = row["tail_samples_per_s"]
    return tails


def _profiles(out: Path, root: Path) -> str:
    """The step_profile table of every trace written (references', then the platform's runs')."""
    from benchmarks.step_profile import read_trace, summarise, table

    rows = {}
    for trace in sorted(out.glob("*.trace.json")):
        rows[f"reference {trace.name.split('.')[0]}"] = summarise(read_trace(trace))
    for run in sorted((root / OutputRoot.RUNS).glob("*")):
        trace = RunFolder(run).profile(0)
        if trace.is_file():
            rows[f"platform {run.name}"] = summarise(read_trace(trace))
    return table(rows) + "\n" if rows else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--strategies", default="ddp,fsdp2,zero1,zero2")
    p.add_argument("--nproc", type=int, default=2, help="processes (GPUs)")
    p.add_argument("--model-size", choices=("base", "tiny"), default="base")
    p.add_argument("--micro-batch", type=int, default=128)
    p.add_argument("--audio-s", type=float, default=2.0)
    p.add_argument("--text-tokens", type=int, default=48)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--tail", type=int, default=3)
    p.add_argument("--profile-steps", type=int, default=0)
    p.add_argument("--launcher", choices=("auto", "torchrun"), default="auto")
    p.add_argument("--output-root", type=Path, default=Path("/tmp/reference_compare"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    strategies = [s for s in args.strategies.split(",") if s]
    unknown = [s for s in strategies if s not in CASES]
    if unknown:
        p.error(f"--strategies: unknown {', '.join(unknown)}; known: {', '.join(CASES)}")
    if args.profile_steps >= args.window and args.profile_steps:
        p.error(
            f"--profile-steps {args.profile_steps}: the platform profiles inside its second window "
            f"of --window {args.window} steps (after a warm-up step); lower it below --window"
        )
    if args.output_root.exists() and any(args.output_root.iterdir()):
        p.error(f"--output-root {args.output_root} is not empty; name a new folder")
    out = args.output_root / "references"
    out.mkdir(parents=True)
    references: dict[str, dict] = {}
    for strategy in strategies:
        cmd = reference_cmd(args, strategy, out)
        print("running:", " ".join(cmd), flush=True)
        done = subprocess.run(cmd, cwd=ROOT, check=False)
        result = out / f"{strategy}.json"
        references[strategy] = json.loads(result.read_text()) if result.is_file() else {}
        if done.returncode or not references[strategy]:
            print(f"reference_compare: {strategy}'s reference failed (exit {done.returncode})")
    root = args.output_root / "platform"
    space = _space_of(strategies, args.output_root / SPACE.name)
    cmd = [sys.executable, "-m", "platform.tune", "--space", str(space), "--output-root", str(root)]
    cmd += [a for item in platform_sets(args) for a in ("--set", item)]
    print("running:", " ".join(cmd), flush=True)
    code = subprocess.run(cmd, cwd=ROOT, check=False).returncode
    platform = _platform_tails(root, strategies) if (root / "run_manifest.tsv").is_file() else {}
    rows = compare(references, platform)
    text = markdown(rows) + ("\n" + _profiles(out, root) if args.profile_steps else "")
    print("\n" + text)
    record = {"command": sys.argv, "rows": rows, "references": references, "sweep_exit": code}
    (args.output_root / "reference_compare.json").write_text(json.dumps(record, indent=1))
    (args.output_root / "reference_compare.md").write_text(text)
    return 0 if all(r["platform_over_reference"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
