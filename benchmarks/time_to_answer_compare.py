"""benchmarks/time_to_answer.py's comparison of its sweeps and its markdown: resident against
fresh per group (tails pooled over an executor's blocks), race against grid, one row per run
and per resident run's memory."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.probes.host_adjust import FIGURES, host_adjusted

__all__ = ["SAME", "blocks", "compare", "markdown", "spread_of"]

SAME = 0.03  # tail samples/s within 3 %: "the same"


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def compare(variants: dict[str, dict], schedulers: list[str], executors: list[str]) -> dict:
    """The top-level figures: per executor of the first scheduler (its first block), resident
    vs fresh (tails pooled over the blocks), and race vs grid per executor."""
    out: dict[str, Any] = {}
    first = schedulers[0]
    for e in dict.fromkeys(executors):
        v = variants[f"{first}_{e}"]
        for key in ("wall_s", "busy_share", "overhead_median_s", "overhead_max_s", "cold_start_s"):
            out[f"{key}_{e}"] = v.get(key)
    fresh, res = variants.get(f"{first}_fresh"), variants.get(f"{first}_resident")
    if fresh and res:
        out["wall_ratio_resident_over_fresh"] = res["wall_s"] / fresh["wall_s"]
        out["tail_samples_per_s"] = compare_tails(variants, first)
        out["host_adjusted"] = adjust_for_host(variants, first, out["tail_samples_per_s"])
    if "race" in schedulers and "fifo" in schedulers:
        out["race_over_grid_wall"] = {
            e: variants[f"race_{e}"]["wall_s"] / variants[f"fifo_{e}"]["wall_s"]
            for e in dict.fromkeys(executors)
        }
    return out


def blocks(variants: dict[str, dict], scheduler: str, executor: str) -> list[dict]:
    """The sweeps of one scheduler and executor, in the order they ran."""
    return [
        v
        for n, v in variants.items()
        if n == f"{scheduler}_{executor}" or n.startswith(f"{scheduler}_{executor}_")
    ]


def pooled_tails(variants: dict[str, dict], scheduler: str, executor: str, group: str) -> list:
    return [
        t
        for v in blocks(variants, scheduler, executor)
        for t in v.get("groups", {}).get(group, {}).get("run_tails") or []
    ]


def compare_tails(variants: dict[str, dict], scheduler: str) -> dict[str, dict]:
    """Each group's tail samples/s resident against fresh: summary.json's robust figures with
    one block per executor, the medians of the pooled run tails with more; and whether the
    difference lies within 3 % or within the repeat-to-repeat spread of this command."""
    fresh_blocks = blocks(variants, scheduler, "fresh")
    res_blocks = blocks(variants, scheduler, "resident")
    one_each = len(fresh_blocks) == 1 and len(res_blocks) == 1
    tails: dict[str, dict] = {}
    for g in fresh_blocks[0].get("groups", {}):
        a, b = fresh_blocks[0]["groups"][g], res_blocks[0].get("groups", {}).get(g)
        if not b:
            continue
        runs = {e: pooled_tails(variants, scheduler, e, g) for e in ("fresh", "resident")}
        c = tails[g] = {
            "fresh": a["robust"] if one_each else median(runs["fresh"]),
            "resident": b["robust"] if one_each else median(runs["resident"]),
            "basis": "robust" if one_each else "median of pooled run tails",
            "fresh_run_tail_median": median(runs["fresh"]),
            "resident_run_tail_median": median(runs["resident"]),
            "fresh_runs": len(runs["fresh"]),
            "resident_runs": len(runs["resident"]),
        }
        if c["fresh"] and c["resident"]:
            c["ratio"] = c["resident"] / c["fresh"]
            c["within_3pct"] = abs(c["ratio"] - 1) <= SAME
            # The repeat-to-repeat spread of the same group and executor in this command
            # (max / min - 1 over its runs' tails; needs two runs of an executor).
            known = [s for s in (spread_of(runs[e]) for e in runs) if s is not None]
            c["repeat_spread"] = max(known) if known else None
            c["within_spread"] = abs(c["ratio"] - 1) <= max(known) if known else None
    return tails


def adjust_for_host(variants: dict[str, dict], scheduler: str, tails: dict[str, dict]):
    """benchmarks/probes/host_adjust.py over every run of ``scheduler``'s fresh and resident blocks
    that the host canary covered; each group's adjusted ratio goes into ``tails``."""
    runs = [
        {
            "group": r["group"],
            "executor": e,
            "tail": r["tail_samples_per_s"],
            **{k: (r.get("host") or {}).get(k) for k in FIGURES},
        }
        for e in ("fresh", "resident")
        for v in blocks(variants, scheduler, e)
        for r in v.get("runs", [])
    ]
    fit = host_adjusted(runs)
    for g, row in ((fit or {}).get("groups") or {}).items():
        if g in tails and row.get("ratio"):
            tails[g]["ratio_host_adjusted"] = row["ratio"]
            tails[g]["within_3pct_host_adjusted"] = abs(row["ratio"] - 1) <= SAME
    return fit


def spread_of(tails: list[float]) -> float | None:
    """How far apart one group's runs were: max / min - 1 (None with fewer than two)."""
    tails = [t for t in tails if t]
    return max(tails) / min(tails) - 1 if len(tails) >= 2 else None


def f(x: Any, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def runs_of(variants: dict[str, dict], scheduler: str, executor: str, group: str) -> str:
    """One group's run tails under ``scheduler`` with ``executor``, block by block."""
    parts = [
        ", ".join(f(t) for t in v["groups"].get(group, {}).get("run_tails", []))
        for v in blocks(variants, scheduler, executor)
    ]
    return " / ".join(parts) or "-"


def markdown(space: str, variants: dict[str, dict], cmp: dict) -> str:
    first = next(iter(variants.values()))["scheduler"] if variants else "fifo"
    rows = [
        f"# Time to answer: `{space}`",
        "",
        "| variant | exit | wall s | runs | busy share | cold start s | overhead median s "
        "| overhead max s | per-run overheads s |",
        "| --- " * 9 + "|",
    ]
    for name, v in variants.items():
        gaps = ", ".join(f(g) for g in v.get("overheads_s", []))
        rows.append(
            f"| {name} | {v['exit_code']} | {f(v['wall_s'], '.0f')} | "
            f"{v.get('runs_started', '-')} | {f(v.get('busy_share'), '.2f')} | "
            f"{f(v.get('cold_start_s'))} | {f(v.get('overhead_median_s'))} | "
            f"{f(v.get('overhead_max_s'))} | {gaps} |"
        )
    if "wall_ratio_resident_over_fresh" in cmp:
        rows += [
            "",
            f"resident / fresh wall: {cmp['wall_ratio_resident_over_fresh']:.2f}; busy "
            f"share {f(cmp['busy_share_fresh'], '.2f')} fresh, "
            f"{f(cmp['busy_share_resident'], '.2f')} resident; per-trial overhead median "
            f"{f(cmp['overhead_median_s_fresh'])} s fresh, "
            f"{f(cmp['overhead_median_s_resident'])} s resident",
            "",
            "| group | fresh samples/s | resident samples/s | resident / fresh | within 3 % "
            "| repeat spread | within spread | resident / fresh, host-adjusted "
            "| run tails fresh | run tails resident |",
            "| --- " * 10 + "|",
        ]
        for g, c in cmp["tail_samples_per_s"].items():
            yes = {True: "yes", False: "no"}
            rows.append(
                f"| {g} | {f(c['fresh'])} | {f(c['resident'])} | "
                f"{f(c.get('ratio'), '.3f')} | {yes.get(c.get('within_3pct'), '-')} | "
                f"{f(c.get('repeat_spread'), '.3f')} | {yes.get(c.get('within_spread'), '-')} | "
                f"{f(c.get('ratio_host_adjusted'), '.3f')} | "
                f"{runs_of(variants, first, 'fresh', g)} | "
                f"{runs_of(variants, first, 'resident', g)} |"
            )
    fit = cmp.get("host_adjusted")
    if fit:
        rows += [
            "",
            f"Host-adjusted (benchmarks/probes/host_adjust.py, {fit['runs']} runs): "
            f"resident effect {f(fit['resident_effect'], '.3f')} (95 %: "
            f"{', '.join(f(v, '.3f') for v in fit['resident_effect_95'] or [None])}), R^2 "
            f"{f(fit['r2'], '.3f')} ({f(fit['r2_without_host'], '.3f')} without the host's "
            f"speed), elasticities "
            + ", ".join(f"{k} {v:.2f}" for k, v in fit["elasticity"].items()),
        ]
    for e, ratio in (cmp.get("race_over_grid_wall") or {}).items():
        rows.append(f"\nrace / grid wall ({e}): {ratio:.2f}")
    rows += [
        "",
        "| variant | run | status | startup s | to first window s | tail samples/s "
        "| compile s | compile cache | GPU SM MHz, W, C, util % | host copy GB/s |",
        "| --- " * 10 + "|",
    ]
    for name, v in variants.items():
        for r in v.get("runs", []):
            g = r.get("gpu") or {}
            nvml = ", ".join(
                f(g.get(k), ".0f") for k in ("sm_mhz", "power_w", "temp_c", "util_pct")
            )
            rows.append(
                f"| {name} | {r['run']} | {r['status']} | {f(r['startup_s'])} | "
                f"{f(r['to_first_window_s'])} | {f(r['tail_samples_per_s'])} | "
                f"{f(r['compile_s'])} | {r['compile_cache'] or '-'} | {nvml if g else '-'} | "
                f"{f((r.get('host') or {}).get('copy_gb_s'), '.2f')} |"
            )
    mem = [(n, m) for n, v in variants.items() for m in v.get("memory") or []]
    if mem:
        rows += [
            "",
            "| variant | resident group | run | outcome | rss MB after | rss growth MB "
            "| GPU alloc MB after | GPU alloc growth MB | release s |",
            "| --- " * 9 + "|",
        ]
        for n, m in mem:
            rows.append(
                f"| {n} | {m['resident_group']} | {m['run']} | {m['outcome']} | "
                f"{f(m.get('rss_mb'), '.0f')} | {f(m.get('rss_growth_mb'), '+.0f')} | "
                f"{f(m.get('gpu_allocated_mb'), '.0f')} | "
                f"{f(m.get('gpu_allocated_growth_mb'), '+.0f')} | {f(m.get('release_s'), '.2f')} |"
            )
    return "\n".join(rows) + "\n"
