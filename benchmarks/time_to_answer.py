"""Time to answer: the same sweep with fresh worker processes per run and with one resident
worker group (config key ``executor``), side by side in one run: wall time, the share of it
spent in timed training steps, the gap between runs, and whether samples/s stayed the same.

    python -m benchmarks.time_to_answer --space SPACE [--set KEY=VALUE ...] [--output-root DIR]
        [--executors fresh,resident] [--schedulers fifo[,race]] [--label cpu2]
        [--json PATH] [--markdown PATH]
    python -m benchmarks.time_to_answer --combine A.json B.json ... --json PATH

An executor named twice (``--executors resident,fresh,resident``) runs a block of its own each
time, in that order, so a host that drifts during the command shows (its second block is
``<scheduler>_<executor>_2``); ``--combine`` pools the sweeps of earlier commands' JSON the same
way. With more than one block of an executor, its groups' tails are pooled over the blocks: the
ratio is the median run tail resident over fresh, the spread max / min - 1 over each executor's
runs.

Each sweep is ``python -m platform.tune --set executor=E --set scheduler=S`` in a subprocess
from the repo root (its progress passes through) into DIR/<scheduler>_<executor>; wall time is
the subprocess's. From rank 0's timing windows (a window spans steps_in_window x iter_ms_mean,
ending at window_end_ts): busy share = timed training / (last window end - first window start),
so the first run's cold start is left out; per-trial overhead = a run's first window start minus
the previous run's last window end (runs in the order they started). Tail samples/s per group:
summary.json's robust figure (one block per executor), and the median over the group's runs of
the mean of their last 3 windows. The manifest gives start-up and compile figures; a resident sweep's groups.json the
memory after each run against the group's first run. The host's speed over each run's tail
windows comes from benchmarks/probes/host_canary.py, run beside the sweeps (``--no-canary``:
not), and each group's resident/fresh ratio at the same host speed from
benchmarks/probes/host_adjust.py. Writes JSON (default
benchmarks/results/time_to_answer_<label>/time_to_answer.json) and markdown beside it; exits 1
when any sweep failed, after writing what was measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.probes.host_canary import Canary, host_over, read_samples
from benchmarks.time_to_answer_compare import compare, markdown
from stage1_common.output_root import OutputRoot

ROOT = Path(__file__).resolve().parent.parent


def num(x: Any) -> Any:
    """A JSON-safe scalar: NaN and missing become None, numpy numbers plain ones."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    if hasattr(x, "item"):
        return num(x.item())
    return x


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def sweep(space: str, root: Path, scheduler: str, executor: str, sets: list[str]) -> dict:
    cmd = [sys.executable, "-m", "platform.tune", "--space", space, "--output-root", str(root)]
    cmd += ["--set", f"executor={executor}", "--set", f"scheduler={scheduler}"]
    cmd += [a for s in sets for a in ("--set", s)]
    print("running:", " ".join(cmd), flush=True)
    launched, t0 = time.time(), time.monotonic()
    code = subprocess.call(cmd, cwd=ROOT)
    rec = {"scheduler": scheduler, "executor": executor, "command": cmd, "exit_code": code}
    rec["wall_s"] = time.monotonic() - t0
    try:
        rec.update(measure(root, launched))
    except Exception as exc:  # what it did not write: say so, keep the rest
        rec["error"] = f"{type(exc).__name__}: {exc}"
        print(f"time_to_answer: {root}: {rec['error']}", file=sys.stderr)
    return rec


def measure(root: Path, launched: float) -> dict[str, Any]:
    import pandas as pd

    t = pd.read_parquet(root / "timing.parquet")
    t = t[t["rank"] == 0].sort_values("window_end_ts").copy()
    t["dur_s"] = t["steps_in_window"] * t["iter_ms_mean"] / 1000
    t["start_ts"] = t["window_end_ts"] - t["dur_s"]
    man = pd.read_csv(root / "run_manifest.tsv", sep="\t").set_index("run")
    runs = []
    for run, w in t.groupby("run", sort=False):
        m = man.loc[run] if run in man.index else {}
        runs.append(
            {
                "run": run,
                "group": w["group"].iloc[0],
                "status": num(m.get("status")),
                "first_start_ts": float(w["start_ts"].min()),
                "last_end_ts": float(w["window_end_ts"].max()),
                "train_s": float(w["dur_s"].sum()),
                "tail_samples_per_s": float(w["samples_per_s"].tail(3).mean()),
                "tail_span": [float(w["start_ts"].tail(3).min()), float(w["window_end_ts"].max())],
                "startup_s": num(m.get("startup_s")),
                "startup_breakdown": num(m.get("startup_breakdown")),
                "compile_s": num(m.get("compile_s")),
                "compile_cache": num(m.get("compile_cache")),
                "resident_group": num(m.get("resident_group")),
            }
        )
    gpu = gpu_by_run(root)
    for r in runs:
        r["gpu"] = gpu.get(r["run"])
    runs.sort(key=lambda r: r["first_start_ts"])
    prev_end = launched  # the first run's gap is its cold start, from the subprocess's launch
    for r in runs:
        r["to_first_window_s"], prev_end = r["first_start_ts"] - prev_end, r["last_end_ts"]
    gaps = [r["to_first_window_s"] for r in runs[1:]]
    span = max(r["last_end_ts"] for r in runs) - min(r["first_start_ts"] for r in runs)
    timed = sum(r["train_s"] for r in runs)
    summary = json.loads((root / "summary.json").read_text())
    groups = {}
    for g in summary.get("ranking", []):
        tails = [r["tail_samples_per_s"] for r in runs if r["group"] == g["group"]]
        groups[g["group"]] = {
            "robust": num(g.get("tail_samples_per_sec_robust")),
            "run_tail_median": median(tails),
            "run_tails": tails,
        }
    return {
        "runs_started": len(runs),
        "timed_train_s": timed,
        "busy_share": timed / span if span > 0 else None,
        "cold_start_s": runs[0]["to_first_window_s"] if runs else None,
        "overheads_s": gaps,
        "overhead_median_s": median(gaps),
        "overhead_max_s": max(gaps) if gaps else None,
        "best_group": summary.get("best_group"),
        "groups": groups,
        "runs": runs,
        "memory": memory(root / "groups.json"),
    }


def gpu_by_run(root: Path) -> dict[str, dict[str, float]]:
    """Rank 0's NVML samples per run (the sweep's GPU telemetry): median SM clock, mean power,
    temperature and utilisation; empty without a GPU."""
    import pandas as pd

    path = root / OutputRoot.GPU_TELEMETRY
    if not path.exists():
        return {}
    g = pd.read_parquet(path)
    g = g[g["rank"] == 0]
    if g.empty:
        return {}
    agg = g.groupby("run").agg(
        sm_mhz=("sm_clock_mhz", "median"),
        power_w=("power_w", "mean"),
        temp_c=("temp_c", "mean"),
        util_pct=("util_gpu_pct", "mean"),
    )
    return {run: {k: float(v) for k, v in row.items()} for run, row in agg.iterrows()}


def memory(path: Path) -> list[dict[str, Any]] | None:
    """Each resident group's runs: rank 0's RSS and GPU memory after the run, and their growth
    since the group's first run ended."""
    if not path.is_file():
        return None
    out = []
    for g in json.loads(path.read_text()).get("groups", []):
        first = (g["runs"][0].get("memory_after") or {}) if g["runs"] else {}
        for r in g["runs"]:
            after = r.get("memory_after") or {}
            row = {"resident_group": g["group"], "run": r["run"], "outcome": r.get("outcome")}
            for key in ("rss_mb", "gpu_allocated_mb"):
                if key in after:
                    row[key] = after[key]
                    row[key.replace("_mb", "_growth_mb")] = after[key] - first.get(key, after[key])
            row["release_s"] = after.get("release_s")
            out.append(row)
    return out


def with_host_speed(variants: dict[str, dict], samples: list[dict[str, float]]) -> None:
    """Each run's host speed over its tail windows, from the canary's samples."""
    for v in variants.values():
        for r in v.get("runs", []):
            if r.get("tail_span"):
                r["host"] = host_over(samples, *r["tail_span"]) or None


def block_name(variants: dict[str, dict], name: str) -> str:
    """``name``, or ``name_2``, ``name_3``... for the later blocks of one variant."""
    k = 1
    while (f"{name}_{k}" if k > 1 else name) in variants:
        k += 1
    return f"{name}_{k}" if k > 1 else name


def combined(paths: list[Path]) -> tuple[dict[str, dict], list[str], list[str]]:
    """The sweeps of earlier results, in the order given, as the blocks of one command."""
    variants: dict[str, dict] = {}
    for path in paths:
        for v in json.loads(path.read_text())["variants"].values():
            variants[block_name(variants, f"{v['scheduler']}_{v['executor']}")] = v
    schedulers = list(dict.fromkeys(v["scheduler"] for v in variants.values()))
    executors = list(dict.fromkeys(v["executor"] for v in variants.values()))
    return variants, schedulers, executors


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.time_to_answer", description=__doc__.split("\n")[0]
    )
    p.add_argument("--space")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument(
        "--output-root", type=Path, default=Path("outputs") / f"time_to_answer_{int(time.time())}"
    )
    p.add_argument("--executors", default="fresh,resident")
    p.add_argument("--schedulers", default="fifo")
    p.add_argument("--label", default="cpu2")
    p.add_argument("--json", type=Path)
    p.add_argument("--markdown", type=Path)
    p.add_argument(
        "--combine",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="pool the sweeps of earlier results (their JSON) instead of running any",
    )
    p.add_argument(
        "--no-canary",
        dest="canary",
        action="store_false",
        help="no host-speed sampler beside the sweeps (benchmarks/probes/host_canary.py)",
    )
    given = sys.argv[1:] if argv is None else argv
    args = p.parse_args(given)
    if not args.combine and not args.space:
        p.error("--space is required (or --combine earlier results)")
    executors = args.executors.split(",")
    schedulers = args.schedulers.split(",")
    out_json = (
        args.json
        or ROOT / "benchmarks" / "results" / f"time_to_answer_{args.label}" / "time_to_answer.json"
    )
    out_md = args.markdown or out_json.with_name("time_to_answer.md")
    if args.combine:
        variants, schedulers, executors = combined(args.combine)
        args.space = args.space or json.loads(args.combine[0].read_text())["space"]
    else:
        root = args.output_root.resolve()
        variants = {}
        canary = out_json.with_suffix(".canary.jsonl")
        canary.unlink(missing_ok=True)
        with Canary(canary) if args.canary else contextlib.nullcontext():
            for s in schedulers:
                for e in executors:
                    name = block_name(variants, f"{s}_{e}")
                    variants[name] = sweep(args.space, root / name, s, e, args.set)
        with_host_speed(variants, read_samples(canary))
    failed = [n for n, v in variants.items() if v["exit_code"] != 0 or "error" in v]
    try:
        cmp = compare(variants, schedulers, executors)
    except Exception as exc:  # a sweep measured nothing: keep the per-variant records
        cmp = {"compare_error": f"{type(exc).__name__}: {exc}"}
    text = markdown(args.space, variants, cmp)
    print("\n" + text)
    record = {
        "space": args.space,
        "sets": args.set,
        "label": args.label,
        "command": shlex.join([sys.executable, "-m", "benchmarks.time_to_answer", *given]),
        "failed": failed,
        **cmp,
        "variants": variants,
    }
    for path, body in ((out_json, json.dumps(record, indent=2, default=str)), (out_md, text)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    print(f"wrote {out_json} and {out_md}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
