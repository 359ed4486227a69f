"""Working on a cluster that other machines belong to: shipping the worker-side packages with
the job, and running one small task on every node (to check what each node sees before any
real work is spread over them). Shared by data_prep's CLI and the platform's driver (which
cannot be imported by data_prep)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

__all__ = [
    "SHIP_EXCLUDES",
    "alive_nodes",
    "first_line",
    "init_address",
    "joining",
    "node_label",
    "on_every_node",
    "runtime_env",
]

# Not shipped with the workload's packages.
SHIP_EXCLUDES = ["__pycache__", "*.pyc", "*.egg-info"]


def joining(address: str | None) -> bool:
    """Whether ``ray.init`` joins an existing cluster: ``--address``, or ``RAY_ADDRESS`` (set by
    the user, or by Ray for a driver submitted as a Ray Job)."""
    return address is not None or bool(os.environ.get("RAY_ADDRESS"))


def init_address(address: str | None) -> str | None:
    """What to pass to ``ray.init``: the cluster to join, or ``"local"`` for a new local cluster.
    A bare ``ray.init()`` would join a cluster that ``ray start`` left on this machine (found
    in /tmp/ray/ray_current_cluster), without the code shipping or node checks of a join, and
    hangs for minutes when that cluster is gone; "no --address" means a local cluster."""
    return address if joining(address) else "local"


def runtime_env(
    env_vars: dict[str, str] | None = None, *, ship_code: bool, modules: tuple = ()
) -> dict:
    """A job's runtime_env: ``env_vars`` for every process and, when ``ship_code``, the
    worker-side packages (``modules``; default trainables/ and data_prep/) shipped with the job,
    so a node that has only the dependencies installed runs this checkout's code. A driver
    submitted as a Ray Job (``ray job submit --working-dir .``) already ships them with its
    working_dir; Ray merges the two runtime_envs and refuses overlapping keys, so those are
    left to the job's."""
    env: dict = {"env_vars": dict(env_vars or {})}
    if ship_code:
        if not modules:
            import data_prep
            import trainables

            modules = (trainables, data_prep)
        env.update(py_modules=list(modules), excludes=list(SHIP_EXCLUDES))
    job = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}").get("runtime_env") or {}
    if set(job) & {"py_modules", "working_dir", "excludes"}:
        env.pop("py_modules", None)
        env.pop("excludes", None)
    for name in job.get("env_vars") or {}:
        env["env_vars"].pop(name, None)
    if not env["env_vars"]:
        env.pop("env_vars")
    return env


def alive_nodes() -> list[dict[str, Any]]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def node_label(node: dict[str, Any]) -> str:
    """How a node is named in messages: its IP and the start of its Ray node id (raylets of
    one machine share a hostname)."""
    return f"{node.get('NodeManagerAddress', '?')} (node {str(node.get('NodeID', ''))[:12]})"


def on_every_node(
    fn: Callable[..., Any], *args: Any, timeout_s: float = 180.0
) -> list[tuple[dict[str, Any], Any]]:
    """Run ``fn(*args)`` once on every alive node (a task pinned there, no CPU reserved);
    returns (node, result) pairs where a failed or silent node's result is the exception
    (``TimeoutError`` when it did not answer within ``timeout_s``)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = alive_nodes()
    task = ray.remote(fn)
    refs = [
        task.options(
            num_cpus=0,
            max_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
        ).remote(*args)
        for n in nodes
    ]
    deadline = _now() + timeout_s
    out = []
    for node, ref in zip(nodes, refs, strict=True):
        try:
            out.append((node, ray.get(ref, timeout=max(0.0, deadline - _now()))))
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            out.append((node, TimeoutError(f"no answer within {timeout_s:g} s")))
        except ray.exceptions.RayTaskError as exc:
            out.append((node, exc.cause if exc.cause is not None else exc))
        except ray.exceptions.RayError as exc:
            out.append((node, exc))
    return out


def _now() -> float:
    import time

    return time.monotonic()


def first_line(exc: BaseException) -> str:
    """The last non-empty line of an exception's text (a remote traceback ends with it)."""
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else type(exc).__name__
