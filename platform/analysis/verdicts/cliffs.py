"""A run's performance cliffs: what torch's compiler did during its timed steps (each window's
``recompiles``, ``graph_breaks``, ``cudagraph_records``, ``cudagraph_skips`` and
``cliff_reason``, counted on the workers by trainables/engine/compile_watch.py), judged into
the run's ``cliff`` verdict with torch's own words and what to change. The run manifest,
per_run_metrics.csv, the console's end-of-run line, summary.md/json and the report all take
it from here.

A run is off a cliff when, after its first window (which holds whatever compiling the compile
warm-up did not do ahead; a run without a warm-up compiles there), in its tail windows (its
last ``tail_timing_points`` after the first, the ranking's tail: stage1_common/tail.py; a run
of one window has none judged here) torch

- recompiled (a shape the warm-up did not compile, a guard that keeps failing), or
- recorded CUDA graphs again (the warm-up recorded every shape's; a replay should follow),

or when torch skipped CUDA graphs in any window (those graphs then run without them for the
rest of the run; the first window's count holds the warm-up's skips). A graph break is counted
where a recompile traced it: a compiled graph's breaks cost every step alike, cliff or not
(DDP's own forward breaks the whole-model graph three times, by design).

Known cliffs (``known_cliff``) are combinations that run, but off a cliff torch is known to
have. They are flagged, not refused: a space refuses every point when it refuses one, so a
sweep over compile_mode x strategy would die for one combination; the cliff is torch's and may
go with its next version; and the run measures what it costs. The launch names them before
the first run; the run's windows then show whether torch did it.

The workers' CPU time per step (``cpu_ms_mean``) is no host-bound measure here: a thread that
waits for the GPU in a CUDA call spins, and counts that as CPU time too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from stage1_common.tail import tail_start

__all__ = [
    "COUNTS",
    "RULE",
    "figures",
    "judge",
    "known_cliff",
    "known_cliff_notes",
    "line",
    "verdict_line",
]

COUNTS = ("recompiles", "graph_breaks", "cudagraph_records", "cudagraph_skips")
RULE = (
    "cliff: after a run's first window, a recompile or a CUDA graph recorded again in its tail "
    "windows (the compile warm-up compiled and recorded every known shape ahead), or a CUDA "
    "graph skipped in any window (those graphs then run without CUDA graphs); torch's reason "
    "is the first it gave in those windows"
)


def _get(config: Any, key: str) -> Any:
    """A config value from a TrialConfig or a manifest row (an empty cell read as NaN: None)."""
    value = config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)
    return None if isinstance(value, float) and math.isnan(value) else value


def known_cliff(config: Any) -> str:
    """The known cliff of a run's config (a TrialConfig or a manifest row): one line with the
    cause and the fix, or ''.

    fsdp2 with compile_mode reduce-overhead: FSDP2 frees each layer's gathered parameters
    after use (``storage.resize_(0)``) and gathers them into new memory at the next use
    (torch/distributed/fsdp/_fully_shard/_fsdp_param.py: ``free_storage``,
    ``alloc_storage``), so the CUDA graphs of a compiled layer find their parameters at new
    addresses (cudagraph trees' ``StaticInputIdxMismatch``) and are recorded again; torch
    re-records for moved parameters without a limit (pytorch/pytorch#182531), and names FSDP
    with reduce-overhead among its victims (#183451). Measured on 2x H200 with regional
    compile: 107 samples/s, iter p50 2,347 ms, against 1,030 samples/s with compile_mode
    default."""
    if (
        _get(config, "strategy") == "fsdp2"
        and _truthy(_get(config, "torch_compile"))
        and _get(config, "compile_mode") == "reduce-overhead"
        and _get(config, "use_gpu") not in (False, "False", "false")
    ):
        return (
            "fsdp2 with compile_mode reduce-overhead: FSDP2 gathers each layer's parameters "
            "into new memory at every step, so torch records the layers' CUDA graphs again at "
            "every step (pytorch/pytorch#183451; ~10x slower on 2x H200); use "
            "compile_mode=default"
        )
    return ""


def known_cliff_notes(runs: Any) -> list[str]:
    """One line per known cliff among a sweep's runs (spaces.expand.RunSpec), naming their
    groups: what the launch and the dry run say before the first run."""
    groups: dict[str, list[str]] = {}
    for run in runs:
        text = known_cliff(run.config)
        if text and run.group not in groups.setdefault(text, []):
            groups[text].append(run.group)
    return [
        f"known cliff ({', '.join(names)}): {text}; run anyway: its end-of-run line, the "
        "manifest's cliff and the report say what torch did"
        for text, names in groups.items()
    ]


def _truthy(value: Any) -> bool:
    return value is True or str(value).lower() == "true"


def figures(windows: pd.DataFrame, tail_points: int) -> dict[str, Any]:
    """A run's cliff figures from its rank-0 windows of one attempt, in order: the tail's
    (its last ``tail_points`` windows after the first) recompiles, graph breaks and CUDA graph
    recordings, the run's CUDA graph skips, how many windows and steps the tail holds, and the
    first reason torch gave in the windows judged. Zeros for windows of an older sweep,
    which did not count them."""
    out: dict[str, Any] = {
        "tail_recompiles": 0,
        "tail_graph_breaks": 0,
        "tail_cudagraph_records": 0,
        "cudagraph_skips": 0,
        "cliff_windows": 0,
        "cliff_steps": 0,
        "cliff_reason": "",
    }
    if windows.empty or any(c not in windows for c in COUNTS):
        return out
    counts = windows[list(COUNTS)].fillna(0).astype("int64")
    # The ranking's tail, but never the first window: a run of one window is judged on none.
    tail = windows.index[max(1, tail_start(len(windows), tail_points)) :]
    steps = windows["steps_in_window"] if "steps_in_window" in windows else pd.Series(dtype=float)
    out.update(
        tail_recompiles=int(counts.loc[tail, "recompiles"].sum()),
        tail_graph_breaks=int(counts.loc[tail, "graph_breaks"].sum()),
        tail_cudagraph_records=int(counts.loc[tail, "cudagraph_records"].sum()),
        cudagraph_skips=int(counts["cudagraph_skips"].sum()),
        cliff_windows=len(tail),
        cliff_steps=int(steps.reindex(tail).fillna(0).sum()),
    )
    judged = windows.index.isin(tail) | (counts["cudagraph_skips"] > 0).to_numpy()
    reasons = windows["cliff_reason"] if "cliff_reason" in windows else pd.Series(dtype=str)
    reasons = [str(r) for r in reasons[judged].dropna() if str(r)] if len(reasons) else []
    out["cliff_reason"] = reasons[0] if reasons else ""
    return out


def judge(figs: Mapping[str, Any], config: Any = None) -> dict[str, str] | None:
    """The run's cliff verdict from its ``figures`` and its config (a TrialConfig or a
    manifest row; it names the fix): ``kind`` (its cliffs, comma-separated), ``detail`` (what
    torch did), ``reported`` (torch's first reason) and ``try`` (what to change); None when
    the run is not off a cliff."""
    records, compiles = figs.get("tail_cudagraph_records") or 0, figs.get("tail_recompiles") or 0
    skips, breaks = figs.get("cudagraph_skips") or 0, figs.get("tail_graph_breaks") or 0
    where = f"in the last {_count(figs.get('cliff_windows') or 0, 'window')}"
    if figs.get("cliff_steps"):
        where += f" ({_count(figs['cliff_steps'], 'step')})"
    kinds, details, fixes = [], [], []
    if records:
        kinds.append("cudagraph re-records")
        details.append(f"CUDA graphs recorded again {_count(records, 'time')} {where}")
        fixes.append(
            known_cliff(config)
            if config is not None and known_cliff(config)
            else "each recompile records its graphs again: fix the recompiles first"
            if compiles
            else "a graph input moves between steps (torch names it); use compile_mode=default, "
            "or keep that input in place"
        )
    if compiles:
        kinds.append("recompiles")
        extra = f", {_count(breaks, 'graph break')} among them" if breaks else ""
        details.append(f"{_count(compiles, 'recompile')} {where}{extra}")
        fixes.append(_recompile_fix(config))
    if skips:
        kinds.append("cudagraph skips")
        details.append(f"CUDA graphs skipped {_count(skips, 'time')}")
        fixes.append(
            "the graphs torch names run without CUDA graphs: remove the cause it names, or use "
            "compile_mode=default"
        )
    if not kinds:
        return None
    return {
        "kind": ", ".join(kinds),
        "detail": "; ".join(details),
        "reported": str(figs.get("cliff_reason") or ""),
        "try": "; ".join(dict.fromkeys(fixes)),
    }


def _recompile_fix(config: Any) -> str:
    if config is not None and _get(config, "batching") == "duration":
        return (
            "a batch the warm-up did not compile (batching duration compiles every bin's row "
            "counts ahead, padded and not; under compile_scope model a batch padded on one "
            "side only compiles once more): compile_scope=layers, a larger batch_max_pad (fewer "
            "bins), or compile_dynamic=true"
        )
    if config is not None and not _get(config, "crop_buckets_s"):
        return (
            "batch shapes the warm-up did not compile: crop_buckets_s puts every batch in a "
            "known shape, compiled ahead (or compile_dynamic=true, one graph for all shapes)"
        )
    return "a guard that keeps failing (torch names it), or a shape the warm-up did not compile"


def line(verdict: Mapping[str, str] | None) -> str:
    """The verdict in one line (the manifest's ``cliff``, the console's end-of-run line): ''
    when none."""
    if not verdict:
        return ""
    reported = f"; torch: {verdict['reported']}" if verdict.get("reported") else ""
    return f"{verdict['detail']}{reported}; try: {verdict['try']}".replace("\t", " ")


def verdict_line(figs: Mapping[str, Any] | None, config: Any = None) -> str:
    """``line(judge(figs, config))``; '' for a run without windows."""
    return line(judge(figs, config)) if figs else ""


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"
