"""Loading named search spaces: find ``search_spaces/NAME.yaml`` (or a space file anywhere),
read it and check every section (grid, fixed, resources, cases, data, baseline, plans) into a
:class:`SearchSpace`, with errors that name the file and the key."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml

from platform.errors import UsageError
from platform.spaces._validate import as_bool, grid_values, known_key, only_keys, positive_int
from platform.spaces.plans import DataPlan, SchedulerPlan, SearchPlan
from platform.spaces.space import SearchSpace, copy_case
from trainables.config import ConfigError

__all__ = ["RESOURCE_KEYS", "SPACES_DIR", "list_spaces", "load_space", "space_path"]

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
        names = sorted(p.stem for p in spaces_dir.glob("*.yaml"))
        by_lower = {n.lower(): n for n in names}  # SMOKE is smoke mistyped
        close = difflib.get_close_matches(name.lower(), by_lower, n=1)
        if close:
            raise UsageError(
                f"unknown space {name!r}; did you mean {by_lower[close[0]]!r}? (see --list-spaces)"
            )
        known = ", ".join(names) or "none"
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
    only_keys(data, TOP_LEVEL_KEYS, f"{path}: unknown top-level key")
    where = str(path)
    grid_raw = data.get("grid") or {}
    fixed_raw = data.get("fixed") or {}
    resources = data.get("resources") or {}
    for section, value in (("grid", grid_raw), ("fixed", fixed_raw), ("resources", resources)):
        if not isinstance(value, dict):
            raise UsageError(f"{path}: '{section}' must be a mapping of key: value")
    only_keys(resources, RESOURCE_KEYS, f"{path}: unknown key", "in resources")
    grid = {}
    for key, values in grid_raw.items():
        known_key(key, f"{where} (grid)")
        if not isinstance(values, list):
            raise UsageError(f"{path}: grid.{key} must be a list of values, e.g. [4, 8]")
        grid[key] = grid_values(key, values, f"{where} (grid)")
    fixed = dict(resources)
    for key, value in fixed_raw.items():
        known_key(key, f"{where} (fixed)")
        if key in grid or key in resources:
            raise UsageError(f"{path}: {key!r} is set twice (grid, fixed or resources); keep one")
        fixed[key] = value
    baseline = data.get("baseline") or {}
    if not isinstance(baseline, dict):
        raise UsageError(f"{path}: 'baseline' must be a mapping of swept keys to their values")
    for key in baseline:
        known_key(key, f"{where} (baseline)")
    return SearchSpace(
        baseline=dict(baseline),
        cases=_cases(data.get("cases"), grid, fixed, path),
        data=_data_plan(data.get("data"), path),
        name=name,
        ref=ref,
        description=str(data.get("description", "")).strip().splitlines()[0]
        if data.get("description")
        else "",
        repeats=positive_int("repeats", data.get("repeats", 1), where),
        max_concurrent_trials=positive_int(
            "max_concurrent_trials", data.get("max_concurrent_trials", 1), where
        ),
        stop_on_error=as_bool("stop_on_error", data.get("stop_on_error", False), where),
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
            known_key(key, f"{path} (cases)")
            if key in grid or key in fixed:
                raise UsageError(
                    f"{path}: {key!r} is set in cases and in grid/fixed/resources; keep one"
                )
            if key in case and key in own:
                raise UsageError(f"{path}: {key!r} is set twice in one case; keep one")
        for key, values in own.items():
            if not isinstance(values, list):
                raise UsageError(f"{path}: a case's grid.{key} must be a list of values")
            grid_values(key, values, f"{path} (cases)")
        out.append(copy_case(case))
    return out


def _data_plan(raw: Any, path: Path) -> DataPlan | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("synth"), dict):
        raise UsageError(
            f"{path}: 'data' must be a mapping with a 'synth' mapping, e.g. data: {{synth: {{utts: 4}}}}"
        )
    only_keys(raw, DATA_KEYS, f"{path}: unknown key", "in data")
    only_keys(raw["synth"], SYNTH_KEYS, f"{path}: unknown key", "in data.synth")
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
