"""The search-space schema: :class:`SearchSpace` (swept keys, fixed keys, cases, repeats and
its plans), ``--set`` overrides applied to it and their inverse (:func:`override`), and the
space written back as YAML. Loading a file is in ``load``, expanding it into runs in ``expand``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import yaml

from platform.errors import UsageError
from platform.spaces._validate import as_bool, grid_values, known_key, positive_int
from platform.spaces.keys import defaults
from platform.spaces.plans import DataPlan, SchedulerPlan, SearchPlan
from trainables.config import ConfigError, coerce_value

__all__ = ["SWEEP_KEYS", "SearchSpace", "copy_case", "override"]

SWEEP_KEYS = ("repeats", "max_concurrent_trials", "stop_on_error")


@dataclass
class SearchSpace:
    """A validated sweep definition: swept keys (``grid``), the rest (``fixed``) and repeats."""

    name: str
    description: str = ""
    repeats: int = 1
    max_concurrent_trials: int = 1
    stop_on_error: bool = False  # end the sweep at the first failed run (the rest stay pending)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)
    cases: list[dict[str, Any]] = field(default_factory=list)
    data: DataPlan | None = None
    source: str = ""
    # Swept values that pick the group the others are compared with (the analysis' vs_baseline).
    baseline: dict[str, Any] = field(default_factory=dict)
    # Keys whose baseline value a ``--set`` list left out, with the value the baseline had: the
    # baseline took the list's first value instead (describe.baseline_notes says so).
    baseline_moved: dict[str, Any] = field(default_factory=dict)
    scheduler: SchedulerPlan = field(default_factory=SchedulerPlan)
    search: SearchPlan = field(default_factory=SearchPlan)
    # What --space takes to load it again: the name, or the absolute path of a file elsewhere.
    ref: str = ""

    def __post_init__(self):
        self.ref = self.ref or self.name

    @property
    def swept_keys(self) -> list[str]:
        """Keys that differ between runs: those of the cases (and of their own grids), then
        those of the grid."""
        keys = [k for case in self.cases for k in (*case, *case.get("grid", {})) if k != "grid"]
        return list(dict.fromkeys(keys)) + list(self.grid)

    def _baseline_value(self, key: str) -> Any:
        """The value ``key`` has in the baseline group: the baseline's, the fixed one, or the
        config default when the space leaves it alone (None when it is swept elsewhere)."""
        if key in self.baseline:
            return self.baseline[key]
        if key in self.fixed:
            return self.fixed[key]
        if key in self.swept_keys:
            return None
        return defaults().get(key)

    def to_yaml(self) -> str:
        """The space as a YAML file that ``--space PATH.yaml`` loads back to the same runs (the
        runbook translation prints it so users can move to a space file)."""
        import dataclasses

        out: dict[str, Any] = {"description": self.description or self.name}
        out.update(
            repeats=self.repeats,
            max_concurrent_trials=self.max_concurrent_trials,
            stop_on_error=self.stop_on_error,
        )
        if self.cases:
            out["cases"] = [copy_case(c) for c in self.cases]
        if self.grid:
            out["grid"] = dict(self.grid)
        out["fixed"] = dict(self.fixed)
        if self.baseline:
            out["baseline"] = dict(self.baseline)
        if self.data is not None:
            out["data"] = dataclasses.asdict(self.data)
        if self.scheduler.name != "fifo":
            out["scheduler"] = dataclasses.asdict(self.scheduler)
        if self.search.name != "grid":
            out["search"] = dataclasses.asdict(self.search)
        return yaml.dump(out, Dumper=_SpaceDumper, sort_keys=False, width=100)

    def with_overrides(self, overrides: list[str]) -> SearchSpace:
        """``key=value`` pairs, values parsed as YAML; a list value makes the key swept."""
        space = SearchSpace(
            **{
                **self.__dict__,
                "grid": dict(self.grid),
                "fixed": dict(self.fixed),
                "cases": [copy_case(c) for c in self.cases],
                "baseline": dict(self.baseline),
                "baseline_moved": dict(self.baseline_moved),
            }
        )
        # Whether a baseline is kept is the space's, not what earlier --sets of this call left:
        # --set micro_batch=8 (which empties smoke's baseline) before or after a list alike.
        had_baseline = bool(self.baseline)
        for item in overrides:
            key, sep, raw = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise UsageError(f"--set {item!r}: expected key=value, e.g. --set max_steps=100")
            try:
                value = yaml.safe_load(raw)
            except yaml.YAMLError:
                value = raw
            where = f"--set {item}"
            if key == "stop_on_error":
                space.stop_on_error = as_bool(key, value, where)
                continue
            plan, _, field_name = key.partition(".")
            if plan in ("scheduler", "search"):
                setattr(space, plan, _override_plan(getattr(space, plan), field_name, value, where))
                continue
            if key in SWEEP_KEYS:
                setattr(space, key, positive_int(key, value, where))
                continue
            known_key(key, where)
            space._set_config_key(key, value, where, had_baseline)
        # Cases whose keys were all set are gone; the same case twice is one case.
        cases: list[dict[str, Any]] = []
        for case in space.cases:
            if not case.get("grid", True):  # its own grid lost every key
                case.pop("grid")
            if case and case not in cases:
                cases.append(case)
        space.cases = cases
        space.source = self.source + (" + --set " + " ".join(overrides) if overrides else "")
        return space

    def _set_config_key(self, key: str, value: Any, where: str, had_baseline: bool) -> None:
        """``--set key=value`` of a config key: a list sweeps it, any other value fixes it. A
        baseline still names one group: the one with the value the key had, or the list's first
        (recorded in ``baseline_moved``)."""
        # The value the space's baseline had, however many --sets of this key moved it since.
        before = self.baseline_moved.pop(key, self._baseline_value(key))
        self.grid.pop(key, None)
        self.fixed.pop(key, None)
        for case in self.cases:
            case.pop(key, None)
            case.get("grid", {}).pop(key, None)
        if not isinstance(value, list):
            self.fixed[key] = value
            self.baseline.pop(key, None)  # no longer swept: it tells no group apart
            return
        self.grid[key] = grid_values(key, value, where)
        if not had_baseline:
            return
        self.baseline[key] = _pick(key, value, before)
        if before is not None and not _same(key, self.baseline[key], before):
            self.baseline_moved[key] = before


def _same(key: str, a: Any, b: Any) -> bool:
    try:
        return coerce_value(key, a) == coerce_value(key, b)
    except ConfigError:
        return a == b


def _pick(key: str, values: list[Any], before: Any) -> Any:
    """The baseline's value of a key that ``--set`` now sweeps: the one it had, when the list
    still holds it, else the list's first."""
    try:
        wanted = coerce_value(key, before)
        return next(v for v in values if coerce_value(key, v) == wanted)
    except (ConfigError, StopIteration):
        return values[0]


def override(key: str, value: Any) -> str:
    """``key=value`` text that ``SearchSpace.with_overrides`` reads back as ``value``: YAML,
    with a string quoted where its plain text would read as something else (a path holding
    ``#`` or ``: ``, ``on``, ``1.0``)."""
    return f"{key}={_override_text(value)}"


def _override_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_override_text(v) for v in value) + "]"
    text = str(value)
    if isinstance(value, str):
        try:
            plain = yaml.safe_load(text) == value
        except yaml.YAMLError:
            plain = False
        if not plain:
            return json.dumps(value)  # JSON strings are YAML strings
    return text


class _SpaceDumper(yaml.SafeDumper):
    """Mappings as blocks, lists inline (``micro_batch: [160, 192]``), as the space files are
    written by hand."""


_SpaceDumper.add_representer(
    list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True)
)


def _override_plan(plan, field_name: str, value: Any, where: str):
    """``--set scheduler=race``, ``--set scheduler.noise_floor=0.05``, ``--set search={name:
    random, num_samples: 4}``: the plan with those fields changed, checked again."""
    import dataclasses

    fields = dataclasses.asdict(plan)
    if field_name:
        fields[field_name] = value
    elif isinstance(value, dict):
        fields.update(value)
    else:
        fields["name"] = value
    return type(plan).parse(fields, where)


def copy_case(case: dict[str, Any]) -> dict[str, Any]:
    """A case with its own ``grid`` copied too, so changing the copy leaves ``case`` alone."""
    out = dict(case)
    if "grid" in out:
        out["grid"] = dict(out["grid"])
    return out
