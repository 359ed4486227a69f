"""Working on a cluster that other machines belong to: shipping the worker-side packages with
the job, and running one small task on every node (to check what each node sees before any
real work is spread over them). Shared by data_prep's CLI, the platform's driver and the workers;
it imports none of them, so callers name the packages to ship."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "SHIP_EXCLUDES",
    "alive_nodes",
    "first_line",
    "init_address",
    "joining",
    "local_auth_mode",
    "local_cpus",
    "local_gpus",
    "node_label",
    "on_every_node",
    "pin_ray_address",
    "pinned",
    "probe_file",
    "read_token",
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


def pin_ray_address() -> Callable[[], None]:
    """The workers' ``worker_process_setup_hook``: sets ``RAY_ADDRESS`` to the worker's own
    cluster before the worker takes any work. Ray's state API, which Ray Train's
    placement-group cleaner calls from its worker, otherwise looks for "the" cluster of the
    machine: with another Ray cluster running there (shared GPU hosts often have one) it fails
    with "Found multiple active Ray instances", and the cleaner stops watching the controller;
    or it finds the other cluster's address.

    A function made here, so Ray ships its code with the job (pickled by value): the hook runs
    before a worker has the driver's ``sys.path``, where a module path (this module's) may not
    import (a GPU host with the project not installed)."""

    def hook() -> None:
        import os

        import ray

        if not os.environ.get("RAY_ADDRESS"):
            os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address

    return hook


def local_auth_mode(address: str | None) -> None:
    """Before ``ray.init`` of a new local cluster: token authentication, what Ray picks for one
    by default (it makes a token when there is none), named explicitly, so that Ray does not
    warn "Token authentication is enabled for this Ray cluster" at every start. A user's own
    ``RAY_AUTH_MODE`` wins; joining a cluster leaves it to that cluster. Only before Ray is
    imported: it reads the mode once, and a driver that disagreed with its cluster's GCS on it
    could not connect."""
    import sys

    if not joining(address) and "ray" not in sys.modules:
        os.environ.setdefault("RAY_AUTH_MODE", "token")


def runtime_env(
    env_vars: dict[str, str] | None = None, *, ship_code: bool, modules: tuple = ()
) -> dict:
    """A job's runtime_env: ``env_vars`` for every process and, when ``ship_code``, the
    worker-side packages the caller names (``modules``, this package among them) shipped with the job,
    so a node that has only the dependencies installed runs this checkout's code. A driver
    submitted as a Ray Job (``ray job submit --working-dir .``) already ships them with its
    working_dir; Ray merges the two runtime_envs and refuses overlapping keys, so those are
    left to the job's."""
    env: dict = {"env_vars": dict(env_vars or {}), "worker_process_setup_hook": pin_ray_address()}
    if ship_code:
        if not modules:
            raise ValueError("runtime_env(ship_code=True) needs the packages to ship")
        env.update(py_modules=list(modules), excludes=list(SHIP_EXCLUDES))
    job = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}").get("runtime_env") or {}
    if set(job) & {"py_modules", "working_dir", "excludes"}:
        env.pop("py_modules", None)
        env.pop("excludes", None)
    if "worker_process_setup_hook" in job:
        env.pop("worker_process_setup_hook")
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


def pinned(fn: Callable[..., Any], node_id: str):
    """``fn`` as a Ray task that runs on node ``node_id`` only, reserves no CPU and is not
    retried (what a check or a log read on one node needs)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return ray.remote(fn).options(
        num_cpus=0,
        max_retries=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    )


def on_every_node(
    fn: Callable[..., Any], *args: Any, timeout_s: float = 180.0
) -> list[tuple[dict[str, Any], Any]]:
    """Run ``fn(*args)`` once on every alive node (a task pinned there, no CPU reserved);
    returns (node, result) pairs where a failed or silent node's result is the exception
    (``TimeoutError`` when it did not answer within ``timeout_s``)."""
    import ray

    nodes = alive_nodes()
    refs = [pinned(fn, n["NodeID"]).remote(*args) for n in nodes]
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


@contextmanager
def probe_file(folder: Path | str) -> Iterator[tuple[str, str]]:
    """A file holding a fresh token, written into ``folder`` (atomically; a folder or an
    object-storage prefix: stage1_common/storage.py) for the block and removed after it: (its
    address, the token). A node that reads the token back (``read_token``) sees the driver's
    ``folder``, not a folder of its own at the same path (or reaches the bucket with its own
    credentials)."""
    from stage1_common.storage import Location

    token = secrets.token_hex(16)
    probe = Location.of(folder).join(f".node-probe-{token[:8]}")
    probe.write_text(token)
    try:
        yield probe.uri, token
    finally:
        probe.delete_file()


def read_token(path: str, token: str) -> str:
    """On a node: '' when ``path`` (a file or an object's address) holds ``token``; else what
    is wrong, in a few words."""
    from stage1_common.storage import Location, unreadable

    where = Location.of(path)
    try:
        text = where.read_text()
    except Exception as exc:  # a missing file, or the store's: no credentials, no endpoint, ...
        return f"cannot read {path} ({unreadable(where, exc)})"
    if text == token:
        return ""
    return f"{path} holds another sweep's token (what the node sees there is not the driver's)"


def _now() -> float:
    import time

    return time.monotonic()


def first_line(exc: BaseException) -> str:
    """The last non-empty line of an exception's text (a remote traceback ends with it)."""
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else type(exc).__name__


def local_cpus() -> int:
    """The CPUs a local Ray cluster started here gets, as Ray counts them (Ray 2.60,
    ``ray._private.utils.get_num_cpus``; read here without importing Ray): a container's limit
    where it sets one (its cgroup's CPU quota, under cgroup v1 also its cpuset: the smaller),
    else os.cpu_count(); RAY_USE_MULTIPROCESSING_CPU_COUNT keeps os.cpu_count(), and
    RAY_OVERRIDE_RESOURCES' ``CPU`` wins over all. tests/test_cluster_units.py holds it against
    Ray's own count."""
    told = _overridden("CPU")
    if told is not None:
        return told
    count = os.cpu_count() or 1
    if os.environ.get("RAY_USE_MULTIPROCESSING_CPU_COUNT"):
        return count
    limit = cgroup_cpus()
    return int(limit) if limit is not None else count


def cgroup_cpus(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU limit of this process's container, None when there is none, read as Ray reads
    it (``_get_docker_cpus``): the quota over the period (cgroup v1's cpu.cfs_quota_us and
    cpu.cfs_period_us, else v2's cpu.max; at least 1) and cgroup v1's cpuset.cpus."""
    quota = None
    try:
        v1 = root / "cpu" / "cpu.cfs_quota_us", root / "cpu" / "cpu.cfs_period_us"
        if v1[0].exists() and v1[1].exists():
            quota = float(v1[0].read_text()) / float(v1[1].read_text())
        elif (root / "cpu.max").exists():
            limit, period = (root / "cpu.max").read_text().split()
            quota = (
                float(limit) / float(period) if limit.isnumeric() and period.isnumeric() else None
            )
    except (OSError, ValueError):
        quota = None
    if quota is not None and quota < 0:
        quota = None
    elif quota == 0:
        quota = 1  # a limit below one CPU still runs on one
    cpuset = None
    try:
        cpuset = 0
        for part in (root / "cpuset" / "cpuset.cpus").read_text().split(","):  # 0-3,8
            start, _, end = part.partition("-")
            cpuset += int(end or start) - int(start) + 1
    except (OSError, ValueError):
        cpuset = None
    if quota and cpuset:
        return min(quota, cpuset)
    return quota or cpuset


def _overridden(resource: str) -> int | None:
    """The count of ``resource`` RAY_OVERRIDE_RESOURCES gives a node Ray starts here (a JSON
    mapping such as ``{"CPU": 32}``; Ray reads it before counting), None when it gives none."""
    text = os.environ.get("RAY_OVERRIDE_RESOURCES")
    if not text:
        return None
    try:
        value = json.loads(text).get(resource)
    except (ValueError, AttributeError):
        return None  # Ray refuses to start on it, naming it
    return None if value is None else int(value)


def local_gpus() -> int:
    """The GPUs a local Ray cluster started here gets, as Ray counts them: RAY_OVERRIDE_RESOURCES'
    ``GPU``, else the entries of CUDA_VISIBLE_DEVICES when it is set, else NVML's count, else 0
    (no driver, no GPU)."""
    told = _overridden("GPU")
    if told is not None:
        return told
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and not d.strip().startswith("-")])
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML library, no driver: no GPU Ray could use
        return 0
