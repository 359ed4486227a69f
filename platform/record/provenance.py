"""What ties a sweep's numbers to the code: the git commit, branch and dirtiness of the checkout
the driver runs from (empty when it is not a git checkout or git is missing)."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["GIT_KEYS", "git_facts"]

GIT_KEYS = ("git_commit_hash", "git_commit_short", "git_branch", "git_dirty")
REPO = Path(__file__).resolve().parents[2]


def _git(*args: str, repo: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_facts(repo: Path = REPO) -> dict[str, str | bool | None]:
    commit = _git("rev-parse", "HEAD", repo=repo)
    if commit is None:
        return dict.fromkeys(GIT_KEYS)
    status = _git("status", "--porcelain", "--untracked-files=no", repo=repo)
    return {
        "git_commit_hash": commit,
        "git_commit_short": commit[:12],
        "git_branch": _git("rev-parse", "--abbrev-ref", "HEAD", repo=repo),
        "git_dirty": bool(status),
    }
