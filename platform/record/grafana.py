"""A Grafana dashboard for the platform's own gauges (``ray_stage1_*``, exported by
trainables/observe/telemetry.py: RayGauges through ``ray.util.metrics``): per-run samples/s, iter
p50 and data share, and GPU utilisation and power per rank.

A local cluster of a sweep or of ``platform.train`` writes it into the session's Grafana
provisioning folder (``<session>/metrics/grafana/dashboards/``, beside Ray's own dashboards), so
Grafana started with Ray's ``grafana.ini`` shows it in the folder "Ray" as "Stage-1 sweep" (or
"Stage-1 training", uid ``stage1-training``, for ``platform.train``); ``python -m
platform.grafana --out FILE`` (the command line, platform/grafana.py) writes it for any other
Grafana (import it, pick the Prometheus data source). See the README, "Dashboards".
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from platform.storage import results

__all__ = ["FILENAME", "UID", "board_json", "board_title", "dashboard", "gauges_in", "install"]

FILENAME = "stage1_grafana_dashboard.json"
UID = "stage1-sweep"
PREFIX = "ray_"  # Ray's Prometheus exporter prefixes every application metric

# (title, metric, legend, unit): one time-series panel each.
PANELS = (
    ("Samples/s per run", "stage1_samples_per_s", "{{run}}", "none"),
    ("Iteration time p50 per run", "stage1_iter_ms_p50", "{{run}}", "ms"),
    ("Data share of the iteration per run", "stage1_data_share", "{{run}}", "percentunit"),
    ("GPU utilisation per rank", "stage1_gpu_util_pct", "{{run}} rank {{rank}}", "percent"),
    ("GPU power per rank", "stage1_gpu_power_w", "{{run}} rank {{rank}}", "watt"),
)


def board_title(training: bool = False) -> str:
    """The board's name: what it watches, a sweep or a training run (platform.train)."""
    return f"Stage-1 {'training' if training else 'sweep'}"


def dashboard(training: bool = False) -> dict[str, Any]:
    """The dashboard JSON (Grafana's schema 39: time-series panels, a Prometheus data source
    variable and a run filter), named for a sweep or, with ``training``, a training run."""
    panels = []
    for i, (title, metric, legend, unit) in enumerate(PANELS):
        panels.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": title,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "table", "placement": "bottom"}},
                "targets": [
                    {
                        "refId": "A",
                        "datasource": {"type": "prometheus", "uid": "${datasource}"},
                        "expr": f'{PREFIX}{metric}{{run=~"$run"}}',
                        "legendFormat": legend,
                    }
                ],
            }
        )
    return {
        "uid": "stage1-training" if training else UID,
        "title": board_title(training),
        "description": "The platform's gauges (ray_stage1_*): one series per run (and rank).",
        "tags": ["ray", "stage1"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Data source",
                },
                {
                    "name": "run",
                    "type": "query",
                    "label": "Run",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": f"label_values({PREFIX}stage1_samples_per_s, run)",
                    "refresh": 2,
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "current": {"text": "All", "value": "$__all"},
                },
            ]
        },
        "panels": panels,
    }


def board_json(training: bool = False) -> str:
    """The dashboard as the file Grafana imports (indented JSON)."""
    return json.dumps(dashboard(training), indent=2) + "\n"


def gauges_in(board: dict[str, Any]) -> set[str]:
    """Every metric name the dashboard's queries read."""
    names = set()
    for panel in board["panels"]:
        for target in panel["targets"]:
            names |= set(re.findall(r"\b(ray_[a-z0-9_]+)\b", target["expr"]))
    return names


def install(session_dir: str | Path | None = None, *, training: bool = False) -> Path | None:
    """Write the dashboard (``training``: platform.train's) beside Ray's own in this Ray
    session's Grafana folder (the local cluster's); None when there is none (a cluster joined
    with --address keeps its own)."""
    if session_dir is None:
        try:
            from ray._private.worker import _global_node

            session_dir = _global_node.get_session_dir_path() if _global_node else None
        except (ImportError, AttributeError):
            session_dir = None
    if not session_dir:
        return None
    folder = Path(session_dir) / "metrics" / "grafana" / "dashboards"
    if not folder.is_dir():
        return None
    path = folder / FILENAME
    results.atomic_write_text(path, board_json(training))
    return path
