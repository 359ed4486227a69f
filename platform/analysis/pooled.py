"""A warm sweep's pooled ranking (``--history confirm``, platform/control/race.py).

A group whose catalogue prior this host confirmed (the schedule's ``priors``, state
``confirmed``) ran once here, and only until its first judged windows fell in the prior's band;
its catalogue runs stand in for its repeats. Its figures in the ranking pool both: its runs
here (ok, or stopped once they confirmed: as far as they ran, their tail the ranking's cut) and
its catalogue runs (each run's tail figures as its own sweep's ranking took them, kept in the
schedule so that the output root stays self-contained). Every other group (no prior, or a prior
dropped because this host measured it outside the band) ranks on this sweep's runs alone. The
ranking's rules do not change: the mean and robust mean over the group's runs, the 95 % interval
over them, the jittery flag, P(fastest) over their tail windows (platform/analysis/confidence.py).

The catalogue runs enter at this host's level today: their tail samples/s means and tail
windows multiplied by the shift this host shows (the race's ``scale`` in the schedule's
``history``: the median of the judged groups' ratios here over their catalogue runs; one
group's own ratio), their tail iter p50 divided by it. Within the race's shift tolerance
(3 %) a host a few percent slower today would otherwise rank a settled group that much above
a group that raced cold, measured here alone. A schedule of an earlier version, with no
``scale``, pools them unscaled, as it raced. The catalogue's rows and this sweep's
per_run_metrics.csv stay as measured; only the pooled ranking scales.

A confirmed group never ranks on catalogue runs alone: one with no measured run here (its run
failed, or was interrupted, after it confirmed; the race then un-settles it, but a schedule of
an earlier version may still say confirmed) is not pooled and ranks on this sweep's runs.

A pooled figure is never shown as this sweep's alone: ``runs_catalogue`` and
``catalogue_sweeps`` (group_summary.csv, ranked_groups.csv) say how many of a group's runs
came from the catalogue and from which sweeps, and summary.json's ``pooled`` (its ``line``, on
the console, in summary.md and the report) says that the ranking is pooled and with what.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from platform.analysis.stats import UNSTABLE_RATIO, in_order_and_tail, tail_ratio

__all__ = ["CATALOGUE", "HERE", "Pooling", "counted_tail", "pool", "scale_line"]

HERE, CATALOGUE = "here", "catalogue"  # a pooled run's ``source``
_MEASURED = ("ok", "stopped_early")  # a confirmed group's runs here that count, as far as they ran


@dataclass(frozen=True)
class Pooling:
    """What a pooled ranking ranks on: ``per_run`` (this sweep's runs, those of confirmed groups
    that ran counted as measured, and the catalogue runs, each with its ``source`` and
    ``sweep``), per confirmed group its runs here and from the catalogue (``groups``), the
    catalogue runs' tail windows (``windows``), this sweep's runs counted though a scheduler
    stopped them (``counted``) and those runs' tail windows (``tails``: after the warm-up);
    the catalogue runs' figures scaled by ``scale``, the shift over ``judged`` groups."""

    per_run: pd.DataFrame
    groups: dict[str, dict[str, Any]]
    windows: dict[str, list[np.ndarray]] = field(default_factory=dict)
    counted: tuple[str, ...] = ()
    tails: dict[str, np.ndarray] = field(default_factory=dict)
    scale: float = 1.0  # the catalogue runs' samples/s x this (the module docstring)
    judged: int = 0  # the groups whose ratios' median it is

    @property
    def sweeps(self) -> list[str]:
        return list(dict.fromkeys(s for g in self.groups.values() for s in g["sweeps"]))

    def line(self) -> str:
        """The ranking's pooled sentence (console, summary.md, report)."""
        here = sum(len(g["here"]) for g in self.groups.values())
        there = sum(len(g["catalogue"]) for g in self.groups.values())
        return (
            f"ranking pooled (--history confirm): {len(self.groups)} group(s) confirmed their "
            f"catalogue prior on this host and rank on {here} run(s) here (stopped once "
            f"confirmed) and {there} earlier run(s) of the same configuration on this host "
            f"fingerprint from the catalogue (sweep(s) {', '.join(self.sweeps)}); the winner, "
            "P(fastest) and the 95 % intervals are over those pooled runs; the others rank on "
            "this sweep's runs alone (--history order ranks every group on this sweep's runs); "
            f"{scale_line(self.scale, self.judged)}"
        )

    def summary(self) -> dict[str, Any]:
        """summary.json's ``pooled``."""
        return {
            "mode": "confirm",
            "groups": {
                g: {"runs_here": v["here"], "runs_catalogue": v["catalogue"], "sweeps": v["sweeps"]}
                for g, v in self.groups.items()
            },
            "sweeps": self.sweeps,
            "scale": self.scale,
            "judged": self.judged,
            "line": self.line(),
        }


def scale_line(scale: float, judged: int) -> str:
    """What the catalogue runs were scaled by, and why (the pooled line's end)."""
    over = (f"median of {judged} judged groups' ratios here over their catalogue runs"
            if judged > 1 else "the one judged group's ratio here over its catalogue runs"
            if judged == 1 else "no shift recorded: unscaled")  # fmt: skip
    return f"catalogue runs scaled by {scale:.3f}, the shift this host shows ({over})"


def pool(
    per_run: pd.DataFrame,
    schedule: dict[str, Any],
    unstable_ratio: float = UNSTABLE_RATIO,
    timing: pd.DataFrame | None = None,
) -> Pooling | None:
    """The pooled runs of a sweep whose schedule confirmed priors (``--history confirm``);
    None for any other sweep (cold, ``--history order``, nothing confirmed with a measured run
    here). ``timing`` (the sweep's windows): a counted run's tail is cut again from it after
    the race's warm-up windows (``counted_tail``); without it, as per_run has it."""
    if (schedule.get("history") or {}).get("mode") != "confirm":
        return None
    confirmed = {
        g: r for g, r in (schedule.get("priors") or {}).items() if r.get("state") == "confirmed"
    }
    if not confirmed:
        return None
    out = per_run.assign(source=HERE, sweep="")
    groups: dict[str, dict[str, Any]] = {}
    windows: dict[str, list[np.ndarray]] = {}
    counted: list[str] = []
    extra = []
    warmup = int((schedule.get("scheduler") or {}).get("warmup_windows") or 0)
    tails: dict[str, np.ndarray] = {}
    kept = schedule["history"].get("scale") or {}  # none before the race scaled: unscaled
    scale, judged = float(kept.get("factor", 1.0)), int(kept.get("judged", 0))
    for group, record in confirmed.items():
        mine = out[(out["group"] == group) & out["status"].isin(_MEASURED)]
        mine = mine[pd.to_numeric(mine["tail_samples_per_sec_mean"], errors="coerce").notna()]
        if mine.empty:  # never on catalogue runs alone (the module docstring)
            continue
        stopped = [r for r, st in zip(mine["run"], mine["status"], strict=True) if st != "ok"]
        counted += stopped
        for run in stopped if timing is not None else ():
            figures, values = counted_tail(timing, run, warmup)
            if figures:
                figures["unstable_run_flag"] = bool(figures["iter_p90_over_p50"] > unstable_ratio)
                out.loc[out["run"] == run, list(figures)] = list(figures.values())
                tails[run] = values
        runs = record.get("catalogue_runs") or []
        for r in runs:
            extra.append(_catalogue_row(group, r, unstable_ratio, scale))
        windows[group] = [np.asarray(r["tail"], float) * scale for r in runs if r.get("tail")]
        groups[group] = {
            "here": list(mine["run"]),
            "catalogue": [f"{r['sweep']}/{r['run']}" for r in runs],
            "sweeps": list(dict.fromkeys(str(r["sweep"]) for r in runs)),
        }
    if not groups:
        return None
    out.loc[out["run"].isin(counted), "status"] = "ok"  # measured here, as far as it ran
    pooled = pd.concat([out, pd.DataFrame(extra)], ignore_index=True) if extra else out
    return Pooling(pooled, groups, windows, tuple(counted), tails, scale, judged)


def counted_tail(timing: pd.DataFrame, run: str, warmup: int) -> tuple[dict[str, Any], np.ndarray]:
    """A run stopped once it confirmed, as the ranking counts it: its tail is every window
    after the race's ``warmup`` windows (rank 0), never a warm-up window. The ordinary cut (the
    last ``tail_timing_points`` after the first, stage1_common/tail.py) would reach back into
    the warm-up of a run stopped a window or two after it (4 windows, 2 of warm-up: the second
    warm-up window ranked, 1.6 % low on H200). Its figures (per_run's columns) and its tail
    windows' samples/s; nothing when no window is past the warm-up."""
    rank0 = timing[timing["rank"] == 0] if "rank" in timing else timing
    df = rank0[rank0["run"] == run]
    df, _ = in_order_and_tail(df, 1)  # in order, as every tail is cut
    if "attempt" in df and df["attempt"].notna().any():  # a restarted run: its last attempt
        df = df[df["attempt"] == df["attempt"].max()]
    tail = df.iloc[warmup:]
    values = tail["samples_per_s"].to_numpy(dtype=float)
    values = values[np.isfinite(values)]
    if not len(values):
        return {}, values
    figures = {
        "tail_windows": len(tail),
        "tail_samples_per_sec_mean": float(values.mean()),
        "tail_mean_iter_p50_ms": float(tail["iter_ms_p50"].mean()),
        "iter_p90_over_p50": tail_ratio(tail["iter_ms_p90"], tail["iter_ms_p50"]),
    }
    return figures, values


def _catalogue_row(
    group: str, r: dict[str, Any], unstable_ratio: float, scale: float
) -> dict[str, Any]:
    """One catalogue run as a row of per_run: its tail figures as its sweep recorded them, at
    this host's level (samples/s x ``scale``, iter p50 / ``scale``; its p90/p50 as it was)."""
    ratio = _number(r.get("iter_ratio"))
    return {
        "run": f"{r['sweep']}/{r['run']}",
        "group": group,
        "status": "ok",
        "tail_windows": len(r.get("tail") or ()),
        "tail_samples_per_sec_mean": _number(r.get("samples_per_s")) * scale,
        "tail_mean_iter_p50_ms": _number(r.get("iter_p50_ms")) / scale,
        "iter_p90_over_p50": ratio,
        "unstable_run_flag": bool(math.isfinite(ratio) and ratio > unstable_ratio),
        "source": CATALOGUE,
        "sweep": str(r["sweep"]),
    }


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
