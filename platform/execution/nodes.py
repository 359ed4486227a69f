"""Checks of every node of a cluster before the first trial: one small task per node
(trainables/node_check.py) reports its versions, where it imports the workload from, whether it
sees the output root, and whether it reads the runs' manifests and a sample of their audio.
Whatever a node cannot do is one line naming the node and the fix (exit 2), before any trial.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from platform.errors import UsageError
from platform.storage.mirror import unreachable_line
from stage1_common.cluster import first_line, node_label, on_every_node, probe_file
from stage1_common.output_root import OutputRoot

__all__ = ["check_nodes", "node_problem"]


def check_nodes(
    root: OutputRoot | None = None,
    manifests: list[tuple[str, str]] | None = None,
    *,
    timeout_s: float = 180.0,
) -> list[dict[str, Any]]:
    """Run the node check on every alive node; raise UsageError for the first problem. With
    ``root``, each node must see a file the driver writes there (in its bucket for a root on
    object storage: ``root.shown``); ``manifests``: (manifest_path, audio_root) pairs every node
    must read. Returns each node's facts."""
    from trainables.node_check import audio_sample, node_facts, versions

    samples = [(m, audio_sample(Path(m), audio)) for m, audio in manifests or ()]
    with contextlib.ExitStack() as stack:
        probe, token = stack.enter_context(probe_file(root.shown)) if root else (None, None)
        answers = on_every_node(node_facts, probe, token, samples, timeout_s=timeout_s)
    mine = versions()
    for node, fact in answers:
        problem = node_problem(node, fact, mine, root)
        if problem:
            raise UsageError(problem)
    return [fact for _, fact in answers]


def node_problem(
    node: dict[str, Any],
    fact: Any,
    mine: dict[str, str],
    root: OutputRoot | None = None,
) -> str | None:
    """What one node's answer to the node check says is wrong (one line with the fix), or
    None. ``fact`` is ``node_facts``' dict, or the exception the task ended with."""
    where = node_label(node)
    if isinstance(fact, TimeoutError):
        return (
            f"node {where} did not run the node check ({fact}); check that the node is "
            "healthy (ray status) and can reach the head"
        )
    if isinstance(fact, BaseException):
        return (
            f"node {where} cannot run the workload's code: {first_line(fact)}; the driver "
            "ships trainables/, data_prep/ and stage1_common/ with the job (runtime_env "
            "py_modules): install the project's dependencies (pip install -e .) on every node"
        )
    differ = [
        f"{k} {fact['versions'].get(k)} (driver {v})"
        for k, v in mine.items()
        if fact["versions"].get(k) != v
    ]
    if differ:
        return (
            f"node {where} runs {', '.join(differ)}; install the driver's versions on every "
            "node (one image for the cluster), or run the driver on the head node"
        )
    if fact.get("output_root") and root is not None:
        return f"node {where} {unreachable_line(root, fact['output_root'])}"
    for manifest, problem in fact.get("manifests", {}).items():
        if problem:
            return (
                f"node {where} cannot read the data of {manifest}: {problem}; put the corpus "
                "on storage every node mounts (or copy it to the same path on each node)"
            )
    return None
