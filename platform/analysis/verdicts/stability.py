"""The Phase B acceptance check of the runbooks: is each group's timing steady across repeats?

Per group, over its ok runs (figures as in platform/analysis/stats.py): the median and the max
of the runs' tail iter p90/p50, and the coefficient of variation (sample std / mean) of the runs'
tail iter p50. Three verdicts:

- ``FAIL``: a figure above its limit (``StabilityLimits``; equality passes; the reason names the
  figure, its value and the limit: ``iter p50 CV 0.0532 > 0.05``), a figure unknown although
  the group has the runs to know it, or no ok run at all (every run failed: more repeats of
  the same would not help);
- ``NOT ENOUGH REPEATS``: no figure above its limit, but fewer ok runs than ``min_repeats``
  (or fewer than the 2 a CV needs): steadiness cannot be told yet;
- ``NOT RUN``: no run of the group ended: the sweep was interrupted before it (its runs pending
  or cut short); nothing to judge yet, and not a failure;
- ``PASS``: enough ok runs and every figure at or below its limit. With ``min_repeats`` 1 a
  group of one ok run passes on its p90/p50 alone: its CV is not judged (one run has none),
  and the reason says so.

This is not the ranking's ``unstable_group`` flag (platform/analysis/stats.py: iter p90/p50
over ``--unstable-ratio`` in most ok runs), which only orders the ranking.

``python -m platform.stability`` prints them with its limits
(platform/analysis/verdicts/limits.py); the report calls ``judge`` as the command does, with the
limits of the folder's own stability.log when it states them, else the defaults.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from platform.analysis import stats
from platform.analysis.verdicts import limits as limit_lines
from platform.errors import UsageError
from platform.storage import results
from stage1_common.output_root import OutputRoot

__all__ = [
    "FAIL",
    "NOT_ENOUGH_REPEATS",
    "NOT_RUN",
    "PASS",
    "StabilityLimits",
    "check",
    "folder_limits",
    "group_figures",
    "judge",
    "pick_groups",
    "verdict_line",
    "why",
]

PASS, FAIL, NOT_ENOUGH_REPEATS, NOT_RUN = "PASS", "FAIL", "NOT ENOUGH REPEATS", "NOT RUN"
COMMAND = "python -m platform.stability"


@dataclass(frozen=True, kw_only=True)
class StabilityLimits:
    """The Phase B limits. Each field is the flag of the same name of platform.stability
    (``max_iter_p50_cv`` is ``--max-iter-p50-cv``), which takes its default from here."""

    min_repeats: int = 3
    """Ok runs a group needs at least (1: a group of one ok run is judged without a CV)."""
    max_iter_ratio_median: float = 1.5
    """Limit of the median over runs of the tail iter p90/p50."""
    max_iter_ratio_max: float = 2.5
    """Limit of the largest tail iter p90/p50 of any run."""
    max_iter_p50_cv: float = 0.05
    """Limit of the coefficient of variation of the runs' tail iter p50."""

    def __post_init__(self) -> None:
        if self.min_repeats < 1:
            raise UsageError(f"--min-repeats must be >= 1, got {self.min_repeats}")
        for name in ("max_iter_ratio_median", "max_iter_ratio_max", "max_iter_p50_cv"):
            if getattr(self, name) <= 0:
                raise UsageError(f"--{name.replace('_', '-')} must be > 0")


def group_figures(root: OutputRoot) -> pd.DataFrame:
    """stats.group_summary's table of a sweep, from its manifest and timing rows; for a folder
    of analysis files only (benchmarks/results/*: no manifest, no rows), its group_summary.csv,
    which the same function wrote. UsageError when the folder has neither."""
    summary = root / root.GROUP_SUMMARY
    if not root.holds_sweep() and summary.is_file():
        return pd.read_csv(summary)
    manifest = results.read_manifest(root)
    timing = results.read_dataset(root.timing, results.TIMING_SCHEMA)
    return stats.group_summary(stats.per_run_metrics(manifest, timing))


def pick_groups(groups: pd.DataFrame, wanted: str, root: OutputRoot) -> list[str]:
    """The groups named in ``wanted`` (comma-separated; empty: all of them); UsageError for a
    name the sweep at ``root`` does not have."""
    known = list(groups["group"])
    names = [g.strip() for g in wanted.split(",") if g.strip()] or known
    unknown = [g for g in names if g not in known]
    if unknown:
        raise UsageError(
            f"--groups: {', '.join(unknown)} not in {root.shown}; its groups: " + ", ".join(known)
        )
    return names


def judge(root: OutputRoot, limits: StabilityLimits, wanted: str = "") -> list[dict]:
    """The verdicts of the groups named in ``wanted`` (empty: all) of the sweep at
    ``root``: what ``python -m platform.stability`` prints and the report shows."""
    groups = group_figures(root)
    names = pick_groups(groups, wanted, root)
    return check(groups, names, limits, unfinished=_unfinished_groups(root))


def _unfinished_groups(root: OutputRoot) -> set[str]:
    """The groups none of whose runs ended (pending or cut short: an interrupted sweep)."""
    if not root.holds_sweep():
        return set()
    manifest = results.read_manifest(root)
    ended = ~manifest["status"].astype(str).isin(["pending", "interrupted"])
    return set(manifest["group"]) - set(manifest.loc[ended, "group"])


def folder_limits(root: OutputRoot) -> tuple[StabilityLimits, str]:
    """The limits to judge a folder by, and where they come from: those its stability.log
    states (so the report agrees with the folder's own check), else the defaults, saying why
    (limits.folder_limits)."""
    return limit_lines.folder_limits(StabilityLimits, root / root.STABILITY_LOG, COMMAND)


def check(
    groups: pd.DataFrame,
    names: list[str],
    limits: StabilityLimits,
    unfinished: set[str] | frozenset[str] = frozenset(),
) -> list[dict]:
    """One verdict per named group (``groups``: stats.group_summary's table): ``verdict``
    (PASS, FAIL or NOT ENOUGH REPEATS), ``passed``, the figures, and why: ``failures`` (a
    figure above its limit, unknown with the runs to know it, or no ok run), ``short`` (too
    few ok runs) and ``notes`` (a figure not judged, and why). ``unfinished``: groups none of
    whose runs ended (NOT RUN)."""
    table = groups.set_index("group")
    return [_verdict(name, table.loc[name], limits, name in unfinished) for name in names]


def _verdict(name: str, g: pd.Series, limits: StabilityLimits, unfinished: bool = False) -> dict:
    runs_ok = int(g["runs_ok"])
    failures, short, notes = [], [], []
    if runs_ok == 0 and unfinished:
        short.append("no run of it ended: the sweep was interrupted first")
    elif runs_ok == 0:
        failures.append("no ok run")  # every run failed: not a matter of repeats
    elif runs_ok < limits.min_repeats:
        short.append(f"{runs_ok} ok runs < {limits.min_repeats}")
    for label, value, limit in (
        ("iter p90/p50 median", g["iter_ratio_median"], limits.max_iter_ratio_median),
        ("iter p90/p50 max", g["iter_ratio_max"], limits.max_iter_ratio_max),
        ("iter p50 CV", g["iter_p50_cv"], limits.max_iter_p50_cv),
    ):
        value = float(value)
        if runs_ok == 0:
            continue  # "no ok run" says it all
        if label == "iter p50 CV" and runs_ok == 1 and limits.min_repeats == 1:
            notes.append("iter p50 CV not judged: one ok run")  # asked for: --min-repeats 1
        elif not math.isfinite(value):
            # A CV needs 2 ok runs, the ratios 1: unknown for want of runs is a shortfall.
            needs = 2 if label == "iter p50 CV" else 1
            (short if runs_ok < needs else failures).append(f"{label} unknown")
        elif value > limit:
            failures.append(f"{label} {value:.4g} > {limit_lines.flag_text(limit)}")
    verdict = FAIL if failures else NOT_ENOUGH_REPEATS if short else PASS
    if runs_ok == 0 and unfinished:
        verdict = NOT_RUN
    return {
        "group": name,
        "verdict": verdict,
        "passed": verdict == PASS,
        "runs_ok": runs_ok,
        "iter_ratio_median": float(g["iter_ratio_median"]),
        "iter_ratio_max": float(g["iter_ratio_max"]),
        "iter_p50_cv": float(g["iter_p50_cv"]),
        "failures": failures,
        "short": short,
        "notes": notes,
    }


def why(v: dict) -> str:
    """A verdict's reasons, as its line and the report's why column give them."""
    return "; ".join(v["failures"] + v["short"] + v.get("notes", []))


def verdict_line(v: dict) -> str:
    """One verdict as the line platform.stability prints (verdict, figures, why)."""
    reasons = why(v)
    return (
        f"{v['verdict']} {v['group']}: {v['runs_ok']} ok runs, iter p90/p50 median "
        f"{v['iter_ratio_median']:.3f} max {v['iter_ratio_max']:.3f}, iter p50 CV "
        f"{v['iter_p50_cv']:.4f}" + (f" ({reasons})" if reasons else "")
    )
