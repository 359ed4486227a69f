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

from platform.analysis.stats import UNSTABLE_RATIO

__all__ = ["CATALOGUE", "HERE", "Pooling", "pool"]

HERE, CATALOGUE = "here", "catalogue"  # a pooled run's ``source``
_MEASURED = ("ok", "stopped_early")  # a confirmed group's runs here that count, as far as they ran


@dataclass(frozen=True)
class Pooling:
    """What a pooled ranking ranks on: ``per_run`` (this sweep's runs, those of confirmed groups
    that ran counted as measured, and the catalogue runs, each with its ``source`` and
    ``sweep``), per confirmed group its runs here and from the catalogue (``groups``), the
    catalogue runs' tail windows (``windows``) and this sweep's runs counted though a scheduler
    stopped them (``counted``)."""

    per_run: pd.DataFrame
    groups: dict[str, dict[str, Any]]
    windows: dict[str, list[np.ndarray]] = field(default_factory=dict)
    counted: tuple[str, ...] = ()

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
            "this sweep's runs alone (--history order ranks every group on this sweep's runs)"
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
            "line": self.line(),
        }


def pool(
    per_run: pd.DataFrame, schedule: dict[str, Any], unstable_ratio: float = UNSTABLE_RATIO
) -> Pooling | None:
    """The pooled runs of a sweep whose schedule confirmed priors (``--history confirm``);
    None for any other sweep (cold, ``--history order``, nothing confirmed)."""
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
    for group, record in confirmed.items():
        mine = out[(out["group"] == group) & out["status"].isin(_MEASURED)]
        mine = mine[pd.to_numeric(mine["tail_samples_per_sec_mean"], errors="coerce").notna()]
        counted += [r for r, st in zip(mine["run"], mine["status"], strict=True) if st != "ok"]
        runs = record.get("catalogue_runs") or []
        for r in runs:
            extra.append(_catalogue_row(group, r, unstable_ratio))
        windows[group] = [np.asarray(r["tail"], float) for r in runs if r.get("tail")]
        groups[group] = {
            "here": list(mine["run"]),
            "catalogue": [f"{r['sweep']}/{r['run']}" for r in runs],
            "sweeps": list(dict.fromkeys(str(r["sweep"]) for r in runs)),
        }
    out.loc[out["run"].isin(counted), "status"] = "ok"  # measured here, as far as it ran
    pooled = pd.concat([out, pd.DataFrame(extra)], ignore_index=True) if extra else out
    return Pooling(pooled, groups, windows, tuple(counted))


def _catalogue_row(group: str, r: dict[str, Any], unstable_ratio: float) -> dict[str, Any]:
    """One catalogue run as a row of per_run (its tail figures as its sweep recorded them)."""
    ratio = _number(r.get("iter_ratio"))
    return {
        "run": f"{r['sweep']}/{r['run']}",
        "group": group,
        "status": "ok",
        "tail_windows": len(r.get("tail") or ()),
        "tail_samples_per_sec_mean": _number(r.get("samples_per_s")),
        "tail_mean_iter_p50_ms": _number(r.get("iter_p50_ms")),
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
