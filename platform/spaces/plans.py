"""The plans of a search space: ``data:`` (a synthetic corpus to generate and prepare),
``scheduler:`` (how runs are stopped early) and ``search:`` (which groups run), each a frozen
dataclass parsed and checked from its YAML form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from platform.errors import UsageError
from platform.spaces._validate import only_keys

__all__ = ["SCHEDULERS", "SEARCHES", "DataPlan", "SchedulerPlan", "SearchPlan"]


@dataclass(frozen=True)
class DataPlan:
    """A space without a dataset: generate a synthetic LibriSpeech-layout corpus of this size
    and prepare it with data_prep (in the driver, before Ray starts) for the runs' manifest."""

    synth: dict[str, Any]
    target_sr: int = 16_000
    trim: bool = True

    def _size(self, key: str) -> int:
        """A size of the corpus: the section's, else data_prep.synth.make_corpus's default."""
        return int(self.synth.get(key, {"speakers": 4, "chapters": 2, "utts": 10}[key]))

    @property
    def speakers(self) -> int:
        return self._size("speakers")

    @property
    def utterances_per_speaker(self) -> int:
        """Every speaker reads ``chapters`` x ``utts`` utterances."""
        return self._size("chapters") * self._size("utts")

    def describe(self) -> str:
        s = self.synth
        return (
            f"synthetic corpus ({self.speakers} speakers x {self._size('chapters')} chapters "
            f"x {self._size('utts')} utterances{', learnable' if s.get('mode') == 'learnable' else ''}), "
            f"prepared to {self.target_sr} Hz" + (" with silence trimming" if self.trim else "")
        )


SCHEDULERS = ("fifo", "asha", "race")
SEARCHES = ("grid", "random", "optuna")


@dataclass(frozen=True)
class SchedulerPlan:
    """``scheduler:`` how runs are stopped early. ``fifo``: never (every run to max_steps);
    ``asha``: Tune's ASHAScheduler on the run's samples/s after the warm-up windows; ``race``:
    platform.control.race, a noise-aware racing of the groups (docs/internals/control.md).

    A run's first ``warmup_windows`` windows never count. ``race``: a group is judged once it has
    ``min_windows`` clean windows (no stall alert, no stall, no epoch boundary where epochs are
    longer than a window: platform.control.race); its bounds are the mean
    samples/s +- the largest of the Student-t half-width at ``confidence`` over its windows,
    the same over its runs' means (2 or more runs), and ``noise_floor`` x the mean (the
    repeat-to-repeat noise one run cannot show). A group whose upper bound falls below the
    best finished, stable group's lower bound is stopped, and comes back should that group
    later prove unstable or fail. The Phase B limits
    (``max_iter_ratio_median``, ``max_iter_ratio_max``, ``max_iter_p50_cv``, as in
    platform.stability) make a group unstable: it is stopped and cannot win. A race warm-started
    from the catalogue stops a group measured there clearly slower than the leader once its first
    ``confirm_windows`` clean windows agree with what was measured; under ``--history confirm``
    a shift every judged group shares beyond ``shift_tolerance`` drops every prior. ``asha``: ``grace_windows``
    windows after the warm-up before the first rung, ``reduction_factor``.
    """

    name: str = "fifo"
    warmup_windows: int = 2
    min_windows: int = 3
    confirm_windows: int = 2
    confidence: float = 0.95
    noise_floor: float = 0.02
    shift_tolerance: float = 0.03
    max_iter_ratio_median: float = 1.5
    max_iter_ratio_max: float = 2.5
    max_iter_p50_cv: float = 0.05
    grace_windows: int = 2
    reduction_factor: int = 3

    @classmethod
    def parse(cls, raw: Any, where: str) -> SchedulerPlan:
        fields = _plan_fields(raw, "scheduler", SCHEDULERS, cls, where)
        plan = cls(**fields)
        for key in ("warmup_windows", "min_windows", "confirm_windows", "grace_windows"):
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
        if not 0 <= plan.shift_tolerance < 1:
            raise UsageError(f"{where}: scheduler.shift_tolerance must be within 0-1, e.g. 0.03")
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

    @property
    def plans_late(self) -> bool:
        """Whether the search picks its groups as the sweep goes (optuna), so its runs are not
        known up front: every group stays a candidate, a run is planned (in the manifest, with
        its record) when its group is picked, and what needs every run planned ahead
        (scheduler race, --resume) is refused. The one place that decides it."""
        return self.name == "optuna"

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
    only_keys(raw, allowed, f"{where}: unknown key", f"in {what}")
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
