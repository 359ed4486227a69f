"""The machine's cache folder: compiled code (inductor's FX-graph and AOTAutograd caches,
Triton's kernels) and FLOPs counts per model shape, kept per machine rather than per output
root, so a sweep, its race, a rerun in a new root and ``platform.train`` with the winner reuse
what was compiled on that machine.

Where it is, first that applies: the ``compile_cache_dir`` key, the ``STAGE1_CACHE_DIR``
environment variable (the driver passes its own to the workers of its job), the user's cache
folder (``$XDG_CACHE_HOME/stage1``, else ``~/.cache/stage1``), resolved on each node.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CACHE_ENV", "machine_cache"]

CACHE_ENV = "STAGE1_CACHE_DIR"


def machine_cache(configured: str = "") -> Path:
    """This node's cache folder (not created here); ``configured``: the compile_cache_dir key."""
    chosen = configured or os.environ.get(CACHE_ENV, "")
    if chosen:
        return Path(chosen).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "stage1"
