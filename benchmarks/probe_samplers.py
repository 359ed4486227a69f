"""What benchmarks/resident_speed_probe.py samples around a run: the GPU's clocks (NVML), the
CUDA kernels of one window (torch.profiler), the host's stacks of two windows (py-spy), and
what the process carries into a run."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["CpuAccount", "Gpu", "KernelWindow", "Spy", "process_facts"]


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
        }

    def window(self, step: int) -> None:
        """At a report: the first one starts the count; every later one moves its end."""
        now = self._now(step)
        if self._start is None:
            self._start = now
        self._end = now

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
    }
