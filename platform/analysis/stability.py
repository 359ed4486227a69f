"""The Phase B acceptance check of the runbooks: is each group's timing steady across repeats?

Per group, over its ok runs (figures as in platform/analysis/stats.py): the median and the max
of the runs' tail iter p90/p50, and the coefficient of variation (sample std / mean) of the runs'
tail iter p50. A group passes when it has at least ``min_repeats`` ok runs and every figure is at
or below its limit (``StabilityLimits``). The command line is ``python -m platform.stability``;
the report shows the same verdicts under the default limits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from platform.analysis import stats
from platform.errors import UsageError
from platform.storage import results
from stage1_common.output_root import OutputRoot

__all__ = ["StabilityLimits", "check", "group_figures", "pick_groups", "verdict_line"]


@dataclass(frozen=True, kw_only=True)
class StabilityLimits:
    """The Phase B limits. Each field is the flag of the same name of platform.stability
    (``max_iter_p50_cv`` is ``--max-iter-p50-cv``), which takes its default from here."""

    min_repeats: int = 3
    """Ok runs a group needs at least."""
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


def group_figures(output_root: OutputRoot | str) -> pd.DataFrame:
    """stats.group_summary's table of a sweep, from its manifest and timing rows."""
    root = OutputRoot.of(output_root)
    manifest = results.read_manifest(root)
    timing = results.read_dataset(root.timing, results.TIMING_SCHEMA)
    return stats.group_summary(stats.per_run_metrics(manifest, timing))


def pick_groups(groups: pd.DataFrame, wanted: str, output_root: OutputRoot | str) -> list[str]:
    """The groups named in ``wanted`` (comma-separated; empty: all of them); UsageError for a
    name the sweep at ``output_root`` does not have."""
    known = list(groups["group"])
    names = [g.strip() for g in wanted.split(",") if g.strip()] or known
    unknown = [g for g in names if g not in known]
    if unknown:
        raise UsageError(
            f"--groups: {', '.join(unknown)} not in {output_root}; its groups: " + ", ".join(known)
        )
    return names


def check(groups: pd.DataFrame, names: list[str], limits: StabilityLimits) -> list[dict]:
    """One verdict per named group (``groups``: stats.group_summary's table)."""
    table = groups.set_index("group")
    verdicts = []
    for name in names:
        g = table.loc[name]
        failures = []
        if g["runs_ok"] < limits.min_repeats:
            failures.append(f"{int(g['runs_ok'])} ok runs < {limits.min_repeats}")
        for label, value, limit in (
            ("iter p90/p50 median", g["iter_ratio_median"], limits.max_iter_ratio_median),
            ("iter p90/p50 max", g["iter_ratio_max"], limits.max_iter_ratio_max),
            ("iter p50 CV", g["iter_p50_cv"], limits.max_iter_p50_cv),
        ):
            if not (isinstance(value, float) and math.isfinite(value)):
                failures.append(f"{label} unknown")
            elif value > limit:
                failures.append(f"{label} {value:.4g} > {limit:g}")
        verdicts.append(
            {
                "group": name,
                "runs_ok": int(g["runs_ok"]),
                "iter_ratio_median": float(g["iter_ratio_median"]),
                "iter_ratio_max": float(g["iter_ratio_max"]),
                "iter_p50_cv": float(g["iter_p50_cv"]),
                "passed": not failures,
                "failures": failures,
            }
        )
    return verdicts


def verdict_line(v: dict) -> str:
    """One verdict as the line platform.stability prints (PASS or FAIL, figures, why)."""
    return (
        f"{'PASS' if v['passed'] else 'FAIL'} {v['group']}: {v['runs_ok']} ok runs, iter "
        f"p90/p50 median {v['iter_ratio_median']:.3f} max {v['iter_ratio_max']:.3f}, iter p50 "
        f"CV {v['iter_p50_cv']:.4f}" + (f" ({'; '.join(v['failures'])})" if v["failures"] else "")
    )
