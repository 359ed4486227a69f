"""The typed configuration of one trial.

Plain dicts cross the Ray boundary (Tune param space, ``train_loop_config``); on each side they
are turned back into a :class:`TrialConfig`, which validates every field in ``__post_init__`` so
that a bad value fails before any work starts, with one line naming the key and the fix (the
checks themselves are in ``trainables/config/checks.py``). The field docs below are the table of
every key users read.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass
from typing import Any

from trainables.config import choices as vocab
from trainables.config.checks import (
    MAX_TEXT_TOKENS,
    ConfigError,
    check_config,
    describe_type,
    is_union,
    match_type,
)
from trainables.config.workload import WorkloadConfig, doc_field

__all__ = ["ConfigError", "MAX_TEXT_TOKENS", "TrialConfig", "field_names", "coerce_value"]


_doc = doc_field


@dataclass(kw_only=True)
class TrialConfig(WorkloadConfig):
    """Everything one trial needs: the workload's fields (trainables/config/trial_config.py), then
    how the run runs. Field docs are the reference for search-space keys."""

    # --- training (sweeps keep these off, as the runbooks do; platform.train turns them on) ---
    lr_schedule: vocab.LrSchedule = _doc(
        "`constant` lr, or `cosine`: linear warm-up over warmup_steps, then cosine decay to "
        "min_lr_ratio x lr at max_steps.",
        default="constant",
    )
    warmup_steps: int = _doc("Linear warm-up steps of the learning rate (0: none).", default=0)
    min_lr_ratio: float = _doc("Floor of the cosine schedule, as a fraction of lr.", default=0.0)
    grad_clip: float = _doc(
        "Clip the global gradient norm to this before each optimizer step (0: off).", default=0.0
    )
    logit_scale_max: float = _doc(
        "CLIP temperature clamp: the learned logit scale (1/temperature) is kept at or below "
        "this after every step (CLIP: 100).",
        default=100.0,
    )
    epochs: int = _doc(
        "Train this many passes over the manifest instead of max_steps (0: use max_steps); the "
        "driver turns it into max_steps from the manifest's size.",
        default=0,
    )
    val_every: int = _doc(
        "Validate every this many steps (a multiple of log_every; 0: off): contrastive loss and "
        "speech-to-text / text-to-speech recall@1/@5 over the whole held-out split.",
        default=0,
    )
    val_manifest_path: str = _doc(
        "data_prep manifest of the held-out split (e.g. dev-clean); empty: val_speakers.",
        default="",
    )
    val_speakers: int = _doc(
        "Without val_manifest_path: hold out this many speakers of manifest_path (the last in "
        "sorted order) for validation; training never sees them.",
        default=0,
    )
    best_metric: vocab.BestMetric = _doc(
        "Validation metric that picks the best checkpoint (val_loss: lowest; recalls: highest).",
        default="val_mean_r1",
    )
    checkpoint_every: int = _doc(
        "Save a checkpoint through Ray Train every this many steps (a multiple of log_every; "
        "0: off): model, optimizer, schedule, step, data position and RNG states.",
        default=0,
    )
    checkpoint_async: bool = _doc(
        "ddp and fsdp2: write checkpoints with torch.distributed.checkpoint's async_save (the "
        "step waits only for the copy to host memory); false: dcp.save. DeepSpeed: synchronous.",
        default=True,
    )
    checkpoint_pinned: bool = _doc(
        "GPU, checkpoint_async: stage in pinned host memory (fast copies; the buffers are made "
        "and pinned once, ahead of the first save); false: pageable shared memory.",
        default=True,
    )
    keep_checkpoints: int = _doc(
        "Checkpoints kept (Ray Train's num_to_keep; with validation the best by best_metric, "
        "and always the latest).",
        default=2,
    )
    max_failures: int = _doc(
        "Worker-group restarts from the latest checkpoint after a worker dies (Ray Train's "
        "FailureConfig; -1: no limit).",
        default=0,
    )
    export_model: vocab.ExportModel = _doc(
        "At the end, write the final or the best checkpoint's model as save_pretrained folders "
        "(runs/<run>/export/speech, text, heads.pt), loadable with speech_pretrained_path and "
        "text_pretrained_path.",
        default="none",
    )
    # --- schedule and measurement ---
    max_steps: int = _doc("Optimizer steps per run.", default=30)
    log_every: int = _doc(
        "Steps per timing window; each window is one ray.train.report (a barrier).", default=5
    )
    tail_timing_points: int = _doc(
        "Windows at the end of a run averaged into its tail figures.", default=3
    )
    cuda_sync_timing: bool = _doc(
        "Synchronize the GPU after each step so step_ms is exact (otherwise launch time).",
        default=False,
    )
    profile_steps: int = _doc(
        "Rank 0 records this many steps with the torch profiler in the second timing window "
        "(one warm-up step before them; log_every must be larger), their forward, backward and "
        "optimizer marked, into runs/<run>/profile-rank0.json (a Chrome trace; python -m "
        "benchmarks.step_profile splits it into the phases' GPU time, communication and GPU "
        "idle time); 0: off. The run gets processes of its own, and the window must end before "
        "the tail windows.",
        default=0,
    )
    timing_ranks: vocab.TimingRanks = _doc(
        "`rank0`: rank 0's windows only; `all`: every rank's windows, gathered to rank 0 at each "
        "report (one more collective per window), one timing row per rank.",
        default="rank0",
    )
    telemetry: bool = _doc(
        "Sample each GPU (NVML) and each node (memory, load, trainer RSS) in the workers, and "
        "print the driver's heartbeats and stall alerts for the run.",
        default=True,
    )
    gpu_telemetry_interval_s: float = _doc("Seconds between NVML samples of a GPU.", default=2.0)
    host_telemetry_interval_s: float = _doc("Seconds between host samples of a node.", default=5.0)
    heartbeat_every_s: float = _doc(
        "Seconds between the driver's heartbeat lines per running run; 0: none.", default=30.0
    )
    stall_alert_ratio: float = _doc(
        "Alert when a window's iter_ms_p50 exceeds this times the run's median so far.",
        default=2.0,
    )
    inject_sleep_s: float = _doc(
        "Fault injection for tests: sleep this long inside the step at inject_sleep_at_step.",
        default=0.0,
    )
    inject_sleep_at_step: int = _doc("First step of the injected sleep (0: none).", default=0)
    inject_sleep_steps: int = _doc("Consecutive steps that sleep from there.", default=1)
    inject_sleep_rank: int = _doc("Rank that sleeps; -1: every rank.", default=-1)
    inject_sleep_every: int = _doc(
        "Of those steps, every Nth sleeps (1: each); 3 gives one slow step in three, the "
        "irregular iteration times of an unstable configuration.",
        default=1,
    )
    inject_error_at_step: int = _doc(
        "Fault injection for tests: raise a RuntimeError inside this step (0: never).", default=0
    )
    inject_error_rank: int = _doc(
        "Rank that raises (or kills itself, inject_kill_at_step); -1: every rank.", default=-1
    )
    inject_kill_at_step: int = _doc(
        "Fault injection for tests: inject_error_rank kills itself with SIGKILL after this step "
        "(0: never).",
        default=0,
    )
    inject_every_attempt: bool = _doc(
        "Fault injection for tests: the inject_* faults act in a run's first attempt only (a "
        "worker group restarted from a checkpoint, or a training resumed with --resume, trains "
        "on without them, so a drill shows its recovery); true: in every attempt.",
        default=False,
    )
    inject_save_delay_s: float = _doc(
        "Fault injection for tests: an asynchronous checkpoint's writer waits this long before "
        "it writes (room to kill a rank while a save is in flight).",
        default=0.0,
    )
    inject_leak_mb_per_step: float = _doc(
        "Fault injection for tests: every rank keeps this many more MB of host memory after each "
        "step (a planted leak for the leak check; training itself is unchanged).",
        default=0.0,
    )
    pg_timeout_s: int = _doc(
        "Process-group (gloo/NCCL) collective timeout, seconds (lowered to just above "
        "stall_timeout_s when that is set).",
        default=1800,
    )
    stall_timeout_s: float = _doc(
        "A rank without progress this long dumps the stacks of its threads to "
        "runs/<run>/stacks-rank<r>.txt, and the collectives of the others time out soon "
        "after; 0: off. Covers the first step too (compilation included).",
        default=900.0,
    )
    run_timeout_s: float = _doc(
        "A run still going after this long (from its trial's start, checked at each window "
        "report) is stopped and recorded `timeout`; 0: no limit.",
        default=0.0,
    )
    fail_tail_lines: int = _doc(
        "Lines from the end of each worker's stdout and stderr that the driver saves to "
        "runs/<run>/fail_tail.txt when the run fails or stalls (the console names the file); "
        "0: none.",
        default=40,
    )
    max_missing_files_fraction: float = _doc(
        "Manifest rows whose audio file is missing are skipped and counted (missing_files in "
        "the run manifest); the run fails when more than this fraction of rows is missing.",
        default=0.01,
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, coerce_value(f.name, getattr(self, f.name), _hints()[f.name]))
        if self.strategy == "auto":  # resolved here: workers and records see ddp or deepspeed
            self.strategy = "ddp" if self.zero_stage == 0 else "deepspeed"
            if self.strategy == "deepspeed":
                self.ddp_comm_hook = "none"
        check_config(self)
        if self.crop_buckets_s:  # one spelling of the buckets: ascending, shortest form
            self.crop_buckets_s = ",".join(f"{b:g}" for b in sorted(self.crop_buckets))

    # --- conversions at the Ray boundary ---
    @classmethod
    def from_dict(cls, values: dict[str, Any], *, where: str = "config") -> TrialConfig:
        """Build from a plain dict; unknown keys fail with the closest known key as the fix."""
        for key in values:
            check_known_key(key, where=where)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def cpus_per_train_worker(self) -> int:
        """CPUs a train worker reserves: its own process plus one per DataLoader worker."""
        return self.cpus_per_worker or self.num_workers + 1

    @property
    def workers_per_node(self) -> int:
        """Train workers each node holds: train_workers / nodes, one under STRICT_SPREAD."""
        if self.placement_strategy == "STRICT_SPREAD":
            return 1
        return self.train_workers // self.nodes if self.nodes else self.train_workers

    @property
    def checkpoint_score_order(self) -> str:
        """How best_metric ranks checkpoints: lower loss or higher recall is better."""
        return "min" if self.best_metric == "val_loss" else "max"

    @property
    def crop_buckets(self) -> tuple[float, ...]:
        """crop_buckets_s as seconds, ascending (empty: off)."""
        return (
            tuple(float(b) for b in self.crop_buckets_s.split(",")) if self.crop_buckets_s else ()
        )

    @property
    def static_shapes(self) -> list[tuple[int, int]] | None:
        """(audio samples, text tokens) of every batch shape the run can see, when they are
        known before it starts (crop_buckets_s, synthetic data); None otherwise."""
        if self.crop_buckets:
            return [(int(round(b * 16_000)), self.text_tokens) for b in self.crop_buckets]
        if self.dataset == "synthetic":
            return [(self.audio_samples, self.text_tokens)]
        return None

    @property
    def audio_samples(self) -> int:
        return int(round(self.audio_s * 16_000))


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(TrialConfig)]


def field_doc(name: str) -> str:
    return {f.name: f.metadata.get("doc", "") for f in dataclasses.fields(TrialConfig)}[name]


def check_known_key(key: str, *, where: str) -> None:
    names = field_names()
    if key not in names:
        close = difflib.get_close_matches(key, names, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "known keys: " + ", ".join(names)
        raise ConfigError(f"unknown key {key!r} in {where}; {hint}")


# str keys that hold a comma list; a YAML list is accepted and joined.
_LIST_KEYS = ("crop_buckets_s",)

_HINTS: dict[str, Any] | None = None


def _hints() -> dict[str, Any]:
    global _HINTS
    if _HINTS is None:
        _HINTS = typing.get_type_hints(TrialConfig)
    return _HINTS


def coerce_value(name: str, value: Any, hint: Any = None) -> Any:
    """Check ``value`` against the field's type; ints are accepted for floats, nothing else."""
    if hint is None:
        check_known_key(name, where="config")
        hint = _hints()[name]
    if name in _LIST_KEYS and isinstance(value, (list, tuple)):
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{name}: expected a list of numbers, got {value!r}")
        value = ",".join(f"{float(v):g}" for v in value)
    options = typing.get_args(hint) if is_union(hint) else (hint,)
    for option in options:
        ok, converted = match_type(value, option)
        if ok:
            return converted
    raise ConfigError(f"{name}: expected {describe_type(hint)}, got {value!r}")
