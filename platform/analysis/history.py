"""What the catalogue says (platform/storage/catalogue.py): its sweeps, two of them compared on
the configurations they share, one configuration's history; and what a warm start takes from it
(the groups' measured order, the points known to fail on the host).

A comparison is per configuration (its cost key): the ratio of the two sides' mean tail samples/s
over their ok runs, with a noise band: Welch's 95 % interval of the ratio when both sides have
two or more runs, else +- ``NOISE_FLOOR`` (the run-to-run noise one run cannot show, as the race
assumes). Within noise: the band holds 1.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import pandas as pd

from platform.analysis.stats import UNSTABLE_RATIO, t_quantile

__all__ = ["NOISE_FLOOR", "compare", "history", "known_failures", "measured_order", "sweeps"]

NOISE_FLOOR = 0.02
# A failure that holds for a configuration on a host whatever the run: out of memory.
_LASTING = ("out of memory", "outofmemory", "cuda oom")


def sweeps(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per sweep, newest last: when, kind, space, host, versions, runs ok of all, the
    best group and its samples/s, the output root."""
    if rows.empty:
        return pd.DataFrame(columns=["sweep", "when", "kind", "space", "host", "gpu", "torch",
                                     "runs", "ok", "best", "samples_per_s", "output_root"])  # fmt: skip
    out = []
    for sweep, df in rows.groupby("sweep", sort=False):
        ok = df[df["status"] == "ok"]
        by_group = ok.groupby("group")["tail_samples_per_sec_mean"].mean()
        best = by_group.idxmax() if len(by_group) else ""
        head = df.iloc[0]
        out.append({
            "sweep": sweep, "when": pd.to_datetime(df["ts"].min(), unit="s").strftime("%Y-%m-%d %H:%M"),
            "kind": head["kind"], "space": head["space"], "host": head["host"],
            "gpu": f"{int(head['gpus'])}x {head['gpu']}" if pd.notna(head["gpus"]) and head["gpus"]
            else head["gpu"],
            "torch": head["torch"], "runs": len(df), "ok": len(ok), "best": best,
            "samples_per_s": round(float(by_group.max()), 1) if len(by_group) else math.nan,
            "output_root": head["output_root"], "_ts": df["ts"].min(),
        })  # fmt: skip
    return pd.DataFrame(out).sort_values("_ts").drop(columns="_ts").reset_index(drop=True)


def compare(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """The configurations two sets of rows share (``a``, ``b``: two sweeps, two hosts, two
    versions), each with both sides' mean samples/s and runs, the ratio b/a and its band."""
    out = []
    shared = [k for k in dict.fromkeys(a["cost_key"]) if k in set(b["cost_key"])]
    for key in shared:
        xa = _samples(a[a["cost_key"] == key])
        xb = _samples(b[b["cost_key"] == key])
        if not xa or not xb:
            continue
        ratio, low, high = _ratio(xa, xb)
        out.append({
            "group": a[a["cost_key"] == key]["group"].iloc[0], "cost_key": key,
            "a_samples_per_s": statistics.fmean(xa), "a_runs": len(xa),
            "b_samples_per_s": statistics.fmean(xb), "b_runs": len(xb),
            "ratio": ratio, "low": low, "high": high, "within_noise": low <= 1.0 <= high,
        })  # fmt: skip
    return pd.DataFrame(out)


def history(rows: pd.DataFrame, key: str) -> pd.DataFrame:
    """Every run of one configuration (a cost key, or a group name), oldest first."""
    mask = (rows["cost_key"] == key) | (rows["group"] == key)
    cols = ["ts", "sweep", "host", "gpu", "torch", "platform", "group", "repeat", "status",
            "tail_samples_per_sec_mean", "startup_s", "compile_s", "failure_reason"]  # fmt: skip
    out = rows.loc[mask, cols].sort_values("ts").reset_index(drop=True)
    when = pd.to_datetime(out["ts"], unit="s").dt.strftime("%Y-%m-%d %H:%M")
    return out.drop(columns="ts").assign(when=when)[["when", *cols[1:]]]


def measured_order(rows: pd.DataFrame, host: str) -> dict[str, tuple[bool, float]]:
    """Cost key -> (jittery, mean samples/s) of its ok runs on ``host``: jittery when most of
    them had a tail iter p90/p50 above the ranking's limit (a race's leader must be steady)."""
    ok = rows[(rows["host"] == host) & (rows["status"] == "ok")]
    ok = ok[ok["tail_samples_per_sec_mean"].notna()]
    out = {}
    for key, df in ok.groupby("cost_key"):
        ratios = df["iter_p90_over_p50"].dropna()
        jittery = bool(len(ratios)) and float((ratios > UNSTABLE_RATIO).mean()) > 0.5
        out[key] = (jittery, float(df["tail_samples_per_sec_mean"].mean()))
    return out


def known_failures(rows: pd.DataFrame, host: str) -> dict[str, dict[str, Any]]:
    """Cost key -> the newest failure on ``host`` that still holds (out of memory), for a
    configuration that never ran ok there since."""
    ran = ~rows["status"].isin(["skipped", "pending", "interrupted"])  # what a run said
    here = rows[(rows["host"] == host) & ran].sort_values("ts", kind="stable")
    out: dict[str, dict[str, Any]] = {}
    for key, df in here.groupby("cost_key"):
        last = df.iloc[-1]
        reason = str(last["failure_reason"] or "")
        if last["status"] != "ok" and any(w in reason.lower() for w in _LASTING):
            when = pd.to_datetime(last["ts"], unit="s").strftime("%Y-%m-%d %H:%M")
            out[key] = {"reason": reason.splitlines()[0][:200], "sweep": last["sweep"],
                        "when": when}  # fmt: skip
    return out


def _samples(df: pd.DataFrame) -> list[float]:
    ok = df[df["status"] == "ok"]["tail_samples_per_sec_mean"].dropna()
    return [float(x) for x in ok if x > 0]


def _ratio(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """b/a and its 95 % band (Welch on the two means, by the delta method; the noise floor
    when either side has one run, and never narrower than it)."""
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    ratio = mb / ma
    half = NOISE_FLOOR * ratio
    if len(a) > 1 and len(b) > 1:
        va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
        se = ratio * math.sqrt(va / ma**2 + vb / mb**2)
        dof = (va + vb) ** 2 / ((va**2 / (len(a) - 1)) + (vb**2 / (len(b) - 1)) or 1e-12)
        half = max(half, t_quantile(0.975, max(1, int(dof))) * se)
    return ratio, ratio - half, ratio + half


def warm_start(runs: list, rows: pd.DataFrame, host: str) -> tuple[list, dict[str, str], list[str]]:
    """A race or a budget on a host seen before: ``runs`` (RunSpecs, in their planned order)
    with each repeat round's groups ordered by what was measured there (steady groups fastest
    first: an early strong leader stops the slower groups sooner; jittery ones after them;
    groups never measured keep their place after those), the runs of groups known to fail there (``known_failures``) to skip (run -> why), and
    one line per skipped group and one for the order."""
    from platform.storage.catalogue import cost_key

    measured = measured_order(rows, host)
    failing = known_failures(rows, host)
    skips: dict[str, str] = {}
    lines: list[str] = []
    for run in runs:
        bad = failing.get(cost_key(run.config))
        if bad is None:
            continue
        why = f"known to fail on this host: {bad['reason']} (sweep {bad['sweep']}, {bad['when']})"
        skips[run.name] = f"not run: {why}"
        if not any(line.startswith(f"history: skipping {run.group}:") for line in lines):
            lines.append(f"history: skipping {run.group}: {why}")
    never = (True, True, 0.0)  # after every group measured here, in the space's order

    def place(run) -> tuple:
        found = measured.get(cost_key(run.config))
        return never if found is None else (False, found[0], -found[1])

    ordered = sorted(runs, key=lambda r: (r.repeat, place(r)))
    known = sum(1 for g in {cost_key(r.config) for r in runs} if g in measured)
    if known:
        lines.append(
            f"history: {known} of {len({r.group for r in runs})} group(s) measured on this host "
            "before; they run first, fastest first (--no-history: the space's order)"
        )
    return ordered, skips, lines
