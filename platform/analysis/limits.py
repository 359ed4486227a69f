"""The limits a check judged by, written as the command-line flags that set them.

``python -m platform.stability`` and ``python -m platform.leak`` end their output with one line
``limits: --flag value ...``; a log of either kept in an output root (stability.log, leak.log)
therefore states what it judged by, and the report judges the folder by the same limits. The
flags are the checks' own (each limits dataclass field is the flag of the same name), so the line
can be pasted back onto the command.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from platform.errors import UsageError

__all__ = ["PREFIX", "flags_line", "logged_limits"]

PREFIX = "limits: "
L = TypeVar("L")


def flags_line(limits: Any) -> str:
    """``limits: --min-repeats 3 --max-iter-p50-cv 0.05`` for a limits dataclass."""
    flags = [f"--{f.name.replace('_', '-')} {getattr(limits, f.name):g}" for f in fields(limits)]
    return PREFIX + " ".join(flags)


def logged_limits(cls: type[L], log: Path) -> L | None:
    """The limits the log at ``log`` states (its ``limits:`` line), as ``cls``; None when there
    is no such file or line, or the line does not read as ``cls``'s flags (a log written before
    the checks stated their limits, or edited by hand)."""
    if not log.is_file():
        return None
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith(PREFIX)]
    if not lines:
        return None
    words = lines[-1][len(PREFIX) :].split()
    kinds = {f.name: f.type for f in fields(cls)}
    values: dict[str, Any] = {}
    try:
        for flag, text in zip(words[::2], words[1::2], strict=True):
            name = flag.removeprefix("--").replace("-", "_")
            values[name] = int(text) if kinds[name] in (int, "int") else float(text)
        return cls(**values)
    except (KeyError, ValueError, TypeError, UsageError):
        return None
