"""Starting (or joining) the Ray cluster of a sweep, with its dashboard and metrics endpoint."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import data_prep
import stage1_common
import trainables
from stage1_common.cluster import init_address, joining, runtime_env

# What a joined cluster's workers import: shipped with the job (runtime_env py_modules).
WORKER_PACKAGES = (trainables, data_prep, stage1_common)

__all__ = ["ClusterInfo", "LOOPBACK_HOSTS", "start_cluster"]

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ClusterInfo:
    dashboard_url: str | None
    metrics_url: str | None
    joined: bool = False  # an existing cluster (--address, RAY_ADDRESS, a Ray Job)


def start_cluster(
    *,
    address: str | None,
    dashboard_host: str,
    dashboard_port: int,
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
        kwargs.update(dashboard_host=dashboard_host, dashboard_port=dashboard_port)
        if metrics_port:
            kwargs["_metrics_export_port"] = metrics_port
    context = ray.init(
        address=init_address(address),
        logging_level="WARNING",
        runtime_env=runtime_env(env_vars, ship_code=joined, modules=WORKER_PACKAGES),
        **kwargs,
    )
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
