"""Expanding a search space into runs: every case x grid point (``space_points``), validated into
TrialConfigs, named, narrowed by the search plan, with the baseline group marked, and repeated
(``expand_runs`` -> :class:`RunSpec`); whether the space's own corpus is made (``needs_corpus``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from platform.errors import UsageError
from platform.spaces.names import fmt_point, group_name
from platform.spaces.space import SearchSpace
from trainables.config import ConfigError, TrialConfig, coerce_value
from trainables.resident.shape import GroupKey

__all__ = ["RunSpec", "expand_runs", "needs_corpus", "space_points"]


@dataclass(frozen=True)
class RunSpec:
    """One repeat of one grid point, ready to become a Tune trial."""

    name: str
    group: str
    repeat: int
    config: TrialConfig
    swept: dict[str, Any]
    baseline: bool = False  # the space's baseline group


def expand_runs(space: SearchSpace, prefix: str = "sweep") -> list[RunSpec]:
    """Every case x grid point x repeat, validated. Repeats are the outer loop (r1 of every group, then
    r2, ...), so slow drift of the machine spreads over all groups instead of one; within a
    repeat, groups of one worker-group shape run together (``_fewest_group_changes``)."""
    points = space_points(space)
    keys = space.swept_keys
    groups: dict[str, tuple[dict[str, Any], TrialConfig]] = {}
    for point in points:
        try:
            cfg = TrialConfig.from_dict({**space.fixed, **point}, where=space.source)
        except ConfigError as exc:
            at = f" (grid point {fmt_point(point)})" if point else ""
            raise ConfigError(f"{space.source}{at}: {exc}") from None
        group = group_name(prefix, cfg, keys)
        if group in groups:
            raise UsageError(
                f"{space.source}: grid points {fmt_point(groups[group][0])} and {fmt_point(point)} "
                f"both get the name {group}; make the swept values distinct"
            )
        groups[group] = (point, cfg)
    base = _baseline_group(space, groups)
    groups = _searched(space, groups, base)
    return [
        RunSpec(
            name=f"{group}_r{r}",
            group=group,
            repeat=r,
            config=groups[group][1],
            swept=groups[group][0],
            baseline=group == base,
        )
        for r in range(1, space.repeats + 1)
        for group in _fewest_group_changes(groups, r)
    ]


def _fewest_group_changes(groups: dict[str, tuple[dict, TrialConfig]], repeat: int) -> list[str]:
    """The groups in the order repeat ``repeat`` runs them: those a resident worker group of one
    shape can train (trainables/resident/shape.py: GroupKey) next to each other, in the space's
    order otherwise, and every other repeat in reverse order of shapes, so the shape changes as
    few times as possible; repeats stay the outer loop (the race judges a repeat of every
    group)."""
    blocks: dict[GroupKey, list[str]] = {}
    for group, (_, cfg) in groups.items():
        blocks.setdefault(GroupKey.of(cfg), []).append(group)
    ordered = list(blocks.values())
    if repeat % 2 == 0:
        ordered.reverse()
    return [group for block in ordered for group in block]


def needs_corpus(space: SearchSpace, runs: list[RunSpec]) -> bool:
    """A space's ``data`` corpus is made only when no run names a manifest of its own."""
    return space.data is not None and not any(r.config.manifest_path for r in runs)


def _searched(
    space: SearchSpace, groups: dict[str, tuple[dict, TrialConfig]], base: str | None
) -> dict[str, tuple[dict, TrialConfig]]:
    """``search: random``: ``num_samples`` of the groups, drawn with ``seed`` (the baseline
    group is always one of them), in the space's order. ``grid`` and ``optuna`` keep every group
    (optuna picks among them as the sweep goes)."""
    search = space.search
    if search.name == "grid":
        return groups
    if search.num_samples > len(groups):
        raise UsageError(
            f"{space.source}: search {search.name} num_samples {search.num_samples} exceeds the "
            f"space's {len(groups)} groups; lower num_samples or use search: grid"
        )
    if space.scheduler.name == "race" and search.plans_late:
        raise UsageError(
            f"{space.source}: scheduler race needs every group planned ahead; use it with "
            f"search grid or random, or scheduler asha with {search.name}"
        )
    if search.plans_late:  # it picks among every group as the sweep goes
        return groups
    import random

    names = list(groups)
    rest = [g for g in names if g != base]
    picked = set(random.Random(search.seed).sample(rest, search.num_samples - (base is not None)))
    return {g: v for g, v in groups.items() if g in picked or g == base}


def space_points(space: SearchSpace) -> list[dict[str, Any]]:
    """Every valid combination of swept values: each case (with its own grid) x the grid."""
    out = []
    for case in space.cases or [{}]:
        own = case.get("grid", {})
        fixed = {k: v for k, v in case.items() if k != "grid"}
        axes = {**own, **space.grid}
        for combo in itertools.product(*axes.values()):
            out.append({**fixed, **dict(zip(axes, combo, strict=True))})
    return out


def _baseline_group(space: SearchSpace, groups: dict[str, tuple[dict, TrialConfig]]) -> str | None:
    """The one group whose config has every ``baseline`` value (None without a baseline)."""
    if not space.baseline:
        return None
    want = {k: coerce_value(k, v) for k, v in space.baseline.items()}
    found = [
        g for g, (_, cfg) in groups.items() if all(getattr(cfg, k) == v for k, v in want.items())
    ]
    if len(found) != 1:
        raise UsageError(
            f"{space.source}: baseline {fmt_point(space.baseline)} matches {len(found)} groups "
            f"({', '.join(found[:3]) or 'none'}); it must pick exactly one, add the swept keys "
            "that tell it apart"
        )
    return found[0]
