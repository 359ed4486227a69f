"""Two py-spy raw profiles side by side (``py-spy record --format raw --threads``, as
benchmarks/probes/resident_speed_probe.py's ``:spy`` runs write them): samples per thread, then
for one thread each frame's inclusive samples in both, heaviest difference first. py-spy leaves
out a thread's idle samples, so a thread's count is its busy time (100 samples a second).

    python -m benchmarks.probes.spy_compare A.txt B.txt [--thread MainThread] [--top 30]
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

THREAD = re.compile(r"^thread \(\w+\): ([^;]*)")


def read(path: Path) -> list[tuple[str, list[str], int]]:
    """(thread name, frames root first, samples) per stack line."""
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        m = THREAD.match(frames[0])
        thread = m.group(1) if m else "?"
        stacks.append((thread, frames[1:] if m else frames, int(count)))
    return stacks


def per_thread(stacks) -> Counter:
    out: Counter = Counter()
    for thread, _, n in stacks:
        out[thread] += n
    return out


def inclusive(stacks, thread: str) -> Counter:
    """Samples in which each frame (its function and library, without the line) is on the
    stack, counted once per sample."""
    out: Counter = Counter()
    for name, frames, n in stacks:
        if name != thread:
            continue
        for f in {re.sub(r":\d+\)$", ")", f) for f in frames}:
            out[f] += n
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--thread", default="MainThread")
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args(argv)
    for f in (args.a, args.b):
        if not f.is_file():
            print(f"{f}: no such profile; give two py-spy raw files", file=sys.stderr)
            return 2
    a, b = read(args.a), read(args.b)
    ta, tb = per_thread(a), per_thread(b)
    print(f"| thread | {args.a.name} | {args.b.name} |\n| --- | --- | --- |")
    for t in sorted(set(ta) | set(tb), key=lambda t: -(ta[t] + tb[t])):
        print(f"| {t} | {ta[t]} | {tb[t]} |")
    ia, ib = inclusive(a, args.thread), inclusive(b, args.thread)
    na, nb = ta[args.thread] or 1, tb[args.thread] or 1
    rows = sorted(set(ia) | set(ib), key=lambda f: -abs(ib[f] - ia[f]))[: args.top]
    print(
        f"\n{args.thread}: inclusive samples (share of the thread's samples), largest change first"
    )
    print(f"| frame | {args.a.name} | {args.b.name} | change |\n| --- | --- | --- | --- |")
    for f in rows:
        print(
            f"| {f[:110]} | {ia[f]} ({ia[f] / na:.1%}) | {ib[f]} ({ib[f] / nb:.1%}) | "
            f"{ib[f] - ia[f]:+d} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
