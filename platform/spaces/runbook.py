"""The runbooks' environment variables, translated into a search space.

``scripts/run_stage1_ab_bench.sh`` (same name and variables as the old runbook) runs
``python -m platform.tune --from-env``: the variables below become ``--set`` overrides of a base
space (``runbook``: the runbooks' defaults, or ``--space NAME``), the equivalent YAML is printed so
users can move to a space file, and the sweep runs as any other.

Every variable has one row in :data:`VARIABLES`: what it sets and how its value is read. A
runbook variable without a counterpart (a name with a runbook prefix that is not in the table) is
named in one warning line; a value that cannot be read is an error naming the variable (exit 2).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from platform.errors import UsageError
from platform.spaces.space import override
from stage1_common.output_root import OutputRoot
from trainables.config.choices import Attention

__all__ = ["VARIABLES", "RunbookPlan", "from_env"]

VAL_SPEAKERS = 2  # the held-out split of SWEEP_VALIDATION_EVERY (no runbook variable names one)
_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n", ""}


def _flag(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise UsageError(f"{name}={raw}: expected 0 or 1 (true/false); fix the variable")


def _int(name: str, raw: str, minimum: int = 1) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise UsageError(f"{name}={raw}: expected an integer, e.g. {name}=4") from None
    if value < minimum:
        raise UsageError(f"{name}={raw}: must be >= {minimum}")
    return value


def _float(name: str, raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise UsageError(f"{name}={raw}: expected a number, e.g. {name}=2") from None
    if value < 0:
        raise UsageError(f"{name}={raw}: must be >= 0")
    return value


def _ints(name: str, raw: str, minimum: int = 1) -> list[int]:
    items = [p.strip() for p in raw.split(",")]
    if not raw.strip() or any(not p for p in items):
        raise UsageError(f"{name}={raw}: expected a comma list of integers, e.g. {name}=4,6,8")
    values = [_int(name, p, minimum) for p in items]
    if len(set(values)) != len(values):
        raise UsageError(f"{name}={raw}: a value is listed twice")
    return values


def _choice(*allowed: str, mapping: Mapping[str, str] | None = None):
    def read(name: str, raw: str) -> str:
        value = raw.strip().lower()
        value = (mapping or {}).get(value, value)
        if value not in allowed:
            raise UsageError(f"{name}={raw}: expected one of {', '.join(allowed)}")
        return value

    return read


_ATTN = _choice(
    *get_args(Attention),
    mapping={"flash": "flash_attention_2", "fa2": "flash_attention_2"},
)
_DTYPE = _choice(
    "auto",
    "fp32",
    "bf16",
    "fp16",
    mapping={"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"},
)


def _compress(name: str, raw: str) -> str:
    value = raw.strip().lower()
    if value in ("bf16", "fp16", "none"):
        return value
    return "bf16" if _flag(name, raw) else "none"  # the runbooks' 1: bf16 compression


def _one_or_list(values: list[int]) -> Any:
    return values[0] if len(values) == 1 else values


@dataclass(frozen=True)
class Variable:
    """One runbook variable: the config key (or plan field) it sets and how to read it."""

    key: str
    read: Callable[[str, str], Any]
    doc: str


# Variable -> what it sets. Keys starting with "@" are the sweep's own settings, not config keys.
VARIABLES: dict[str, Variable] = {
    # --- sweep ---
    "MODE": Variable(
        "@mode", _choice("sweep"), "only `sweep`; train with python -m platform.train"
    ),
    "REPEATS": Variable("@repeats", _int, "repeats per group"),
    "MAX_STEPS": Variable("max_steps", _int, "steps per run"),
    "SWEEP_ZERO_STAGES": Variable(
        "zero_stage",
        lambda n, r: _one_or_list(_ints(n, r, 0)),
        "ZeRO stages; 0 runs DDP, 1-3 DeepSpeed (strategy auto)",
    ),
    "SWEEP_MICRO_BATCHES": Variable(
        "micro_batch", lambda n, r: _one_or_list(_ints(n, r)), "micro-batches"
    ),
    "SWEEP_NUM_WORKERS_LIST": Variable(
        "num_workers", lambda n, r: _one_or_list(_ints(n, r, 0)), "DataLoader workers"
    ),
    "SWEEP_PREFETCH_LIST": Variable(
        "prefetch_factor", lambda n, r: _one_or_list(_ints(n, r)), "DataLoader prefetch"
    ),
    "SWEEP_LOG_EVERY": Variable("log_every", _int, "steps per timing window"),
    "TAIL_TIMING_POINTS": Variable("tail_timing_points", _int, "windows in the tail figures"),
    "OUTPUT_ROOT": Variable("@output_root", lambda n, r: Path(r), "--output-root"),
    "DRIVER_LOG_PATH": Variable("@driver_log", lambda n, r: Path(r), "a copy of the console"),
    "INCLUDE": Variable(
        "@include", lambda n, r: _include(r), "GPUs: localhost:0,1 (DeepSpeed's syntax)"
    ),
    "SWEEP_VALIDATION_EVERY": Variable(
        "val_every", lambda n, r: _int(n, r, 0), "validation every N steps"
    ),
    "SWEEP_CHECKPOINT_EVERY": Variable(
        "checkpoint_every", lambda n, r: _int(n, r, 0), "checkpoint every N steps"
    ),
    "DRY_RUN": Variable("@dry_run", _flag, "print the runs, run nothing (--dry-run)"),
    # --- faults ---
    "STOP_ON_ERROR": Variable("@stop_on_error", _flag, "end the sweep at the first failed run"),
    "RUN_TIMEOUT_SEC": Variable("run_timeout_s", _float, "stop a run past this many seconds"),
    "FAILURE_DUMP_TAIL": Variable("@dump_tail", _flag, "print failed runs' log tails"),
    "FAIL_TAIL_LINES": Variable(
        "fail_tail_lines", lambda n, r: _int(n, r, 0), "lines of those tails"
    ),
    "RESUME_RUNS": Variable("@resume", _flag, "--resume when OUTPUT_ROOT holds a sweep"),
    # --- monitoring ---
    "HEARTBEAT_EVERY_SEC": Variable("heartbeat_every_s", _float, "heartbeat lines"),
    "ENABLE_GPU_TELEMETRY": Variable("@gpu_telemetry", _flag, "NVML samples"),
    "GPU_TELEMETRY_INTERVAL_SEC": Variable(
        "gpu_telemetry_interval_s", _float, "NVML sample period"
    ),
    "ENABLE_HOST_TELEMETRY": Variable("@host_telemetry", _flag, "host samples"),
    "HOST_TELEMETRY_INTERVAL_SEC": Variable(
        "host_telemetry_interval_s", _float, "host sample period"
    ),
    "STALL_ALERT_RATIO": Variable("stall_alert_ratio", _float, "stall alert threshold"),
    "ENABLE_CUDA_SYNC_TIMING": Variable("cuda_sync_timing", _flag, "exact step_ms"),
    "TIMING_RANK_SCOPE": Variable("timing_ranks", _choice("rank0", "all"), "rank0 or all"),
    "ENABLE_ETA_LOGGING": Variable("@eta", _flag, "ETA in progress lines (always on)"),
    # --- data ---
    "DATASET_ROOT": Variable("@dataset_root", lambda n, r: Path(r), "prepared corpus folder"),
    "DATASET_MANIFEST_PATH": Variable("manifest_path", lambda n, r: r, "data_prep manifest"),
    "DATASET_USE_TRIM": Variable("@use_trim", _flag, "the trimmed manifest of DATASET_ROOT"),
    "DATASET_OFFLINE_TRIMMED": Variable(
        "@offline_trimmed", _flag, "trimmed by data_prep (the only way)"
    ),
    "ENABLE_LENGTH_FIXED_SLICE": Variable("@fixed_slice", _flag, "crop_policy fixed_slice"),
    "FIXED_SLICE_SECONDS": Variable("fixed_slice_s", _float, "fixed_slice length"),
    "ENABLE_LENGTH_BUCKET": Variable("length_bucketing", _flag, "length bucketing"),
    # --- model and numerics ---
    "PRECISION_MODE": Variable(
        "precision",
        _choice("auto", "fp32", "bf16", "fp16", mapping={"float32": "fp32"}),
        "precision",
    ),
    "ATTN_IMPL": Variable("@attn", _ATTN, "both encoders' attention"),
    "SPEECH_ATTN_IMPL": Variable("speech_attention", _ATTN, "speech encoder attention"),
    "TEXT_ATTN_IMPL": Variable("text_attention", _ATTN, "text encoder attention"),
    "MODEL_LOAD_DTYPE": Variable("model_load_dtype", _DTYPE, "weights' dtype"),
    "ENABLE_TF32": Variable("tf32", _flag, "TF32 matmuls"),
    "MATMUL_PRECISION": Variable(
        "matmul_precision", _choice("highest", "high", "medium"), "fp32 matmuls"
    ),
    "ENABLE_TORCH_COMPILE": Variable("torch_compile", _flag, "torch.compile"),
    "TORCH_COMPILE_MODE": Variable(
        "compile_mode",
        _choice("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
        "compile mode",
    ),
    "TORCH_COMPILE_DYNAMIC": Variable(
        "compile_dynamic",
        lambda n, r: "auto" if r.strip().lower() == "auto" else _flag(n, r),
        "dynamic shapes",
    ),
    # --- the DDP runbooks' knobs (DDP runs only under strategy auto) ---
    "NSA_DDP_BUCKET_MB": Variable("bucket_mb", _int, "gradient bucket, MB"),
    "NSA_DDP_STATIC_GRAPH": Variable("ddp_static_graph", _flag, "DDP static_graph"),
    "NSA_DDP_FIND_UNUSED": Variable(
        "ddp_find_unused_parameters", _flag, "DDP find_unused_parameters"
    ),
    "NSA_DDP_COMPRESS": Variable("ddp_comm_hook", _compress, "bf16 gradient compression"),
    "NSA_OPT_FUSED": Variable(
        "optimizer",
        lambda n, r: "adamw_torch" if _flag(n, r) else "adamw_torch_foreach",
        "fused AdamW (else foreach)",
    ),
}

# Names with these prefixes belong to the runbooks: one not in the table gets a warning line.
RUNBOOK_PREFIXES = (
    "SWEEP_",
    "NSA_",
    "ENABLE_",
    "DATASET_",
    "TORCH_COMPILE_",
    "GPU_TELEMETRY_",
    "HOST_TELEMETRY_",
    "FIXED_SLICE_",
    "TIMING_",
    "TAIL_",
    "FAIL",
    "RUN_",
)


def _include(raw: str) -> list[tuple[str, list[int]]]:
    """DeepSpeed's ``--include``: ``localhost:0,1`` or ``host1:0,1@host2:0,1``."""
    hosts = []
    for part in raw.strip().split("@"):
        host, sep, slots = part.partition(":")
        if not host.strip() or not sep:
            raise UsageError(
                f"INCLUDE={raw}: expected DeepSpeed's HOST:GPU,GPU[@HOST:...], e.g. "
                "INCLUDE=localhost:0,1"
            )
        hosts.append((host.strip(), _ints("INCLUDE", slots, 0)))
    return hosts


@dataclass
class RunbookPlan:
    """What the environment asks for: ``--set`` overrides and the sweep's own settings."""

    sets: list[str] = field(default_factory=list)
    repeats: int | None = None
    stop_on_error: bool | None = None
    output_root: Path | None = None
    driver_log: Path | None = None
    resume: bool = False
    dry_run: bool = False
    cuda_visible_devices: str | None = None
    warnings: list[str] = field(default_factory=list)
    used: dict[str, str] = field(default_factory=dict)  # the runbook variables that were set


def from_env(env: Mapping[str, str] | None = None, *, address: str | None = None) -> RunbookPlan:
    """Read the runbook's variables from ``env`` (default os.environ)."""
    env = os.environ if env is None else env
    plan = RunbookPlan()
    values: dict[str, Any] = {}
    for name, var in VARIABLES.items():
        if name in env:
            plan.used[name] = env[name]
            values[var.key] = var.read(name, env[name])
    for name in sorted(env):
        if name not in VARIABLES and name.startswith(RUNBOOK_PREFIXES):
            plan.warnings.append(f"{name} has no counterpart in the platform and is ignored")
    sets: dict[str, Any] = {}
    for key, value in values.items():
        if not key.startswith("@"):
            sets[key] = value
    if "zero_stage" in sets:
        sets["strategy"] = "auto"  # the runbooks' z0 is DDP, z1-z3 DeepSpeed
    _data(values, sets, plan)
    _telemetry(values, sets, plan)
    if sets.get("val_every"):  # the platform validates on a held-out split
        sets["val_speakers"] = VAL_SPEAKERS
        plan.warnings.append(
            f"SWEEP_VALIDATION_EVERY: validation holds out {VAL_SPEAKERS} speakers of the manifest "
            "(val_speakers); --set val_manifest_path=PATH.tsv uses a split of your own"
        )
    if values.get("@dump_tail") is False:
        sets["fail_tail_lines"] = 0
    if "@attn" in values:
        sets.setdefault("speech_attention", values["@attn"])
        sets.setdefault("text_attention", values["@attn"])
    if values.get("@fixed_slice"):
        sets["crop_policy"] = "fixed_slice"
    elif values.get("@fixed_slice") is False and "fixed_slice_s" in sets:
        plan.warnings.append("FIXED_SLICE_SECONDS is ignored: ENABLE_LENGTH_FIXED_SLICE=0")
        sets.pop("fixed_slice_s")
    if values.get("@eta") is False:
        plan.warnings.append("ENABLE_ETA_LOGGING=0: progress lines always show the ETA")
    if "@include" in values:
        _gpus(values["@include"], sets, plan, address)
    plan.repeats = values.get("@repeats")
    plan.stop_on_error = values.get("@stop_on_error")
    plan.output_root = values.get("@output_root")
    plan.driver_log = values.get("@driver_log")
    plan.dry_run = bool(values.get("@dry_run"))
    if values.get("@resume"):
        if plan.output_root is None:
            raise UsageError("RESUME_RUNS=1 needs OUTPUT_ROOT: the sweep folder to resume")
        plan.resume = OutputRoot(plan.output_root).holds_sweep()
    if plan.stop_on_error is not None:
        sets["stop_on_error"] = plan.stop_on_error  # a setting of the sweep that --set takes
    plan.sets = [override(k, v) for k, v in sets.items()]
    return plan


def _data(values: dict[str, Any], sets: dict[str, Any], plan: RunbookPlan) -> None:
    trim = values.get("@use_trim")
    if values.get("@offline_trimmed") is False and trim:
        raise UsageError(
            "DATASET_OFFLINE_TRIMMED=0 with DATASET_USE_TRIM=1: the platform trims only offline; "
            "prepare the corpus with python -m data_prep.librispeech --trim and set "
            "DATASET_OFFLINE_TRIMMED=1"
        )
    root = values.get("@dataset_root")
    if root is not None and "manifest_path" not in sets:
        name = "manifest_16k_trim.tsv" if trim is not False else "manifest_16k.tsv"
        sets["manifest_path"] = str(root / name)
    elif root is not None:
        plan.warnings.append("DATASET_ROOT is ignored: DATASET_MANIFEST_PATH names the manifest")
    if "manifest_path" in sets:
        sets["dataset"] = "manifest"


def _telemetry(values: dict[str, Any], sets: dict[str, Any], plan: RunbookPlan) -> None:
    """GPU and host sampling are one switch here (``telemetry``)."""
    given = {
        name: values[key]
        for name, key in (
            ("ENABLE_GPU_TELEMETRY", "@gpu_telemetry"),
            ("ENABLE_HOST_TELEMETRY", "@host_telemetry"),
        )
        if key in values
    }
    if not given:
        return
    on = any(given.values())
    sets["telemetry"] = on
    if given.get("ENABLE_HOST_TELEMETRY"):  # a leak hunt: host-memory growth must be the run's
        sets["executor"] = "fresh"
    off = [name for name, value in given.items() if not value]
    if on and off:
        plan.warnings.append(
            f"{off[0]}=0 is ignored: GPU and host telemetry are one switch (telemetry), on "
            "because the other is on"
        )
    elif not on and len(given) == 1:
        plan.warnings.append(
            f"{off[0]}=0 turns off GPU and host telemetry both: they are one switch (telemetry)"
        )


def _gpus(
    hosts: list[tuple[str, list[int]]], sets: dict[str, Any], plan: RunbookPlan, address: str | None
) -> None:
    local = {"localhost", "127.0.0.1", socket.gethostname()}
    if len(hosts) == 1 and hosts[0][0] in local:
        gpus = hosts[0][1]
        sets.update(train_workers=len(gpus), use_gpu=True)
        if address:
            plan.warnings.append(
                f"INCLUDE=localhost:{','.join(map(str, gpus))} picks the count only with --address: "
                "the cluster's GPUs are Ray's to place"
            )
        else:
            plan.cuda_visible_devices = ",".join(map(str, gpus))
        return
    counts = {len(slots) for _, slots in hosts}
    if len(counts) != 1:
        raise UsageError(
            "INCLUDE: every host must give the same number of GPUs (Ray Train places one worker "
            "per GPU on each node)"
        )
    if not address:
        raise UsageError(
            f"INCLUDE names {len(hosts)} hosts: start a Ray cluster on them (ray start) and pass "
            "--address HEAD:PORT"
        )
    sets.update(train_workers=len(hosts) * counts.pop(), nodes=len(hosts), use_gpu=True)
