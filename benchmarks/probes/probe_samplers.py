"""What benchmarks/probes/resident_speed_probe.py samples around a run: the GPU's clocks (NVML), the
CUDA kernels of one window (torch.profiler), the host's stacks of two windows (py-spy), what
the process carries into a run, and where on the host it runs: the cores its threads ran on
and the NUMA node of its memory (a long-lived process may run far from memory an earlier run
touched first)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["CpuAccount", "Gpu", "KernelWindow", "Spy", "host_facts", "numa_pages", "process_facts"]


class Gpu:
    """NVML samples every 0.5 s while a run's windows are timed."""

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.samples: list[tuple[float, float, float]] = []
        self.on = False
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        n, h = self.nvml, self.handle
        while True:
            if self.on:
                self.samples.append(
                    (
                        n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
                        n.nvmlDeviceGetPowerUsage(h) / 1000,
                        n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU),
                    )
                )
            time.sleep(0.5)

    def summary(self) -> dict[str, float]:
        s, self.samples = self.samples, []
        if not s:
            return {}
        return {
            "sm_mhz": statistics.median(x[0] for x in s),
            "power_w": statistics.fmean(x[1] for x in s),
            "temp_c": statistics.fmean(x[2] for x in s),
        }


class KernelWindow:
    """torch.profiler's CUDA kernels over one window (started at the K-th report, stopped at
    the next): the heaviest kernels, in milliseconds per step."""

    TOP = 12

    def __init__(self, after_window: int, steps_per_window: int) -> None:
        self.after, self.steps = after_window, steps_per_window
        self.prof = None
        self.table: list[dict[str, Any]] = []

    def on_window(self, n: int) -> None:
        import torch

        if n == self.after and self.after > 0:
            acts = [torch.profiler.ProfilerActivity.CUDA]
            self.prof = torch.profiler.profile(activities=acts)
            self.prof.start()
        elif self.prof is not None and n == self.after + 1:
            torch.cuda.synchronize()
            self.prof.stop()
            self.table = self._top(self.prof.key_averages())
            self.prof = None

    def _top(self, averages) -> list[dict[str, Any]]:
        rows = []
        for e in averages:
            us = getattr(e, "self_device_time_total", 0)
            if us > 0:
                rows.append(
                    {
                        "kernel": e.key[:110],
                        "ms_per_step": us / 1e3 / self.steps,
                        "calls_per_step": e.count / self.steps,
                    }
                )
        rows.sort(key=lambda r: -r["ms_per_step"])
        total = sum(r["ms_per_step"] for r in rows)
        top = [
            dict(
                r,
                ms_per_step=round(r["ms_per_step"], 2),
                calls_per_step=round(r["calls_per_step"], 1),
            )
            for r in rows[: self.TOP]
        ]
        return [{"kernel": "(all kernels)", "ms_per_step": round(total, 2)}] + top


class Spy:
    """py-spy (``--native``: it pauses the process for each sample, 100 a second) sampling this process over the two
    windows after the K-th report: where the host's side of a step goes, Python and C++
    frames. The raw stacks go to ``out``; ``top`` holds the heaviest leaf frames."""

    TOP = 25

    def __init__(self, after_window: int, out: Path | None) -> None:
        self.after, self.out = after_window, out
        self.proc: subprocess.Popen | None = None
        self.top: list[tuple[int, str]] = []

    def on_window(self, n: int) -> None:
        if not self.after or self.out is None:
            return
        if n == self.after:
            allow_tracing_by_children()
            cmd = ["py-spy", "record", "--pid", str(os.getpid()), "--native"]
            cmd += ["--threads", "--rate", "100", "--format", "raw", "-o", str(self.out)]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        elif n == self.after + 2 and self.proc is not None:
            self.stop()

    def stop(self) -> None:
        import signal

        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        proc.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            err = b"timed out"
        if proc.returncode not in (0, -2, 130) or not self.out.exists():
            print(f"py-spy: exit {proc.returncode}: {err.decode()[-300:]}", file=sys.stderr)
            return
        leaves: dict[str, int] = {}
        for line in self.out.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if stack and count.isdigit():
                leaf = stack.rsplit(";", 1)[-1]
                leaves[leaf] = leaves.get(leaf, 0) + int(count)
        self.top = sorted(((c, f) for f, c in leaves.items()), reverse=True)[: self.TOP]


def allow_tracing_by_children() -> None:
    """Yama's ptrace_scope 1 lets a process be traced only by its ancestors: let py-spy, a
    child, attach (prctl PR_SET_PTRACER, PR_SET_PTRACER_ANY)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(0x59616D61, ctypes.c_ulong(-1), 0, 0, 0)
    except Exception:  # noqa: BLE001 - then py-spy says why it cannot attach
        pass


class CpuAccount:
    """Where the host's CPU goes over a run's timed windows, per step: the whole process (every
    thread), its child processes (the loader's workers), and the training thread's context
    switches (nonvoluntary: it was runnable and a core was taken from it; voluntary: it
    waited, for the GPU, a lock or the GIL)."""

    def __init__(self) -> None:
        self._start: dict[str, float] | None = None
        self.tid = threading.get_native_id()  # the training thread: the one that makes this

    def _now(self, step: int) -> dict[str, float]:
        import psutil

        me = psutil.Process()
        kids = me.children(recursive=True)
        switches = {"voluntary": 0.0, "nonvoluntary": 0.0}
        status = Path(f"/proc/self/task/{self.tid}/status")
        if status.exists():
            for line in status.read_text().splitlines():
                key, _, value = line.partition(":")
                if key.endswith("_ctxt_switches"):
                    switches[key.split("_")[0]] = float(value)
        cpu = me.cpu_times()
        kid_cpu = 0.0
        for k in kids:
            try:
                t = k.cpu_times()
                kid_cpu += t.user + t.system
            except psutil.Error:
                pass
        return {
            "step": step,
            "proc": cpu.user + cpu.system,
            "kids": kid_cpu,
            **switches,
            "threads": me.num_threads(),
            "cpu": _last_cpu(os.getpid(), self.tid),
            "by_name": _thread_cpu_by_name(),
            "kid_cpus": [_last_cpu(k.pid) for k in kids],
        }

    def window(self, step: int) -> None:
        """At a report: the first one starts the count; every later one moves its end."""
        now = self._now(step)
        if self._start is None:
            self._start = now
            self._cpus: list[int] = []
            self._kid_cpus: list[int] = []
        self._end = now
        self._cpus.append(now["cpu"])
        self._kid_cpus += now["kid_cpus"]

    def summary(self) -> dict[str, Any]:
        if self._start is None or self._end["step"] <= self._start["step"]:
            return {}
        a, b = self._start, self._end
        steps = b["step"] - a["step"]
        return {
            "proc_cpu_ms_per_step": round((b["proc"] - a["proc"]) * 1e3 / steps, 1),
            "loader_cpu_ms_per_step": round((b["kids"] - a["kids"]) * 1e3 / steps, 1),
            "nvcsw_per_step": round((b["nonvoluntary"] - a["nonvoluntary"]) / steps, 2),
            "vcsw_per_step": round((b["voluntary"] - a["voluntary"]) / steps, 2),
            "threads_during": int(b["threads"]),
            "cpus_allowed": len(os.sched_getaffinity(0)),
            "train_thread_cpus": self._cpus,  # the core it last ran on, at each window
            "train_thread_nodes": sorted({_node_of(c) for c in self._cpus if c >= 0}),
            "loader_nodes": sorted({_node_of(c) for c in self._kid_cpus if c >= 0}),
            "numa_pages_after": numa_pages(),
            "thread_cpu_ms_per_step": _per_step(a["by_name"], b["by_name"], steps),
        }


def _thread_cpu_by_name() -> dict[str, float]:
    """CPU seconds of this process's threads, summed per thread name (``comm``: pt_autograd_0,
    pt_nccl_watchdg, cuda-EvtHandlr, python, ...), and how many threads bear each name."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rpartition(")")[2].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
        out[f"#{name}"] = out.get(f"#{name}", 0) + 1
    return out


def _per_step(a: dict[str, float], b: dict[str, float], steps: int) -> dict[str, Any]:
    """Each thread name's CPU ms per step between two samples (with its thread count), the
    busiest first; names that used under 0.5 ms per step are left out."""
    rows = {
        name: (round((b[name] - a.get(name, 0.0)) * 1e3 / steps, 1), int(b.get(f"#{name}", 0)))
        for name in b
        if not name.startswith("#")
    }
    busy = sorted(((v, n, name) for name, (v, n) in rows.items() if v >= 0.5), reverse=True)
    return {f"{name} x{n}": v for v, n, name in busy}


def _last_cpu(pid: int, tid: int | None = None) -> int:
    """The core a thread (or a process's main thread) last ran on (/proc stat field 39)."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    try:
        return int(Path(path).read_text().rpartition(")")[2].split()[36])
    except (OSError, IndexError, ValueError):
        return -1


def _nodes() -> dict[int, set[int]]:
    """NUMA node -> its cores (one node 0 with every core where /sys does not say)."""
    out: dict[int, set[int]] = {}
    for d in sorted(Path("/sys/devices/system/node").glob("node[0-9]*")):
        cores: set[int] = set()
        for part in (d / "cpulist").read_text().strip().split(","):
            if part:
                a, _, b = part.partition("-")
                cores |= set(range(int(a), int(b or a) + 1))
        out[int(d.name[4:])] = cores
    return out or {0: set(range(os.cpu_count() or 1))}


def node_cores(node: Any) -> set[int]:
    """The cores of a NUMA node that this process may use (none for an unknown node)."""
    try:
        cores = _nodes().get(int(node), set())
    except (TypeError, ValueError):
        return set()
    return cores & os.sched_getaffinity(0)


def _node_of(cpu: int) -> int:
    return next((n for n, cores in _nodes().items() if cpu in cores), -1)


def numa_pages() -> dict[str, int]:
    """The process's resident pages per NUMA node (``/proc/self/numa_maps``), in MB."""
    totals: dict[str, int] = {}
    try:
        text = Path("/proc/self/numa_maps").read_text()
    except OSError:
        return totals
    for line in text.splitlines():
        kernelpage = 4096
        for field in line.split():
            if field.startswith("kernelpagesize_kB="):
                kernelpage = int(field.split("=")[1]) * 1024
        for field in line.split():
            if field[:1] == "N" and "=" in field and field[1:].split("=")[0].isdigit():
                node, pages = field[1:].split("=")
                totals[node] = totals.get(node, 0) + int(pages) * kernelpage
    return {f"node{k}": v >> 20 for k, v in sorted(totals.items())}


def host_facts() -> dict[str, Any]:
    """The host as the process sees it: cores, NUMA nodes, the GPU's node, huge pages."""

    def read(path: str) -> str:
        try:
            return Path(path).read_text().strip()
        except OSError:
            return ""

    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in read("/proc/cpuinfo").splitlines()
            if line.startswith("model name")
        ),
        "",
    )
    status = dict(
        line.split(":\t", 1) for line in read("/proc/self/status").splitlines() if ":\t" in line
    )
    gpu_node = ""
    try:
        import pynvml

        pynvml.nvmlInit()
        bus = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).busId
        bus = bus.decode() if isinstance(bus, bytes) else bus
        gpu_node = read(f"/sys/bus/pci/devices/{bus.lower()[4:]}/numa_node") or read(
            f"/sys/bus/pci/devices/{bus.lower()}/numa_node"
        )
    except Exception as exc:  # no NVML here
        gpu_node = f"unknown ({type(exc).__name__})"
    return {
        "cpu_model": model,
        "cpu_count": os.cpu_count(),
        "cpus_allowed": status.get("Cpus_allowed_list", ""),
        "mems_allowed": status.get("Mems_allowed_list", ""),
        "numa_nodes": {n: f"{min(c)}-{max(c)} ({len(c)})" for n, c in _nodes().items()},
        "gpu_numa_node": gpu_node,
        "thp": read("/sys/kernel/mm/transparent_hugepage/enabled"),
        "cpu_max": read("/sys/fs/cgroup/cpu.max"),
        "kernel": os.uname().release,
    }


def process_facts() -> dict[str, Any]:
    """What the process carries into a run: its threads, child processes, open files and
    memory mappings (a resident run starts with what the earlier runs left)."""
    import psutil

    me = psutil.Process()
    maps = Path(f"/proc/{os.getpid()}/maps")
    return {
        "threads": sorted(t.name for t in threading.enumerate()),
        "os_threads": me.num_threads(),
        "children": len(me.children(recursive=True)),
        "fds": me.num_fds(),
        "maps": len(maps.read_text().splitlines()) if maps.exists() else None,
        "rss_mb": me.memory_info().rss >> 20,
        "os_thread_names": {
            k: int(v) for k, v in _thread_cpu_by_name().items() if k.startswith("#")
        },
    }
