"""Worker-side telemetry: GPU samples through NVML, host samples through psutil, on a background
thread, drained into each window report. The loop computes; this only observes.

NVML numbers GPUs its own way and ignores CUDA_VISIBLE_DEVICES, so each worker finds its GPU by
the CUDA device's UUID. Calls that block (the PCIe throughput counter waits ~20 ms) are never
made. Without NVML (a CPU machine, no driver) GPU telemetry is off with a note, not an error.
"""

from __future__ import annotations

import importlib
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = [
    "ENV_ALLOWED_PREFIXES",
    "HostSampler",
    "NvmlGpu",
    "RayGauges",
    "Telemetry",
    "collect_env",
    "safe_environment",
    "start_telemetry",
]

GPU_FIELDS = (
    "util_gpu_pct",
    "util_mem_pct",
    "mem_used_mib",
    "power_w",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "temp_c",
    "throttle_reasons",
    "energy_j",
)


class NvmlGpu:
    """One GPU, sampled through an NVML module (``pynvml`` from nvidia-ml-py, or a recording
    with the same functions). ``energy_every``: read the energy counter every n-th sample."""

    def __init__(self, uuid: str, nvml: Any = None, *, energy_every: int = 5):
        self.nvml = nvml if nvml is not None else importlib.import_module("pynvml")
        self.nvml.nvmlInit()
        self.energy_every = max(1, energy_every)
        self.samples = 0
        wanted = uuid.lower().removeprefix("gpu-")
        for index in range(self.nvml.nvmlDeviceGetCount()):
            handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
            found = _text(self.nvml.nvmlDeviceGetUUID(handle))
            if found.lower().removeprefix("gpu-") == wanted:
                self.handle, self.index, self.uuid = handle, index, found
                break
        else:
            raise LookupError(f"no NVML device has the UUID {uuid}")
        self.name = _text(self.nvml.nvmlDeviceGetName(self.handle))

    def sample(self) -> dict[str, Any]:
        n, h = self.nvml, self.handle
        util = self._call(n.nvmlDeviceGetUtilizationRates, h)
        mem = self._call(n.nvmlDeviceGetMemoryInfo, h)
        power_mw = self._call(n.nvmlDeviceGetPowerUsage, h)
        reasons = (
            getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or n.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        row = {
            "gpu_index": self.index,
            "gpu_uuid": self.uuid,
            "util_gpu_pct": None if util is None else float(util.gpu),
            "util_mem_pct": None if util is None else float(util.memory),
            "mem_used_mib": None if mem is None else mem.used / 2**20,
            "power_w": None if power_mw is None else power_mw / 1000.0,
            "sm_clock_mhz": self._call(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
            "mem_clock_mhz": self._call(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_MEM),
            "temp_c": self._call(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU),
            "throttle_reasons": self._call(reasons, h),
            "energy_j": None,
        }
        if self.samples % self.energy_every == 0:
            energy_mj = self._call(n.nvmlDeviceGetTotalEnergyConsumption, h)
            row["energy_j"] = None if energy_mj is None else energy_mj / 1000.0
        self.samples += 1
        return row

    def _call(self, fn: Callable, *args):
        try:
            return fn(*args)
        except self.nvml.NVMLError:  # not supported on this GPU or driver: a gap, not a failure
            return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class HostSampler:
    """Node memory, swap and load, and the memory of the trainer processes of this node with
    all their descendants (DataLoader workers, compile workers), found by walking the process
    tree from each trainer's pid."""

    def __init__(self, trainer_pids: list[int]):
        self.trainer_pids = list(trainer_pids)

    def sample(self) -> dict[str, Any]:
        import psutil

        vm, swap = psutil.virtual_memory(), psutil.swap_memory()
        load = os.getloadavg()
        rss = vms = procs = 0
        for pid in self.trainer_pids:
            try:
                root = psutil.Process(pid)
                family = [root, *root.children(recursive=True)]
            except psutil.Error:  # the trainer has exited
                continue
            for proc in family:
                try:
                    info = proc.memory_info()
                except psutil.Error:  # exited between the walk and the read
                    continue
                rss, vms, procs = rss + info.rss, vms + info.vms, procs + 1
        return {
            "mem_total_mib": vm.total / 2**20,
            "mem_available_mib": vm.available / 2**20,
            "swap_total_mib": swap.total / 2**20,
            "swap_used_mib": swap.used / 2**20,
            "load_1": load[0],
            "load_5": load[1],
            "load_15": load[2],
            "trainer_pids": len(self.trainer_pids),
            "trainer_procs": procs,
            "trainer_rss_mib": rss / 2**20,
            "trainer_vsz_mib": vms / 2**20,
        }


class Telemetry:
    """Background sampling of a few sources, each at its own interval; rows wait in a buffer
    until the next window report drains them."""

    def __init__(self, sources: dict[str, tuple[Callable[[], dict[str, Any]], float]], base: dict):
        self.sources = sources
        self.base = base  # rank, node: stamped on every row
        self.rows: dict[str, list[dict[str, Any]]] = {kind: [] for kind in sources}
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="telemetry", daemon=True)
        self.errors: dict[str, str] = {}

    def start(self) -> Telemetry:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=5)

    def drain(self) -> dict[str, list[dict[str, Any]]]:
        with self.lock:
            out, self.rows = self.rows, {kind: [] for kind in self.sources}
        return out

    def _run(self) -> None:
        due = {kind: time.monotonic() for kind in self.sources}
        while not self.stop_event.is_set():
            now = time.monotonic()
            for kind, (sample, interval_s) in self.sources.items():
                if now < due[kind]:
                    continue
                # Keep the cadence: the next sample is due one interval after this one was.
                due[kind] = max(due[kind] + interval_s, now)
                try:
                    row = {"ts": time.time(), **self.base, **sample()}
                except Exception as exc:  # a sampler must never take the training down
                    self.errors[kind] = f"{type(exc).__name__}: {exc}"[:200]
                    continue
                with self.lock:
                    self.rows[kind].append(row)
            self.stop_event.wait(max(0.01, min(due.values()) - time.monotonic()))


def start_telemetry(
    cfg,
    *,
    rank: int,
    local_rank: int,
    device,
    trainer_pids: list[int],
    node: str = "",
    node_id: str = "",
) -> tuple[Telemetry | None, str]:
    """Start this worker's samplers: its GPU (NVML) and, on each node's first local rank, the
    host. Returns the sampler (None when off) and what is being sampled, for the manifest."""
    if not cfg.telemetry:
        return None, "off"
    node = node or socket.gethostname()
    sources: dict[str, tuple[Callable[[], dict[str, Any]], float]] = {}
    note = []
    if device.type == "cuda":
        try:
            import torch

            gpu = NvmlGpu(str(torch.cuda.get_device_properties(device).uuid))
            sources["gpu"] = (gpu.sample, cfg.gpu_telemetry_interval_s)
            note.append("gpu")
        except Exception as exc:  # no pynvml, no driver, no match: sample the host only
            note.append(f"no gpu telemetry ({type(exc).__name__}: {str(exc)[:120]})")
    else:
        note.append("no gpu telemetry (no GPU)")
    if local_rank == 0:
        sources["host"] = (HostSampler(trainer_pids).sample, cfg.host_telemetry_interval_s)
    note.append("host")
    telemetry = (
        Telemetry(sources, {"rank": rank, "node": node, "node_id": node_id}) if sources else None
    )
    return (telemetry.start() if telemetry else None), "+".join(note)


# Environment variables worth keeping beside a result: what configures the libraries that ran.
ENV_ALLOWED_PREFIXES = (
    "CUDA_",
    "NCCL_",
    "NVSHMEM_",
    "TORCH_",
    "PYTORCH_",
    "OMP_",
    "MKL_",
    "RAY_",
    "GLOO_",
    "HF_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "DS_",
    "PYTHONHASHSEED",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
)
_SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH")


def safe_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The allow-listed variables, never one whose name looks like it holds a secret."""
    environ = os.environ if environ is None else environ
    return {
        k: v
        for k, v in sorted(environ.items())
        if k.startswith(ENV_ALLOWED_PREFIXES) and not any(m in k.upper() for m in _SECRET_MARKERS)
    }


def collect_env(device) -> dict[str, Any]:
    """Versions, GPUs and environment of this worker: what ties a number to the code."""
    import sys
    from importlib import metadata

    import torch

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    facts: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "python": sys.version.split()[0],
        "torch": str(torch.__version__),  # a str subclass whose unpickling imports torch
        "cuda": torch.version.cuda,
        "ray": version("ray"),
        "deepspeed": version("deepspeed"),
        "transformers": version("transformers"),
        "nvidia_ml_py": version("nvidia-ml-py"),
        "gpus": [],
        "driver": None,
    }
    if device.type == "cuda":
        facts["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        facts["gpu_memory_gib"] = [
            torch.cuda.get_device_properties(i).total_memory / 2**30
            for i in range(torch.cuda.device_count())
        ]
        try:
            import pynvml

            pynvml.nvmlInit()
            facts["driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
        except Exception:  # no NVML: the driver version stays unknown
            pass
    facts["env"] = safe_environment()
    return facts


class RayGauges:
    """Per-run gauges exported through ``ray.util.metrics`` to the cluster's Prometheus endpoint
    (and the dashboard's metrics views), set from rank 0's window reports. Ray prefixes the
    names with ``ray_``."""

    # The names as declared; Prometheus shows them with Ray's ``ray_`` prefix. The Grafana
    # dashboard (platform/grafana.py) draws exactly these.
    NAMES = (
        "stage1_samples_per_s",
        "stage1_iter_ms_p50",
        "stage1_data_share",
        "stage1_gpu_util_pct",
        "stage1_gpu_power_w",
    )

    def __init__(self, run: str):
        from ray.util.metrics import Gauge

        self.run = run
        run_tag, rank_tags = ("run",), ("run", "rank")
        self.gauges = {
            "samples_per_s": Gauge("stage1_samples_per_s", "samples/s of the last window", run_tag),
            "iter_ms_p50": Gauge("stage1_iter_ms_p50", "iter_ms p50 of the last window", run_tag),
            "data_share": Gauge(
                "stage1_data_share", "data_ms / iter_ms of the last window", run_tag
            ),
        }
        self.gpu = {
            "util_gpu_pct": Gauge("stage1_gpu_util_pct", "GPU utilisation, %", rank_tags),
            "power_w": Gauge("stage1_gpu_power_w", "GPU power, W", rank_tags),
        }

    def update(self, metrics: dict[str, Any]) -> None:
        tags = {"run": self.run}
        values = {
            "samples_per_s": metrics.get("samples_per_s"),
            "iter_ms_p50": metrics.get("iter_ms_p50"),
            "data_share": metrics["data_ms_mean"] / metrics["iter_ms_mean"]
            if metrics.get("iter_ms_mean")
            else None,
        }
        for name, value in values.items():
            if value is not None:
                self.gauges[name].set(float(value), tags=tags)
        latest: dict[int, dict[str, Any]] = {}
        for row in metrics.get("gpu_samples") or ():
            latest[row["rank"]] = row
        for rank, row in latest.items():
            for name, gauge in self.gpu.items():
                if row.get(name) is not None:
                    gauge.set(float(row[name]), tags={"run": self.run, "rank": str(rank)})
