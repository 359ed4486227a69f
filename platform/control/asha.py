"""``scheduler: asha``: Tune's ASHAScheduler judged after a warm-up, its stops recorded.

``WarmASHA`` ranks runs by the mean samples/s of their windows after the first
``warmup_windows`` (compile, cache fill and data warm-up would otherwise decide the rungs), with
``time_attr`` the windows after the warm-up; each stop it makes before ``max_steps`` goes into
the sweep's ``schedule.json`` (platform.control.race.Schedule).
"""

from __future__ import annotations

import math
import statistics

from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from platform.control.race import METRIC, Schedule
from platform.spaces.expand import RunSpec
from platform.spaces.space import SearchSpace

__all__ = ["WarmASHA"]


class WarmASHA(ASHAScheduler):
    """Tune's ASHAScheduler on the mean samples/s of a run's windows after the warm-up
    (``time_attr``: windows after the warm-up); its stops go into the schedule."""

    def __init__(self, space: SearchSpace, runs: list[RunSpec], schedule: Schedule,
                 trial_runs: dict[str, str], budget: bool = False):  # fmt: skip
        plan = space.scheduler
        windows = max(math.ceil(r.config.max_steps / r.config.log_every) for r in runs)
        # With --budget a run's length and windows are the budget's (set when it is handed
        # out): it ends at its own max_steps, never at a last rung counted from the space's.
        max_t = 10**6 if budget else max(1, windows - plan.warmup_windows)
        super().__init__(
            time_attr="platform_window",
            metric=METRIC,
            mode="max",
            max_t=max_t,
            grace_period=min(plan.grace_windows, max_t),
            reduction_factor=plan.reduction_factor,
        )
        self.warmup = plan.warmup_windows
        self.max_steps = {r.name: r.config.max_steps for r in runs}
        self.schedule = schedule
        self.trial_runs = trial_runs
        self.history: dict[str, list[float]] = {}

    def on_trial_result(self, tune_controller, trial, result):
        values = self.history.setdefault(trial.trial_id, [])
        values.append(float(result.get("samples_per_s") or math.nan))
        if len(values) <= self.warmup:
            return TrialScheduler.CONTINUE
        after = values[self.warmup :]
        seen = {**result, "platform_window": len(after), METRIC: statistics.fmean(after)}
        decision = super().on_trial_result(tune_controller, trial, seen)
        run = self.trial_runs.get(trial.trial_id, "")
        step = int(result.get("step") or 0)
        if decision == TrialScheduler.STOP and run and step < self.max_steps.get(run, 0):
            self.schedule.stop(
                run,
                "asha",
                step,
                len(values),
                f"asha: mean {seen[METRIC]:.2f} samples/s after the warm-up is below the "
                f"rung cutoff (top 1/{self._reduction_factor:g}) at window {len(values)}",
            )
        return decision

    def on_trial_complete(self, tune_controller, trial, result):
        self.history.pop(trial.trial_id, None)
        if trial.trial_id in self._trial_info:
            del self._trial_info[trial.trial_id]
