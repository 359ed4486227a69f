"""What ties a sweep's numbers to the code: the git commit, branch and dirtiness of the checkout
the driver runs from (empty when it is not a git checkout or git is missing). git is asked
through stage1_common/version.py's helper, and the short commit has its length, so the run
manifest and ``--version`` name a commit alike."""

from __future__ import annotations

from pathlib import Path

from stage1_common.version import CHECKOUT, SHORT_HASH, git

__all__ = ["GIT_KEYS", "git_facts"]

GIT_KEYS = ("git_commit_hash", "git_commit_short", "git_branch", "git_dirty")


def git_facts(repo: Path = CHECKOUT) -> dict[str, str | bool | None]:
    commit = git("rev-parse", "HEAD", checkout=repo)
    if commit is None:
        return dict.fromkeys(GIT_KEYS)
    status = git("status", "--porcelain", "--untracked-files=no", checkout=repo)
    return {
        "git_commit_hash": commit,
        "git_commit_short": commit[:SHORT_HASH],
        "git_branch": git("rev-parse", "--abbrev-ref", "HEAD", checkout=repo),
        "git_dirty": bool(status),
    }
