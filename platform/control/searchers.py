"""The Tune search algorithms that hand out a sweep's runs, one per trial.

- ``PlannedSearcher`` (``search: grid`` / ``random``): the planned runs in order, passing over
  the runs of groups that left the race (platform.control.race) and handing out again those of
  a group let back in; it tells the race how each run ended.
- ``OptunaPlanner`` (``search: optuna``): Tune's OptunaSearch over the space's keys (cases as a
  choice) picks groups one after another; each picked group runs its repeats.

Both hand Tune what ``param`` gives for a run: its trial's param space (the driver's encoded
``RunTicket``, platform/execution/tuner.py). Neither keeps a Tune checkpoint: the sweep's
record is ``schedule.json``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray.tune.search import Searcher

from platform.control.budget import Budget
from platform.control.race import METRIC, Race, Schedule
from platform.spaces.expand import RunSpec
from platform.spaces.space import SearchSpace
from stage1_common.tail import tail_start

__all__ = ["OptunaPlanner", "PlannedSearcher"]


class PlannedSearcher(Searcher):
    """Hands out the planned runs in order (``search: grid`` or ``random``), passing over the
    runs of groups that left the race (they are ``skipped``). A group let back into the race
    gets its passed-over runs first, before the next planned one."""

    def __init__(self, runs: list[RunSpec], param: Callable[[RunSpec], dict],
                 trial_runs: dict[str, str], race: Race | None = None,
                 budget: Budget | None = None, on_budget: Callable[[], None] = lambda: None):  # fmt: skip
        super().__init__()
        self.todo = list(runs)
        self.param = param
        self.trial_runs = trial_runs
        self.race = race
        self.budget, self.on_budget = budget, on_budget  # --budget: the run as it plans it
        self.in_flight: set[str] = set()  # trial ids handed out, not complete yet

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True

    def suggest(self, trial_id: str):
        while (run := self._next()) is not None:
            if self.race is not None and not self.race.runnable(run.name):
                self.race.skip(run.name)
                if self.budget is not None:
                    self.budget.pass_over(run.name)
                continue
            if self.budget is not None:
                run = self.budget.admit(run)
                self.on_budget()
                if run is None:
                    continue
            self.trial_runs[trial_id] = run.name
            self.in_flight.add(trial_id)
            return self.param(run)
        # A run still going may yet make its group unstable and bring back the groups it
        # knocked out: ask again later (Tune stops asking a searcher once it says finished).
        if self.race is not None and self.in_flight:
            return None
        return Searcher.FINISHED

    def _next(self) -> RunSpec | None:
        """A passed-over run of a re-admitted group (not one still planned: a resume after a
        hard kill may hold it in both), else the next planned run."""
        while self.race is not None and (name := self.race.rerun()) is not None:
            if all(r.name != name for r in self.todo):
                return self.race.runs[name]
        return self.todo.pop(0) if self.todo else None

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        self.in_flight.discard(trial_id)
        run = self.trial_runs.get(trial_id)
        if self.budget is not None and run is not None:
            stopped = self.race is not None and run in self.race.schedule.stops
            self.budget.ended(run, ok=not error and not stopped)
        if self.race is not None and run is not None:
            self.race.complete(run, _outcome(self.race.runs[run].config, result, error))

    def save(self, checkpoint_path: str) -> None:  # the record is schedule.json
        Path(checkpoint_path).write_text("{}")

    def restore(self, checkpoint_path: str) -> None:
        pass


class OptunaPlanner(Searcher):
    """``search: optuna``: Tune's OptunaSearch (TPE, ``seed``) picks ``num_samples`` groups one
    after another; each picked group runs its repeats, and OptunaSearch is told the mean of
    their tail samples/s. The define-by-run space has one categorical parameter per swept key
    (and ``case`` when the space has cases), so only valid combinations are proposed. A
    proposal of a group already run is answered with its known value and asked again."""

    MAX_ASKS = 50

    def __init__(self, space: SearchSpace, runs: list[RunSpec], param: Callable[[RunSpec], dict],
                 trial_runs: dict[str, str], schedule: Schedule,
                 on_plan: Callable[[RunSpec], None]):  # fmt: skip
        super().__init__()
        from ray.tune.search.optuna import OptunaSearch

        self.space, self.param, self.trial_runs = space, param, trial_runs
        self.schedule, self.on_plan = schedule, on_plan
        self.by_point: dict[tuple, str] = {}
        self.group_runs: dict[str, list[RunSpec]] = {}
        self.group_of_run = {r.name: r.group for r in runs}
        for r in runs:
            self.by_point.setdefault(_point_key(r.swept), r.group)
            self.group_runs.setdefault(r.group, []).append(r)
        self.budget = space.search.num_samples
        self.inner = OptunaSearch(space=self._define, metric=METRIC, mode="max",
                                  seed=space.search.seed)  # fmt: skip
        self.queue: list[RunSpec] = []
        self.asked: dict[str, str] = {}  # group -> the OptunaSearch trial id that proposed it
        self.values: dict[str, list[float]] = {}  # group -> its finished runs' tail samples/s
        self.pending: dict[str, int] = {}  # group -> runs not yet ended
        self.windows: dict[str, list[float]] = {}  # Tune trial id -> samples/s per window
        self.asks = 0

    def _define(self, trial) -> None:
        cases = self.space.cases or [{}]
        c = trial.suggest_categorical("case", list(range(len(cases)))) if len(cases) > 1 else 0
        case = cases[c]
        for key, values in case.get("grid", {}).items():
            trial.suggest_categorical(f"{key}@case{c}", values)
        for key, values in self.space.grid.items():
            trial.suggest_categorical(key, values)

    def _group_of(self, params: dict[str, Any]) -> str:
        cases = self.space.cases or [{}]
        case = cases[int(params.get("case", 0))]
        point = {k: v for k, v in case.items() if k != "grid"}
        for key, value in params.items():
            if key != "case":
                point[key.split("@")[0]] = value
        return self.by_point[_point_key(point)]

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True

    def suggest(self, trial_id: str):
        if not self.queue and not self._ask():
            return Searcher.FINISHED
        run = self.queue.pop(0)
        self.trial_runs[trial_id] = run.name
        self.on_plan(run)
        return self.param(run)

    def _ask(self) -> bool:
        """Ask OptunaSearch for the next group; False when the budget or the space is spent."""
        while (
            len(self.asked) < min(self.budget, len(self.group_runs)) and self.asks < self.MAX_ASKS
        ):
            self.asks += 1
            tid = f"optuna_{self.asks}"
            params = self.inner.suggest(tid)
            group = self._group_of(params)
            if group in self.asked:
                known = self.values.get(group)
                value = statistics.fmean(known) if known else None
                self.inner.on_trial_complete(
                    tid, result={METRIC: value} if value is not None else None, error=value is None
                )
                continue
            self.asked[group] = tid
            self.schedule.state["picked"].append(group)
            self.schedule.save()
            self.queue = list(self.group_runs[group])
            self.pending[group] = len(self.queue)
            return True
        return False

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.windows.setdefault(trial_id, []).append(float(result.get("samples_per_s") or 0.0))

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        run = self.trial_runs.get(trial_id)
        if run is None:
            return
        group = self.group_of_run[run]
        cfg = self.group_runs[group][0].config
        seen = self.windows.pop(trial_id, []) or [float((result or {}).get("samples_per_s") or 0)]
        if not error and any(seen):
            self.values.setdefault(group, []).append(
                statistics.fmean(seen[tail_start(len(seen), cfg.tail_timing_points) :])
            )
        self.pending[group] -= 1
        if self.pending[group] == 0:
            del self.pending[group]
            known = self.values.get(group)
            self.inner.on_trial_complete(
                self.asked[group],
                result={METRIC: statistics.fmean(known)} if known else None,
                error=not known,
            )

    def save(self, checkpoint_path: str) -> None:  # the record is schedule.json
        Path(checkpoint_path).write_text("{}")

    def restore(self, checkpoint_path: str) -> None:
        pass


def _outcome(cfg, result: dict | None, error: bool) -> str:
    """How a trial ended, for the race: ok (at max_steps), error, timeout (run_timeout_s) or
    cut (stopped short otherwise: the sweep was interrupted)."""
    result = result or {}
    if error:
        return "error"
    if (result.get("step") or 0) >= cfg.max_steps:
        return "ok"
    if cfg.run_timeout_s and (result.get("time_total_s") or 0) >= cfg.run_timeout_s:
        return "timeout"
    return "cut"


def _point_key(point: dict[str, Any]) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in point.items()))
