"""The machine's cache folder: compiled code (inductor's FX-graph and AOTAutograd caches,
Triton's kernels) and FLOPs counts per model shape, kept per machine rather than per output
root, so a sweep, its race, a rerun in a new root and ``platform.train`` with the winner reuse
what was compiled on that machine; and the machine's calibration (``calibration.json``: the
platform against its references, written by ``python -m platform.calibrate``).

It also keeps Python's bytecode where the environment says not to write it beside the sources
and the packages a worker imports ship none (``bytecode_env``).

Where it is, first that applies: the ``compile_cache_dir`` key, the ``STAGE1_CACHE_DIR``
environment variable (the driver passes its own to the workers of its job), the user's cache
folder (``$XDG_CACHE_HOME/stage1``, else ``~/.cache/stage1``), resolved on each node.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = [
    "BYTECODE_PACKAGES",
    "CACHE_ENV",
    "bytecode_env",
    "configured_cache",
    "keep_bytecode",
    "machine_cache",
]

CACHE_ENV = "STAGE1_CACHE_DIR"
# What every train worker imports (and Ray's other processes: ray): the packages whose
# bytecode, or its absence, decides a worker's start-up.
BYTECODE_PACKAGES = ("torch", "ray", "transformers")


def machine_cache(configured: str = "") -> Path:
    """This node's cache folder (not created here); ``configured``: the compile_cache_dir key."""
    chosen = configured or os.environ.get(CACHE_ENV, "")
    if chosen:
        return Path(chosen).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "stage1"


def configured_cache(configs: Iterable) -> str:
    """The first ``compile_cache_dir`` set by one of ``configs`` (objects with that field, as a
    sweep's run configs), else '': the machine cache a sweep's runs use, for the driver."""
    return next((c.compile_cache_dir for c in configs if c.compile_cache_dir), "")


def bytecode_env(
    environ: Mapping[str, str] | None = None, packages: tuple[str, ...] = BYTECODE_PACKAGES
) -> dict[str, str]:
    """The environment that lets a process and those it starts keep Python's bytecode in the
    machine cache (``pycache/``, Python's ``PYTHONPYCACHEPREFIX``), or {} when there is nothing
    to fix. The folder is the machine cache of ``environ`` (``STAGE1_CACHE_DIR``, else the
    user's cache folder: the driver's, before any run's ``compile_cache_dir`` is known).

    Container images often set ``PYTHONDONTWRITEBYTECODE`` and install packages without
    bytecode: then every process compiles every module it imports from source, every time (on
    a 2x H100 host whose torch and Ray shipped no .pyc: import torch 5.3-6.7 s instead of
    3.1-3.3 s, the model code 17.5-18.0 s instead of 11.4-12.4 s, in each of a sweep's
    processes). Where that setting is on and one of ``packages`` has no bytecode beside its
    source, the processes write theirs to the machine cache, once per machine, and read it
    from there after: nothing is written beside the sources, which is what the setting
    protects. A user's own ``PYTHONPYCACHEPREFIX`` wins. (With a prefix Python reads no
    ``__pycache__`` beside a source at all: the machine's first processes compile what they
    import once, into the prefix.)"""
    environ = os.environ if environ is None else environ
    if not environ.get("PYTHONDONTWRITEBYTECODE") or environ.get("PYTHONPYCACHEPREFIX"):
        return {}
    if all(_has_bytecode(name) for name in packages):
        return {}
    folder = machine_cache(environ.get(CACHE_ENV, "")) / "pycache"
    return {"PYTHONPYCACHEPREFIX": str(folder), "PYTHONDONTWRITEBYTECODE": ""}


def keep_bytecode(env: Mapping[str, str]) -> None:
    """Apply ``bytecode_env``'s answer to this process (its later imports read and write the
    bytecode there) and to the processes it starts (they inherit the environment: a local Ray
    cluster's). Nothing when ``env`` is empty."""
    import sys

    if not env:
        return
    os.environ.update(env)
    sys.pycache_prefix = env["PYTHONPYCACHEPREFIX"]
    sys.dont_write_bytecode = False


def _has_bytecode(package: str) -> bool:
    """Whether ``package`` (found, not imported) has bytecode beside its ``__init__`` for this
    interpreter; True for one that is not installed or not a source package."""
    spec = importlib.util.find_spec(package)
    origin = spec.origin if spec is not None else None
    if not origin or not origin.endswith(".py"):
        return True
    try:
        return Path(importlib.util.cache_from_source(origin)).exists()
    except NotImplementedError:  # an interpreter without a cache tag
        return True
