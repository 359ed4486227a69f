"""Starting (or joining) the Ray cluster of a sweep, with its dashboard and metrics endpoint,
and the environment every process of the sweep's Ray job gets."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

import data_prep
import stage1_common
import trainables
from stage1_common.cluster import init_address, joining, runtime_env
from stage1_common.machine_cache import CACHE_ENV

# What a joined cluster's workers import: shipped with the job (runtime_env py_modules).
WORKER_PACKAGES = (trainables, data_prep, stage1_common)

__all__ = [
    "DEFAULT_DASHBOARD_PORT",
    "ClusterInfo",
    "dashboard_port_problem",
    "FORWARDED_ENV_PREFIXES",
    "LOOPBACK_HOSTS",
    "start_cluster",
    "train_env_vars",
]

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
DEFAULT_DASHBOARD_PORT = 8265  # Ray's


def _port_free(host: str, port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def dashboard_port_problem(host: str, port: int | None) -> str:
    """Why a local cluster's dashboard cannot listen on ``port`` asked for by name ('' when it
    can, or when no port was asked for: then a taken default moves, see _dashboard_port)."""
    if port is None or port == 0 or _port_free(host, port):
        return ""
    return (
        f"--dashboard-port {port} is in use on {host} (another Ray cluster?); choose a free "
        "port, or leave --dashboard-port out (a free one is then taken)"
    )


def _dashboard_port(host: str, port: int | None) -> int:
    """The port asked for, else Ray's default where it is free, else any free port: another
    Ray cluster on a shared machine holds 8265 often, and Ray then ran without a dashboard."""
    if port is not None:
        return port
    if _port_free(host, DEFAULT_DASHBOARD_PORT):
        return DEFAULT_DASHBOARD_PORT
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


@dataclass(frozen=True)
class ClusterInfo:
    dashboard_url: str | None
    metrics_url: str | None
    joined: bool = False  # an existing cluster (--address, RAY_ADDRESS, a Ray Job)


def start_cluster(
    *,
    address: str | None,
    dashboard_host: str,
    dashboard_port: int | None,
    metrics_port: int | None,
    env_vars: dict[str, str],
) -> ClusterInfo:
    """``ray.init`` a local cluster with the dashboard on ``dashboard_host`` (loopback unless the
    user asks otherwise) and the Prometheus endpoint on ``metrics_port``, or join ``address``.
    Raises ConnectionError when ``address`` cannot be reached."""
    import ray

    kwargs: dict[str, Any] = {}
    joined = joining(address)
    if not joined:
        if dashboard_host not in LOOPBACK_HOSTS:
            print(
                f"warning: the Ray dashboard listens on {dashboard_host}: anyone who can reach "
                "that address can see and control this cluster (jobs, logs, actors)",
                file=sys.stderr,
                flush=True,
            )
        # include_dashboard stays None: Ray starts the dashboard when its packages are there
        # (ray[default]) and goes on without it otherwise (minimal Ray on some GPU images).
        kwargs.update(
            dashboard_host=dashboard_host,
            dashboard_port=_dashboard_port(dashboard_host, dashboard_port),
        )
        if metrics_port:
            kwargs["_metrics_export_port"] = metrics_port
    context = ray.init(
        address=init_address(address),
        logging_level="WARNING",
        # What the workers print stays in their log files (runs/<run>/workers/ says where; a
        # failed run's and a restart's tails are saved in its folder): on the console, Ray's
        # tracebacks of a restart or DCP's per-save lines buried the driver's own lines.
        # RAY_LOG_TO_DRIVER=1 brings them back.
        log_to_driver=os.environ.get("RAY_LOG_TO_DRIVER", "0") == "1",
        runtime_env=runtime_env(env_vars, ship_code=joined, modules=WORKER_PACKAGES),
        **kwargs,
    )
    _start_train_coordinator()
    dashboard = getattr(context, "dashboard_url", None) or None
    if dashboard and not dashboard.startswith("http"):
        dashboard = f"http://{dashboard}"
    node = next((n for n in ray.nodes() if n.get("Alive")), {})
    port = node.get("MetricsExportPort")
    ip = node.get("NodeManagerAddress", "127.0.0.1")
    return ClusterInfo(
        dashboard_url=dashboard,
        metrics_url=f"http://{ip}:{port}/metrics" if port and port > 0 else None,
        joined=joined,
    )


def _start_train_coordinator() -> None:
    """Start Ray's AutoscalingCoordinator actor now, without waiting for it. Ray Train V2's
    controller registers every worker group's resources with it at the group's start and waits
    up to 5 s for the answer (ray.train.v2 scaling_policy: after_controller_start); the first
    group of a sweep otherwise creates it, and on a 2x H100 host that wait timed out, 5 s of the
    first run's start-up and a traceback on the console. Private API: without it, Train makes
    it as before."""
    try:
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            get_or_create_autoscaling_coordinator,
        )
    except ImportError:
        return
    get_or_create_autoscaling_coordinator()


# Communication settings a user exported for the driver must reach every worker, also on a
# cluster joined with --address (whose processes did not inherit this shell's environment).
# The driver's NCCL/NVSHMEM/gloo settings, and its machine cache folder (compiled code, FLOPs;
# stage1_common/machine_cache.py), reach every process of the job, on every node.
FORWARDED_ENV_PREFIXES = ("NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM_", "GLOO_", CACHE_ENV)


def train_env_vars(environ: dict[str, str] | None = None, *, local: bool = False) -> dict[str, str]:
    """Environment of every process of the sweep's Ray job.

    A Ray Train V2 worker's result queue holds one report, and the controller drains it only on
    its health-check poll (2 s by default): a window shorter than that would block in
    ``ray.train.report``. A shorter poll keeps short windows honest; users can still set it.

    On a ``local`` cluster (one machine, started by this driver: no autoscaler and no other
    node) nothing can drain a node, so Ray Train's preemption watcher, one more process per
    worker group that polls Ray's drain state and prints an ERROR line on the console at each
    start (ray-project/ray#53727), is off. A joined cluster keeps Ray's default; a user's own
    ``RAY_TRAIN_ENABLE_PREEMPTION_WATCHER`` always wins.
    """
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}
    env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = environ.get(
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25"
    )
    watcher = environ.get("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0" if local else None)
    if watcher is not None:
        env["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] = watcher
    return env
