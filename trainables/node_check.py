"""What one node of a cluster can do, checked by a small task on that node before the first trial
(the driver: platform/execution/nodes.py): its versions, where it imports the workload from, whether it
sees the output root, and whether it can read a manifest and a sample of its audio files.

It lives here, not in ``platform``, because it runs in a Ray worker on every node.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from stage1_common.cluster import read_token

__all__ = ["audio_sample", "node_facts", "versions"]


def versions() -> dict[str, str]:
    """The versions a driver and its nodes must agree on."""
    import ray
    import torch

    return {
        "python": ".".join(map(str, sys.version_info[:3])),
        "ray": ray.__version__,
        "torch": torch.__version__.split("+")[0],
    }


def node_facts(
    probe: str | None = None,
    token: str | None = None,
    manifests: list[tuple[str, list[str]]] | None = None,
) -> dict[str, Any]:
    """Facts of the node this task runs on. ``probe``/``token``: a file the driver wrote under
    the output root and its content (the node sees the same storage when it reads the token
    back). ``manifests``: (manifest_path, audio files) pairs to read (``audio_sample``)."""
    import ray

    facts: dict[str, Any] = {
        "node_id": ray.get_runtime_context().get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "versions": versions(),
        "code_path": str(Path(__file__).resolve().parent),
    }
    if probe is not None:
        facts["output_root"] = read_token(probe, token or "")
    facts["manifests"] = {
        path: _read_manifest(Path(path), audio) for path, audio in manifests or ()
    }
    return facts


def _read_manifest(path: Path, audio: list[str]) -> str:
    """'' when the manifest and the ``audio`` files can be read here."""
    from trainables.data.manifest_table import read_manifest_table

    try:
        read_manifest_table(path)
    except (OSError, ValueError) as exc:
        return f"cannot read manifest {path} ({getattr(exc, 'strerror', None) or exc})"
    for name in audio:
        try:
            with open(name, "rb") as fh:
                fh.read(64)
        except OSError as exc:
            return f"cannot read audio file {name} ({exc.strerror or exc})"
    return ""


def audio_sample(manifest: Path, audio_root: str, sample: int = 8) -> list[str]:
    """Up to ``sample`` audio files of a manifest, spread over it, that can be read here (the
    driver picks them; every node must then read the same ones)."""
    from trainables.data.manifest_table import read_manifest_table

    table = read_manifest_table(manifest)
    if not table.num_rows or "path" not in table.column_names:
        return []
    root = Path(audio_root) if audio_root else Path(manifest).parent
    paths = table.column("path").to_pylist()
    rows = len(paths)
    picks = sorted({round(i * (rows - 1) / max(sample - 1, 1)) for i in range(min(sample, rows))})
    return [str(root / paths[i]) for i in picks if os.access(root / paths[i], os.R_OK)]
