"""How sure the ranking is of its winner: the probability that each group is the fastest, and
which groups are within noise of the winner, by a two-level bootstrap over the measurements.

A group's figure is the mean over its ok runs of each run's tail mean samples/s (the ranking's
figure, stats.group_summary). One bootstrap draw resamples a group's ok runs with replacement
and, inside each drawn run, its tail windows with replacement (a hierarchical bootstrap: the
noise between repeats, which is the larger on a shared host, and the noise inside a run both
count). Over the draws:

- ``p_best``: the share of draws in which the group has the highest figure (ties split);
- ``vs_best_low`` / ``vs_best_high``: the 2.5 % and 97.5 % quantiles of the group's figure over
  the named winner's in the same draw;
- ``within_noise_of_best``: that interval reaches 1 (the winner itself: True).

A group measured by one run has no repeat to resample: its draws carry the windows' noise
only, which understates how much a second run on the same host can differ (about 10 % on the
GPU hosts this was built on); ``noise`` says which kind each group's interval holds, and
``sentence`` says it in words. Seeded: the same measurements give the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from platform.analysis.stats import in_order_and_tail, tail_points

__all__ = [
    "COLUMNS",
    "DRAWS",
    "confidence",
    "of_sweep",
    "sentence",
    "tail_windows",
    "top_two_within_noise",
]

DRAWS = 4000
LEVEL = 0.95
# ranked_groups.csv's columns from here (empty for a group without an ok run).
COLUMNS = {"p_best": "p_fastest", "vs_best_low": "vs_best_low", "vs_best_high": "vs_best_high"}


def tail_windows(
    timing: pd.DataFrame, tail_points: Mapping[str, int], runs: Sequence[str]
) -> dict[str, np.ndarray]:
    """Each run's tail windows' samples/s (rank 0; a restarted run's last attempt), for the
    ``runs`` given (the ok ones): the windows stats.run_figures averages (the same cut)."""
    rank0 = timing[timing["rank"] == 0] if "rank" in timing else timing
    out: dict[str, np.ndarray] = {}
    for run, df in rank0[rank0["run"].isin(list(runs))].groupby("run", sort=False):
        _, tail = in_order_and_tail(df, tail_points.get(run, 1))
        values = tail["samples_per_s"].to_numpy(dtype=float)
        values = values[np.isfinite(values)]
        if len(values):
            out[str(run)] = values
    return out


def _draws(runs: list[np.ndarray], rng: np.random.Generator, draws: int) -> np.ndarray:
    """A group's figure in each draw: runs resampled, then each drawn run's windows."""
    slots = len(runs)
    pick = rng.integers(0, slots, size=(draws, slots)) if slots > 1 else np.zeros((draws, 1), int)
    figure = np.zeros(draws)
    for s in range(slots):
        chosen = pick[:, s]
        for r, windows in enumerate(runs):
            rows = np.flatnonzero(chosen == r)
            if not len(rows):
                continue
            resampled = rng.integers(0, len(windows), size=(len(rows), len(windows)))
            figure[rows] += windows[resampled].mean(axis=1)
    return figure / slots


def confidence(
    groups: Mapping[str, list[np.ndarray]], best: str, *, draws: int = DRAWS, seed: int = 0
) -> pd.DataFrame:
    """One row per group with measured runs (``groups``: group -> its ok runs' tail windows),
    the named winner ``best`` first, then by ``p_best``: columns group, runs, windows, p_best,
    vs_best_low, vs_best_high, within_noise_of_best, noise."""
    measured = {g: [np.asarray(w, float) for w in runs if len(w)] for g, runs in groups.items()}
    measured = {g: runs for g, runs in measured.items() if runs}
    if best not in measured:
        raise ValueError(f"the winner {best!r} has no measured run")
    rng = np.random.default_rng(seed)
    names = list(measured)
    figures = np.stack([_draws(measured[g], rng, draws) for g in names])  # groups x draws
    top = figures.max(axis=0)
    at_top = figures == top
    p_best = (at_top / at_top.sum(axis=0)).mean(axis=1)
    ratio = figures / figures[names.index(best)]
    low, high = np.quantile(ratio, [(1 - LEVEL) / 2, (1 + LEVEL) / 2], axis=1)
    rows = [
        {
            "group": g,
            "runs": len(measured[g]),
            "windows": int(sum(len(w) for w in measured[g])),
            "p_best": float(p_best[i]),
            "vs_best_low": 1.0 if g == best else float(low[i]),
            "vs_best_high": 1.0 if g == best else float(high[i]),
            "within_noise_of_best": bool(g == best or high[i] >= 1.0),
            "noise": "runs and windows" if len(measured[g]) > 1 else "windows only",
        }
        for i, g in enumerate(names)
    ]
    table = pd.DataFrame(rows)
    table["_first"] = table["group"] != best
    table = table.sort_values(["_first", "p_best"], ascending=[True, False], kind="stable")
    return table.drop(columns="_first").reset_index(drop=True)


def top_two_within_noise(ranked: pd.DataFrame) -> bool | None:
    """Whether the runner-up is within noise of the winner: its 95 % interval against the
    winner (runs and windows resampled: the ``vs_best_high`` of ``of_sweep``'s ranking) reaches
    1. None when either of the top two has fewer than 2 ok runs (one run's interval carries its
    windows' noise only, not a repeat's) or the runner-up has no interval. The one basis of
    summary.md's noise line, the verdict's "how sure" and the line above: t intervals over 2
    runs (1 degree of freedom) are 9 standard deviations wide and once called two groups 8 %
    apart within noise while this interval put the runner-up at 0.879-0.971x."""
    top = ranked[ranked["runs_ok"] > 0].head(2)
    if len(top) < 2 or (top["runs_ok"] < 2).any() or "vs_best_high" not in top:
        return None
    high = top.iloc[1]["vs_best_high"]
    return None if not np.isfinite(high) else bool(high >= 1.0)


def sentence(table: pd.DataFrame) -> str:
    """The winner's confidence in one line: its probability of being the fastest, what the
    intervals rest on, the groups within noise of it (with their interval)."""
    if table.empty:
        return "how sure: nothing measured"
    best = table.iloc[0]
    runs = int(table["runs"].min())
    close = table.iloc[1:][table.iloc[1:]["within_noise_of_best"]]
    near = ", ".join(
        f"{r.group} ({r.vs_best_low:.3f}-{r.vs_best_high:.3f}x)" for r in close.itertuples()
    )
    text = f"P(fastest) {best.p_best:.2f}"
    text += f"; within noise of it: {near}" if near else "; no other group within noise"
    if runs < 2:
        text += (
            "; a group measured by one run carries its windows' noise only (a repeat on the "
            "same host can differ by more): run 2 or more repeats for how sure"
        )
    return text if math.isfinite(best.p_best) else "how sure: cannot be told"


def of_sweep(
    manifest: pd.DataFrame, timing: pd.DataFrame, ranked: pd.DataFrame, pooling=None
) -> tuple[pd.DataFrame, dict | None]:
    """``ranked`` with the confidence columns (``COLUMNS``) and summary.json's ``confidence``
    (the winner, its probability, the groups within noise of it, the line; None when no group
    finished a run): the winner is the ranking's first group with an ok run. ``pooling``
    (platform/analysis/pooled.py: a warm race's pooled ranking): its groups' runs here that a
    scheduler stopped once they confirmed count, and their catalogue runs' tail windows join
    theirs, as the ranking counts them."""
    measured = ranked[ranked["runs_ok"] > 0]
    empty = ranked.assign(**{c: float("nan") for c in COLUMNS.values()})
    if measured.empty:
        return empty, None
    counted = set(pooling.counted) if pooling is not None else set()
    ok = manifest[(manifest["status"] == "ok") | manifest["run"].isin(counted)]
    windows = tail_windows(timing, tail_points(ok), list(ok["run"]))
    if pooling is not None:  # a run stopped once confirmed: its windows after the warm-up
        windows.update(pooling.tails)
    there = pooling.windows if pooling is not None else {}
    groups = {
        g: [windows[r] for r in ok.loc[ok["group"] == g, "run"] if r in windows]
        + list(there.get(g, []))
        for g in measured["group"]
    }
    best = str(measured.iloc[0]["group"])
    if not groups.get(best):
        return empty, None
    table = confidence({g: runs for g, runs in groups.items() if runs}, best)
    by_group = table.set_index("group")
    out = ranked.copy()
    for source, column in COLUMNS.items():
        out[column] = [by_group[source].get(g, float("nan")) for g in ranked["group"]]
    close = table.iloc[1:][table.iloc[1:]["within_noise_of_best"]]
    summary = {
        "best_group": best,
        "p_fastest": float(table.iloc[0]["p_best"]),
        "within_noise": list(close["group"]),
        "runs_min": int(table["runs"].min()),
        "draws": DRAWS,
        "line": sentence(table),
    }
    return out, summary
