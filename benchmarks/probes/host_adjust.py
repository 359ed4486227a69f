"""Tails adjusted for the host's speed at the time (issue 24): resident against fresh once the
host's drift during the command is taken out.

On two H100 hosts (benchmarks/results/time_to_answer_1xh100/tails/11_host_canary/) the tail
samples/s of eleven runs of one configuration, fresh and in-process alternating, followed what a
separate process (benchmarks/probes/host_canary.py) measured over the same seconds: its memory-copy
bandwidth (r = 0.93 on one host) and its SHA-256 speed (r = 0.85 on the other). The host's speed
moved during the command, and it moved the runs with it. A run's tail is therefore compared at
the host speed of the whole command:

    log(tail) = a_group + c * resident + b1 * log(copy GB/s) + b2 * log(SHA-256 MB/s)

fitted by least squares over every run of the command (``b``, the tail's elasticities to the
host's speeds, are learnt from runs of one group at different host speeds; ``c`` keeps the
executor's own difference out of them). Each run's adjusted tail is its tail times
(reference / its figure) ** b for each figure, the reference being the median over all runs; a
group's adjusted ratio is the median adjusted tail resident over the median adjusted tail fresh.
``resident_effect`` (exp c) comes with its 95 % interval.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

__all__ = ["FIGURES", "host_adjusted"]

FIGURES = ("copy_gb_s", "hash_mb_s")  # the canary's figures, each a term of the fit


def host_adjusted(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``runs``: dicts with group, executor ("fresh" or "resident"), tail and the canary's
    FIGURES. None when they cannot be fitted: fewer runs than the model has terms plus two, or
    one host speed only."""
    runs = [r for r in runs if (r.get("tail") or 0) > 0 and all(r.get(k) for k in FIGURES)]
    groups = sorted({r["group"] for r in runs})
    both = {r["executor"] for r in runs} >= {"fresh", "resident"}
    terms = len(groups) + both + len(FIGURES)
    if len(runs) < terms + 2 or any(len({r[k] for r in runs}) < 2 for k in FIGURES):
        return None
    import numpy as np

    x = np.zeros((len(runs), terms))
    for i, r in enumerate(runs):
        x[i, groups.index(r["group"])] = 1.0
        if both:
            x[i, len(groups)] = float(r["executor"] == "resident")
        for j, k in enumerate(FIGURES):
            x[i, terms - len(FIGURES) + j] = math.log(r[k])
    y = np.log([r["tail"] for r in runs])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    b = {k: float(coef[terms - len(FIGURES) + j]) for j, k in enumerate(FIGURES)}
    ref = {k: statistics.median(r[k] for r in runs) for k in FIGURES}
    base = x[:, : terms - len(FIGURES)]
    out: dict[str, Any] = {
        "elasticity": b,
        "resident_effect": None,
        "resident_effect_95": None,
        "r2": r_squared(x, y, coef),
        "r2_without_host": r_squared(base, y, np.linalg.lstsq(base, y, rcond=None)[0]),
        "reference": ref,
        "runs": len(runs),
        "groups": {},
    }
    if both:
        c, half = float(coef[len(groups)]), interval(x, y, coef, len(groups))
        out["resident_effect"] = math.exp(c)
        out["resident_effect_95"] = [math.exp(c - half), math.exp(c + half)] if half else None

    def adjusted(r: dict[str, Any]) -> float:
        return r["tail"] * math.prod((ref[k] / r[k]) ** b[k] for k in FIGURES)

    for g in groups:
        adj = {
            e: [adjusted(r) for r in runs if r["group"] == g and r["executor"] == e]
            for e in ("fresh", "resident")
        }
        row = {f"{e}_adjusted": statistics.median(v) if v else None for e, v in adj.items()}
        if row["fresh_adjusted"] and row["resident_adjusted"]:
            row["ratio"] = row["resident_adjusted"] / row["fresh_adjusted"]
        out["groups"][g] = row
    return out


def interval(x, y, coef, j: int) -> float | None:
    """Half the 95 % interval of coefficient j (normal approximation; None if singular)."""
    import numpy as np

    n, p = x.shape
    resid = y - x @ coef
    try:
        cov = float((resid**2).sum()) / (n - p) * np.linalg.inv(x.T @ x)
    except np.linalg.LinAlgError:
        return None
    return 1.96 * math.sqrt(max(float(cov[j, j]), 0.0))


def r_squared(x, y, coef) -> float | None:
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - x @ coef) ** 2).sum()) / ss_tot if ss_tot > 0 else None
