"""The sweep's answer in words: the verdict line that opens report.html (the winner, its x
baseline, how sure the ranking is and what would make it surer, the command that trains it),
summary.md's line on the noise between the top two, and the legend of the console's ranking.
The winner's probability of being the fastest comes from confidence.py (summary.json's
``confidence``).

Plain text, commands in backticks (summary.md is markdown; the page makes them <code>). How
sure is ``confidence.top_two_within_noise``: the runner-up's 95 % interval against the winner
(runs and windows resampled) reaches 1 (within noise), stays below it (clearly ahead), or
cannot be told (a group with fewer than 2 ok runs). The same interval as the "How sure" line's,
so the two never disagree.
"""

from __future__ import annotations

from typing import Any

from platform.analysis import stats

__all__ = ["NOISE_LINES", "jittery_legend", "noise_line", "verdict"]

NOISE_LINES = {
    True: (
        "The top two groups are within noise of each other (the runner-up's 95 % interval "
        "against the winner, runs and windows resampled, reaches 1)."
    ),
    False: (
        "The top two groups are apart beyond noise (the runner-up's 95 % interval against the "
        "winner, runs and windows resampled, stays below 1)."
    ),
    None: "Noise between the top two cannot be told: run 2 or more repeats per group.",
}
# Repeats per group of the retest that tells the top two apart when a group has one run: 3 is
# the fewest from which the robust mean drops the fastest and the slowest.
RETEST_REPEATS = 3


def noise_line(noise: bool | None) -> str:
    """summary.md's sentence on the noise between the top two (and the page's, under the
    ranking); ``noise``: summary.json's ``top_two_within_noise``."""
    return NOISE_LINES[noise]


def jittery_legend(unstable_ratio: float) -> str:
    """What the console ranking's ``*`` means, and why those groups sit after slower ones."""
    return (
        f"* jittery: tail iter p90/p50 above {unstable_ratio:g} in most of its ok runs (or it "
        "left the race as unstable or failed); ranked after every steady group whatever its "
        "samples/s, so rank 1 (best_config.json) is the fastest steady group. The ranking's "
        "own flag, not the Phase B check (python -m platform.stability)."
    )


def verdict(
    summary: dict[str, Any], ranking: list[dict[str, Any]], best: dict[str, Any], root: str = ""
) -> str:
    """One line: who won, by how much over the baseline, how sure, what would make it surer
    and the command that trains it; or that nothing won. ``summary``: summary.json;
    ``ranking``: ranked_groups.csv's rows in order; ``best``: best_config.json; ``root``: the
    output root's folder as the retest command names it ('' for none: a root on object storage,
    or a folder without the sweep's files, which --from-ranked reads)."""
    measured = [g for g in ranking if (stats.finite(g.get("runs_ok")) or 0) > 0]
    if not measured:
        counts = summary.get("status_counts") or {}
        said = ", ".join(f"{status} {n}" for status, n in counts.items()) or "no runs"
        return f"Verdict: no winner: no run finished ok ({said}); Failed runs below says why."
    top = next((g for g in measured if g["group"] == best.get("group")), measured[0])
    wins = "leads so far" if summary.get("partial") else "wins"  # an interrupted sweep
    parts = [
        f"{top['group']} {wins} with {stats.finite(top.get('tail_samples_per_sec_robust')):.1f} tail "
        "samples/s"
        + ("; it is jittery (every group is)" if _true(top.get("unstable_group")) else "")
        + _pooled(top),
        _baseline(top, ranking),
    ]
    second = next((g for g in measured if g is not top), None)
    retest = (best.get("space"), root)
    parts.append(_how_sure(top, second, summary.get("top_two_within_noise"), retest))
    sure = summary.get("confidence")
    if sure and second is not None and sure.get("best_group") == top["group"]:
        parts.append(_p_fastest(sure))
    command = best.get("command")
    parts.append(f"train it with `{command}`" if command else "no best_config.json to train it")
    return "Verdict: " + "; ".join(parts) + "."


def _pooled(top: dict[str, Any]) -> str:
    """' (pooled: ...)' for a winner ranked on its runs here and the catalogue's
    (platform/analysis/pooled.py), '' otherwise: never shown as this sweep's alone."""
    there = int(stats.finite(top.get("runs_catalogue")) or 0)
    if not there:
        return ""
    here = int(stats.finite(top.get("runs_ok")) or 0) - there
    return (
        f" (pooled: {here} run(s) here and {there} earlier run(s) on this host from the "
        f"catalogue, sweep(s) {str(top.get('catalogue_sweeps') or '').replace(';', ', ')})"
    )


def _baseline(top: dict[str, Any], ranking: list[dict[str, Any]]) -> str:
    """The winner against the baseline group, or why there is no such figure."""
    if _true(top.get("baseline")):
        return "it is the baseline"
    base = next((g for g in ranking if _true(g.get("baseline"))), None)
    if not any("baseline" in g for g in ranking):  # a ranking from before baselines
        return "x baseline: not recorded in this ranking"
    if base is None:
        return "x baseline: none (no group of this sweep is its space's baseline)"
    ratio = stats.finite(top.get("vs_baseline"))
    if ratio is None:
        return f"x baseline: unknown (the baseline, {base['group']}, has no ok run)"
    return f"{ratio:.2f}x the baseline ({base['group']})"


def _how_sure(top: dict, second: dict | None, noise: bool | None, retest: tuple) -> str:
    """How sure the winner is against the runner-up, with the figures, and what would make it
    surer (a retest of the top two: platform/control/promote.py)."""
    if second is None:
        return "the only group measured, so nothing to compare it with"
    name, runs = second["group"], [int(stats.finite(g.get("runs_ok")) or 0) for g in (top, second)]
    a, b = (
        stats.finite(top["tail_samples_per_sec_robust"]),
        stats.finite(second["tail_samples_per_sec_robust"]),
    )
    if a and b and a < b:  # only a jittery group ranks after a faster steady one
        return f"ahead of {name} only because {name} is jittery ({(b / a - 1) * 100:.1f} % faster)"
    gap = f"{(a / b - 1) * 100:.1f} % faster" if a and b else "?"
    jitter = f"; {name} is jittery" if _true(second.get("unstable_group")) else ""
    interval = f"its 95 % interval against the winner {_ratio_interval(second)}"
    if noise is True:
        more = max(2 * max(runs), RETEST_REPEATS)
        return (
            f"within noise of {name} ({gap}{jitter}; {interval} reaches 1): more repeats of "
            f"the two, or more steps per run, would separate them{_retest(*retest, more)}"
        )
    if noise is False:
        return (
            f"clearly ahead of {name} ({gap}{jitter}; {interval}, {runs[0]} and {runs[1]} ok runs)"
        )
    few = "one ok run per group" if max(runs) == 1 else f"{runs[0]} and {runs[1]} ok runs"
    return (
        f"how sure cannot be told with {few} ({gap} than {name}{jitter}): run 2 or more repeats of "
        f"the top two{_retest(*retest, RETEST_REPEATS)}"
    )


def _p_fastest(sure: dict[str, Any]) -> str:
    """The winner's probability of being the fastest (confidence.py), and what it rests on."""
    rests = (
        "runs and windows resampled"
        if sure.get("runs_min", 0) >= 2
        else "window noise only: a group has one run"
    )
    return f"P(fastest) {sure['p_fastest']:.2f} ({rests})"


def _retest(space: str | None, root: str, repeats: int) -> str:
    """': `python -m platform.tune --from-ranked ...`' for an output root's folder of a known
    space ('' otherwise)."""
    if not root or not space:
        return ""
    return (
        f": `python -m platform.tune --space {space} --from-ranked {root} --top 2 "
        f"--repeats {repeats}`"
    )


def _ratio_interval(g: dict[str, Any]) -> str:
    """A group's 95 % interval against the winner (confidence.py), as '0.879-0.971x'."""
    low, high = stats.finite(g.get("vs_best_low")), stats.finite(g.get("vs_best_high"))
    return "-" if low is None or high is None else f"{low:.3f}-{high:.3f}x"


def _true(value: Any) -> bool:
    """A flag from summary.json (a bool) or a CSV cell (True/"True")."""
    return str(value).lower() == "true"
