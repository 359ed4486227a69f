"""Worker-side telemetry: the NVML sampler against a recording of a real 2x H200 machine
(tests/data/nvml_h200x2.json, made by tests/gpu/record_nvml.py) replayed through the same
functions; the host sampler on real processes; the sampling thread; secrets; git facts."""

import json
import multiprocessing as mp
import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainables.observe.telemetry import HostSampler, NvmlGpu, Telemetry, safe_environment

RECORDING = Path(__file__).parent / "data" / "nvml_h200x2.json"


class RecordedNvml:
    """The pynvml functions NvmlGpu calls, answering from a recording (one sample per call of
    the utilisation function, then the next)."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    class NVMLError(Exception):
        pass

    def __init__(self, record: dict):
        self.devices = record["devices"]
        self.position = [0] * len(self.devices)
        self.inits = 0

    def _value(self, handle: int, key: str):
        samples = self.devices[handle]["samples"]
        value = samples[self.position[handle] % len(samples)][key]
        if isinstance(value, dict) and "nvml_error" in value:
            raise self.NVMLError(value["nvml_error"])
        return value

    def nvmlInit(self):
        self.inits += 1

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetUUID(self, handle):
        return self.devices[handle]["uuid"]

    def nvmlDeviceGetName(self, handle):
        return self.devices[handle]["name"]

    def nvmlDeviceGetUtilizationRates(self, handle):
        util = self._value(handle, "utilization")
        return SimpleNamespace(gpu=util["gpu"], memory=util["memory"])

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=self._value(handle, "memory_used"))

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._value(handle, "power_mw")

    def nvmlDeviceGetClockInfo(self, handle, kind):
        return self._value(handle, "sm_clock" if kind == self.NVML_CLOCK_SM else "mem_clock")

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return self._value(handle, "temperature")

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self._value(handle, "clocks_event_reasons")

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        value = self._value(handle, "energy_mj")
        self.position[handle] += 1  # the last call of a sample: move on
        return value


@pytest.fixture
def record():
    return json.loads(RECORDING.read_text())


def test_the_gpu_is_found_by_its_cuda_uuid_not_its_index(record):
    second = record["devices"][1]["uuid"]
    # torch reports the UUID without NVML's "GPU-" prefix.
    gpu = NvmlGpu(second.removeprefix("GPU-"), RecordedNvml(record))
    assert gpu.index == 1 and gpu.uuid == second and gpu.name == "NVIDIA H200"
    with pytest.raises(LookupError, match="no NVML device has the UUID"):
        NvmlGpu("00000000-0000-0000-0000-000000000000", RecordedNvml(record))


def test_samples_convert_the_recorded_answers(record):
    nvml = RecordedNvml(record)
    gpu = NvmlGpu(record["devices"][0]["uuid"], nvml, energy_every=1)
    # energy_every=1: every sample reads the energy counter, which moves the replay on.
    rows = [gpu.sample() for _ in record["devices"][0]["samples"]]
    for row, raw in zip(rows, record["devices"][0]["samples"], strict=True):
        assert row["gpu_index"] == 0 and row["gpu_uuid"] == record["devices"][0]["uuid"]
        assert row["util_gpu_pct"] == raw["utilization"]["gpu"]
        assert row["mem_used_mib"] == pytest.approx(raw["memory_used"] / 2**20)
        assert row["power_w"] == pytest.approx(raw["power_mw"] / 1000)
        assert row["sm_clock_mhz"] == raw["sm_clock"] and row["mem_clock_mhz"] == raw["mem_clock"]
        assert row["temp_c"] == raw["temperature"]
        assert row["throttle_reasons"] == raw["clocks_event_reasons"]
        assert row["energy_j"] == pytest.approx(raw["energy_mj"] / 1000)
    assert {r["power_w"] > 50 for r in rows} == {True}  # a real H200 idles near 75 W


def test_energy_is_read_less_often_and_unsupported_calls_leave_gaps(record):
    record["devices"][0]["samples"][0]["temperature"] = {"nvml_error": "Not Supported"}
    gpu = NvmlGpu(record["devices"][0]["uuid"], RecordedNvml(record), energy_every=3)
    rows = [gpu.sample() for _ in range(6)]
    assert [r["energy_j"] is not None for r in rows] == [True, False, False, True, False, False]
    assert rows[0]["temp_c"] is None and rows[0]["power_w"] is not None


def _child_with_grandchild(ready, stop):
    grandchild = mp.get_context("fork").Process(target=stop.wait)
    grandchild.start()
    ready.set()
    stop.wait()
    grandchild.join()


def test_host_sampler_walks_the_trainer_process_trees():
    ctx = mp.get_context("fork")
    ready, stop = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_child_with_grandchild, args=(ready, stop))
    child.start()
    try:
        assert ready.wait(10)
        row = HostSampler([os.getpid()]).sample()
        alone = HostSampler([child.pid]).sample()
    finally:
        stop.set()
        child.join()
    # This process, its child (the "DataLoader worker") and the child's child; the manager
    # process of mp.Event may add more.
    assert row["trainer_pids"] == 1 and row["trainer_procs"] >= 3
    assert alone["trainer_procs"] == 2
    assert row["trainer_rss_mib"] > alone["trainer_rss_mib"] > 0
    assert row["mem_total_mib"] > row["mem_available_mib"] > 0
    assert row["load_1"] >= 0 and row["swap_total_mib"] >= 0
    assert HostSampler([2**22 + 12345]).sample()["trainer_procs"] == 0  # a pid that is gone


def test_the_sampling_thread_keeps_each_sources_cadence():
    calls = {"fast": 0, "slow": 0}

    def source(kind):
        def sample():
            calls[kind] += 1
            if kind == "slow" and calls[kind] == 2:
                raise RuntimeError("a sampler error is recorded, not raised")
            return {"value": calls[kind]}

        return sample

    telemetry = Telemetry(
        {"fast": (source("fast"), 0.05), "slow": (source("slow"), 0.2)}, {"rank": 3, "node": "n"}
    ).start()
    time.sleep(1.0)
    first = telemetry.drain()
    time.sleep(0.3)
    telemetry.stop()
    second = telemetry.drain()
    # ~20 and ~5 due; a busy machine may skip ticks (the cadence never bunches them up).
    assert 10 <= len(first["fast"]) <= 22 and 3 <= len(first["slow"]) <= 6
    assert all(r["rank"] == 3 and r["node"] == "n" and r["ts"] > 0 for r in first["fast"])
    assert len(second["fast"]) >= 4  # drained rows are not seen twice
    assert [r["value"] for r in first["fast"]][:3] == [1, 2, 3]
    assert "RuntimeError" in telemetry.errors["slow"]


def test_secrets_never_leave_the_environment():
    env = {
        "NCCL_DEBUG": "INFO",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "RAY_MY_API_TOKEN": "x",
        "HF_TOKEN": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "NCCL_PASSWORD": "x",
        "DS_CREDENTIALS_FILE": "x",
        "HOME": "/root",
        "TORCH_AUTH_HEADER": "x",
    }
    assert safe_environment(env) == {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO"}


def test_git_facts_of_a_checkout_and_of_a_plain_folder(tmp_path):
    from platform.record.provenance import git_facts

    assert git_facts(tmp_path) == dict.fromkeys(
        ("git_commit_hash", "git_commit_short", "git_branch", "git_dirty")
    )
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)

    git("init", "-b", "trunk")
    (repo / "a.txt").write_text("a")
    git("add", "a.txt")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-m", "a")
    facts = git_facts(repo)
    assert len(facts["git_commit_hash"]) == 40 and facts["git_branch"] == "trunk"
    assert (
        facts["git_commit_short"] == facts["git_commit_hash"][:12] and facts["git_dirty"] is False
    )
    (repo / "a.txt").write_text("b")
    assert git_facts(repo)["git_dirty"] is True


def test_env_facts_unpickle_without_importing_torch():
    """Rank 0's first window carries them to the group pool, the Tune trial and the driver:
    none of those processes imports torch (a TorchVersion in them cost every thin resident
    trial a torch import, 2.6 s of CPU here and 4.6-6.9 s on an H200 host)."""
    import pickle
    import sys

    import torch

    from trainables.observe.telemetry import collect_env

    facts = collect_env(torch.device("cpu"))
    assert facts["torch"] == torch.__version__ and facts["python"]
    probe = (
        "import pickle, sys; pickle.loads(sys.stdin.buffer.read()); print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], input=pickle.dumps(facts), capture_output=True, check=True
    )
    assert out.stdout.strip() == b"False", out.stderr[-2000:]
