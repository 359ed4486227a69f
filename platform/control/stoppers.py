"""Who ends a running trial from outside it: Tune stoppers, asked at each window report.

- ``RunTimeout``: a run past its ``run_timeout_s`` (trial time) is stopped; the recorder
  (platform.record.recorder) then records it as a ``timeout``.
- ``SweepStopper``: the sweep's stopper, ``RunTimeout`` and, with ``scheduler: race``, the race's
  decisions (platform.control.race).
"""

from __future__ import annotations

from ray.tune.stopper import Stopper

from platform.control.race import Race
from platform.spaces.expand import RunSpec

__all__ = ["RunTimeout", "SweepStopper"]


class RunTimeout(Stopper):
    """Stops a run whose trial has been going longer than its run_timeout_s (checked at each
    window report; a run that stops reporting is the stall watchdog's case)."""

    def __init__(self, runs: list[RunSpec], trial_runs: dict[str, str]):
        self.limits = {r.name: r.config.run_timeout_s for r in runs if r.config.run_timeout_s}
        # Tune trial id -> run name: the sweep's searcher fills it when it hands a run out,
        # SweepRecorder when the trial starts.
        self.trial_runs = trial_runs

    def __call__(self, trial_id, result) -> bool:
        limit = self.limits.get(self.trial_runs.get(trial_id, ""))
        return bool(limit) and result.get("time_total_s", 0) >= limit

    def stop_all(self) -> bool:
        return False


class SweepStopper(RunTimeout):
    """Tune's stopper for a sweep: ``run_timeout_s`` (``RunTimeout``) and, with ``scheduler:
    race``, the race's decisions (every window goes through the race first)."""

    def __init__(self, runs: list[RunSpec], trial_runs: dict[str, str], race: Race | None):
        super().__init__(runs, trial_runs)
        self.race = race

    def __call__(self, trial_id, result) -> bool:
        run = self.trial_runs.get(trial_id, "")
        if self.race is not None and run and self.race.observe(run, result):
            return True
        return super().__call__(trial_id, result)
