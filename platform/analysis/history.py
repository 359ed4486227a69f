"""What the catalogue says (platform/storage/catalogue.py): its sweeps, two of them compared on
the configurations they share, one configuration's history; and what a warm start takes from it
(the groups' measured order, the points known to fail on the host, and each group's figures as a
race's prior).

A comparison is per configuration (its cost key): the ratio b/a of the two sides' mean tail
samples/s over their measured runs (ok, or stopped early by a scheduler as far as they ran: a
warm race's runs stop once they confirm their prior), with a 95 % noise band (``ratio_band``)
that is the widest of three half-widths, each relative to the ratio:

- windows: Welch's interval on the two sides' tail windows (every measured run's, pooled per
  side);
- runs: the run-to-run spread pooled over every configuration the comparison holds (each run's
  mean relative to its configuration's mean on its side), with Student's t at the pooled
  degrees of freedom, when they are ``RUN_NOISE_MIN_DOF`` or more: two runs of one
  configuration alone give t at 1 degree of freedom (12.7), a band that holds almost anything
  (0.41-1.56x in benchmarks/results/warm_race_2xh200/);
- the noise floor, ``NOISE_FLOOR`` (the repeat-to-repeat noise one run cannot show, as the race
  assumes).

Within noise: the band holds 1.

What a warm start takes from the catalogue: platform/analysis/priors.py.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import pandas as pd

from platform.analysis.stats import UNSTABLE_RATIO, t_quantile

__all__ = [
    "NOISE_FLOOR",
    "RUN_NOISE_MIN_DOF",
    "WINDOWS",
    "compare",
    "history",
    "jittery",
    "ratio_band",
    "run_noise",
    "sweeps",
    "window_values",
]

NOISE_FLOOR = 0.02
# Fewer pooled degrees of freedom than this and the run-to-run term is left out of a band
# (Student's t at 1-2 degrees of freedom is 12.7-4.3: a band that tells nothing apart).
RUN_NOISE_MIN_DOF = 3
WINDOWS = "window_samples_per_s"  # the catalogue's column: a run's windows, in order (rank 0)


def sweeps(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per sweep, newest last: when, kind, space, host, versions, runs ok of all, the
    best group and its samples/s, the output root. The best group is the sweep's own ranking's
    first (``group_rank`` 1: steady groups first, groups out of the race after those in it);
    for rows written before the catalogue kept the rank, the highest mean of the steady groups
    (jittery ones only when no group is steady)."""
    if rows.empty:
        return pd.DataFrame(columns=["sweep", "when", "kind", "space", "host", "gpu", "torch",
                                     "runs", "ok", "best", "samples_per_s", "output_root"])  # fmt: skip
    out = []
    for sweep, df in rows.groupby("sweep", sort=False):
        ok = df[df["status"] == "ok"]
        by_group = ok.groupby("group")["tail_samples_per_sec_mean"].mean()
        # A group without an ok run here (a warm race's runs stop once they confirm their
        # prior): the mean of its runs stopped early, as far as they ran.
        partial = df[df["status"] == "stopped_early"].groupby("group")["tail_samples_per_sec_mean"]
        by_group = by_group.combine_first(partial.mean())
        best = _best_group(df, ok, by_group)
        head = df.iloc[0]
        out.append({
            "sweep": sweep, "when": pd.to_datetime(df["ts"].min(), unit="s").strftime("%Y-%m-%d %H:%M"),
            "kind": head["kind"], "space": head["space"], "host": head["host"],
            "gpu": f"{int(head['gpus'])}x {head['gpu']}" if pd.notna(head["gpus"]) and head["gpus"]
            else head["gpu"],
            "torch": head["torch"], "runs": len(df), "ok": len(ok), "best": best,
            "samples_per_s": round(float(by_group[best]), 1) if best in by_group else math.nan,
            "output_root": head["output_root"], "_ts": df["ts"].min(),
        })  # fmt: skip
    return pd.DataFrame(out).sort_values("_ts").drop(columns="_ts").reset_index(drop=True)


def _best_group(df: pd.DataFrame, ok: pd.DataFrame, by_group: pd.Series) -> str:
    """The sweep's best group: its ranking's first, else the fastest steady group."""
    if not len(by_group):
        return ""
    ranks = df.dropna(subset=["group_rank"]) if "group_rank" in df else df.iloc[:0]
    if len(ranks):
        return str(ranks.sort_values("group_rank", kind="stable").iloc[0]["group"])
    ratios = ok.groupby("group")["iter_p90_over_p50"].apply(jittery)
    steady = [g for g in by_group.index if not ratios.get(g, False)]
    return str(by_group[steady].idxmax() if steady else by_group.idxmax())


def compare(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """The configurations two sets of rows share (``a``, ``b``: two sweeps, two hosts, two
    versions), each with both sides' mean samples/s, runs and tail windows, the ratio b/a and
    its band (``ratio_band``; the run-to-run term pooled over the shared configurations)."""
    shared = [k for k in dict.fromkeys(a["cost_key"]) if k in set(b["cost_key"])]
    sides = {}
    for key in shared:
        xa, xb = _runs(a[a["cost_key"] == key]), _runs(b[b["cost_key"] == key])
        if xa[0] and xb[0]:  # an ok run a side
            sides[key] = (xa, xb)
    noise = run_noise([means for pair in sides.values() for means, _ in pair])
    out = []
    for key, ((ma, wa), (mb, wb)) in sides.items():
        ratio, low, high = ratio_band(ma, mb, wa, wb, noise)
        out.append({
            "group": a[a["cost_key"] == key]["group"].iloc[0], "cost_key": key,
            "a_samples_per_s": statistics.fmean(ma), "a_runs": len(ma), "a_windows": len(wa),
            "b_samples_per_s": statistics.fmean(mb), "b_runs": len(mb), "b_windows": len(wb),
            "ratio": ratio, "low": low, "high": high, "within_noise": low <= 1.0 <= high,
        })  # fmt: skip
    return pd.DataFrame(out)


def ratio_band(
    a_means: Sequence[float],
    b_means: Sequence[float],
    a_windows: Sequence[float] = (),
    b_windows: Sequence[float] = (),
    noise: tuple[float, int] | None = None,
    *,
    floor: float = NOISE_FLOOR,
    confidence: float = 0.95,
) -> tuple[float, float, float]:
    """b/a of the two sides' means (over their runs) and its band at ``confidence``: the
    widest of Welch's interval on the windows (two or more a side, by the delta method),
    the pooled run-to-run term (``noise``: relative sd and its degrees of freedom, from
    ``run_noise``; left out under ``RUN_NOISE_MIN_DOF``) and ``floor``, each relative to the
    ratio."""
    ma, mb = statistics.fmean(a_means), statistics.fmean(b_means)
    ratio = mb / ma
    q = (1 + confidence) / 2
    half = floor
    if len(a_windows) > 1 and len(b_windows) > 1:
        wa, wb = statistics.fmean(a_windows), statistics.fmean(b_windows)
        va = statistics.variance(a_windows) / len(a_windows) / wa**2
        vb = statistics.variance(b_windows) / len(b_windows) / wb**2
        denom = va**2 / (len(a_windows) - 1) + vb**2 / (len(b_windows) - 1)
        dof = (va + vb) ** 2 / denom if denom > 0 else len(a_windows) + len(b_windows) - 2
        half = max(half, t_quantile(q, max(1, int(dof))) * math.sqrt(va + vb))
    if noise is not None and noise[1] >= RUN_NOISE_MIN_DOF:
        spread = noise[0] * math.sqrt(1 / len(a_means) + 1 / len(b_means))
        half = max(half, t_quantile(q, noise[1]) * spread)
    return ratio, ratio * (1 - half), ratio * (1 + half)


def run_noise(configs: Sequence[Sequence[float]]) -> tuple[float, int]:
    """The run-to-run spread pooled over ``configs`` (each: the run means of one configuration
    on one side): the relative sd of a run about its configuration's mean, and its degrees of
    freedom (runs less one, summed)."""
    squares, dof = 0.0, 0
    for means in configs:
        if len(means) > 1:
            m = statistics.fmean(means)
            squares += sum((x / m - 1) ** 2 for x in means)
            dof += len(means) - 1
    return (math.sqrt(squares / dof) if dof else 0.0), dof


def _runs(df: pd.DataFrame) -> tuple[list[float], list[float]]:
    """A side's measured runs of one configuration (ok, or stopped early by a scheduler, as far
    as they ran: a warm race stops a run once it confirms its prior): their tail means, and
    their tail windows (each run's last ``tail_windows`` windows, where the catalogue kept its
    windows)."""
    measured = df["status"].isin(["ok", "stopped_early"])
    ok = df[measured & (df["tail_samples_per_sec_mean"] > 0)]
    means = [float(x) for x in ok["tail_samples_per_sec_mean"]]
    windows: list[float] = []
    for row in ok.to_dict("records"):
        values = window_values(row.get(WINDOWS))
        n = row.get("tail_windows")
        tail = values[-int(n) :] if n and n == n and int(n) > 0 else values
        windows += tail
    return means, windows


def window_values(cell: Any) -> list[float]:
    """A catalogue row's windows (None for rows written before it kept them)."""
    if cell is None or (isinstance(cell, float) and math.isnan(cell)):
        return []
    return [float(x) for x in cell if x is not None and math.isfinite(float(x))]


def history(rows: pd.DataFrame, key: str) -> pd.DataFrame:
    """Every run of one configuration (a cost key, or a group name), oldest first."""
    mask = (rows["cost_key"] == key) | (rows["group"] == key)
    cols = ["ts", "sweep", "host", "gpu", "torch", "platform", "group", "repeat", "status",
            "tail_samples_per_sec_mean", "startup_s", "compile_s", "failure_reason"]  # fmt: skip
    out = rows.loc[mask, cols].sort_values("ts").reset_index(drop=True)
    when = pd.to_datetime(out["ts"], unit="s").dt.strftime("%Y-%m-%d %H:%M")
    return out.drop(columns="ts").assign(when=when)[["when", *cols[1:]]]


def jittery(ratios: pd.Series) -> bool:
    """Most of a group's ok runs had a tail iter p90/p50 above the ranking's limit."""
    ratios = ratios.dropna()
    return bool(len(ratios)) and float((ratios > UNSTABLE_RATIO).mean()) > 0.5
