"""Durations as people write and read them: ``90s``, ``4m``, ``1h30m`` (``--budget``, the budget's
plans and its line in the summary)."""

from __future__ import annotations

import re

__all__ = ["parse_duration", "shown"]

_PART = r"(\d+(?:\.\d+)?)\s*([hms]?)"


def parse_duration(text: str) -> float:
    """Seconds of ``90s``, ``4m``, ``1h30m``, ``1.5h`` or ``600`` (seconds)."""
    value = str(text).strip().lower()
    parts = re.findall(_PART, value)
    bare = [n for n, unit in parts if not unit]
    if not value or not parts or re.sub(_PART, "", value).strip() or (bare and len(parts) > 1):
        raise ValueError(f"{text!r} is not a duration; write it as 90s, 4m, 1h30m or 1.5h")
    units = [u for _, u in parts]
    if len(set(units)) < len(units):  # 1m1m
        raise ValueError(f"{text!r} is not a duration; write it as 90s, 4m, 1h30m or 1.5h")
    seconds = sum(float(n) * {"h": 3600, "m": 60, "s": 1, "": 1}[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"{text!r} is no time at all; give a budget such as 10m")
    return seconds


def shown(seconds: float) -> str:
    """``3m52s``: a duration as the plan and the report say it."""
    seconds = int(round(seconds))
    m, s = divmod(seconds, 60)
    h, m = divmod(m, 60)
    return (f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s").replace("m00s", "m")
