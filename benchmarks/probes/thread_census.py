"""Which threads of a training process use the CPU, sampled from /proc beside a run (issue 53):
a platform worker against its reference, thread by thread.

    python -m benchmarks.probes.thread_census --out census.jsonl --match strategy_reference \
        --match torchrun_main --match RayTrainWorker --match ray::  &     # until killed
    python -m benchmarks.probes.thread_census --summarize census.jsonl [--top 12]

Every ``--period`` seconds it reads, for each process whose command line contains one of the
``--match`` strings, every thread's name, user and system CPU time, involuntary context
switches (the thread was runnable but another took its core) and last CPU, the process's CPU
affinity, and the machine's busy CPUs (/proc/stat), one JSON line per sample. Nothing here
stops or slows the process it watches: /proc is read, never ptrace'd.

``--summarize``: per process (its label and pid, while it lived), the machine's busy cores and
each thread name's CPU use in cores (threads of one name added, their count shown), and the
involuntary switches per second: a loop thread at 1.0 core with many involuntary switches is
waiting for a core; a thread nobody expected at a high share is a suspect.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _label(cmdline: str, matches: list[str]) -> str | None:
    for m in matches:
        if m in cmdline:
            return m
    return None


def _process_cpu(pid: str) -> tuple[str, float] | None:
    """(name, CPU seconds) of a whole process."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return stat[stat.index("(") + 1 : stat.rindex(")")], (int(fields[11]) + int(fields[12])) / TICK


def _thread(pid: int, tid: str) -> dict | None:
    stat = _read(f"/proc/{pid}/task/{tid}/stat")
    if not stat:
        return None
    name = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    status = _read(f"/proc/{pid}/task/{tid}/status")
    nvcs = 0
    for line in status.splitlines():
        if line.startswith("nonvoluntary_ctxt_switches"):
            nvcs = int(line.split()[1])
    # fields[0] is field 3 (state): utime is field 14, stime 15, processor 39.
    return {
        "tid": int(tid),
        "name": name,
        "cpu_s": (int(fields[11]) + int(fields[12])) / TICK,
        "nvcs": nvcs,
        "core": int(fields[36]),
    }


def _machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine."""
    first = _read("/proc/stat").splitlines()[0].split()[1:]
    vals = [int(v) for v in first]
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals)


def sample(matches: list[str]) -> dict:
    procs, others = [], {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        cmdline = _read(f"/proc/{entry}/cmdline").replace("\0", " ").strip()
        label = _label(cmdline, matches)
        if label is None:
            cpu = _process_cpu(entry)
            if cpu is not None:
                others[entry] = [cpu[0], cpu[1], " ".join(cmdline.split())[:100]]
            continue
        status = _read(f"/proc/{entry}/status")
        allowed = next(
            (
                ln.split(":", 1)[1].strip()
                for ln in status.splitlines()
                if ln.startswith("Cpus_allowed_list")
            ),
            "",
        )
        try:
            tids = os.listdir(f"/proc/{entry}/task")
        except OSError:
            continue
        threads = [t for t in (_thread(int(entry), tid) for tid in tids) if t]
        procs.append(
            {
                "pid": int(entry),
                "label": label,
                "cmd": cmdline[:160],
                "cpus": allowed,
                "threads": threads,
            }
        )
    busy, total = _machine_busy()
    return {"ts": time.time(), "busy": busy, "total": total, "procs": procs, "others": others}


def record(out: Path, matches: list[str], period: float) -> None:
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    with out.open("a") as f:
        while not stop:
            f.write(json.dumps(sample(matches)) + "\n")
            f.flush()
            time.sleep(period)


def summarize(path: Path, top: int = 12, min_cores: float = 0.5, from_frac: float = 0.4) -> str:
    """Per process that used ``min_cores`` or more on average: its threads' CPU in cores over the
    last ``1 - from_frac`` of the samples it was seen in (a run's steps come after its start)."""
    samples = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    seen: dict[int, list[tuple[dict, dict]]] = defaultdict(list)
    for s in samples:
        for p in s["procs"]:
            seen[p["pid"]].append((s, p))
    out = []
    for pid, rows in seen.items():
        if len(rows) < 3:
            continue
        (s0, p0), (s1, p1) = rows[int(from_frac * (len(rows) - 1))], rows[-1]
        wall = s1["ts"] - s0["ts"]
        before = {t["tid"]: t for t in p0["threads"]}
        by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
        for t in p1["threads"]:
            b = before.get(t["tid"], {"cpu_s": 0.0, "nvcs": 0})
            agg = by_name[t["name"]]
            agg[0] += t["cpu_s"] - b["cpu_s"]
            agg[1] += t["nvcs"] - b["nvcs"]
            agg[2] += 1
        cores = sum(v[0] for v in by_name.values()) / wall
        if cores < min_cores:
            continue
        machine = (s1["busy"] - s0["busy"]) / max(1, s1["total"] - s0["total"])
        ncpu = os.cpu_count() or 1
        out.append(
            f"## {p1['label']} pid {pid}: {cores:.2f} cores over {wall:.0f} s, "
            f"{len(p1['threads'])} threads, affinity {p1['cpus']}, machine busy "
            f"{machine * ncpu:.1f} of {ncpu} cores\n`{p1['cmd'][:120]}`\n"
        )
        out.append(
            "| thread | threads | cores | involuntary switches/s |\n| --- | --- | --- | --- |"
        )
        ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
        for name, (cpu, nvcs, n) in ranked:
            out.append(f"| {name} | {n} | {cpu / wall:.3f} | {nvcs / wall:.1f} |")
        out.append("")
    return "\n".join(out) + "\n" + _busiest_others(samples, top)


def _busiest_others(samples: list[dict], top: int) -> str:
    """The processes that were not watched but used the CPU while any watched one lived: what
    else kept the machine's cores busy (Ray's own processes, the driver)."""
    watched = [s for s in samples if s["procs"] and "others" in s]
    if len(watched) < 2:
        return ""
    used: dict[str, list] = {}
    for prev, cur in pairwise(watched):
        if cur["ts"] - prev["ts"] > 5:  # a gap between runs: nothing watched lived there
            continue
        for pid, (name, cpu, cmd) in cur.get("others", {}).items():
            before = prev.get("others", {}).get(pid)
            if before is not None:
                row = used.setdefault(pid, [name, 0.0, cmd])
                row[1] += cpu - before[1]
    wall = sum(
        cur["ts"] - prev["ts"] for prev, cur in pairwise(watched) if cur["ts"] - prev["ts"] <= 5
    )
    ranked = sorted(used.items(), key=lambda kv: -kv[1][1])[:top]
    lines = [
        f"## Other processes while a watched one ran ({wall:.0f} s)\n",
        "| pid | name | cores | command |\n| --- | --- | --- | --- |",
    ]
    for pid, (name, cpu, cmd) in ranked:
        lines.append(f"| {pid} | {name} | {cpu / max(wall, 1e-9):.3f} | `{cmd[:80]}` |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--match", action="append", default=[])
    p.add_argument("--period", type=float, default=1.0)
    p.add_argument("--summarize", type=Path)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--from-frac", type=float, default=0.4, help="--summarize: skip this share")
    args = p.parse_args(argv)
    if args.summarize:
        print(summarize(args.summarize, args.top, from_frac=args.from_frac))
        return 0
    if not args.out or not args.match:
        p.error("--out and at least one --match, or --summarize FILE")
    record(args.out, args.match, args.period)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
