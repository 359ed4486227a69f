"""The checks of a TrialConfig (trainables/config/trial_config.py): each field's range, the
rules across fields, and the type matching behind them. A broken rule raises a ConfigError whose
message is one line: the key, the problem, the fix.

It knows the config only by its attributes (it never imports trial_config, which calls
``check_config`` from ``TrialConfig.__post_init__``).
"""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

__all__ = [
    "MAX_TEXT_TOKENS",
    "ConfigError",
    "check_config",
    "describe_type",
    "is_union",
    "needs_own_processes",
    "match_type",
]

# Smallest allowed value of each integer field that has one.
_MINIMUMS = {
    "grad_accum_steps": 1,
    "micro_batch": 1,
    "num_workers": 0,
    "prefetch_factor": 1,
    "bucket_mb": 1,
    "train_workers": 1,
    "cpus_per_worker": 0,
    "intra_op_threads": 0,
    "text_tokens": 2,
    "proj_dim": 1,
    "max_steps": 1,
    "log_every": 1,
    "tail_timing_points": 1,
    "profile_steps": 0,
    "pg_timeout_s": 1,
    "length_bucketing_pool": 1,
    "inject_sleep_at_step": 0,
    "inject_sleep_steps": 1,
    "inject_sleep_rank": -1,
    "inject_sleep_every": 1,
    "inject_error_at_step": 0,
    "inject_error_rank": -1,
    "fail_tail_lines": 0,
    "warmup_steps": 0,
    "epochs": 0,
    "val_every": 0,
    "val_speakers": 0,
    "checkpoint_every": 0,
    "keep_checkpoints": 1,
    "max_failures": -1,
    "nodes": 0,
}

# Longest token sequence each text encoder size has position embeddings for.
MAX_TEXT_TOKENS = {"tiny": 128, "base": 512}


class ConfigError(ValueError):
    """A configuration value that cannot run. The message is one line: the key, the problem, the fix."""


def check_config(cfg) -> None:
    """Every rule a TrialConfig must meet, after its values were coerced to their types; the
    first broken one (in this order) raises a ConfigError naming the key and the fix."""
    _check_strategy(cfg)
    _check_placement(cfg)
    _check_shapes(cfg)
    _check_buckets(cfg)
    _check_batching(cfg)
    _check_load_dtype(cfg)
    _check_training(cfg)
    _check_observing(cfg)
    _check_executor(cfg)
    _check_local_paths(cfg)


# Read through local paths by every worker (the corpus, its audio and weights). A tokenizer_path
# is one small file, read once per worker: it may be on object storage (trainables/data/text.py).
LOCAL_PATH_KEYS = (
    "manifest_path",
    "val_manifest_path",
    "audio_root",
    "speech_pretrained_path",
    "text_pretrained_path",
)


def _check_local_paths(cfg) -> None:
    """The corpus and weights are read with local file calls (random reads of
    thousands of audio files per epoch): an object-storage URI gets the fix, copy or mount. The
    compile cache is a folder of each node, the same path on all of them: an absolute one."""
    cache = cfg.compile_cache_dir
    if cache and not (cache.startswith("/") or cache.startswith("~")):
        raise ConfigError(
            f"compile_cache_dir: {cache} is a relative path, and each worker resolves it on its "
            "own node from a folder of Ray's; give an absolute path (~ allowed)"
        )
    for key in LOCAL_PATH_KEYS:
        value = str(getattr(cfg, key) or "")
        scheme, sep, rest = value.partition("://")
        if sep and len(scheme) > 1 and scheme != "file":
            tool = {"s3": "aws s3 sync", "gs": "gcloud storage rsync"}.get(scheme, "rclone copy")
            raise ConfigError(
                f"{key}: {value} is on object storage, and it is read through local paths; copy "
                f"it to the same path on every node ({tool}) or mount the bucket there "
                f"(mountpoint-s3, s3fs, gcsfuse), then set {key} to that path"
            )


def _check_strategy(cfg) -> None:
    """Integer minimums, the strategy and its ZeRO stage, precision."""
    for name, low in _MINIMUMS.items():
        if getattr(cfg, name) < low:
            raise ConfigError(f"{name}: must be >= {low}, got {getattr(cfg, name)}")
    if not 0 <= cfg.zero_stage <= 3:
        raise ConfigError(f"zero_stage: must be 0, 1, 2 or 3, got {cfg.zero_stage}")
    if cfg.strategy in ("ddp", "fsdp2") and cfg.zero_stage != 0:
        raise ConfigError(
            f"zero_stage: {cfg.zero_stage} needs strategy deepspeed; with strategy "
            f"{cfg.strategy} set zero_stage=0 (or set strategy=deepspeed)"
        )
    if cfg.strategy == "fsdp2" and cfg.torch_compile and cfg.compile_scope != "layers":
        raise ConfigError(
            "compile_scope: fsdp2 compiles layer by layer (its hooks sit between the layers); "
            "set compile_scope=layers"
        )
    if cfg.compile_pos_conv and not (cfg.torch_compile and cfg.compile_scope == "layers"):
        raise ConfigError(
            "compile_pos_conv: a region of regional compilation; set torch_compile=true with "
            "compile_scope=layers (compile_scope model compiles it with the rest) or "
            "compile_pos_conv=false"
        )
    if cfg.compile_fuse_linears and not (cfg.torch_compile and cfg.compile_backend == "inductor"):
        raise ConfigError(
            "compile_fuse_linears: an Inductor pass, it runs only in compiled code; set "
            "torch_compile=true with compile_backend=inductor (or compile_fuse_linears=false)"
        )
    if cfg.strategy == "deepspeed" and cfg.zero_stage == 3:
        # Both read a convolution's weight outside that convolution's forward, where ZeRO-3
        # has not gathered it.
        for key, plain in (("pos_conv", "conv"), ("extractor_layout", "channels_first")):
            if getattr(cfg, key) != plain:
                raise ConfigError(
                    f"{key}: {getattr(cfg, key)} reads convolution weights outside their "
                    f"module's forward, where ZeRO-3 has not gathered them; under zero_stage 3 "
                    f"set {key}={plain}"
                )
    if cfg.extractor_norm in ("triton", "folded") and cfg.extractor_layout != "matmul":
        raise ConfigError(
            f"extractor_norm: {cfg.extractor_norm} runs inside the GEMM feature encoder; set "
            "extractor_layout=matmul (or extractor_norm=auto)"
        )
    if cfg.ddp_comm_hook != "none" and (cfg.strategy != "ddp" or cfg.use_gpu is False):
        raise ConfigError(
            f"ddp_comm_hook: {cfg.ddp_comm_hook} needs strategy ddp on GPUs; set ddp_comm_hook=none"
        )
    if cfg.precision == "fp16" and cfg.use_gpu is False:
        raise ConfigError("precision: fp16 needs a GPU; on the CPU use fp32, bf16 or auto")


def _check_profile_window(cfg) -> None:
    """The profiler's window stays inside the second timing window (which no race, ASHA or
    stall alert judges: they start with the third) and ends before the tail windows: its steps
    are slower, and the tail figures are the run's."""
    from trainables.observe.profiling import profile_window

    first, last = profile_window(cfg.log_every, cfg.profile_steps)
    if last > 2 * cfg.log_every:
        raise ConfigError(
            f"profile_steps: {cfg.profile_steps} steps and the profiler's warm-up step do not fit "
            f"in the second timing window (steps {cfg.log_every + 1}-{2 * cfg.log_every}); set "
            f"log_every to at least {cfg.profile_steps + 1} or lower profile_steps"
        )
    tail_from = cfg.max_steps - cfg.tail_timing_points * cfg.log_every + 1
    if last >= tail_from:
        raise ConfigError(
            f"profile_steps: the profiler's steps {first}-{last} reach the tail windows (from "
            f"step {max(1, tail_from)}); set max_steps to at least "
            f"{last + cfg.tail_timing_points * cfg.log_every} or lower profile_steps"
        )


def _check_shapes(cfg) -> None:
    """The schedule, transcripts and crops."""
    if cfg.log_every > cfg.max_steps:
        raise ConfigError(
            f"log_every: {cfg.log_every} is larger than max_steps {cfg.max_steps}, so no "
            "window would ever be reported; set log_every <= max_steps"
        )
    if cfg.profile_steps:
        _check_profile_window(cfg)
    if not cfg.text_pretrained_path and cfg.text_tokens > MAX_TEXT_TOKENS[cfg.model_size]:
        raise ConfigError(
            f"text_tokens: {cfg.text_tokens} exceeds the {MAX_TEXT_TOKENS[cfg.model_size]} "
            f"positions of the {cfg.model_size} text encoder; lower text_tokens"
        )
    if not 0.1 <= cfg.min_audio_s <= cfg.max_audio_s <= 60:
        raise ConfigError(
            f"min_audio_s/max_audio_s: need 0.1 <= min_audio_s <= max_audio_s <= 60, got "
            f"{cfg.min_audio_s} and {cfg.max_audio_s}; swap or fix the crop bounds"
        )
    if not 0.1 <= cfg.fixed_slice_s <= 60:
        raise ConfigError(f"fixed_slice_s: must be within 0.1-60 seconds, got {cfg.fixed_slice_s}")
    if cfg.length_bucketing and (cfg.dataset != "manifest" or cfg.crop_policy != "limit_longest"):
        raise ConfigError(
            "length_bucketing: groups crops of different lengths, so it needs dataset "
            "manifest with crop_policy limit_longest; set length_bucketing=false"
        )


def _check_observing(cfg) -> None:
    """Telemetry, alerts, time limits, fault injection, and the remaining ranges."""
    for name in ("gpu_telemetry_interval_s", "host_telemetry_interval_s"):
        if not 0.05 <= getattr(cfg, name) <= 3600:
            raise ConfigError(f"{name}: must be within 0.05-3600 seconds, got {getattr(cfg, name)}")
    if cfg.heartbeat_every_s < 0:
        raise ConfigError(f"heartbeat_every_s: must be >= 0 (0: off), got {cfg.heartbeat_every_s}")
    if cfg.stall_alert_ratio <= 1:
        raise ConfigError(f"stall_alert_ratio: must be > 1, got {cfg.stall_alert_ratio}")
    for name in ("stall_timeout_s", "run_timeout_s"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{name}: must be >= 0 (0: off), got {getattr(cfg, name)}")
    if not 0 <= cfg.max_missing_files_fraction <= 1:
        raise ConfigError(
            "max_missing_files_fraction: must be within 0-1 (0: no missing file allowed), "
            f"got {cfg.max_missing_files_fraction}"
        )
    if not 0 <= cfg.inject_leak_mb_per_step <= 64:
        raise ConfigError(
            f"inject_leak_mb_per_step: must be within 0-64, got {cfg.inject_leak_mb_per_step}"
        )
    if cfg.inject_sleep_s < 0:
        raise ConfigError(f"inject_sleep_s: must be >= 0, got {cfg.inject_sleep_s}")
    if cfg.manifest_path and not cfg.manifest_path.endswith(".tsv"):
        raise ConfigError(f"manifest_path: {cfg.manifest_path} is not a data_prep manifest (.tsv)")
    if not 0.1 <= cfg.audio_s <= 60:
        raise ConfigError(f"audio_s: must be within 0.1-60 seconds, got {cfg.audio_s}")
    if cfg.lr <= 0:
        raise ConfigError(f"lr: must be > 0, got {cfg.lr}")
    if cfg.weight_decay < 0:
        raise ConfigError(f"weight_decay: must be >= 0, got {cfg.weight_decay}")


def _check_buckets(cfg) -> None:
    if not cfg.crop_buckets_s:
        return
    try:
        buckets = [float(b) for b in cfg.crop_buckets_s.split(",")]
    except ValueError:
        raise ConfigError(
            f"crop_buckets_s: {cfg.crop_buckets_s!r} is not a comma list of seconds; write "
            "e.g. 1.0,1.5,2.0,2.5,3.0"
        ) from None
    if cfg.dataset != "manifest" or cfg.crop_policy != "limit_longest":
        raise ConfigError(
            "crop_buckets_s: buckets limit_longest crops of a manifest; set dataset=manifest "
            "and crop_policy=limit_longest, or crop_buckets_s=''"
        )
    if cfg.length_bucketing:
        raise ConfigError(
            "crop_buckets_s: already puts one crop length in each step; set length_bucketing=false"
        )
    outside = [b for b in buckets if not cfg.min_audio_s <= b <= cfg.max_audio_s]
    if outside or len(set(buckets)) != len(buckets):
        raise ConfigError(
            f"crop_buckets_s: buckets must be distinct and within min_audio_s-max_audio_s "
            f"({cfg.min_audio_s:g}-{cfg.max_audio_s:g} s), got {cfg.crop_buckets_s}"
        )


def _check_batching(cfg) -> None:
    """batching duration: whole utterances of a manifest, a budget one longest utterance fits,
    a padding bound that gives a few bins."""
    if cfg.batching != "duration":
        return
    if cfg.dataset != "manifest" or cfg.crop_policy != "limit_longest":
        raise ConfigError(
            "batching: duration batches whole utterances of a manifest (up to max_audio_s); set "
            "dataset=manifest and crop_policy=limit_longest, or batching=count"
        )
    if cfg.crop_buckets_s or cfg.length_bucketing:
        key = "crop_buckets_s=''" if cfg.crop_buckets_s else "length_bucketing=false"
        raise ConfigError(
            f"batching: duration makes its own length bins (batch_max_pad) and takes no crop "
            f"buckets or length bucketing; set {key}"
        )
    # Bins are whole 20 ms frames: one frame is the least padding, at most batch_max_pad of
    # the shortest utterance (trainables/data/durations.py).
    least = 0.02 / max(cfg.min_audio_s - 0.02, 0.02)
    if not least <= cfg.batch_max_pad <= 1:
        raise ConfigError(
            f"batch_max_pad: must be within {least:.3g}-1 (padded audio at most 1 + "
            f"batch_max_pad times the real, in bins of whole 20 ms frames down to min_audio_s "
            f"{cfg.min_audio_s:g} s), got {cfg.batch_max_pad}"
        )
    # The longest bin: max_audio_s in whole 20 ms frames (trainables/data/durations.py; the
    # config imports nothing of the data folder, which imports it).
    longest = -(-round(cfg.max_audio_s * 16_000) // 320) * 320 / 16_000
    if cfg.batch_audio_s < longest:
        got = "is not set" if cfg.batch_audio_s == 0 else f"{cfg.batch_audio_s:g} s is too small"
        raise ConfigError(
            f"batch_audio_s: {got}; batching duration fills each rank's micro-batch with up to "
            f"batch_audio_s seconds of padded audio, at least one utterance of max_audio_s "
            f"({longest:g} s): set batch_audio_s to e.g. micro_batch x the mean utterance "
            f"(256 x 2 s: 512)"
        )


def _check_placement(cfg) -> None:
    if not cfg.nodes:
        return
    if cfg.train_workers % cfg.nodes:
        raise ConfigError(
            f"nodes: {cfg.train_workers} train workers cannot be split evenly over "
            f"{cfg.nodes} nodes; set train_workers to a multiple of nodes"
        )
    if cfg.placement_strategy == "STRICT_SPREAD" and cfg.nodes != cfg.train_workers:
        raise ConfigError(
            f"nodes: STRICT_SPREAD puts each of the {cfg.train_workers} train workers on a "
            f"node of its own, so nodes must be {cfg.train_workers}; set nodes="
            f"{cfg.train_workers} or placement_strategy=PACK"
        )
    if cfg.placement_strategy == "STRICT_PACK" and cfg.nodes > 1:
        raise ConfigError(
            f"nodes: STRICT_PACK keeps every train worker on one node, not {cfg.nodes}; "
            "use placement_strategy=PACK"
        )


def _check_training(cfg) -> None:
    for name in ("val_every", "checkpoint_every"):
        every = getattr(cfg, name)
        if every and every % cfg.log_every:
            raise ConfigError(
                f"{name}: {every} is not a multiple of log_every {cfg.log_every} (both are "
                f"done at a window's report); set {name}="
                f"{max(1, round(every / cfg.log_every)) * cfg.log_every}"
            )
    if cfg.val_every and not (cfg.val_manifest_path or cfg.val_speakers):
        raise ConfigError(
            "val_every: validation needs a held-out split; set val_manifest_path=PATH.tsv "
            "or val_speakers=N (or val_every=0)"
        )
    if (cfg.val_manifest_path or cfg.val_speakers) and cfg.dataset != "manifest":
        raise ConfigError(
            "val_manifest_path/val_speakers: validation reads a manifest; set "
            "dataset=manifest (or drop them)"
        )
    if cfg.val_manifest_path and not cfg.val_manifest_path.endswith(".tsv"):
        raise ConfigError(
            f"val_manifest_path: {cfg.val_manifest_path} is not a data_prep manifest (.tsv)"
        )
    if cfg.warmup_steps >= cfg.max_steps and cfg.lr_schedule == "cosine":
        raise ConfigError(
            f"warmup_steps: {cfg.warmup_steps} leaves no step of the cosine schedule "
            f"(max_steps {cfg.max_steps}); lower warmup_steps"
        )
    if not 0 <= cfg.min_lr_ratio <= 1:
        raise ConfigError(f"min_lr_ratio: must be within 0-1, got {cfg.min_lr_ratio}")
    if cfg.dropout != "model" and not 0 <= cfg.dropout < 1:
        raise ConfigError(f"dropout: a rate in [0, 1) or model, got {cfg.dropout}")
    if cfg.grad_clip < 0:
        raise ConfigError(f"grad_clip: must be >= 0 (0: off), got {cfg.grad_clip}")
    if cfg.logit_scale_max < 1:
        raise ConfigError(f"logit_scale_max: must be >= 1, got {cfg.logit_scale_max}")
    if cfg.export_model == "best" and not (cfg.val_every and cfg.checkpoint_every):
        raise ConfigError(
            "export_model: best needs validation and checkpoints (val_every and "
            "checkpoint_every > 0); use export_model=final"
        )


def _check_load_dtype(cfg) -> None:
    load = cfg.model_load_dtype
    if load in ("auto", "fp32"):
        return
    if load == "fp16" and cfg.use_gpu is False:
        raise ConfigError("model_load_dtype: fp16 needs a GPU; on the CPU use fp32, bf16 or auto")
    if load == "fp16" and cfg.strategy in ("ddp", "fsdp2"):
        raise ConfigError(
            f"model_load_dtype: fp16 weights under {cfg.strategy} cannot be loss-scaled (the "
            "gradient scaler refuses fp16 gradients); use strategy deepspeed, or "
            "model_load_dtype auto/fp32"
        )
    if cfg.precision not in ("auto", load):
        raise ConfigError(
            f"model_load_dtype: {load} weights with precision {cfg.precision}; set "
            f"precision={load}, or model_load_dtype auto or fp32"
        )


# --- type matching (coerce_value) ---


def is_union(hint: Any) -> bool:
    """Whether a type hint is a union (``X | Y``)."""
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def match_type(value: Any, option: Any) -> tuple[bool, Any]:
    """Whether ``value`` is of type ``option``, and the value converted to it (int -> float)."""
    if typing.get_origin(option) is Literal:
        return (value in typing.get_args(option) and not isinstance(value, bool)), value
    if option is bool:
        return isinstance(value, bool), value
    if option is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if option is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, float(value)
        return False, value
    if option is str:
        return isinstance(value, str), value
    raise TypeError(f"unsupported config type {option!r}")


def describe_type(hint: Any) -> str:
    """A type hint in words, for error messages."""
    options = typing.get_args(hint) if is_union(hint) else (hint,)
    parts = []
    for option in options:
        if typing.get_origin(option) is Literal:
            parts.append("one of " + ", ".join(repr(v) for v in typing.get_args(option)))
        else:
            parts.append(getattr(option, "__name__", str(option)))
    return " or ".join(parts)


def needs_own_processes(cfg) -> str:
    """Why a run must train in processes of its own (``executor: fresh``), or '' when a resident
    worker group can run it."""
    if cfg.checkpoint_every:  # registered with its own Ray Train run (and restarted from them)
        return "it saves checkpoints through Ray Train (checkpoint_every)"
    if cfg.inject_leak_mb_per_step:
        return "it plants a host-memory leak (inject_leak_mb_per_step), which must be its own"
    if cfg.profile_steps:  # the profiler (CUPTI) may slow a process's later launches
        return "it runs the profiler (profile_steps), whose after-effects must not reach other runs"
    return ""


def _check_executor(cfg) -> None:
    why = needs_own_processes(cfg) if cfg.executor == "resident" else ""
    if why:
        raise ConfigError(
            f"executor: resident cannot run this run: {why}; set executor=fresh (or auto)"
        )
