"""The host's side of two profiled steps, op by op (issue 42): where a platform run's loop and
autograd threads spend CPU time that its reference's do not.

    python -m benchmarks.probes.host_ops BASE_TRACE.json OTHER_TRACE.json [--top 15] \
        [--json OUT.json]

Two Chrome traces of the same workload (benchmarks/strategy_reference.py's ``--profile`` and the
platform's ``profile_steps``, as benchmarks/reference_compare.py makes them; ``.gz`` read too).
Per trace, two threads: the loop's (the one that opens the ``forward`` phase) and autograd's
(the other thread with the most CPU ops, which runs the backward). For each: the median of its
kernel launch calls (microseconds), then the ops whose own time (less the ops and runtime calls
nested in them) differs most between the traces: calls per profiled step, median us, ms per
step. A GPU that waits for the host (``gpu_idle`` in benchmarks/step_profile.py) waits for
these.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
from pathlib import Path

from benchmarks.step_profile import read_trace


def threads(events: list[dict]) -> dict[str, int]:
    """The loop's and autograd's thread ids."""
    loops = [
        e["tid"] for e in events if e.get("cat") == "user_annotation" and e["name"] == "forward"
    ]
    ops = collections.Counter(e.get("tid") for e in events if e.get("cat") == "cpu_op")
    others = [tid for tid, _ in ops.most_common() if tid not in loops[:1]]
    if not loops or not others:
        raise ValueError(
            "a trace without a 'forward' phase or a second thread of CPU ops: profile training "
            "steps with record_function('forward') around the forward (as "
            "benchmarks/strategy_reference.py --profile and profile_steps do) and a backward"
        )
    return {"loop": loops[0], "autograd": others[0]}


def _self_us(spans: list[dict]) -> list[tuple[str, float]]:
    """Each op of one thread with its own time: its duration less the ops and runtime calls
    nested in it (an ``aten::to`` holds its ``aten::_to_copy``, which holds its ``copy_``)."""
    stack: list[list] = []  # [end, index]
    own = [[e["name"], float(e["dur"])] for e in spans]
    for i, e in enumerate(spans):
        while stack and stack[-1][0] <= e["ts"]:
            stack.pop()
        if stack:
            own[stack[-1][1]][1] -= e["dur"]
        stack.append([e["ts"] + e["dur"], i])
    return [
        (name, us) for (name, us), e in zip(own, spans, strict=True) if e.get("cat") == "cpu_op"
    ]


def per_thread(events: list[dict]) -> dict[str, dict]:
    """Per thread role: steps, each op's own durations (us), and cudaLaunchKernel's."""
    steps = sum(1 for e in events if e.get("cat") == "user_annotation" and e["name"] == "forward")
    out = {}
    for role, tid in threads(events).items():
        spans = sorted(
            (e for e in events
             if e.get("tid") == tid and "dur" in e and e.get("cat") in ("cpu_op", "cuda_runtime")),
            key=lambda e: (e["ts"], -e["dur"]),
        )  # fmt: skip
        ops: dict[str, list[float]] = collections.defaultdict(list)
        for name, us in _self_us(spans):
            ops[name].append(us)
        launches = [e["dur"] for e in spans if e["name"].startswith("cudaLaunchKernel")]
        out[role] = {"steps": max(steps, 1), "ops": ops, "launch_us": launches}
    return out


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.1f}" if values else "-"


def compare(base: dict, other: dict, top: int) -> list[str]:
    lines = []
    for role in ("loop", "autograd"):
        a, b = base[role], other[role]
        launch = [_median(side["launch_us"]) for side in (a, b)]
        lines.append(f"{role} thread: cudaLaunchKernel median {launch[0]} -> {launch[1]} us")
        rows = []
        for name in set(a["ops"]) | set(b["ops"]):
            da, db = a["ops"].get(name, []), b["ops"].get(name, [])
            ms_a, ms_b = sum(da) / 1e3 / a["steps"], sum(db) / 1e3 / b["steps"]
            rows.append((ms_b - ms_a, name, da, db, ms_a, ms_b))
        rows.sort(key=lambda r: -abs(r[0]))
        lines.append("| op | per step | median us | ms per step |")
        lines.append("| --- | --- | --- | --- |")
        for _, name, da, db, ms_a, ms_b in rows[:top]:
            med = [_median(d) for d in (da, db)]
            lines.append(
                f"| {name[:60]} | {len(da) / a['steps']:.0f} -> {len(db) / b['steps']:.0f} | "
                f"{med[0]} -> {med[1]} | {ms_a:.1f} -> {ms_b:.1f} |"
            )
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base", type=Path)
    p.add_argument("other", type=Path)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    base, other = (per_thread(read_trace(path)) for path in (args.base, args.other))
    lines = [f"{args.base.name} -> {args.other.name}", ""] + compare(base, other, args.top)
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"command": sys.argv, "lines": lines}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
