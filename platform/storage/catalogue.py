"""The catalogue: every sweep and training a machine ran, one row per run, kept across output roots.

One store per machine, ``catalogue/`` in the machine cache (stage1_common/machine_cache.py), and
a copy of each sweep's rows in its output root (``catalogue.parquet``: on a cluster the root is a
shared folder or a bucket, so the cluster's sweeps are there too). The store is a Parquet
dataset, one file per sweep written whole (a temporary name, then a rename): two sweeps ending
at once write two files and lose no row, any reader sees whole files only, and the same files
work in a folder, on NFS or copied to a bucket, which a single SQLite file does not (its locks
are not safe on network filesystems) and DuckDB would only add a dependency to read Parquet
that pyarrow reads already. A row holds the host's fingerprint (GPU model and count, driver,
CUDA, torch, Ray, DeepSpeed and the platform's version), the space, the run's config (whole, as
JSON, and its cost key), its status and failure reason, its tail figures, its windows'
samples/s (rank 0, in order: a race's prior and a comparison's noise band,
platform/analysis/priors.py and history.py), its group's place in the sweep's own ranking, the platform's
git commit that ran it and its corpus (``manifest_path``), and its start-up
(and whether the run started a worker group) and compile costs: what a ``--budget`` plans with
on the host (platform/control/costs.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import uuid
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from stage1_common.fileio import atomic_path
from stage1_common.machine_cache import machine_cache
from stage1_common.output_root import OutputRoot

if TYPE_CHECKING:
    from trainables.config import TrialConfig

__all__ = [
    "CATALOGUE",
    "cost_key",
    "FINGERPRINT_KEYS",
    "SCHEMA",
    "append",
    "fingerprint",
    "host_now",
    "read",
    "store",
]

CATALOGUE = "catalogue"  # the machine's folder in its cache; catalogue.parquet in a root
FINGERPRINT_KEYS = ("gpu", "gpus", "driver", "cuda", "torch", "ray", "deepspeed", "platform")
_TEXT = ("sweep", "kind", "output_root", "space", "host", "run", "group", "status",
         "failure_reason", "cost_key", "config", *FINGERPRINT_KEYS[:1], *FINGERPRINT_KEYS[2:])  # fmt: skip
_NUMBERS = ("tail_samples_per_sec_mean", "tail_mean_iter_p50_ms", "iter_p90_over_p50",
            "startup_s", "compile_s", "compile_in_windows_s", "tail_windows", "micro_batch",
            "ts")  # fmt: skip
SCHEMA = pa.schema(
    [(k, pa.string()) for k in _TEXT]
    + [("repeat", pa.int64()), ("gpus", pa.int64()), ("starts_group", pa.bool_())]
    + [(k, pa.float64()) for k in _NUMBERS]
    # The group's place in the sweep's own ranking (1: its best), and the run's windows.
    + [("group_rank", pa.int64()), ("window_samples_per_s", pa.list_(pa.float64()))]
    # The platform's git commit that ran it (the fingerprint's ``platform`` is the package
    # version, the same across commits) and its corpus (cost_key leaves paths out): what a
    # race's prior must share with the sweep to be pooled (platform/analysis/priors.py).
    + [("git_commit", pa.string()), ("manifest_path", pa.string())]
)


# Keys that do not change how fast a step runs or how long a run takes to start.
_NOT_COST = {"max_steps", "log_every", "tail_timing_points", "run_timeout_s", "seed", "epochs"}


def cost_key(cfg: TrialConfig) -> str:
    """The configuration's fingerprint for the costs it has on a machine."""
    values = {
        k: v
        for k, v in cfg.to_dict().items()
        if k not in _NOT_COST and not k.endswith(("_path", "_dir"))
    }
    return hashlib.sha1(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]


def fingerprint(host: Mapping[str, Any]) -> str:
    """The host's fingerprint: a hash of ``FINGERPRINT_KEYS`` (a new torch is a new host)."""
    values = [str(host.get(k) or "") for k in FINGERPRINT_KEYS]
    return hashlib.sha1("|".join(values).encode()).hexdigest()[:12]


def host_of_env(env: Mapping[str, Any]) -> dict[str, Any]:
    """A run's host from its env.json (its rank 0's view of the machine)."""
    gpus = env.get("gpus") or []
    return {
        "gpu": gpus[0] if gpus else "cpu",
        "gpus": len(gpus),
        "driver": env.get("driver") or "",
        "cuda": env.get("cuda") or "",
        "torch": env.get("torch") or "",
        "ray": env.get("ray") or "",
        "deepspeed": env.get("deepspeed") or "",
        "platform": _platform_version(),
    }


def host_now() -> dict[str, Any]:
    """This machine as a sweep about to start sees it (NVML and the installed versions, no
    torch import): the same fields, so the same machine gives the same fingerprint."""
    gpus, driver = _nvml()
    torch_version = _version("torch")
    return {
        "gpu": gpus[0] if gpus else "cpu",
        "gpus": len(gpus),
        "driver": driver,
        "cuda": _torch_cuda(),
        "torch": torch_version,
        "ray": _version("ray"),
        "deepspeed": _version("deepspeed"),
        "platform": _platform_version(),
    }


def store(configured: str = "") -> Path:
    """The machine's catalogue folder."""
    return machine_cache(configured) / CATALOGUE


def append(rows: list[dict[str, Any]], folder: Path, name: str | None = None) -> Path | None:
    """Write ``rows`` as one new file of the dataset in ``folder`` (whole, under a name no other
    writer takes); None for no rows."""
    if not rows:
        return None
    table = pa.Table.from_pylist([_typed(r) for r in rows], schema=SCHEMA)
    folder.mkdir(parents=True, exist_ok=True)
    name = name or f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path = folder / f"{name}.parquet"
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return path


def read(*places: Path) -> pa.Table:
    """Every row of the catalogues at ``places`` (folders of the dataset, or one root's
    catalogue.parquet), oldest first; a run found twice (the machine's and its root's copy, or
    a resumed sweep's earlier attempt) once, as last written."""
    tables = []
    for place in places:
        files = sorted(place.glob("*.parquet")) if place.is_dir() else [place]
        for path in files:
            try:
                tables.append(ds.dataset(str(path), schema=SCHEMA, format="parquet").to_table())
            except (OSError, pa.ArrowException) as exc:  # a file no sweep of ours wrote whole
                print(f"catalogue: {path} skipped ({type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:120]})", file=sys.stderr)  # fmt: skip
    if not tables:
        return SCHEMA.empty_table()
    table = pa.concat_tables(tables)
    df = table.to_pandas().sort_values("ts", kind="stable")  # a run's newest row wins
    df = df.drop_duplicates(subset=["sweep", "run"], keep="last")
    return pa.Table.from_pandas(df, schema=SCHEMA, preserve_index=False)


def rows_of(
    root: OutputRoot, manifest: list[dict[str, Any]], configs: Mapping[str, Any], *,
    kind: str, space: str, ranks: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """One row per run of a finished sweep or training: its manifest row (status, reason, tail
    figures, costs), its config (``configs``: run -> TrialConfig), its host (env.json; a run
    that never started has none: the sweep's first host), its windows (timing.parquet, rank 0)
    and its group's rank in the sweep (``ranks``: group -> rank, as the analysis ranks them)."""
    from trainables.resident.shape import starts_group

    windows = _windows(root)

    here = host_now()
    hosts = {}
    up: set = set()  # a resident run of a shape already up reuses its group
    starts: dict[str, bool] = {}
    for row in manifest:
        cfg = configs.get(row["run"])
        if cfg is not None and row.get("startup_s") not in (None, ""):
            starts[row["run"]] = starts_group(cfg, up)
        env = _read_json(root.run_folder(row["run"]).env)
        if env.get("torch"):
            seen = host_of_env(env)
            # The machine the driver runs on, as a later sweep here names it (host_now), unless
            # the runs' GPUs were on other nodes (a CPU-only driver of a GPU cluster).
            hosts[row["run"]] = seen if seen["gpu"] != "cpu" and here["gpu"] == "cpu" else here
    first = next(iter(hosts.values()), here)
    # One id per output root: a resumed sweep's rows replace its earlier attempt's.
    sweep = (
        f"{Path(root.shown.split('?')[0]).name}-{hashlib.sha1(root.shown.encode()).hexdigest()[:6]}"
    )
    out = []
    for row in manifest:
        cfg = configs.get(row["run"])
        if cfg is None:
            continue
        host = hosts.get(row["run"], first)
        out.append(
            {
                "sweep": sweep,
                "kind": kind,
                "output_root": root.shown,
                "space": space,
                "host": fingerprint(host),
                **host,
                "run": row["run"],
                "group": row.get("group"),
                "repeat": row.get("repeat"),
                "status": row.get("status"),
                "failure_reason": row.get("failure_reason") or "",
                "cost_key": cost_key(cfg),
                "config": json.dumps(cfg.to_dict(), sort_keys=True, default=str),
                "micro_batch": cfg.micro_batch,
                "tail_samples_per_sec_mean": row.get("tail_samples_per_sec_mean"),
                "tail_mean_iter_p50_ms": row.get("tail_mean_iter_p50_ms"),
                "iter_p90_over_p50": row.get("iter_p90_over_p50"),
                "tail_windows": row.get("tail_windows"),
                "startup_s": row.get("startup_s"),
                "starts_group": starts.get(row["run"]),
                "compile_s": row.get("compile_s"),
                "compile_in_windows_s": row.get("compile_in_windows_s"),
                "ts": time.time(),
                "group_rank": (ranks or {}).get(row.get("group")),
                "window_samples_per_s": windows.get(row["run"]),
                "git_commit": row.get("git_commit_hash") or "",
                "manifest_path": str(cfg.manifest_path or ""),
            }
        )
    return out


def _windows(root: OutputRoot) -> dict[str, list[float]]:
    """Run -> its windows' samples/s (rank 0, in order: a resumed training run's attempts one
    after another), from the root's timing.parquet (none when it cannot be read)."""
    from platform.storage import results

    try:
        timing = results.read_dataset(root.timing, results.TIMING_SCHEMA)
    except (OSError, ValueError, pa.ArrowException):
        return {}
    if timing.empty:
        return {}
    order = ["run", "attempt", "window"]
    rank0 = timing[timing["rank"] == 0].sort_values(order, kind="stable")
    rank0 = rank0.drop_duplicates(subset=order, keep="last")
    return {str(run): [float(x) for x in df["samples_per_s"]] for run, df in rank0.groupby("run")}


def _typed(row: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for f in SCHEMA:
        value = row.get(f.name)
        if pa.types.is_list(f.type):
            out[f.name] = None if value is None else [float(x) for x in value]
        elif pa.types.is_string(f.type):
            out[f.name] = None if value is None else str(value)
        elif pa.types.is_boolean(f.type):
            out[f.name] = None if value is None else bool(value)
        else:
            try:
                number = float(value)
            except (TypeError, ValueError):
                number = None
            if number is not None and number != number:  # NaN
                number = None
            out[f.name] = (int(number) if pa.types.is_integer(f.type) and number is not None
                           else number)  # fmt: skip
    return out


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""


def _platform_version() -> str:
    return _version("stage1-platform") or "0"


def _torch_cuda() -> str:
    """``torch.version.cuda`` of the installed torch, read from its version.py (no torch import:
    2-3 s on the driver), as a run's env.json records it; '' for a CPU build."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return ""
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except OSError:
        return ""
    found = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return found.group(1) if found else ""


def _nvml() -> tuple[list[str], str]:
    """The GPUs' names and the driver's version (none without NVML or a GPU)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML library, no GPU: a CPU host
        return [], ""
    try:
        names = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            names.append(name.decode() if isinstance(name, bytes) else name)
        driver = pynvml.nvmlSystemGetDriverVersion()
        return names, driver.decode() if isinstance(driver, bytes) else driver
    finally:
        pynvml.nvmlShutdown()
