"""Whether the runs fit the cluster: ``use_gpu: auto`` decided from its GPUs, every trial's CPUs
and GPUs within its totals, and placements that span nodes given enough nodes that can each
hold their share, so that no trial waits forever for resources that do not exist."""

from __future__ import annotations

import dataclasses

from platform.errors import UsageError
from platform.spaces.expand import RunSpec
from trainables.config.checks import needs_own_processes

__all__ = ["resolve_executors", "resolve_resources"]


def resolve_resources(
    runs: list[RunSpec],
    cluster: dict[str, float],
    nodes: list[dict[str, float]] | None = None,
    *,
    where: str = "the cluster",
) -> list[RunSpec]:
    """Decide ``use_gpu: auto`` and check that every trial fits the cluster (``cluster``: its
    totals; ``nodes``: each alive node's resources), so that no trial waits forever for
    resources that do not exist, or for nodes a placement strategy needs. The launch asks it of
    the cluster it started or joined; before that (and in the dry run), execution/inputs.py asks
    it of what a local cluster would have (``where``: "this machine")."""
    cpus, gpus = cluster.get("CPU", 0.0), cluster.get("GPU", 0.0)
    out = []
    for run in runs:
        cfg = run.config
        use_gpu = cfg.use_gpu if cfg.use_gpu != "auto" else gpus >= cfg.train_workers
        if cfg.precision == "fp16" and not use_gpu:
            raise UsageError(
                f"run {run.name}: precision fp16 needs GPUs, the run has none; use fp32, bf16 or auto"
            )
        need_cpu = cfg.train_workers * cfg.cpus_per_train_worker
        need_gpu = cfg.train_workers if use_gpu else 0
        if need_gpu > gpus and cfg.use_gpu is True:
            raise UsageError(
                f"use_gpu true: run {run.name} needs {need_gpu} GPU(s), {where} has "
                f"{gpus:g}; set use_gpu=auto (GPUs where there are enough) or use_gpu=false, or "
                "lower train_workers"
            )
        if need_cpu > cpus or need_gpu > gpus:
            raise UsageError(
                f"run {run.name} needs {need_cpu} CPUs and {need_gpu} GPUs "
                f"({cfg.train_workers} train workers x {cfg.cpus_per_train_worker} CPUs), "
                f"{where} has {cpus:g} CPUs and {gpus:g} GPUs; lower train_workers, num_workers "
                "or cpus_per_worker"
            )
        if nodes is not None:
            _check_placement(run, cfg, bool(use_gpu), nodes, where)
        out.append(dataclasses.replace(run, config=dataclasses.replace(cfg, use_gpu=use_gpu)))
    return out


def _check_placement(
    run: RunSpec, cfg, use_gpu: bool, nodes: list[dict[str, float]], where: str
) -> None:
    """A placement that spans nodes (``nodes`` > 0, STRICT_SPREAD, STRICT_PACK) needs enough
    nodes that can each hold their share of the workers."""
    per_node = cfg.workers_per_node
    want = cfg.train_workers // per_node
    if cfg.placement_strategy == "STRICT_PACK":
        per_node, want = cfg.train_workers, 1
    elif not cfg.nodes and cfg.placement_strategy != "STRICT_SPREAD":
        return
    cpu, gpu = per_node * cfg.cpus_per_train_worker, (per_node if use_gpu else 0)
    able = sum(1 for n in nodes if n.get("CPU", 0.0) >= cpu and n.get("GPU", 0.0) >= gpu)
    if able < want:
        how = (
            f"placement_strategy {cfg.placement_strategy}"
            if not cfg.nodes
            else f"nodes {cfg.nodes}, placement_strategy {cfg.placement_strategy}"
        )
        raise UsageError(
            f"run {run.name} places {cfg.train_workers} train workers on {want} nodes of "
            f"{per_node} each ({how}), which needs {want} nodes with {cpu} CPUs and {gpu} GPUs "
            f"free; {where} has {able} such node(s) of {len(nodes)}; add nodes, or lower "
            "train_workers, or use placement_strategy PACK"
        )


def resolve_executors(runs: list[RunSpec], *, training: bool) -> list[RunSpec]:
    """Decide ``executor: auto``: a sweep's run trains in the resident group of its shape, unless
    it needs processes of its own (trainables/config/checks.py: needs_own_processes);
    platform.train's run always has its own (one TorchTrainer with restarts from its
    checkpoints)."""
    out = []
    for run in runs:
        executor = run.config.executor
        if training and executor == "resident":
            raise UsageError(
                f"run {run.name}: executor resident is for sweeps; platform.train trains in "
                "processes of its own, drop executor=resident"
            )
        if executor == "auto":
            executor = "fresh" if training or needs_own_processes(run.config) else "resident"
        config = dataclasses.replace(run.config, executor=executor)
        out.append(dataclasses.replace(run, config=config))
    return out
