"""Named search spaces: load ``search_spaces/NAME.yaml``, apply ``--set`` overrides, validate,
and expand grid x repeats into runs."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from platform.errors import UsageError
from trainables.config import ConfigError, TrialConfig, check_known_key, coerce_value

__all__ = [
    "check_inputs",
    "DataPlan",
    "SchedulerPlan",
    "SearchPlan",
    "SPACES_DIR",
    "RESOURCE_KEYS",
    "RunSpec",
    "SearchSpace",
    "expand_runs",
    "list_spaces",
    "load_space",
]

SPACES_DIR = Path(__file__).resolve().parents[2] / "search_spaces"
TOP_LEVEL_KEYS = (
    "description",
    "repeats",
    "max_concurrent_trials",
    "stop_on_error",
    "resources",
    "grid",
    "fixed",
    "cases",
    "data",
    "baseline",
    "scheduler",
    "search",
)
DATA_KEYS = ("synth", "target_sr", "trim")
SYNTH_KEYS = ("speakers", "chapters", "utts", "seed", "mode")
RESOURCE_KEYS = (
    "train_workers",
    "use_gpu",
    "cpus_per_worker",
    "nodes",
    "placement_strategy",
)
SWEEP_KEYS = ("repeats", "max_concurrent_trials", "stop_on_error")

# Short name tokens of swept keys. The first four always appear (the runbooks' names); the rest
# appear only when swept.
_ALWAYS = (
    ("zero_stage", "z"),
    ("micro_batch", "mb"),
    ("num_workers", "nw"),
    ("prefetch_factor", "pf"),
)
_TOKENS = {
    "strategy": "",
    "bucket_mb": "bk",
    "train_workers": "w",
    "model_size": "",
    "audio_s": "a",
    "run_timeout_s": "rt",
    "stall_timeout_s": "stall",
    "inject_sleep_at_step": "sleep",
    "inject_sleep_s": "slp",
    "inject_sleep_every": "every",
    "inject_error_at_step": "err",
    "crop_buckets_s": "cb",
    "compile_mode": "cm",
    "compile_scope": "cs",
    "optimizer": "opt",
    "ddp_gradient_as_bucket_view": "gbv",
}


@dataclass(frozen=True)
class DataPlan:
    """A space without a dataset: generate a synthetic LibriSpeech-layout corpus of this size
    and prepare it with data_prep (on the sweep's cluster) before the first trial."""

    synth: dict[str, Any]
    target_sr: int = 16_000
    trim: bool = True

    def describe(self) -> str:
        s = self.synth
        return (
            f"synthetic corpus ({s.get('speakers', 4)} speakers x {s.get('chapters', 2)} chapters "
            f"x {s.get('utts', 10)} utterances{', learnable' if s.get('mode') == 'learnable' else ''}), "
            f"prepared to {self.target_sr} Hz" + (" with silence trimming" if self.trim else "")
        )


SCHEDULERS = ("fifo", "asha", "race")
SEARCHES = ("grid", "random", "optuna")


@dataclass(frozen=True)
class SchedulerPlan:
    """``scheduler:`` how runs are stopped early. ``fifo``: never (every run to max_steps);
    ``asha``: Tune's ASHAScheduler on the run's samples/s after the warm-up windows; ``race``:
    platform/race.py, a noise-aware racing of the groups (docs/ARCHITECTURE.md, "Racing").

    A run's first ``warmup_windows`` windows never count. ``race``: a group is judged once it has
    ``min_windows`` clean windows (no stall alert, no epoch boundary); its bounds are the mean
    samples/s +- the largest of the Student-t half-width at ``confidence`` over its windows,
    the same over its runs' means (2 or more runs), and ``noise_floor`` x the mean (the
    repeat-to-repeat noise one run cannot show). A group whose upper bound falls below the
    best finished, stable group's lower bound is stopped. The Phase B limits
    (``max_iter_ratio_median``, ``max_iter_ratio_max``, ``max_iter_p50_cv``, as in
    platform.stability) make a group unstable: it is stopped and cannot win. ``asha``:
    ``grace_windows`` windows after the warm-up before the first rung, ``reduction_factor``.
    """

    name: str = "fifo"
    warmup_windows: int = 2
    min_windows: int = 3
    confidence: float = 0.95
    noise_floor: float = 0.02
    max_iter_ratio_median: float = 1.5
    max_iter_ratio_max: float = 2.5
    max_iter_p50_cv: float = 0.05
    grace_windows: int = 2
    reduction_factor: int = 3

    @classmethod
    def parse(cls, raw: Any, where: str) -> SchedulerPlan:
        fields = _plan_fields(raw, "scheduler", SCHEDULERS, cls, where)
        plan = cls(**fields)
        for key in ("warmup_windows", "min_windows", "grace_windows"):
            minimum = 0 if key == "warmup_windows" else 1
            value = getattr(plan, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise UsageError(f"{where}: scheduler.{key} must be an integer >= {minimum}")
        if isinstance(plan.reduction_factor, bool) or plan.reduction_factor not in range(2, 100):
            raise UsageError(f"{where}: scheduler.reduction_factor must be an integer >= 2")
        if not 0.5 <= plan.confidence < 1:
            raise UsageError(f"{where}: scheduler.confidence must be within 0.5-1, e.g. 0.95")
        if not 0 <= plan.noise_floor < 1:
            raise UsageError(f"{where}: scheduler.noise_floor must be within 0-1, e.g. 0.02")
        for key in ("max_iter_ratio_median", "max_iter_ratio_max", "max_iter_p50_cv"):
            if not getattr(plan, key) > 0:
                raise UsageError(f"{where}: scheduler.{key} must be > 0")
        return plan


@dataclass(frozen=True)
class SearchPlan:
    """``search:`` which groups run. ``grid``: every one; ``random``: ``num_samples`` groups
    drawn without replacement (``seed``); ``optuna``: ``num_samples`` groups that Tune's
    OptunaSearch (TPE) picks one after another from the results so far."""

    name: str = "grid"
    num_samples: int = 0
    seed: int = 0

    @classmethod
    def parse(cls, raw: Any, where: str) -> SearchPlan:
        plan = cls(**_plan_fields(raw, "search", SEARCHES, cls, where))
        if isinstance(plan.num_samples, bool) or not isinstance(plan.num_samples, int):
            raise UsageError(f"{where}: search.num_samples must be an integer")
        if plan.name != "grid" and plan.num_samples < 1:
            raise UsageError(
                f"{where}: search {plan.name} needs num_samples >= 1, e.g. "
                f"search: {{name: {plan.name}, num_samples: 8}}"
            )
        if isinstance(plan.seed, bool) or not isinstance(plan.seed, int):
            raise UsageError(f"{where}: search.seed must be an integer")
        return plan


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


def _copy_case(case: dict[str, Any]) -> dict[str, Any]:
    out = dict(case)
    if "grid" in out:
        out["grid"] = dict(out["grid"])
    return out


def _plan_fields(raw: Any, what: str, names: tuple[str, ...], cls, where: str) -> dict[str, Any]:
    """``what: NAME`` or ``what: {name: NAME, key: value, ...}``, checked against ``cls``."""
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict) or "name" not in raw:
        raise UsageError(
            f"{where}: {what} must be one of {', '.join(names)} or a mapping with 'name', "
            f"e.g. {what}: {{name: {names[-1]}}}"
        )
    if raw["name"] not in names:
        raise UsageError(
            f"{where}: {what} {raw['name']!r} is unknown; use one of {', '.join(names)}"
        )
    allowed = tuple(cls.__dataclass_fields__)
    _only(raw, allowed, f"{where}: unknown key", f"in {what}")
    defaults = cls()
    for key, value in raw.items():
        default = getattr(defaults, key)
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            raw = {**raw, key: float(value)}
        elif key != "name" and type(value) is not type(default):
            raise UsageError(
                f"{where}: {what}.{key} must be a {type(default).__name__}, got {value!r}"
            )
    return dict(raw)


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
            out["cases"] = [_copy_case(c) for c in self.cases]
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
                "cases": [_copy_case(c) for c in self.cases],
                "baseline": dict(self.baseline),
            }
        )
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
                space.stop_on_error = _bool(key, value, where)
                continue
            plan, _, field_name = key.partition(".")
            if plan in ("scheduler", "search"):
                setattr(space, plan, _override_plan(getattr(space, plan), field_name, value, where))
                continue
            if key in SWEEP_KEYS:
                setattr(space, key, _positive_int(key, value, where))
                continue
            _known(key, where)
            space.grid.pop(key, None)
            space.fixed.pop(key, None)
            for case in space.cases:
                case.pop(key, None)
                case.get("grid", {}).pop(key, None)
            if not (isinstance(value, list) and space.baseline.get(key, value) in value):
                # Its value is gone, or the key is no longer swept: it picks no group.
                space.baseline.pop(key, None)
            if isinstance(value, list):
                space.grid[key] = _grid_values(key, value, where)
            else:
                space.fixed[key] = value
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


@dataclass(frozen=True)
class RunSpec:
    """One repeat of one grid point, ready to become a Tune trial."""

    name: str
    group: str
    repeat: int
    config: TrialConfig
    swept: dict[str, Any]
    baseline: bool = False  # the space's baseline group


def list_spaces(spaces_dir: Path = SPACES_DIR) -> dict[str, str]:
    """Space names and their one-line descriptions; a broken file shows its error instead."""
    out = {}
    for path in sorted(spaces_dir.glob("*.yaml")):
        try:
            out[path.stem] = load_space(path.stem, spaces_dir).description
        except (UsageError, ConfigError) as exc:
            out[path.stem] = f"(invalid: {exc})"
    return out


def space_path(name: str, spaces_dir: Path = SPACES_DIR) -> Path:
    """``NAME`` is ``search_spaces/NAME.yaml``; a value with a slash or ending in .yaml/.yml is a
    file anywhere (users keep their spaces in their own repositories)."""
    if "/" in name or name.endswith((".yaml", ".yml")):
        path = Path(name).expanduser()
        if not path.is_file():
            raise UsageError(
                f"--space {name}: no such file; give a YAML space file or a name from --list-spaces"
            )
        return path
    path = spaces_dir / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in spaces_dir.glob("*.yaml"))) or "none"
        raise UsageError(f"unknown space {name!r}; known spaces: {known} (see --list-spaces)")
    return path


def load_space(name: str, spaces_dir: Path = SPACES_DIR) -> SearchSpace:
    """A named space (``search_spaces/NAME.yaml``) or a space file anywhere (``PATH.yaml``);
    a file's space is named after its stem."""
    path = space_path(name, spaces_dir)
    ref = name if path.parent == spaces_dir else str(path.resolve())
    name = path.stem
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"{at}: YAML syntax error: {problem}; fix the file") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping with keys {', '.join(TOP_LEVEL_KEYS)}")
    _only(data, TOP_LEVEL_KEYS, f"{path}: unknown top-level key")
    where = str(path)
    grid_raw = data.get("grid") or {}
    fixed_raw = data.get("fixed") or {}
    resources = data.get("resources") or {}
    for section, value in (("grid", grid_raw), ("fixed", fixed_raw), ("resources", resources)):
        if not isinstance(value, dict):
            raise UsageError(f"{path}: '{section}' must be a mapping of key: value")
    _only(resources, RESOURCE_KEYS, f"{path}: unknown key", "in resources")
    grid = {}
    for key, values in grid_raw.items():
        _known(key, f"{where} (grid)")
        if not isinstance(values, list):
            raise UsageError(f"{path}: grid.{key} must be a list of values, e.g. [4, 8]")
        grid[key] = _grid_values(key, values, f"{where} (grid)")
    fixed = dict(resources)
    for key, value in fixed_raw.items():
        _known(key, f"{where} (fixed)")
        if key in grid or key in resources:
            raise UsageError(f"{path}: {key!r} is set twice (grid, fixed or resources); keep one")
        fixed[key] = value
    baseline = data.get("baseline") or {}
    if not isinstance(baseline, dict):
        raise UsageError(f"{path}: 'baseline' must be a mapping of swept keys to their values")
    for key in baseline:
        _known(key, f"{where} (baseline)")
    return SearchSpace(
        baseline=dict(baseline),
        cases=_cases(data.get("cases"), grid, fixed, path),
        data=_data_plan(data.get("data"), path),
        name=name,
        ref=ref,
        description=str(data.get("description", "")).strip().splitlines()[0]
        if data.get("description")
        else "",
        repeats=_positive_int("repeats", data.get("repeats", 1), where),
        max_concurrent_trials=_positive_int(
            "max_concurrent_trials", data.get("max_concurrent_trials", 1), where
        ),
        stop_on_error=_bool("stop_on_error", data.get("stop_on_error", False), where),
        scheduler=SchedulerPlan.parse(data.get("scheduler", "fifo"), where),
        search=SearchPlan.parse(data.get("search", "grid"), where),
        grid=grid,
        fixed=fixed,
        source=str(path),
    )


def _cases(raw: Any, grid: dict, fixed: dict, path: Path) -> list[dict[str, Any]]:
    """Explicit combinations (a list of mappings) crossed with the grid, for keys whose valid
    values depend on each other (ddp with zero_stage 0, deepspeed with 0-3). A case's own
    ``grid:`` sweeps keys only within that case (bucket_mb only for ddp)."""
    if raw is None:
        return []
    if not isinstance(raw, list) or not raw or not all(isinstance(c, dict) and c for c in raw):
        raise UsageError(
            f"{path}: 'cases' must be a list of mappings, e.g. - {{strategy: ddp, zero_stage: 0}}"
        )
    out = []
    for case in raw:
        own = case.get("grid", {})
        if not isinstance(own, dict) or ("grid" in case and not own):
            raise UsageError(
                f"{path}: a case's 'grid' must be a mapping of key: [values], e.g. "
                "- {strategy: ddp, grid: {bucket_mb: [25, 100]}}"
            )
        for key in (*case, *own):
            if key == "grid":
                continue
            _known(key, f"{path} (cases)")
            if key in grid or key in fixed:
                raise UsageError(
                    f"{path}: {key!r} is set in cases and in grid/fixed/resources; keep one"
                )
            if key in case and key in own:
                raise UsageError(f"{path}: {key!r} is set twice in one case; keep one")
        for key, values in own.items():
            if not isinstance(values, list):
                raise UsageError(f"{path}: a case's grid.{key} must be a list of values")
            _grid_values(key, values, f"{path} (cases)")
        out.append(_copy_case(case))
    return out


def _only(mapping: dict[str, Any], allowed: tuple[str, ...], prefix: str, where: str = "") -> None:
    """Refuse the first key of ``mapping`` that is not in ``allowed``, naming the allowed ones."""
    for key in mapping:
        if key not in allowed:
            at = f" {where}" if where else ""
            raise UsageError(f"{prefix} {key!r}{at}; allowed: {', '.join(allowed)}")


def _data_plan(raw: Any, path: Path) -> DataPlan | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("synth"), dict):
        raise UsageError(
            f"{path}: 'data' must be a mapping with a 'synth' mapping, e.g. data: {{synth: {{utts: 4}}}}"
        )
    _only(raw, DATA_KEYS, f"{path}: unknown key", "in data")
    _only(raw["synth"], SYNTH_KEYS, f"{path}: unknown key", "in data.synth")
    for key, value in raw["synth"].items():
        if key == "mode":
            from data_prep.synth import MODES

            if value not in MODES:
                raise UsageError(
                    f"{path}: data.synth.mode must be one of {', '.join(MODES)}, got {value!r}"
                )
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < (0 if key == "seed" else 1)
        ):
            raise UsageError(f"{path}: data.synth.{key} must be a positive integer, got {value!r}")
    target_sr = raw.get("target_sr", 16_000)
    if isinstance(target_sr, bool) or not isinstance(target_sr, int) or target_sr < 1000:
        raise UsageError(f"{path}: data.target_sr must be an integer rate in Hz, got {target_sr!r}")
    trim = raw.get("trim", True)
    if not isinstance(trim, bool):
        raise UsageError(f"{path}: data.trim must be true or false, got {trim!r}")
    return DataPlan(synth=dict(raw["synth"]), target_sr=target_sr, trim=trim)


def expand_runs(space: SearchSpace, prefix: str = "sweep") -> list[RunSpec]:
    """Every case x grid point x repeat, validated. Repeats are the outer loop (r1 of every group, then
    r2, ...), so slow drift of the machine spreads over all groups instead of one."""
    points = space_points(space)
    keys = space.swept_keys
    groups: dict[str, tuple[dict[str, Any], TrialConfig]] = {}
    for point in points:
        try:
            cfg = TrialConfig.from_dict({**space.fixed, **point}, where=space.source)
        except ConfigError as exc:
            at = f" (grid point {_fmt_point(point)})" if point else ""
            raise ConfigError(f"{space.source}{at}: {exc}") from None
        group = group_name(prefix, cfg, keys)
        if group in groups:
            raise UsageError(
                f"{space.source}: grid points {_fmt_point(groups[group][0])} and {_fmt_point(point)} "
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
            config=cfg,
            swept=point,
            baseline=group == base,
        )
        for r in range(1, space.repeats + 1)
        for group, (point, cfg) in groups.items()
    ]


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
    if space.scheduler.name == "race" and search.name == "optuna":
        raise UsageError(
            f"{space.source}: scheduler race needs every group planned ahead; use it with "
            "search grid or random, or scheduler asha with optuna"
        )
    if search.name == "optuna":
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
            f"{space.source}: baseline {_fmt_point(space.baseline)} matches {len(found)} groups "
            f"({', '.join(found[:3]) or 'none'}); it must pick exactly one, add the swept keys "
            "that tell it apart"
        )
    return found[0]


def check_inputs(space: SearchSpace, runs: list[RunSpec]) -> None:
    """Files the runs read must exist and have the right columns before any trial starts."""
    import shutil

    if (
        any(r.config.optimizer == "deepspeed_fused_adam" for r in runs)
        and shutil.which("ninja") is None
    ):
        raise UsageError(
            "optimizer deepspeed_fused_adam compiles a CUDA extension and ninja is missing; "
            "pip install ninja, or use optimizer=adamw_torch"
        )
    _check_checkpoints(runs)
    seen: set[str] = set()
    for run in runs:
        cfg = run.config
        if cfg.dataset != "manifest":
            continue
        if not cfg.manifest_path:
            if space.data is None:
                raise UsageError(
                    f"{space.source}: dataset manifest needs manifest_path (or a data: section); "
                    "set manifest_path=PATH/manifest_16k_trim.tsv"
                )
            continue
        if cfg.manifest_path in seen:
            continue
        seen.add(cfg.manifest_path)
        path = Path(cfg.manifest_path)
        if not path.is_file():
            raise UsageError(
                f"manifest_path {path} does not exist; make it with python -m data_prep.librispeech"
            )
        from trainables.manifest import MANIFEST_REQUIRED  # imports torch: only when needed

        with path.open(encoding="utf-8") as fh:
            header = fh.readline().rstrip("\n").split("\t")
        missing = [c for c in MANIFEST_REQUIRED if c not in header]
        if missing:
            raise UsageError(
                f"manifest_path {path} lacks column(s) {', '.join(missing)}; "
                "make it with python -m data_prep.librispeech"
            )


def _check_checkpoints(runs: list[RunSpec]) -> None:
    """Pretrained folders must hold the right kind of checkpoint, and the text encoder must have
    positions for text_tokens."""
    from trainables.pretrained import checkpoint_problem, read_config

    seen: set[tuple[str, str]] = set()
    for run in runs:
        cfg = run.config
        for side, path in (
            ("speech", cfg.speech_pretrained_path),
            ("text", cfg.text_pretrained_path),
        ):
            if not path or (side, path) in seen:
                continue
            seen.add((side, path))
            problem = checkpoint_problem(path, side)
            if problem:
                raise UsageError(problem)
        if cfg.text_pretrained_path:
            positions = int(read_config(cfg.text_pretrained_path).get("max_position_embeddings", 0))
            if cfg.text_tokens > positions:
                raise UsageError(
                    f"text_tokens: {cfg.text_tokens} exceeds the {positions} positions of "
                    f"{cfg.text_pretrained_path}; lower text_tokens"
                )


def group_name(prefix: str, cfg: TrialConfig, swept: list[str]) -> str:
    """``sweep_z0_mb8_nw0_pf2`` plus a token for every other swept key."""
    tokens = [prefix]
    if "strategy" in swept:
        tokens.append({"ddp": "ddp", "deepspeed": "ds"}[cfg.strategy])
    tokens += [f"{short}{_fmt(getattr(cfg, key))}" for key, short in _ALWAYS]
    for key in swept:
        if key == "strategy" or key in dict(_ALWAYS):
            continue
        short = _TOKENS.get(key, key.replace("_", ""))
        tokens.append(f"{short}{_fmt(getattr(cfg, key))}")
    return "_".join(tokens)


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value == "":
        return "off"
    if isinstance(value, str) and "," in value:  # a comma list (crop_buckets_s): 1x1p5x2
        return "x".join(_fmt(float(v)) if _is_number(v) else _fmt(v) for v in value.split(","))
    if isinstance(value, float):
        value = f"{value:g}".replace(".", "p").replace("-", "m")
    return re.sub(r"[^A-Za-z0-9]+", "", str(value))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _fmt_point(point: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items())


def _known(key: str, where: str) -> None:
    try:
        check_known_key(key, where=where)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _grid_values(key: str, values: list[Any], where: str) -> list[Any]:
    if not values:
        raise UsageError(f"{where}: grid.{key} is an empty list; give at least one value")
    for value in values:
        try:
            coerce_value(key, value)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    if len(set(map(repr, values))) != len(values):
        raise UsageError(f"{where}: grid.{key} lists a value twice: {values}")
    return values


def _bool(key: str, value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def _positive_int(key: str, value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{where}: {key} must be an integer >= 1, got {value!r}")
    return value
