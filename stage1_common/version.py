"""Which code wrote a file: the installed distribution's version and, in a git checkout, its
commit, as one line (``stage1-platform 0.1.0 (git 309623f1a2b3)``). The analysis records it in
summary.json and summary.md, the report on its page, the CLIs print it for ``--version``;
platform/record/provenance.py asks git through the same ``git`` helper for the run manifest's
git columns, so both name a commit by the same ``SHORT_HASH`` characters."""

from __future__ import annotations

import functools
import subprocess
from importlib import metadata
from pathlib import Path

__all__ = ["CHECKOUT", "DISTRIBUTION", "SHORT_HASH", "git", "version_line"]

DISTRIBUTION = "stage1-platform"  # pyproject.toml's [project] name
CHECKOUT = Path(__file__).resolve().parents[1]
SHORT_HASH = 12  # characters of a commit's short name, here and in the run manifest


@functools.cache
def version_line() -> str:
    """``stage1-platform 0.1.0 (git 309623f1a2b3)``; ``(git 309623f1a2b3, dirty)`` when tracked
    files differ from that commit; no bracket outside a git checkout (or without git). Asked
    once per process: the answer cannot change while it runs."""
    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        version = "(not installed)"
    # Only this package's own checkout counts: an installed copy under some other project's
    # repository (a venv inside it) has no commit of ours.
    answer = git("rev-parse", "--show-toplevel", f"--short={SHORT_HASH}", "HEAD") or ""
    top, _, commit = answer.partition("\n")
    if not commit or Path(top).resolve() != CHECKOUT:
        return f"{DISTRIBUTION} {version}"
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return f"{DISTRIBUTION} {version} (git {commit}{', dirty' if dirty else ''})"


def git(*args: str, checkout: Path = CHECKOUT) -> str | None:
    """git's answer (stdout, stripped) in ``checkout``; None when it is no git checkout, git is
    missing or the command fails ("" is a real answer: a clean ``git status``)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(checkout), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
