"""Where a training step's time goes, from a torch profiler window (issue 42): a Chrome trace
(``torch.profiler`` ``export_chrome_trace``, one ``ProfilerStep#N`` per step, the step's phases
under ``record_function("forward" | "backward" | "optimizer")``, as
benchmarks/strategy_reference.py and the platform's ``profile_steps`` write them) summarised
per step, in milliseconds:

- ``step``: the wall time of a step (its ``ProfilerStep#`` span);
- ``forward``, ``backward``, ``optimizer``: the GPU time of the kernels each phase launched
  (a kernel belongs to the phase whose span holds its launch, on any thread: the backward's
  kernels are launched by autograd's own thread while the loop waits in ``backward``), other
  than communication;
- ``comm``: the communication kernels' time (NCCL's), ``comm_exposed`` the part of it when no
  other kernel ran (communication the step waited for);
- ``gpu_idle``: the step's wall time when no kernel, copy or set ran on the GPU (the host's
  share: Python, launches, hooks, synchronisation).

    python -m benchmarks.step_profile TRACE.json [TRACE2.json ...] [--json OUT.json] [--kernels N]

One row a trace, labelled by its file's name (a platform run's ``profile-rank0.json`` by its
run's folder).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

PHASES = ("forward", "backward", "optimizer")
COLUMNS = ("step", *PHASES, "comm", "comm_exposed", "gpu_idle")
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(spans: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in spans)


def _clip(spans, lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(s, lo), min(e, hi)) for s, e in spans if e > lo and s < hi]


def is_comm(name: str) -> bool:
    return "nccl" in name.lower()


def summarise(events: list[dict]) -> dict[str, float]:
    """Milliseconds per step of each column (COLUMNS), averaged over the trace's steps, and
    ``steps``: how many."""
    complete = [e for e in events if e.get("ph") == "X"]
    steps = [
        (e["ts"], e["ts"] + e["dur"])
        for e in complete
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    if not steps:
        raise ValueError("no ProfilerStep# span in the trace: profile with prof.step() per step")
    phases = {
        p: [
            (e["ts"], e["ts"] + e["dur"])
            for e in complete
            if e.get("name") == p and e.get("cat") in ("user_annotation", "cpu_op")
        ]
        for p in PHASES
    }
    launches = {
        e["args"]["correlation"]: e["ts"]
        for e in complete
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    gpu = [e for e in complete if e.get("cat") in _GPU_CATS]
    comm = _union([(e["ts"], e["ts"] + e["dur"]) for e in gpu if is_comm(e["name"])])
    compute = _union([(e["ts"], e["ts"] + e["dur"]) for e in gpu if not is_comm(e["name"])])
    busy = _union(comm + compute)
    out = dict.fromkeys(COLUMNS, 0.0)
    for lo, hi in steps:
        out["step"] += hi - lo
        out["comm"] += _length(_clip(comm, lo, hi))
        busy_ms, compute_ms = _length(_clip(busy, lo, hi)), _length(_clip(compute, lo, hi))
        out["comm_exposed"] += busy_ms - compute_ms  # communication while nothing else ran
        out["gpu_idle"] += (hi - lo) - busy_ms
    for e in gpu:
        if is_comm(e["name"]) or e.get("cat") != "kernel":
            continue
        launched = launches.get(e.get("args", {}).get("correlation"))
        if launched is None or not any(lo <= launched < hi for lo, hi in steps):
            continue
        for phase, spans in phases.items():
            if any(lo <= launched < hi for lo, hi in spans):
                out[phase] += e["dur"]
                break
    n = len(steps)
    summary = {k: round(v / n / 1e3, 2) for k, v in out.items()}  # us -> ms per step
    summary["steps"] = n
    return summary


def top_kernels(events: list[dict], n: int = 25) -> list[dict]:
    """The ``n`` kernels with the most GPU time over the trace's steps, by name: calls and
    milliseconds per step, and their share of all kernel time."""
    complete = [e for e in events if e.get("ph") == "X"]
    steps = sum(
        1
        for e in complete
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#")
    )
    steps = max(steps, 1)
    totals: dict[str, list[float]] = {}
    for e in complete:
        if e.get("cat") == "kernel":
            entry = totals.setdefault(str(e.get("name", "")), [0, 0.0])
            entry[0] += 1
            entry[1] += e["dur"]
    all_us = sum(us for _, us in totals.values()) or 1.0
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][1])[:n]
    return [
        {
            "kernel": name[:120],
            "calls_per_step": calls / steps,
            "ms_per_step": us / steps / 1e3,
            "share": us / all_us,
        }
        for name, (calls, us) in ranked
    ]


def read_trace(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        data = json.load(fh)
    return data["traceEvents"] if isinstance(data, dict) else data


def table(rows: dict[str, dict[str, float]]) -> str:
    head = "| trace | steps | " + " | ".join(f"{c} ms" for c in COLUMNS) + " |"
    lines = [head, "| --- " * (len(COLUMNS) + 2) + "|"]
    for label, s in rows.items():
        lines.append(
            f"| {label} | {s['steps']} | " + " | ".join(f"{s[c]:.1f}" for c in COLUMNS) + " |"
        )
    return "\n".join(lines)


def kernel_table(rows: list[dict]) -> str:
    """Markdown of ``top_kernels`` rows."""
    lines = ["| kernel | calls/step | ms/step | share |", "| --- | --- | --- | --- |"]
    for r in rows:
        name = r["kernel"].replace("|", "/")
        lines.append(
            f"| {name} | {r['calls_per_step']:.0f} | {r['ms_per_step']:.2f} | {r['share']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", type=Path, nargs="+")
    parser.add_argument("--json", type=Path, help="write the summaries here")
    parser.add_argument(
        "--kernels", type=int, default=0, help="also list each trace's N kernels with most GPU time"
    )
    args = parser.parse_args(argv)
    rows, kernels = {}, {}
    for path in args.traces:
        label = path.parent.name if path.name.startswith("profile-rank") else path.name
        try:
            events = read_trace(path)
            rows[label.split(".")[0]] = summarise(events)
            if args.kernels:
                kernels[label.split(".")[0]] = top_kernels(events, args.kernels)
        except (OSError, ValueError, KeyError) as exc:
            print(f"step_profile: error: {path}: {exc}", file=sys.stderr)
            return 2
    print(table(rows))
    for label, top in kernels.items():
        print(f"\n{label}: the {len(top)} kernels with the most GPU time\n{kernel_table(top)}")
    if args.json:
        out = {"summaries": rows, "kernels": kernels} if kernels else rows
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
