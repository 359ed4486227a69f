"""Why a resident run's tail samples/s can trail a fresh run's (issue 24), without Ray: the same
configuration (h200_fastest's eager mb256 crop-bucket case, DDP, world 1) trained

- in fresh processes (``--runs 1`` in a subprocess, as a fresh trial would), before and after;
- in one process several times, as a resident group does: after ``serve.release``, after a
  light release (collect and ``empty_cache`` only), and after a pause that lets the GPU cool;

with the GPU's SM clock, power and temperature (NVML) over each run's timed windows. One line per
run and a table; ``--json`` keeps them. A step may name its case (``first:mainline``,
``release:buckets``): ``buckets`` is the crop-bucket case, ``mainline`` the same without crop
buckets (padded batches, as h200_fastest's baseline group), so a sequence can run the bucket
case after the mainline in one process, as a resident group that runs the sweep in order does.
``--profile-window K`` records the CUDA kernels of the window after the K-th (torch.profiler)
in the runs marked ``:profile`` (``fresh:buckets:profile``): their heaviest kernels per step, to
tell which kernels a slower run spends its time in. Each
run also records the caching allocator's out-of-memory count (``num_ooms``: a workspace request
that failed makes cuDNN choose, and cache for the process's life, another plan), the training
thread's CPU time per step, and what the process carried into the run (threads, child
processes, open files, memory mappings, RSS). ``:spy`` (``fresh:buckets:spy``) samples the host's
stacks, Python and C++, over two windows with py-spy (``--spy-window``, ``--spy-dir``): where the
host's side of a step goes. Tails leave out the profiled or sampled windows (and the next).
Each run records page faults per step, its anonymous memory on huge pages and glibc malloc's
state; ``mallopt``, ``thp`` and ``hugefresh`` change how malloc and the kernel back a run's memory
(benchmarks/probes/memory_facts.py). The samplers: benchmarks/probes/probe_samplers.py.

    python -m benchmarks.probes.resident_speed_probe --manifest PATH [--steps 150] [--json F]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.probes.memory_facts import (
    FaultAccount,
    advise_huge_pages,
    fix_malloc_thresholds,
    huge_page_env,
    malloc_facts,
    memory_host_facts,
    memory_table,
    smaps_rollup,
)
from benchmarks.probes.probe_samplers import (
    CpuAccount,
    Gpu,
    KernelWindow,
    Spy,
    host_facts,
    process_facts,
)

TAIL_WINDOWS = 3  # the tail: the last windows' mean samples/s (benchmarks/time_to_answer.py)


STEPS = {  # --sequence's steps
    "fresh": "fresh process",
    "first": "in-process, its first run",
    "release": "in-process, after serve.release",
    "light": "in-process, after a light release (collect, empty_cache)",
    "pause": "in-process, after serve.release and a pause",
    "freeze": "in-process, after serve.release and gc.freeze",
    "numa": "in-process, after serve.release, every thread on the GPU's NUMA node's cores",
    "mallopt": "in-process, after serve.release and fixed malloc thresholds (mallopt)",
    "thp": "in-process, after serve.release, its anonymous memory advised to huge pages",
    "hugefresh": "fresh process, malloc's heaps on huge pages (glibc.malloc.hugetlb=1)",
}


CASES = {"buckets": "1.0,1.5,2.0,2.5,3.0", "mainline": ""}  # crop_buckets_s per case
MARKS = ("", "profile", "spy")  # what may follow a step's case


def config(
    manifest: str,
    steps: int,
    micro_batch: int = 256,
    telemetry: bool = False,
    case: str = "buckets",
):
    from trainables.config import TrialConfig

    return TrialConfig(
        model_size="base",
        use_gpu=True,
        train_workers=1,
        strategy="ddp",
        zero_stage=0,
        precision="auto",
        dataset="manifest",
        manifest_path=manifest,
        crop_policy="limit_longest",
        min_audio_s=1.0,
        max_audio_s=3.0,
        crop_buckets_s=CASES[case],
        text_tokens=64,
        micro_batch=micro_batch,
        num_workers=6,
        prefetch_factor=4,
        max_steps=steps,
        log_every=20,
        telemetry=telemetry,
        stall_timeout_s=0,
    )


def gpu_worker(report):
    """Rank 0 of a world of 1 on GPU 0, as a resident group's worker sees itself."""
    import torch

    from trainables.loop import WorkerContext

    device = torch.device("cuda", 0)
    return WorkerContext(
        rank=0,
        world_size=1,
        device=device,
        report=report,
        start_ts=time.time(),
        resident=True,
        process_ts=0.0,
    )


def train_once(
    cfg, gpu: Gpu | None, profile_window: int = 0, spy: Spy | None = None
) -> dict[str, Any]:
    import torch

    from trainables.loop import run_training

    before, malloc_start = process_facts(), malloc_facts()
    windows: list[dict[str, float]] = []
    kernels = KernelWindow(profile_window, cfg.log_every)
    account, faults = CpuAccount(), FaultAccount()
    ooms_before = torch.cuda.memory_stats().get("num_ooms", 0)

    def report(m: dict[str, Any], checkpoint=None) -> None:
        keys = ("samples_per_s", "step_ms_p50", "cpu_ms_mean")
        windows.append({k: float(m.get(k) or 0.0) for k in keys} | {"t": time.time()})
        kernels.on_window(len(windows))
        account.window(int(m.get("step") or 0))
        faults.window(int(m.get("step") or 0))
        if spy is not None:
            spy.on_window(len(windows))
        if gpu is not None:
            gpu.on = len(windows) >= 1  # from the end of the first (warm-up) window on

    run_training(cfg, gpu_worker(report))
    if gpu is not None:
        gpu.on = False
    if spy is not None:
        spy.stop()
    # The tail, without the profiled window and the next (where its tables are built), and
    # without the sampled windows.
    profiled = {profile_window + 1, profile_window + 2} if profile_window else set()
    if spy is not None and spy.after:
        profiled |= {spy.after + 1, spy.after + 2}
    clean = [w for i, w in enumerate(windows, start=1) if i not in profiled]
    tail = clean[-TAIL_WINDOWS:]
    stats = torch.cuda.memory_stats()
    return {
        "tail_samples_per_s": statistics.fmean(w["samples_per_s"] for w in tail),
        "cpu_ms_mean": statistics.fmean(w["cpu_ms_mean"] for w in clean[1:] or clean),
        "process_before": before,
        "step_ms_p50": statistics.median(w["step_ms_p50"] for w in windows[1:]),
        "windows": [round(w["samples_per_s"], 1) for w in windows],
        "window_ends": [round(w["t"], 2) for w in windows],  # wall clock (host_canary.py)
        "num_ooms": stats.get("num_ooms", 0) - ooms_before,
        "peak_reserved_gb": round(stats.get("reserved_bytes.all.peak", 0) / 2**30, 1),
        "kernels": kernels.table,
        **account.summary(),
        **faults.summary(),
        "smaps_end": smaps_rollup(),
        "malloc_start": malloc_start,
        "malloc_end": malloc_facts(),
        "spy_top": spy.top if spy is not None else [],
        **(gpu.summary() if gpu is not None else {}),
    }


def light_release() -> None:
    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def pin_to_gpu_node(host: dict[str, Any]) -> None:
    """Every thread of this process (and the loader workers it forks later) on the cores of
    the GPU's NUMA node: the placement a fresh process's first touch would favour."""
    from benchmarks.probes.probe_samplers import node_cores

    cores = node_cores(host.get("gpu_numa_node"))
    if not cores:
        print(f"numa: no node to pin to ({host.get('gpu_numa_node')!r})", flush=True)
        return
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except OSError:
            pass
    print(f"numa: pinned to {len(cores)} cores of node {host['gpu_numa_node']}", flush=True)


def init_process_group(port: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)


def fresh(
    args: argparse.Namespace,
    case: str,
    profile_window: int,
    spy_out: Path | None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One run in a new process (its own imports, CUDA context and process group)."""
    cmd = [sys.executable, "-m", "benchmarks.probes.resident_speed_probe", "--one"]
    cmd += ["--manifest", args.manifest, "--steps", str(args.steps), "--case", case]
    cmd += ["--micro-batch", str(args.micro_batch), "--profile-window", str(profile_window)]
    cmd += ["--telemetry"] if args.telemetry else []
    if spy_out is not None:
        cmd += ["--spy-window", str(args.spy_window), "--spy-out", str(spy_out)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--manifest", required=True)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--pause-s", type=float, default=40.0)
    p.add_argument("--micro-batch", type=int, default=256)
    p.add_argument("--telemetry", action="store_true", help="NVML and host sampling on")
    p.add_argument(
        "--sequence",
        default="fresh,first,release,light,pause,fresh",
        help=f"comma-separated steps, one run each: {', '.join(STEPS)}; each may name its "
        f"case after a colon ({', '.join(CASES)}), or --case's, and ':profile' after that "
        "to profile that run's window (see --profile-window)",
    )
    p.add_argument("--case", choices=sorted(CASES), default="buckets")
    p.add_argument(
        "--profile-window",
        type=int,
        default=0,
        help="record the CUDA kernels of the window after this one, in the runs whose step "
        "ends with ':profile' (0: none). Profile only the last run of a process: once "
        "started, the profiler (CUPTI) may keep slowing the process's later launches",
    )
    p.add_argument(
        "--spy-window",
        type=int,
        default=3,
        help="in the runs whose step ends with ':spy': py-spy samples the two windows after "
        "this one (raw stacks into --spy-dir)",
    )
    p.add_argument("--spy-dir", type=Path, default=Path("."))
    p.add_argument("--spy-out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path)
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:  # a fresh run's child: one run, its record as the last line
        init_process_group(29611)
        cfg = config(args.manifest, args.steps, args.micro_batch, args.telemetry, args.case)
        spy = Spy(args.spy_window, args.spy_out) if args.spy_out else None
        print(json.dumps(train_once(cfg, Gpu(), args.profile_window, spy)), flush=True)
        return 0

    from trainables.resident.serve import release

    host = {**host_facts(), **memory_host_facts()}
    print(json.dumps({"host": host}), flush=True)
    rows: list[dict[str, Any]] = []
    cfg = config(args.manifest, args.steps, args.micro_batch, args.telemetry)
    gpu, pg_up = None, False
    sequence = [(item, *item.partition(":")[::2]) for item in args.sequence.split(",")]
    for item, step, rest in sequence:  # every step checked before the first run
        case, _, mark = rest.partition(":")
        if step not in STEPS or (case or args.case) not in CASES or mark not in MARKS:
            print(
                f"--sequence: unknown step {item!r}; steps {', '.join(STEPS)}, cases "
                f"{', '.join(CASES)}",
                file=sys.stderr,
            )
            return 2
    for i, (_, step, rest) in enumerate(sequence):
        case, _, mark = rest.partition(":")
        case = case or args.case
        window = args.profile_window if mark == "profile" else 0
        spy_out = args.spy_dir / f"spy_{i + 1}_{step}_{case}.txt" if mark == "spy" else None
        variant: Any = ""
        if step in ("fresh", "hugefresh"):
            if pg_up:  # the child takes the GPU alone (this process keeps its CUDA context)
                release(cfg)
                import torch.distributed as dist

                dist.destroy_process_group()
                pg_up = False
            env = huge_page_env() if step == "hugefresh" else None
            variant = env["GLIBC_TUNABLES"] if env else ""
            rec = fresh(args, case, window, spy_out, env)
        else:
            if not pg_up:  # the first in-process run, or the first after a fresh step
                init_process_group(29612 + i)  # a new port each time
                gpu, pg_up = gpu or Gpu(), True
            elif step == "light":
                light_release()
            else:
                release(cfg)
            if step == "pause":
                time.sleep(args.pause_s)
            if step == "numa":
                pin_to_gpu_node(host)
            # What the resident group does before a run (trainables/resident/serve.py).
            if step == "freeze":
                gc.collect()
                gc.freeze()
            if step == "mallopt":
                variant = fix_malloc_thresholds()
            if step == "thp":
                variant = advise_huge_pages()
            rec = train_once(
                config(args.manifest, args.steps, args.micro_batch, args.telemetry, case),
                gpu,
                window,
                Spy(args.spy_window, spy_out) if spy_out else None,
            )
        label = f"{i + 1}. {case}, {STEPS[step]}"
        rows.append(dict(rec, case=case, step=step, label=label, variant=variant))
        print(json.dumps(rows[-1]), flush=True)
        if args.json:  # after every run: a command cut short keeps the runs it finished
            args.json.write_text(json.dumps({"host": host, "runs": rows}, indent=1))

    fresh_tails: dict[str, list[float]] = {}
    for r in rows:
        if r["step"] == "fresh":
            fresh_tails.setdefault(r["case"], []).append(r["tail_samples_per_s"])
    base = {c: statistics.fmean(v) for c, v in fresh_tails.items()}  # the case's fresh mean
    print(
        "\n| run | tail samples/s | / its case's fresh mean | step ms p50 | CPU ms per step "
        "| process / loader CPU ms per step | switches per step (nonvoluntary, voluntary) "
        "| threads during | OOMs | SM MHz | power W "
        "| before it: threads, children, fds, maps, RSS MB |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        pb = r.get("process_before", {})
        print(
            f"| {r['label']} | {r['tail_samples_per_s']:.1f} | "
            f"{r['tail_samples_per_s'] / base.get(r['case'], float('nan')):.3f} | "
            f"{r['step_ms_p50']:.1f} | {r.get('cpu_ms_mean', float('nan')):.1f} | "
            f"{r.get('proc_cpu_ms_per_step')} / {r.get('loader_cpu_ms_per_step')} | "
            f"{r.get('nvcsw_per_step')}, {r.get('vcsw_per_step')} | {r.get('threads_during')} | "
            f"{r.get('num_ooms', 0)} | {r.get('sm_mhz', float('nan')):.0f} | "
            f"{r.get('power_w', float('nan')):.0f} | {pb.get('os_threads')}, "
            f"{pb.get('children')}, {pb.get('fds')}, {pb.get('maps')}, {pb.get('rss_mb')} |"
        )
    print("", *memory_table(rows), sep="\n")
    for r in rows:
        if r.get("process_before"):
            print(f"{r['label']}: Python threads before it: {r['process_before']['threads']}")
    print(f"\nhost: {host}")
    for r in rows:  # where it ran: the training thread's and the loader's NUMA nodes, its memory
        print(
            f"{r['label']}: training thread on cores {r.get('train_thread_cpus')} (nodes "
            f"{r.get('train_thread_nodes')}), loader on nodes {r.get('loader_nodes')}, "
            f"resident MB per node after: {r.get('numa_pages_after')}"
        )
    for r in rows:
        print(f"{r['label']}: CPU ms per step by thread name: {r.get('thread_cpu_ms_per_step')}")
        print(f"  OS threads before it: {r.get('process_before', {}).get('os_thread_names')}")
    for r in rows:
        if r.get("kernels"):
            print(f"\n{r['label']}: kernels, ms per step (calls per step)")
            for k in r["kernels"]:
                print(f"  {k['ms_per_step']:8.2f}  ({k.get('calls_per_step', '')})  {k['kernel']}")
    for r in rows:
        if r.get("spy_top"):
            print(f"\n{r['label']}: py-spy, heaviest leaf frames (samples)")
            for count, frame in r["spy_top"]:
                print(f"  {count:7d}  {frame[:140]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
