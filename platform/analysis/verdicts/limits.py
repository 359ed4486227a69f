"""The limits a check judged by, written as the command-line flags that set them.

``python -m platform.stability`` and ``python -m platform.leak`` end their output with one line
``limits: --flag value ...``; a log of either kept in an output root (stability.log, leak.log)
therefore states what it judged by, and the report judges the folder by the same limits. The
flags are the checks' own (each limits dataclass field is the flag of the same name), so the line
can be pasted back onto the command. Each value is written so that it reads back equal
(``flag_text``): a limit the report reads from a log is the limit the check used.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from platform.errors import UsageError

__all__ = [
    "PREFIX",
    "UnreadableLimits",
    "flag_text",
    "flags_line",
    "folder_limits",
    "logged_limits",
]

PREFIX = "limits: "
L = TypeVar("L")


class UnreadableLimits(ValueError):
    """A log's ``limits:`` line that does not read as the check's flags; the message says
    why."""


def flag_text(value: int | float) -> str:
    """``value`` as a flag's argument that reads back equal: ``3``, ``50`` for 50.0 (a whole
    float below 1e15, as argparse's float() reads it back), else Python's shortest exact
    form (``0.05``, ``1.0000001``, ``1e+20``). Never ``:g``, which keeps 6 digits and writes
    1000000 as ``1e+06`` (not an int)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def flags_line(limits: Any) -> str:
    """``limits: --min-repeats 3 --max-iter-p50-cv 0.05`` for a limits dataclass."""
    flags = [
        f"--{f.name.replace('_', '-')} {flag_text(getattr(limits, f.name))}" for f in fields(limits)
    ]
    return PREFIX + " ".join(flags)


def logged_limits(cls: type[L], log: Path) -> L | None:
    """The limits the log at ``log`` states (its last ``limits:`` line), as ``cls``; None when
    there is no such file or line (a log written before the checks stated their limits).
    UnreadableLimits when the line does not read as ``cls``'s flags (edited by hand, or a
    flag of another version)."""
    if not log.is_file():
        return None
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith(PREFIX)]
    if not lines:
        return None
    words = lines[-1][len(PREFIX) :].split()
    kinds = {f.name: f.type for f in fields(cls)}
    if len(words) % 2:
        raise UnreadableLimits(f"{lines[-1]!r}: a flag without its value")
    values: dict[str, Any] = {}
    for flag, text in zip(words[::2], words[1::2], strict=True):
        name = flag.removeprefix("--").replace("-", "_")
        if name not in kinds:
            raise UnreadableLimits(f"{lines[-1]!r}: {flag} is not one of the check's flags")
        try:
            values[name] = int(text) if kinds[name] in (int, "int") else float(text)
        except ValueError:
            raise UnreadableLimits(f"{lines[-1]!r}: {flag} {text} is not a number") from None
    try:
        return cls(**values)
    except UsageError as exc:
        raise UnreadableLimits(f"{lines[-1]!r}: {exc}") from None


def folder_limits(cls: type[L], log: Path, command: str) -> tuple[L, str]:
    """The limits to judge a folder by, and where they come from, in words the page shows:
    those its log at ``log`` states (so the report agrees with the folder's own check), else
    ``cls``'s defaults, saying why where the folder has the log (``command``: the check's
    command, e.g. ``python -m platform.stability``)."""
    defaults = f"the defaults of {command}"
    try:
        logged = logged_limits(cls, log)
    except UnreadableLimits as exc:
        return cls(), (
            f"{defaults}, not this folder's {log.name}: its limits line cannot be read ({exc}), "
            "so the log may have judged by other limits"
        )
    if logged is not None:
        return logged, f"the limits of this folder's {log.name}"
    if log.is_file():
        return cls(), (
            f"{defaults} (this folder's {log.name} states no limits: written before the checks "
            "printed them)"
        )
    return cls(), defaults
