"""A py-spy speedscope record as a timeline: per second, each thread's most sampled frames
(``py-spy record --format speedscope --threads --idle -r 100``, as
benchmarks/probes/first_run_gpu.sh with FIRST_RUN_SPY=1 writes it). A speedscope profile keeps
its samples in order, so a sample's index at a known rate is its time; a thread's clock starts
when py-spy first saw it (every thread's record ends with the recording).

    python -m benchmarks.probes.spy_timeline RECORD.json[.gz] [--rate 100] \
        [--threads MainThread,...]

Each line: the second, then the two most sampled pairs "our frame >> leaf frame" of that second
(our frame: the innermost frame of this project's packages, '-' when none).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

OURS = ("trainables/", "platform/", "stage1_common/", "data_prep/")


def timeline(record: dict, rate: float, threads: set[str] | None = None) -> list[str]:
    frames = record["shared"]["frames"]

    def label(i: int) -> str:
        f = frames[i]
        return f"{f['name']} ({Path(f.get('file', '')).name}:{f.get('line', '')})"

    def ours(i: int) -> bool:
        return any(part in frames[i].get("file", "") for part in OURS)

    end = max(len(p["samples"]) for p in record["profiles"]) / rate
    lines = []
    for profile in record["profiles"]:
        name = profile["name"].split('"')[1] if '"' in profile["name"] else profile["name"]
        if threads and name not in threads:
            continue
        start = end - len(profile["samples"]) / rate
        lines.append(f"== {name} (from {start:.2f} s)")
        seconds: dict[int, Counter] = defaultdict(Counter)
        for k, stack in enumerate(profile["samples"]):
            mine = [label(i) for i in stack if ours(i)]
            leaf = label(stack[-1]) if stack else "idle"
            seconds[int(start + k / rate)][f"{mine[-1] if mine else '-'}  >>  {leaf}"] += 1
        for second in sorted(seconds):
            top = seconds[second].most_common(2)
            lines.append(f"{second:4d}s  " + " | ".join(f"{n} {key}" for key, n in top))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("record", type=Path)
    parser.add_argument("--rate", type=float, default=100.0, help="samples a second")
    parser.add_argument("--threads", default="", help="thread names, comma-separated (all)")
    args = parser.parse_args(argv)
    opener = gzip.open if args.record.suffix == ".gz" else open
    with opener(args.record, "rt") as fh:
        record = json.load(fh)
    wanted = {t for t in args.threads.split(",") if t} or None
    print("\n".join(timeline(record, args.rate, wanted)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
