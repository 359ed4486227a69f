"""Ray Data pipeline against a plain single-process loop, same per-file work, one run.

    python -m benchmarks.probes.data_prep_bench [--files 320] [--repeats 3] [--workers N] \
        [--corpus DIR]

Both variants call data_prep.pipeline.process_row on the same task list (decode, downmix,
resample to 16 kHz, trim, write FLAC; --force so nothing is skipped) into fresh output folders.
Repeats alternate serial / Ray Data so machine drift hits both; medians and their ratio are
printed. The Ray cluster is started once before timing (its start-up is printed separately).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from data_prep import synth
from data_prep.audio import TrimSettings
from data_prep.layout import discover
from data_prep.pipeline import make_tasks, run_ray_data, run_serial
from stage1_common.fileio import write_json


def corpus_for(files: int, corpus: Path | None) -> tuple[Path, float]:
    """A synth corpus of at least ``files`` utterances; returns its root and audio hours."""
    speakers, chapters = 8, 4
    utts = -(-files // (speakers * chapters))
    root = corpus or Path(tempfile.mkdtemp(prefix="data_prep_bench_"))
    spans = root / synth.SPANS_FILE
    if not spans.exists():
        print(f"generating {speakers * chapters * utts} files under {root} ...", flush=True)
        synth.make_corpus(root, speakers=speakers, chapters=chapters, utts=utts, seed=7)
    lines = spans.read_text().splitlines()[1:]
    hours = sum(float(line.split("\t")[3]) for line in lines) / 3600
    return root, hours


def timed(run, tasks) -> tuple[float, float, float]:
    """Wall time, time to the first result, and files/s after the first result arrived."""
    start = time.perf_counter()
    rows, first, first_count = [], None, 0
    for row in run(tasks):
        rows.append(row)
        if first is None:
            first = time.perf_counter() - start
        if time.perf_counter() - start <= first + 1e-3:
            first_count = len(rows)  # results arrive a block at a time
    elapsed = time.perf_counter() - start
    bad = [r for r in rows if r["status"] != "written"]
    if len(rows) != len(tasks) or bad:
        raise SystemExit(f"benchmark run did not process every file: {bad[:3]}")
    steady = (len(rows) - first_count) / max(elapsed - first, 1e-9)
    return elapsed, first, steady


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=2000, help="at least this many utterances")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, help="Ray Data tasks; default: all CPUs")
    p.add_argument("--corpus", type=Path, help="reuse (or create) the corpus here")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)

    root, hours = corpus_for(args.files, args.corpus)
    found = discover(root)
    n = len(found.utterances)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    t0 = time.perf_counter()
    ray.init(include_dashboard=False, logging_level="WARNING")
    ray_start_s = time.perf_counter() - t0
    workers = args.workers or int(ray.cluster_resources()["CPU"])
    scratch = Path(tempfile.mkdtemp(prefix="data_prep_bench_out_"))
    times: dict[str, list[float]] = {"serial": [], "ray_data": []}
    firsts: dict[str, list[float]] = {"serial": [], "ray_data": []}
    steadies: dict[str, list[float]] = {"serial": [], "ray_data": []}
    try:
        for rep in range(1, args.repeats + 1):
            for name, run in (
                ("serial", run_serial),
                ("ray_data", lambda t: run_ray_data(t, workers)),
            ):
                out = scratch / f"{name}_{rep}"
                tasks = make_tasks(
                    found.utterances,
                    root,
                    out,
                    target_sr=16_000,
                    trim=True,
                    settings=TrimSettings(),
                    force=True,
                )
                wall, first, steady = timed(run, tasks)
                times[name].append(wall)
                firsts[name].append(first)
                steadies[name].append(steady)
                print(
                    f"  repeat {rep} {name:<8} {wall:7.2f} s  (first result after {first:.2f} s)",
                    flush=True,
                )
                shutil.rmtree(out)
    finally:
        ray.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)

    cores = {"serial": 1, "ray_data": workers}
    figures = {}
    for name, values in times.items():
        median = statistics.median(values)
        figures[name] = {
            "median_s": median,
            "files_per_s": n / median,
            "audio_hours_per_s_per_core": hours / median / cores[name],
            "first_result_s": statistics.median(firsts[name]),
            "steady_files_per_s": statistics.median(steadies[name]),
            "cores": cores[name],
            "runs_s": values,
        }
    ratio = figures["ray_data"]["files_per_s"] / figures["serial"]["files_per_s"]
    steady_ratio = (
        figures["ray_data"]["steady_files_per_s"] / figures["serial"]["steady_files_per_s"]
    )
    print(
        f"\n{n} files, {hours:.2f} h of audio, {os.cpu_count()} CPUs, Ray start-up {ray_start_s:.1f} s (not timed)"
    )
    header = f"{'variant':<10} {'cores':>5} {'median s':>9} {'files/s':>8} {'audio h/s/core':>15}"
    print(header + f" {'1st result s':>13} {'steady files/s':>15}")
    for name, f in figures.items():
        print(
            f"{name:<10} {f['cores']:>5} {f['median_s']:>9.2f} {f['files_per_s']:>8.1f} "
            f"{f['audio_hours_per_s_per_core']:>15.4f} {f['first_result_s']:>13.2f} "
            f"{f['steady_files_per_s']:>15.1f}"
        )
    print(
        f"ray_data / serial throughput: {ratio:.2f}x end to end, "
        f"{steady_ratio:.2f}x after the first result"
    )
    if args.json:
        write_json(
            args.json,
            {
                "files": n,
                "audio_hours": hours,
                "cpus": os.cpu_count(),
                "ray_start_s": ray_start_s,
                "ratio": ratio,
                "steady_ratio": steady_ratio,
                **figures,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
