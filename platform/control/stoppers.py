"""Who ends a running trial from outside it: Tune stoppers, asked at each window report.

- ``RunTimeout``: a run past its ``run_timeout_s`` (trial time) is stopped; the recorder
  (platform.record.recorder) then records it as a ``timeout``.
- ``SweepStopper``: the sweep's stopper, ``RunTimeout``, with ``scheduler: race`` the race's
  decisions (platform.control.race), and with ``--budget`` a run boxed in seconds ended at its
  share and every run stopped at the budget's end (platform.control.budget).
"""

from __future__ import annotations

from ray.tune.stopper import Stopper

from platform.control.budget import Budget
from platform.control.race import Race, Schedule
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
    """Tune's stopper for a sweep: ``run_timeout_s`` (``RunTimeout``), with ``scheduler: race``
    the race's decisions (every window goes through the race first), with a ``budget`` its
    boxed runs and its end."""

    def __init__(self, runs: list[RunSpec], trial_runs: dict[str, str], race: Race | None,
                 budget: Budget | None = None, schedule: Schedule | None = None):  # fmt: skip
        super().__init__(runs, trial_runs)
        self.race, self.budget, self.schedule = race, budget, schedule

    def __call__(self, trial_id, result) -> bool:
        run = self.trial_runs.get(trial_id, "")
        ours = self.budget is not None and run and self.budget.seen(run, result)
        if self.race is not None and run and self.race.observe(run, result):
            return True  # the race's stop, recorded as the race's
        if ours:
            said = self.budget.decide(run)
            if said == "boxed":  # ends here as a finished run (schedule: ended_by_budget)
                self.schedule.save()
                return True
            if said == "deadline":
                self._cut(run, result)
                return True
        return super().__call__(trial_id, result)

    def stop_all(self) -> bool:
        """The budget's safety: its whole time spent (the sweep's end's share too) and a run
        still going, which has not reported a window since its end came (each run going is
        otherwise stopped at its next window, ``__call__``, and nothing more is handed out);
        the sweep then settles those runs (platform/execution/tuner.py: Sweep.finish_files)."""
        return self.budget is not None and self.budget.spent()

    def _cut(self, run: str, seen: dict) -> None:
        self.schedule.stop(run, "budget", int(seen.get("step") or 0),
                           int(seen.get("window") or seen.get("windows") or 0),
                           "the budget's time was up")  # fmt: skip
