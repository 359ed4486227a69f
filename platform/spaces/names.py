"""Names of groups and runs: ``sweep_z0_mb8_nw0_pf2`` plus a short token for every other swept
key, and the ``key=value`` text that names a grid point in error messages."""

from __future__ import annotations

import re
from typing import Any

from trainables.config import TrialConfig

__all__ = ["fmt_point", "group_name"]

# Short name tokens of swept keys. The first four always appear (the runbooks' names); the rest
# appear only when swept.
_ALWAYS = (
    ("zero_stage", "z"),
    ("micro_batch", "mb"),
    ("num_workers", "nw"),
    ("prefetch_factor", "pf"),
)
_TOKENS = {
    "strategy": "",
    "bucket_mb": "bk",
    "train_workers": "w",
    "model_size": "",
    "audio_s": "a",
    "run_timeout_s": "rt",
    "stall_timeout_s": "stall",
    "inject_sleep_at_step": "sleep",
    "inject_sleep_s": "slp",
    "inject_sleep_every": "every",
    "inject_error_at_step": "err",
    "crop_buckets_s": "cb",
    "compile_mode": "cm",
    "compile_scope": "cs",
    "optimizer": "opt",
    "ddp_gradient_as_bucket_view": "gbv",
    "fsdp_reshard_after_forward": "reshard",
    "dropout": "do",
    "batching": "",
    "batch_audio_s": "ba",
    "batch_max_pad": "pad",
}


def group_name(prefix: str, cfg: TrialConfig, swept: list[str]) -> str:
    """``sweep_z0_mb8_nw0_pf2`` plus a token for every other swept key."""
    tokens = [prefix]
    if "strategy" in swept:
        tokens.append({"ddp": "ddp", "fsdp2": "fsdp2", "deepspeed": "ds"}[cfg.strategy])
    tokens += [f"{short}{_fmt(getattr(cfg, key))}" for key, short in _ALWAYS]
    for key in swept:
        if key == "strategy" or key in dict(_ALWAYS):
            continue
        short = _TOKENS.get(key, key.replace("_", ""))
        tokens.append(f"{short}{_fmt(getattr(cfg, key))}")
    return "_".join(tokens)


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value == "":
        return "off"
    if isinstance(value, str) and "," in value:  # a comma list (crop_buckets_s): 1x1p5x2
        return "x".join(_fmt(float(v)) if _is_number(v) else _fmt(v) for v in value.split(","))
    if isinstance(value, float):
        value = f"{value:g}".replace(".", "p").replace("-", "m")
    return re.sub(r"[^A-Za-z0-9]+", "", str(value))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def fmt_point(point: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items())
