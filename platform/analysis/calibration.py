"""The instrument's own overhead: the platform against its references at one point on this
machine (``python -m platform.calibrate``), kept in the machine cache beside the compiled code
and shown in every sweep's summary and report.

A calibration is one ``benchmarks/reference_compare.py`` result: for each comparison (ddp,
fsdp2, zero1, zero2, and the compiled ddp_compiled, fsdp2_compiled, ddp_cudagraphs,
fsdp2_cudagraphs), the median over its pairs of turns of the platform's tail samples/s over
its bare reference's (benchmarks/strategy_reference.py under torchrun or DeepSpeed's
launcher), with the lowest and highest. 1.0: the platform adds nothing to what the libraries
cost on their own.

``<machine cache>/calibration.json`` holds one entry per host: the GPU's name and the processes
(the references' world size; ``cpu`` for a CPU run) and torch's version. Storing one replaces
the host's older entry and keeps the other hosts'. A sweep finds its host from its runs
(runs/<run>/env.json's first GPU and torch, the manifest's train_workers) and shows, for each
strategy it ranked, that host's ratio, or says there is none and how to measure it. The cache
is the sweep's own ``compile_cache_dir`` where its runs set one, else this machine's
(stage1_common/machine_cache.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from platform.analysis import stats
from platform.errors import UsageError
from platform.storage import results
from stage1_common.machine_cache import machine_cache
from stage1_common.output_root import OutputRoot

__all__ = [
    "CALIBRATION",
    "REFERENCES",
    "comparison_of",
    "entry_of",
    "for_sweep",
    "host_name",
    "read_entries",
    "store",
    "utc_time",
]

CALIBRATION = "calibration.json"
# Each comparison of benchmarks/reference_compare.py (its CASES) and the reference it holds
# the platform against; tests/test_calibration.py keeps the two lists the same.
REFERENCES = {
    "ddp": "a bare torchrun DDP",
    "fsdp2": "a bare torchrun FSDP2",
    "zero1": "a bare DeepSpeed ZeRO-1",
    "zero2": "a bare DeepSpeed ZeRO-2",
    "ddp_compiled": "a bare torchrun DDP compiled layer by layer",
    "fsdp2_compiled": "a bare torchrun FSDP2 compiled layer by layer",
    "ddp_cudagraphs": "a bare torchrun DDP with CUDA graphs (reduce-overhead)",
    "fsdp2_cudagraphs": "a bare torchrun FSDP2 with CUDA graphs (reduce-overhead)",
}
COMMAND = "python -m platform.calibrate"


def comparison_of(row: Mapping[str, Any]) -> str | None:
    """The comparison a run's config (a manifest row) is measured by: its strategy, ZeRO stage,
    torch_compile and compile_mode; None where no reference exists (ZeRO-3, compiled ZeRO,
    another compile mode)."""
    strategy, zero = _text(row.get("strategy")), int(stats.finite(row.get("zero_stage")) or 0)
    if strategy == "auto":  # as TrialConfig resolves it
        strategy = "ddp" if zero == 0 else "deepspeed"
    compiled = _text(row.get("torch_compile")).lower() in ("true", "1", "yes")
    if strategy == "deepspeed":
        return f"zero{zero}" if zero in (1, 2) and not compiled else None
    if strategy not in ("ddp", "fsdp2"):
        return None
    if not compiled:
        return strategy
    modes = {"default": "compiled", "reduce-overhead": "cudagraphs"}
    mode = modes.get(_text(row.get("compile_mode")) or "default")
    return f"{strategy}_{mode}" if mode else None


def host_name(host: Mapping[str, Any]) -> str:
    """``2x NVIDIA H200, torch 2.11.0+cu130``."""
    return f"{host['count']}x {host['device']}, torch {host['torch']}"


# --- storing: a reference_compare.json into the machine cache


def entry_of(record: Mapping[str, Any], *, measured: str, source: str) -> dict[str, Any]:
    """The calibration of one reference_compare.json (``record``; an older one without pairs
    counts as one pair): its host, each comparison's median ratio, lowest, highest and pairs.
    ``measured``: when, where the record does not say. UsageError when it measured nothing."""
    rows = record.get("rows")
    if not isinstance(rows, list) or not rows:
        raise UsageError(f"{source} holds no rows; give a reference_compare.json that measured")
    ref = next((r for r in _references(record) if r.get("device") and r.get("torch")), None)
    if ref is None:
        raise UsageError(f"{source}: no reference result names its device and torch")
    comparisons = {}
    for row in rows:
        ratio = stats.finite(row.get("platform_over_reference"))
        if ratio is not None and row.get("strategy"):
            comparisons[str(row["strategy"])] = {
                "reference": row.get("reference") or row["strategy"],
                "ratio": ratio,
                "low": stats.finite(row.get("ratio_low")) or ratio,
                "high": stats.finite(row.get("ratio_high")) or ratio,
                "pairs": int(row.get("pairs") or 1),
            }
    if not comparisons:
        raise UsageError(f"{source}: no comparison has a ratio (every side failed)")
    count = ref.get("world_size") or 1
    return {
        "host": {"device": ref["device"], "count": int(count), "torch": str(ref["torch"])},
        "measured": record.get("measured") or measured,
        "stored": utc_time(),
        "commit": record.get("commit"),
        "dirty": record.get("dirty"),
        "command": record.get("command"),
        "pairs": max(c["pairs"] for c in comparisons.values()),
        "source": source,
        "comparisons": comparisons,
    }


def store(cache: Path, entry: dict[str, Any]) -> tuple[Path, dict[str, Any] | None]:
    """Add ``entry`` to ``<cache>/calibration.json`` (written atomically) in place of its host's
    older entry, keeping the other hosts'; returns the file and the entry replaced. UsageError,
    writing nothing, when the host's stored entry was measured later."""
    path = Path(cache) / CALIBRATION
    entries = read_entries(path)
    older = next((e for e in entries if e.get("host") == entry["host"]), None)
    if older and str(older.get("measured") or "") > str(entry["measured"]):
        raise UsageError(
            f"{path} holds a later calibration of {host_name(entry['host'])} (measured "
            f"{older['measured']}, this one {entry['measured']}); remove its entry there to "
            "store an older one"
        )
    kept = [e for e in entries if e is not older]
    results.write_json(path, {"entries": [*kept, entry]})
    return path, older


def read_entries(path: Path) -> list[dict[str, Any]]:
    """The stored calibrations ([] when there is no file); UsageError for a file that is not
    one (left as it is)."""
    if not Path(path).is_file():
        return []
    found = results.read_json(path).get("entries")
    if not isinstance(found, list):
        raise UsageError(f"{path} is not a calibration file (no entries); move it away")
    return found


# --- reading: the calibration of a sweep's host


def for_sweep(
    root: OutputRoot, manifest: pd.DataFrame, groups: list[str] | None = None
) -> dict[str, Any]:
    """The calibration of the sweep's host(s) for the strategies of ``groups`` (default: every
    group of ``manifest``): ``cache`` (the file read), ``hosts`` (each host's name, stored
    entry or None, and its strategies' comparisons and stored figures), ``lines`` (one per
    strategy, or one saying there is none and the command) and ``line`` (the console's)."""
    rows = _ranked_rows(manifest, groups)
    cache = machine_cache(_configured_cache(rows)) / CALIBRATION
    try:
        entries = read_entries(cache)
    except UsageError as exc:
        return {
            "cache": str(cache),
            "hosts": [],
            "lines": [str(exc)],
            "line": f"calibration: {exc}",
        }
    hosts: dict[str, dict[str, Any]] = {}
    for row in rows:
        host = _host(results.read_json(root.run_folder(str(row["run"])).env), row)
        if host is None:
            continue
        name = host_name(host)
        found = hosts.setdefault(name, {"host": host, "strategies": {}, "no_reference": []})
        comparison = comparison_of(row)
        if comparison is None:
            found["no_reference"].append(_described(row))
        else:
            found["strategies"].setdefault(comparison, None)
    for found in hosts.values():
        entry = next((e for e in entries if e.get("host") == found["host"]), None)
        found["entry"] = {k: v for k, v in entry.items() if k != "comparisons"} if entry else None
        stored = (entry or {}).get("comparisons") or {}
        found["strategies"] = {s: stored.get(s) for s in found["strategies"]}
        found["no_reference"] = sorted(set(found["no_reference"]))
    return {"cache": str(cache), "hosts": list(hosts.values()), **_lines(hosts, cache)}


def _ranked_rows(manifest: pd.DataFrame, groups: list[str] | None) -> list[dict[str, Any]]:
    """The manifest rows of the ranked groups in their order, ok runs first in each (their
    env.json is written)."""
    if manifest.empty or "run" not in manifest:
        return []
    rows = manifest.to_dict("records")
    order = {g: i for i, g in enumerate(groups if groups is not None else [])}
    if groups is not None:
        rows = [r for r in rows if r.get("group") in order]
    return sorted(rows, key=lambda r: (order.get(r.get("group"), 0), r.get("status") != "ok"))


def _configured_cache(rows: list[dict[str, Any]]) -> str:
    """The runs' compile_cache_dir where one set it (their machine cache), else ''."""
    return next(filter(None, (_text(r.get("compile_cache_dir")) for r in rows)), "")


def _host(env: Mapping[str, Any], row: Mapping[str, Any]) -> dict[str, Any] | None:
    """A run's host as a calibration names it: its first GPU (``cpu`` without one), its
    processes (train_workers, as the references' world size) and torch; None without env.json."""
    if not env.get("torch"):
        return None
    gpus = env.get("gpus") or []
    count = stats.finite(row.get("train_workers")) or len(gpus) or 1
    return {"device": gpus[0] if gpus else "cpu", "count": int(count), "torch": str(env["torch"])}


def _lines(hosts: dict[str, dict[str, Any]], cache: Path) -> dict[str, Any]:
    if not hosts:
        why = "no run here recorded its host (runs/<run>/env.json)"
        return {"lines": [f"no calibration looked up: {why}"], "line": f"calibration: {why}"}
    lines, said = [], []
    for name, found in hosts.items():
        strategies, entry = found["strategies"], found["entry"]
        command = _command(found, cache)
        for s, figures in strategies.items():
            if entry and figures:
                lines.append(f"{s}: {_ratio_line(s, figures, entry)}")
            elif entry:
                lines.append(f"{s}: not in the calibration of {name}; measure it: {command}")
        lines += [f"{d}: no reference to calibrate it against" for d in found["no_reference"]]
        measured = [s for s, figures in strategies.items() if entry and figures]
        if not strategies:
            said.append(f"no ranked strategy of {name} has a reference")
        elif not entry:
            lines.append(f"no calibration for {name} on this machine: run {command}")
            said.append(f"none for {name} on this machine: run {command}")
        else:
            ratios = ", ".join(f"{s} {strategies[s]['ratio']:.3f}" for s in measured)
            said.append(
                f"{len(measured)} of the {len(strategies)} ranked strategies measured against "
                f"their references on {name} ({ratios or '-'}; {_date(entry)})"
                + (f"; the others: {command}" if len(measured) < len(strategies) else "")
            )
    return {"lines": lines, "line": "calibration: " + "; ".join(said)}


def _ratio_line(strategy: str, figures: Mapping[str, Any], entry: Mapping[str, Any]) -> str:
    """``platform at 0.960 of a bare torchrun DDP on this host (2 pairs, 0.911-1.009),
    measured 2026-11-28, git 4499f17a1b2c``."""
    pairs = int(figures.get("pairs") or 1)
    spread = f", {figures['low']:.3f}-{figures['high']:.3f}" if pairs > 1 else ""
    reference = REFERENCES.get(strategy) or f"its reference ({figures.get('reference')})"
    commit = f"git {entry['commit']}" if entry.get("commit") else "commit not recorded"
    dirty = " (dirty)" if entry.get("dirty") else ""
    return (
        f"platform at {figures['ratio']:.3f} of {reference} on this host ({pairs} "
        f"pair{'' if pairs == 1 else 's'}{spread}), {_date(entry)}, {commit}{dirty}"
    )


def _command(found: Mapping[str, Any], cache: Path) -> str:
    """The command that measures the host's strategies (all of them: a new calibration
    replaces the host's stored one)."""
    names = ",".join(found["strategies"]) or "ddp"
    command = f"{COMMAND} --strategies {names} --nproc {found['host']['count']}"
    if cache.parent != machine_cache(""):
        command += f" --compile-cache-dir {cache.parent}"
    return command


def _described(row: Mapping[str, Any]) -> str:
    keys = ("strategy", "zero_stage", "torch_compile", "compile_mode")
    return " ".join(f"{k}={_text(row.get(k))}" for k in keys if _text(row.get(k)))


def _date(entry: Mapping[str, Any]) -> str:
    return f"measured {str(entry.get('measured') or 'at an unknown date')[:10]}"


def _references(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every reference result of the record: each turn's (``turns``), or an older record's
    one set (``references``)."""
    found = [ref for turn in record.get("turns") or [] for ref in (turn[0] or {}).values()]
    found += list((record.get("references") or {}).values())
    return [r for r in found if isinstance(r, Mapping)]


def utc_time(seconds: float | None = None) -> str:
    """``2026-11-28T13:00:30Z``: a time as calibration.json keeps it (now by default)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def _text(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value).strip()
