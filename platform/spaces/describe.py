"""The plan a dry run prints (``python -m platform.tune --dry-run``): the space, how many runs,
how they are searched and scheduled, the fixed keys grouped by family, the corpus made first,
a line when a ``--set`` moved the baseline (``baseline_notes``; the real run prints it too), and
one line per run with its swept values."""

from __future__ import annotations

from platform.spaces.expand import RunSpec, needs_corpus
from platform.spaces.keys import format_grouped
from platform.spaces.space import SearchSpace, override

__all__ = ["baseline_notes", "format_plan"]


def format_plan(space: SearchSpace, runs: list[RunSpec]) -> str:
    configs = [r.config.to_dict() for r in runs]
    # Swept keys, and keys that follow them (strategy auto: ddp for z0, deepspeed for z1-z3).
    swept = space.swept_keys + [
        k
        for k in configs[0]
        if k not in space.swept_keys and len({repr(c[k]) for c in configs}) > 1
    ]
    fixed = {k: v for k, v in configs[0].items() if k not in swept}
    lines = [
        f"space {space.name}: {space.description}",
        f"{len(runs)} runs = {len(runs) // space.repeats} groups x {space.repeats} repeats, "
        f"{space.max_concurrent_trials} at a time",
        _schedule_line(space, len(runs) // space.repeats),
        "fixed:",
        format_grouped(fixed),
    ]
    if needs_corpus(space, runs):
        lines.append(f"data: {space.data.describe()}, before the first run")
    lines += baseline_notes(space, runs)
    width = max(len(r.name) for r in runs)
    header = f"{'#':>3}  {'run':<{width}}  " + "  ".join(f"{k:>12}" for k in swept)
    lines += ["", header, "-" * len(header)]
    for i, run in enumerate(runs, start=1):
        values = "  ".join(f"{getattr(run.config, k)!s:>12}" for k in swept)
        mark = "  (baseline)" if run.baseline else ""
        lines.append(f"{i:>3}  {run.name:<{width}}  {values}{mark}")
    return "\n".join(lines)


def baseline_notes(space: SearchSpace, runs: list[RunSpec]) -> list[str]:
    """One line per key whose baseline value a ``--set`` list left out: the baseline moved to a
    group the space never named (the list's first value), and the comparisons with it too."""
    group = next((r.group for r in runs if r.baseline), None)
    now = f"the baseline is now {group}" if group else "no group is the baseline now"
    return [
        f"baseline: {key} {value} is not in --set {override(key, space.grid[key])}; {now} "
        f"({key} {space.baseline[key]}, the list's first value)"
        for key, value in space.baseline_moved.items()
        if key in space.grid and key in space.baseline
    ]


def _schedule_line(space: SearchSpace, groups: int) -> str:
    search, sched = space.search, space.scheduler
    what = {
        "grid": "search grid: every group",
        "random": f"search random: {groups} groups drawn (seed {search.seed})",
        "optuna": f"search optuna: {search.num_samples} of these {groups} groups, picked as "
        f"the sweep goes (seed {search.seed})",
    }[search.name]
    how = {
        "fifo": "scheduler fifo: every run to max_steps",
        "asha": f"scheduler asha: warm-up {sched.warmup_windows} windows, first rung after "
        f"{sched.grace_windows} more, reduction factor {sched.reduction_factor}",
        "race": f"scheduler race: warm-up {sched.warmup_windows} windows, judged after "
        f"{sched.min_windows} clean windows at {sched.confidence:g} confidence, noise floor "
        f"{sched.noise_floor:g}; slower and unstable groups stop early, survivors get the repeats",
    }[sched.name]
    return f"{what}; {how}"
