"""How fast the host's CPU and memory are, sampled over time beside a probe (issue 24).

The resident-vs-fresh tails gap of benchmarks/probes/resident_speed_probe.py showed up as uniformly
dearer CPU work on some hosts, in runs that sat in the middle of each sequence, between the
fresh runs. A process that stays slow and a host that is slow for a few minutes look the same
there. This canary tells them apart: a separate process that, every ``--period`` seconds, times a
fixed piece of CPU work (SHA-256 over a 256 KiB buffer that stays in the core's cache) and a
fixed memory copy (64 MiB, beyond the caches), and appends one JSON line per sample. Its own
process never changes, so a dip in its figures is the host's, not the probe process's.

    python -m benchmarks.probes.host_canary --out canary.jsonl &         # until killed
    python -m benchmarks.probes.host_canary --summarize probe.json canary.jsonl

``--summarize`` takes each run's tail (the span of its last three timed windows, from
``window_ends``), the canary's medians over that span, and each run's tail over the mean of the
fresh runs next to it (the one before and the one after), so an in-process run is compared
with fresh runs minutes from it, on the host as it was then.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.probes.host_adjust import host_adjusted

TAIL_WINDOWS = 3  # as benchmarks/probes/resident_speed_probe.py


def sample(buf: bytes, src: bytearray, dst: bytearray) -> dict[str, float]:
    t0 = time.perf_counter()
    for _ in range(32):
        hashlib.sha256(buf).digest()
    t1 = time.perf_counter()
    dst[:] = src
    t2 = time.perf_counter()
    return {
        "t": round(time.time(), 3),
        "hash_mb_s": round(32 * len(buf) / 2**20 / (t1 - t0), 1),
        "copy_gb_s": round(len(src) / 2**30 / (t2 - t1), 2),
    }


def run(out: Path, period: float) -> None:
    buf, src, dst = bytes(range(256)) * 1024, bytearray(64 * 2**20), bytearray(64 * 2**20)
    with out.open("a") as f:
        while True:
            f.write(json.dumps(sample(buf, src, dst)) + "\n")
            f.flush()
            time.sleep(period)


class Canary:
    """This module's sampler in a process of its own while the ``with`` block runs."""

    def __init__(self, out: Path, period: float = 0.5) -> None:
        self.out, self.period, self.proc = out, period, None

    def __enter__(self) -> Canary:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "benchmarks.probes.host_canary", "--out", str(self.out)]
        cmd += ["--period", str(self.period)]
        self.proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[2])
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def read_samples(path: Path) -> list[dict[str, float]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def host_over(samples: list[dict[str, float]], start: float, end: float) -> dict[str, Any]:
    """The canary's medians between two wall-clock times (an empty dict if none fell there)."""
    inside = [s for s in samples if start <= s["t"] <= end]
    if not inside:
        return {}
    return {
        "copy_gb_s": statistics.median(s["copy_gb_s"] for s in inside),
        "hash_mb_s": statistics.median(s["hash_mb_s"] for s in inside),
        "samples": len(inside),
    }


def tail_span(run_rec: dict[str, Any]) -> tuple[float, float] | None:
    ends = run_rec.get("window_ends") or []
    if len(ends) <= TAIL_WINDOWS:
        return None
    return ends[-TAIL_WINDOWS - 1], ends[-1]


def neighbours_fresh(runs: list[dict[str, Any]], i: int) -> float | None:
    """The mean tail of the nearest fresh run before run i and the nearest after it."""
    case = runs[i]["case"]
    before = [r for r in runs[:i] if r["step"] == "fresh" and r["case"] == case][-1:]
    after = [r for r in runs[i + 1 :] if r["step"] == "fresh" and r["case"] == case][:1]
    near = [r["tail_samples_per_s"] for r in before + after]
    return statistics.fmean(near) if near else None


def summarize(probe: Path, canary: Path) -> list[str]:
    runs = json.loads(probe.read_text())["runs"]
    samples = read_samples(canary)
    fit_runs: list[dict[str, Any]] = []
    lines = [
        "| run | tail samples/s | / fresh runs next to it | canary SHA-256 MB/s | "
        "canary copy GB/s | canary samples |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for i, r in enumerate(runs):
        span = tail_span(r)
        host = host_over(samples, *span) if span else {}
        near = neighbours_fresh(runs, i)
        ratio = f"{r['tail_samples_per_s'] / near:.3f}" if near else "-"
        hash_s = f"{host['hash_mb_s']:.0f}" if host else "-"
        copy_s = f"{host['copy_gb_s']:.2f}" if host else "-"
        lines.append(
            f"| {r['label']} | {r['tail_samples_per_s']:.1f} | {ratio} | {hash_s} | {copy_s} "
            f"| {host.get('samples', 0)} |"
        )
        fit_runs.append(
            {"group": r["case"], "executor": "fresh" if r["step"] == "fresh" else "resident"}
            | {"tail": r["tail_samples_per_s"], **host}
        )
    fit = host_adjusted(fit_runs)
    if fit:
        lo_hi = ", ".join(f"{v:.3f}" for v in fit["resident_effect_95"] or [])
        lines += [
            "",
            f"In-process over fresh at the same host speed (benchmarks/probes/host_adjust.py, "
            f"{fit['runs']} runs): {fit['resident_effect']:.3f} (95 %: {lo_hi}); R^2 "
            f"{fit['r2']:.3f}, {fit['r2_without_host']:.3f} without the host's speed",
        ]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.probes.host_canary", description=__doc__)
    p.add_argument("--out", type=Path, help="append samples here until killed")
    p.add_argument("--period", type=float, default=0.5)
    p.add_argument("--summarize", nargs=2, type=Path, metavar=("PROBE_JSON", "CANARY_JSONL"))
    args = p.parse_args(argv)
    if args.summarize:
        missing = [str(f) for f in args.summarize if not f.is_file()]
        if missing:
            print(f"--summarize: no such file {missing[0]}", file=sys.stderr)
            return 2
        print("\n".join(summarize(*args.summarize)))
        return 0
    if args.out is None:
        print("give --out FILE (to sample) or --summarize PROBE_JSON CANARY_JSONL", file=sys.stderr)
        return 2
    run(args.out, args.period)
    return 0


if __name__ == "__main__":
    sys.exit(main())
