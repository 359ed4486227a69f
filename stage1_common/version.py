"""Which code wrote a file: the installed distribution's version and, in a git checkout, its
commit, as one line (``stage1-platform 0.1.0 (git 309623f)``). The analysis records it in
summary.json and summary.md, the report on its page, the CLIs print it for ``--version``."""

from __future__ import annotations

import functools
import subprocess
from importlib import metadata
from pathlib import Path

__all__ = ["DISTRIBUTION", "version_line"]

DISTRIBUTION = "stage1-platform"  # pyproject.toml's [project] name
_CHECKOUT = Path(__file__).resolve().parents[1]


@functools.cache
def version_line() -> str:
    """``stage1-platform 0.1.0 (git 309623f)``; ``(git 309623f, dirty)`` when tracked files
    differ from that commit; no bracket outside a git checkout (or without git). Asked once per
    process: the answer cannot change while it runs."""
    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        version = "(not installed)"
    # Only this package's own checkout counts: an installed copy under some other project's
    # repository (a venv inside it) has no commit of ours.
    top, _, commit = _git("rev-parse", "--show-toplevel", "--short", "HEAD").partition("\n")
    if not commit or Path(top).resolve() != _CHECKOUT:
        return f"{DISTRIBUTION} {version}"
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return f"{DISTRIBUTION} {version} (git {commit}{', dirty' if dirty else ''})"


def _git(*args: str) -> str:
    """git's answer in this package's checkout; "" when it is none or git is missing."""
    try:
        done = subprocess.run(
            ["git", "-C", str(_CHECKOUT), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""
