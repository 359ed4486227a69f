"""What a training process observes about itself while the loop computes, one module per
concern:

- ``timing``: per-step times and a window's statistics;
- ``window_metrics``: one timing window's metrics, and what rank 0 gathers for it;
- ``telemetry``: GPU (NVML) and host samples on a background thread, the environment, Ray's
  gauges;
- ``gc_control``: the time Python's garbage collector took, and the collector paused during
  big imports;
- ``profiling``: the torch profiler window of ``profile_steps``;
- ``startup``: where a run's start-up time goes, and the GPU's first uses warmed up beside it;
- ``watchdog``: hang detection (stack dumps) and the process group's timeouts.

Nothing is re-exported here: import the module that owns a name.
"""

__all__: list[str] = []
