"""Record what NVML answers on this machine, for the replaying fake of the unit tests.

    python tests/gpu/record_nvml.py OUT.json [--samples 10] [--interval-s 0.5]

Calls exactly the functions trainables.observe.telemetry.NvmlGpu calls, on every GPU, and writes
their answers (or the NVML error a call raised) per sample. tests/test_telemetry.py replays the file
through the same interface.
"""

import argparse
import json
import time

import pynvml

CALLS = {
    "utilization": lambda h: (lambda u: {"gpu": u.gpu, "memory": u.memory})(
        pynvml.nvmlDeviceGetUtilizationRates(h)
    ),
    "memory_used": lambda h: pynvml.nvmlDeviceGetMemoryInfo(h).used,
    "power_mw": pynvml.nvmlDeviceGetPowerUsage,
    "sm_clock": lambda h: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
    "mem_clock": lambda h: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
    "temperature": lambda h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
    "clocks_event_reasons": pynvml.nvmlDeviceGetCurrentClocksEventReasons,
    "energy_mj": pynvml.nvmlDeviceGetTotalEnergyConsumption,
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--interval-s", type=float, default=0.5)
    args = p.parse_args()
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    devices = []
    for h in handles:
        uuid, name = pynvml.nvmlDeviceGetUUID(h), pynvml.nvmlDeviceGetName(h)
        devices.append(
            {
                "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                "name": name.decode() if isinstance(name, bytes) else name,
                "samples": [],
            }
        )
    for _ in range(args.samples):
        for device, h in zip(devices, handles, strict=True):
            sample = {}
            for key, call in CALLS.items():
                try:
                    sample[key] = call(h)
                except pynvml.NVMLError as exc:
                    sample[key] = {"nvml_error": str(exc)}
            device["samples"].append(sample)
        time.sleep(args.interval_s)
    record = {"driver": pynvml.nvmlSystemGetDriverVersion(), "devices": devices}
    with open(args.out, "w") as fh:
        json.dump(record, fh, indent=1)


if __name__ == "__main__":
    main()
