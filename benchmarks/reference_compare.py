"""Each strategy in the platform against its reference outside it, at one point, in one command
(issues 42 and 53): is "ZeRO-1 at 0.6x of DDP" DeepSpeed's cost or the platform's?

    python -m benchmarks.reference_compare [--strategies ddp,fsdp2,zero1,zero2] [--pairs N]
        [--variant NAME=BASE:KEY=VALUE,...] [--nproc N] [--model-size base] [--micro-batch 128]
        [--audio-s 2.0] [--text-tokens 48] [--profile-steps 5] [--output-root DIR]
        [--set KEY=VALUE ...]

``--strategies`` picks from ddp, fsdp2, zero1, zero2 (eager) and ddp_compiled, fsdp2_compiled
(regional compile, compile_mode default), ddp_cudagraphs, fsdp2_cudagraphs (reduce-overhead).
Each of ``--pairs`` turns runs, in this order:

1. Every strategy's reference (benchmarks/strategy_reference.py: the workload as torch's and
   DeepSpeed's own documentation trains it, importing nothing of the project) under its
   launcher: ``torchrun`` for ddp and fsdp2, DeepSpeed's ``deepspeed`` for zero1 and zero2
   (``--launcher torchrun`` for all: a machine without DeepSpeed's launcher).
2. The platform at the same point: one ``platform.tune`` sweep of
   benchmarks/spaces/strategy_references.yaml's point with a case per strategy asked for (and
   per ``--variant``: a platform-only case compared with its base's reference, e.g.
   ``ddp_t5=ddp:intra_op_threads=5``), synthetic data of the same shape, the same steps and
   windows, ``--set`` passed on (on a CPU: ``--set num_workers=0 --set cpus_per_worker=1``).

One table: each side's median tail samples/s (the mean of the last ``--tail`` windows after
``--warmup-steps``), the median over the turns of platform / reference (each turn's platform
against the same turn's reference) with the lowest and highest, and each side against its own
DDP; with ``--profile-steps``, each side's profiled step of the first turn
(benchmarks/step_profile.py: the phases' GPU time, communication, the communication no kernel
hid, the GPU's idle time).

``--combine RESULT ...`` runs nothing: it puts the turns of earlier commands' results in one
table (each turn's ratio is within its command), so ``--pairs 3`` can be split over machines
that allow 10 minutes a call; with ``--output-root``, the combined .json and .md go there.

Writes DIR/reference_compare.json and .md (the table rewritten after every turn: an
interrupted command keeps the turns it finished). Both sides run on the same machine in one
command: compare nothing across commands.

The .json also says when the command ended (``measured``) and from which tree (``commit``,
``dirty``): ``python -m platform.calibrate`` runs this command and keeps its ratios with them
in the machine cache, as this machine's calibration (``--from DIR``: one measured before).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from platform.record.provenance import git_facts
from stage1_common.output_root import OutputRoot, RunFolder

ROOT = Path(__file__).resolve().parents[1]
SPACE = ROOT / "benchmarks" / "spaces" / "strategy_references.yaml"
_REGIONAL = {"torch_compile": True, "compile_scope": "layers", "zero_stage": 0}
# Each comparison: the reference's own arguments, and the platform's case at the same point.
CASES: dict[str, tuple[list[str], dict]] = {
    "ddp": (["--strategy", "ddp"], {"strategy": "ddp", "zero_stage": 0}),
    "fsdp2": (["--strategy", "fsdp2"], {"strategy": "fsdp2", "zero_stage": 0}),
    "zero1": (["--strategy", "zero1"], {"strategy": "deepspeed", "zero_stage": 1}),
    "zero2": (["--strategy", "zero2"], {"strategy": "deepspeed", "zero_stage": 2}),
}
# Regional compile (every transformer block and the feature encoder compiled one by one),
# without and with CUDA graphs (compile_mode reduce-overhead): ddp_compiled, fsdp2_cudagraphs, ...
CASES |= {
    f"{strategy}_{name}": (
        ["--strategy", strategy, "--compile", mode],
        {"strategy": strategy, **_REGIONAL, "compile_mode": mode},
    )
    for name, mode in (("compiled", "default"), ("cudagraphs", "reduce-overhead"))
    for strategy in ("ddp", "fsdp2")
}
EAGER = ("ddp", "fsdp2", "zero1", "zero2")
OUTPUT_ROOT = Path("/tmp/reference_compare")


def parse_variant(text: str) -> tuple[str, str, dict]:
    """``NAME=BASE:key=value,key=value``: a platform-only case, BASE's case with the values
    changed, compared with BASE's reference (e.g. ``ddp_t5=ddp:intra_op_threads=5``)."""
    import yaml

    name, _, rest = text.partition("=")
    base, _, sets = rest.partition(":")
    if not name or base not in CASES:
        raise ValueError(
            f"--variant {text!r}: write NAME=BASE:key=value,... with BASE one of {', '.join(CASES)}"
        )
    values = {}
    for item in filter(None, sets.split(",")):
        key, _, raw = item.partition("=")
        values[key.strip()] = yaml.safe_load(raw)
    return name, base, {**CASES[base][1], **values}


def reference_cmd(args, strategy: str, out: Path) -> list[str]:
    """The reference's command under its launcher."""
    script = [
        *CASES[strategy][0], "--model-size", args.model_size,
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


def compare(
    pairs: list[tuple[dict[str, dict], dict[str, float | None]]], bases: dict[str, str]
) -> list[dict]:
    """One row per comparison over the pairs (each: the references' results and the platform's
    tail samples/s by name, from one turn of the command): each side's median, the median of
    the pairs' platform / reference ratios with their lowest and highest, and each side's
    median against its own DDP. ``bases``: each name's reference (a variant's is its base's).
    None where a side has no figure."""

    def ratio(a, b):
        return a / b if a and b else None

    def median(values):
        values = [v for v in values if v]
        return statistics.median(values) if values else None

    rows = []
    for name, base in bases.items():
        plat = [p.get(name) for _, p in pairs]
        ref = [(r.get(base) or {}).get("tail_samples_per_s") for r, _ in pairs]
        ratios = [v for v in map(ratio, plat, ref) if v]
        plat_ddp = [ratio(p.get(name), p.get("ddp")) for _, p in pairs]
        ref_ddp = [
            ratio(
                (r.get(base) or {}).get("tail_samples_per_s"),
                (r.get("ddp") or {}).get("tail_samples_per_s"),
            )
            for r, _ in pairs
        ]
        rows.append(
            {
                "strategy": name,
                "reference": base,
                "pairs": len(ratios),
                "platform_samples_per_s": median(plat),
                "reference_samples_per_s": median(ref),
                "platform_over_reference": median(ratios),
                "ratio_low": min(ratios) if ratios else None,
                "ratio_high": max(ratios) if ratios else None,
                "ratios": [round(v, 4) for v in ratios],
                "platform_vs_ddp": median(plat_ddp),
                "reference_vs_ddp": median(ref_ddp),
            }
        )
    return rows


def markdown(rows: list[dict]) -> str:
    f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
    out = [
        "| strategy | pairs | platform samples/s | reference samples/s | platform / reference "
        "(median) | lowest - highest | platform vs its ddp | reference vs its ddp |",
        "|" + " --- |" * 8,
    ]
    for r in rows:
        name = (
            r["strategy"]
            if r["reference"] == r["strategy"]
            else f"{r['strategy']} (vs {r['reference']})"
        )
        out.append(
            f"| {name} | {r['pairs']} | {f(r['platform_samples_per_s'], '.1f')} | "
            f"{f(r['reference_samples_per_s'], '.1f')} | {f(r['platform_over_reference'], '.3f')} "
            f"| {f(r['ratio_low'], '.3f')} - {f(r['ratio_high'], '.3f')} "
            f"| {f(r['platform_vs_ddp'], '.3f')} | {f(r['reference_vs_ddp'], '.3f')} |"
        )
    return "\n".join(out) + "\n"


def _space_of(cases: dict[str, dict], path: Path) -> Path:
    """benchmarks/spaces/strategy_references.yaml with ``cases`` (name: the platform's case)."""
    import yaml

    space = yaml.safe_load(SPACE.read_text())
    full = _filled(cases)
    space["cases"] = list(full.values())
    if "ddp" in cases:  # every key a case sets: a variant of ddp is another group
        space["baseline"] = full["ddp"]
    else:
        space.pop("baseline", None)
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def _filled(cases: dict[str, dict]) -> dict[str, dict]:
    """Each case with every key any case sets (the config's default where it sets none), so
    each case names one group and the sweep's rows are found by all of them."""
    from trainables.config import TrialConfig

    keys = list(dict.fromkeys(k for case in cases.values() for k in case))
    defaults = TrialConfig().to_dict()
    return {name: {k: case.get(k, defaults.get(k)) for k in keys} for name, case in cases.items()}


def _same(value, wanted) -> bool:
    return str(value).strip().lower() == str(wanted).strip().lower()


def _platform_tails(root: Path, cases: dict[str, dict]) -> dict[str, float | None]:
    """Each case's tail samples/s in the sweep in ``root`` (its ok run whose manifest row holds
    every value of the case; keys a case leaves out hold their defaults)."""
    import pandas as pd

    from benchmarks.strategy_sweep import table

    if not (root / "run_manifest.tsv").is_file():
        return {}
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False)
    rows = {r["run"]: r for r in manifest.to_dict("records")}
    tails: dict[str, float | None] = {}
    for row in table(root):
        rec = rows.get(row["run"], {})
        for name, case in _filled(cases).items():
            if row["status"] == "ok" and all(_same(rec.get(k), v) for k, v in case.items()):
                tails[name] = row["tail_samples_per_s"]
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


def _one_turn(args, turn: Path, strategies: list[str], cases: dict[str, dict]):
    """One turn of the command: every reference asked for, then one platform sweep of every
    case; returns (the references' results, the platform's tails, the sweep's exit code)."""
    out = turn / "references"
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
    root = turn / "platform"
    space = _space_of(cases, turn / SPACE.name)
    cmd = [sys.executable, "-m", "platform.tune", "--space", str(space), "--output-root", str(root)]
    cmd += [a for item in platform_sets(args) for a in ("--set", item)]
    print("running:", " ".join(cmd), flush=True)
    code = subprocess.run(cmd, cwd=ROOT, check=False).returncode
    return references, _platform_tails(root, cases), code


def combine(paths: list[Path], out: Path | None) -> int:
    """``--combine``: the turns of several earlier commands' reference_compare.json in one
    table (each turn's ratio was taken within its command, so turns split over several calls
    of a 10-minute machine still compare); ``out``: write the .json and .md there too."""
    turns, bases = [], {}
    for path in paths:
        path = path / "reference_compare.json" if path.is_dir() else path
        record = json.loads(path.read_text())
        turns += [tuple(t) for t in record["turns"]]
        bases.update({r["strategy"]: r["reference"] for r in record["rows"]})
    rows = compare(turns, bases)
    text = markdown(rows)
    print(text)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        record = {
            "command": sys.argv,
            "combined": [str(p) for p in paths],
            "rows": rows,
            "turns": turns,
        }
        (out / "reference_compare.json").write_text(json.dumps(record, indent=1))
        (out / "reference_compare.md").write_text(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--combine",
        nargs="+",
        type=Path,
        metavar="RESULT",
        help="only combine the turns of earlier results (folders or .json files) into one table",
    )
    p.add_argument("--strategies", default=",".join(EAGER), help=f"of {', '.join(CASES)}")
    p.add_argument("--pairs", type=int, default=1, help="turns of references then platform")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=BASE:KEY=VALUE,...",
        help="a platform-only case compared with BASE's reference",
    )
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
    p.add_argument("--output-root", type=Path, default=OUTPUT_ROOT)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    if args.combine:
        missing = [str(c) for c in args.combine if not c.exists()]
        if missing:
            p.error(f"--combine: {', '.join(missing)} does not exist")
        out = args.output_root if args.output_root != OUTPUT_ROOT else None
        return combine(args.combine, out)
    strategies = [s for s in args.strategies.split(",") if s]
    unknown = [s for s in strategies if s not in CASES]
    if unknown:
        p.error(f"--strategies: unknown {', '.join(unknown)}; known: {', '.join(CASES)}")
    if args.pairs < 1:
        p.error(f"--pairs {args.pairs}: at least 1")
    if args.profile_steps >= args.window and args.profile_steps:
        p.error(
            f"--profile-steps {args.profile_steps}: the platform profiles inside its second window "
            f"of --window {args.window} steps (after a warm-up step); lower it below --window"
        )
    if args.output_root.exists() and any(args.output_root.iterdir()):
        p.error(f"--output-root {args.output_root} is not empty; name a new folder")
    cases = {s: CASES[s][1] for s in strategies}
    bases = {s: s for s in strategies}
    for text in args.variant:
        try:
            name, base, case = parse_variant(text)
        except ValueError as e:
            p.error(str(e))
        if base not in strategies:
            p.error(f"--variant {text}: add {base} to --strategies (its reference)")
        cases[name], bases[name] = case, base
    turns, codes = [], []
    for i in range(1, args.pairs + 1):
        print(f"reference_compare: turn {i} of {args.pairs}", flush=True)
        references, platform, code = _one_turn(
            args, args.output_root / f"turn{i}", strategies, cases
        )
        turns.append((references, platform))
        codes.append(code)
        rows = compare(turns, bases)
        (args.output_root / "reference_compare.md").write_text(markdown(rows))  # kept per turn
    text = markdown(rows)
    if args.profile_steps:
        turn = args.output_root / "turn1"
        text += "\n" + _profiles(turn / "references", turn / "platform")
    print("\n" + text)
    git = git_facts()  # when and from which tree: platform.calibrate keeps them with the ratios
    record = {
        "command": sys.argv,
        "rows": rows,
        "turns": turns,
        "sweep_exits": codes,
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": git["git_commit_short"],
        "dirty": git["git_dirty"],
    }
    (args.output_root / "reference_compare.json").write_text(json.dumps(record, indent=1))
    (args.output_root / "reference_compare.md").write_text(text)
    return 0 if all(r["platform_over_reference"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
