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
        [--gaps N]

``--gaps N``: what the GPU waited for in its idle time, per step (``idle_gaps``). Each gap
between two GPU activities inside the steps is charged to the activity that ends it: if the
host launched that work after the gap began, the GPU waited for the host (``host``), charged to
the innermost host op around the launch (an eager op between compiled regions, a CUDA graph's
replay, the loop between steps); if it was launched before, it waited in the queue for
something else (``queued``: a stream or event wait, a copy, another stream's work). The N
(phase, cause, op) rows with the most idle time; their sum is ``gpu_idle`` less the idle time
before the trace's first GPU activity and after its last, which no activity ends.

One row a trace, labelled by its file's name (a platform run's ``profile-rank0.json`` by its
run's folder).
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import sys
from pathlib import Path
from typing import Any

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


def _steps(complete: list[dict], required: bool = True) -> list[tuple[float, float]]:
    """The trace's ``ProfilerStep#`` spans, in time order (``required``: refused when none)."""
    steps = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in complete
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#")
    )
    if required and not steps:
        raise ValueError("no ProfilerStep# span in the trace: profile with prof.step() per step")
    return steps


def summarise(events: list[dict]) -> dict[str, float]:
    """Milliseconds per step of each column (COLUMNS), averaged over the trace's steps, and
    ``steps``: how many."""
    complete = [e for e in events if e.get("ph") == "X"]
    steps = _steps(complete)
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
    milliseconds per step, their share of all kernel time, and ``op``: the innermost host op
    around their launches that holds most of their time (an eager op, or the compiled graph
    or CUDA graph replay that launched them)."""
    complete = [e for e in events if e.get("ph") == "X"]
    steps = max(len(_steps(complete, required=False)), 1)
    launches = {
        e["args"]["correlation"]: e
        for e in complete
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    host = _HostOps(complete)
    totals: dict[str, list] = {}
    for e in complete:
        if e.get("cat") == "kernel":
            entry = totals.setdefault(str(e.get("name", "")), [0, 0.0, {}])
            entry[0] += 1
            entry[1] += e["dur"]
            launch = launches.get(e.get("args", {}).get("correlation"))
            op = "(no launch recorded)"
            if launch is not None:
                op = host._innermost(launch.get("tid"), launch["ts"]) or str(launch["name"])
            entry[2][op] = entry[2].get(op, 0.0) + e["dur"]
    all_us = sum(us for _, us, _ in totals.values()) or 1.0
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][1])[:n]
    return [
        {
            "kernel": name[:120],
            "calls_per_step": calls / steps,
            "ms_per_step": us / steps / 1e3,
            "share": us / all_us,
            "op": max(ops, key=ops.get)[:80],
        }
        for name, (calls, us, ops) in ranked
    ]


_HOST_CATS = ("cpu_op", "user_annotation", "python_function")


def idle_gaps(events: list[dict], n: int = 15) -> list[dict]:
    """The GPU's idle gaps inside the steps, each charged to the GPU activity that ends it
    (see the module's docstring): rows of ``phase`` (forward, backward, optimizer, or ``step``
    outside them), ``cause`` (``host`` or ``queued``), ``op`` (the innermost host op around the
    launch, on the launching thread), ``ms_per_step``, ``gaps_per_step`` and ``largest_ms``;
    the ``n`` with the most idle time."""
    complete = [e for e in events if e.get("ph") == "X"]
    steps = _steps(complete)
    launches = {
        e["args"]["correlation"]: e
        for e in complete
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    host = _HostOps(complete)
    gpu = sorted((e for e in complete if e.get("cat") in _GPU_CATS), key=lambda e: e["ts"])
    totals: dict[tuple[str, str, str], list[float]] = {}
    busy_until = None
    for e in gpu:
        start = e["ts"]
        if busy_until is not None and start > busy_until and _inside(busy_until, start, steps):
            key = host.charge(e, busy_until, launches)
            entry = totals.setdefault(key, [0.0, 0.0, 0.0])
            gap = start - busy_until
            entry[0] += gap
            entry[1] += 1
            entry[2] = max(entry[2], gap)
        end = start + e["dur"]
        busy_until = end if busy_until is None else max(busy_until, end)
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:n]
    return [
        {
            "phase": phase,
            "cause": cause,
            "op": op[:80],
            "ms_per_step": us / len(steps) / 1e3,
            "gaps_per_step": count / len(steps),
            "largest_ms": largest / 1e3,
        }
        for (phase, cause, op), (us, count, largest) in ranked
    ]


def _inside(lo: float, hi: float, steps: list[tuple[float, float]]) -> bool:
    """Whether the gap (lo, hi) lies within the steps' span (not before the first one began or
    after the last one ended)."""
    return lo >= steps[0][0] and hi <= steps[-1][1]


class _HostOps:
    """The trace's host ops by thread, in start order, and the phases' spans (any thread), to
    find what was around a launch: a launch's innermost op is the latest-starting op of its
    thread still running at the launch (ops on one thread nest)."""

    def __init__(self, complete: list[dict]):
        self.phases = [
            (e["ts"], e["ts"] + e["dur"], e["name"])
            for e in complete
            if e.get("name") in PHASES and e.get("cat") in ("user_annotation", "cpu_op")
        ]
        by_tid: dict[Any, list[dict]] = {}
        for e in complete:
            name = str(e.get("name", ""))
            if e.get("cat") in _HOST_CATS and name not in PHASES:
                if not name.startswith("ProfilerStep#"):
                    by_tid.setdefault(e.get("tid"), []).append(e)
        self.ops = {tid: sorted(ops, key=lambda e: e["ts"]) for tid, ops in by_tid.items()}
        self.starts = {tid: [e["ts"] for e in ops] for tid, ops in self.ops.items()}

    def charge(self, kernel: dict, gap_start: float, launches: dict) -> tuple[str, str, str]:
        """(phase, cause, op) of the gap that ``kernel`` ends."""
        launch = launches.get(kernel.get("args", {}).get("correlation"))
        if launch is None:
            return ("step", "queued", "(no launch recorded)")
        at = launch["ts"]
        cause = "host" if at + launch["dur"] > gap_start else "queued"
        phase = next((name for lo, hi, name in self.phases if lo <= at <= hi), "step")
        return (phase, cause, self._innermost(launch.get("tid"), at) or str(launch["name"]))

    def _innermost(self, tid: Any, at: float, reach: int = 2000) -> str | None:
        ops, starts = self.ops.get(tid, []), self.starts.get(tid, [])
        i = bisect.bisect_right(starts, at) - 1
        for e in ops[max(i - reach, -1) + 1 : i + 1][::-1]:
            if e["ts"] + e["dur"] >= at:
                return str(e["name"])
        return None


def gaps_table(rows: list[dict]) -> str:
    """Markdown of ``idle_gaps`` rows."""
    lines = [
        "| phase | waited for | host op around the launch | idle ms/step | gaps/step | largest ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        op = r["op"].replace("|", "/")
        lines.append(
            f"| {r['phase']} | {r['cause']} | {op} | {r['ms_per_step']:.2f} | "
            f"{r['gaps_per_step']:.1f} | {r['largest_ms']:.2f} |"
        )
    return "\n".join(lines)


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
    lines = [
        "| kernel | calls/step | ms/step | share | launched in (host op) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        name, op = r["kernel"].replace("|", "/"), r.get("op", "").replace("|", "/")
        lines.append(
            f"| {name} | {r['calls_per_step']:.0f} | {r['ms_per_step']:.2f} | {r['share']:.3f} "
            f"| {op} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", type=Path, nargs="+")
    parser.add_argument("--json", type=Path, help="write the summaries here")
    parser.add_argument(
        "--kernels", type=int, default=0, help="also list each trace's N kernels with most GPU time"
    )
    parser.add_argument(
        "--gaps", type=int, default=0, help="also charge each trace's idle GPU time: N rows"
    )
    args = parser.parse_args(argv)
    rows, kernels, gaps = {}, {}, {}
    for path in args.traces:
        label = path.parent.name if path.name.startswith("profile-rank") else path.name
        try:
            events = read_trace(path)
            rows[label.split(".")[0]] = summarise(events)
            if args.kernels:
                kernels[label.split(".")[0]] = top_kernels(events, args.kernels)
            if args.gaps:
                gaps[label.split(".")[0]] = idle_gaps(events, args.gaps)
        except (OSError, ValueError, KeyError) as exc:
            print(f"step_profile: error: {path}: {exc}", file=sys.stderr)
            return 2
    print(table(rows))
    for label, top in kernels.items():
        print(f"\n{label}: the {len(top)} kernels with the most GPU time\n{kernel_table(top)}")
    for label, top in gaps.items():
        print(f"\n{label}: what the GPU waited for when idle\n{gaps_table(top)}")
    if args.json:
        extra = {k: v for k, v in (("kernels", kernels), ("gaps", gaps)) if v}
        out = {"summaries": rows, **extra} if extra else rows
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
