"""Faster answers: which run starts next and which run stops early, in the driver's Tune loop.

- ``Schedule``: the sweep's record of it, ``schedule.json`` in the output root: the plans, the
  full grid's size, every early stop (run, step, window, why), every eliminated group and every
  run skipped because of it. Written atomically at each decision; ``--resume`` reads it back.
- ``Race`` (``scheduler: race``): noise-aware successive racing of the groups. Runs start in the
  planned order (repeat 1 of every group, then repeat 2 of the groups still in the race, ...). A
  group's estimate is the mean over its runs of their clean windows' samples/s (after the
  warm-up windows; a window with a stall alert or an epoch boundary is not clean); its bounds
  add and subtract the largest of three half-widths: Student's t over the windows, Student's t
  over the runs' means (two or more runs), and ``noise_floor`` x the mean. A group is stopped
  when its upper bound falls below the highest lower bound of the groups that have a finished,
  stable run; a group breaking a Phase B limit (platform.stability) is stopped as unstable.
  Decisions are taken only on a clean window or when a run ends. Stopped runs keep their
  windows (``stopped_early``); the group's later repeats are ``skipped``.
- ``WarmASHA`` (``scheduler: asha``): Tune's ASHAScheduler on the mean samples/s after the
  warm-up windows.
- ``PlannedSearcher`` (``search: grid`` / ``random``) and ``OptunaPlanner`` (``search:
  optuna``, Tune's OptunaSearch over the space's keys, cases as a choice): the Tune search
  algorithms that hand out the runs.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ray.tune.schedulers import ASHAScheduler, TrialScheduler
from ray.tune.search import Searcher

from platform.analysis import stats
from platform.record.recorder import RunTimeout
from platform.spaces.space import RunSpec, SearchSpace
from platform.storage import results

__all__ = [
    "SCHEDULE",
    "OptunaPlanner",
    "PlannedSearcher",
    "Race",
    "Schedule",
    "SweepStopper",
    "WarmASHA",
]

SCHEDULE = "schedule.json"
METRIC = "platform_samples_per_s"  # what ASHA and Optuna rank runs by (set by the driver)


class Schedule:
    """What the scheduler and the searcher decided, kept in ``schedule.json``."""

    def __init__(self, output_root: Path, space: SearchSpace, runs: list[RunSpec]):
        self.path = Path(output_root) / SCHEDULE
        groups = list(dict.fromkeys(r.group for r in runs))
        self.state: dict[str, Any] = {
            "scheduler": asdict(space.scheduler),
            "search": asdict(space.search),
            # The full grid: every group of the space x repeats, each to max_steps.
            "full_grid": {
                "groups": len(groups),
                "runs": len(runs),
                "steps": sum(r.config.max_steps for r in runs),
            },
            "stops": {},  # run -> {by, step, window, reason, ts}
            "eliminated": {},  # group -> {kind, reason, run, step, ts}
            "skipped": {},  # run -> reason
            "picked": [],  # optuna: groups in the order it picked them
        }

    def load(self) -> None:
        """``--resume``: the decisions of the earlier attempt."""
        import json

        if self.path.is_file():
            old = json.loads(self.path.read_text())
            for key in ("stops", "eliminated", "skipped", "picked"):
                self.state[key] = old.get(key, self.state[key])

    def save(self) -> None:
        results.write_json(self.path, self.state)

    @property
    def stops(self) -> dict[str, dict[str, Any]]:
        return self.state["stops"]

    def stop(self, run: str, by: str, step: int, window: int, reason: str) -> None:
        self.stops[run] = {"by": by, "step": step, "window": window, "reason": reason,
                           "ts": time.time()}  # fmt: skip
        self.save()


class Race:
    """``scheduler: race``; see the module docstring. ``echo`` prints a decision."""

    def __init__(self, runs: list[RunSpec], space: SearchSpace, schedule: Schedule, echo=print):
        self.plan = space.scheduler
        self.schedule = schedule
        self.echo = echo
        self.runs = {r.name: r for r in runs}
        self.groups: dict[str, list[str]] = {}
        for r in runs:
            self.groups.setdefault(r.group, []).append(r.name)
        self.windows: dict[str, list[dict[str, Any]]] = {}  # run -> its windows (rank 0)
        self.finished: dict[str, dict[str, float]] = {}  # ok run -> its tail figures
        self.running: set[str] = set()

    # --- what the searcher asks ---
    @property
    def eliminated(self) -> dict[str, dict[str, Any]]:
        return self.schedule.state["eliminated"]

    def runnable(self, run: str) -> bool:
        return self.runs[run].group not in self.eliminated

    def skip(self, run: str) -> None:
        group = self.runs[run].group
        self.schedule.state["skipped"][run] = (
            f"not run: group {group} left the race ({self.eliminated[group]['kind']})"
        )
        self.schedule.save()

    # --- what the stopper and the searcher tell ---
    def observe(self, run: str, result: dict[str, Any]) -> bool:
        """One window of ``run``; True when the run is to stop now."""
        self.running.add(run)
        history = self.windows.setdefault(run, [])
        window = _window(result, history, self.runs[run].config.stall_alert_ratio,
                         self.plan.warmup_windows)  # fmt: skip
        history.append(window)
        if run in self.schedule.stops:
            return True
        if window["clean"]:  # never decide on a window with a stall alert or an epoch boundary
            self._check_unstable_midway(run)
            self._decide(run)
        return run in self.schedule.stops

    def complete(self, run: str, outcome: str) -> None:
        """``run`` ended: ``ok`` (at max_steps), ``error`` (it failed), ``timeout`` (stopped by
        run_timeout_s) or ``cut`` (the sweep was interrupted: --resume runs it again)."""
        self.running.discard(run)
        group = self.runs[run].group
        if run in self.schedule.stops or group in self.eliminated or outcome == "cut":
            return
        if outcome != "ok":
            self._eliminate(group, "failed", f"run {run} did not finish ({outcome})")
            return
        figures = _tail_figures(self.windows.get(run, []), self.runs[run].config)
        if figures:
            self.finished[run] = figures
        self._check_unstable(group)
        self._decide(run)

    def restore(self, timing, done: dict[str, dict[str, Any]]) -> None:
        """``--resume``: the windows of the runs kept from the earlier attempt (ok and stopped
        runs) and the finished runs' figures; the decisions come from schedule.json."""
        rank0 = timing[timing["rank"] == 0] if "rank" in timing else timing
        for run, st in done.items():
            if run not in self.runs:
                continue
            rows = rank0[rank0["run"] == run].sort_values("window").to_dict("records")
            history: list[dict[str, Any]] = []
            for row in rows:
                history.append(_window(row, history, self.runs[run].config.stall_alert_ratio,
                                       self.plan.warmup_windows))  # fmt: skip
            self.windows[run] = history
            figures = _tail_figures(history, self.runs[run].config)
            if st.get("status") == "ok" and figures:
                self.finished[run] = figures

    # --- the statistics ---
    def bounds(self, group: str) -> dict[str, float] | None:
        """The group's estimate and bounds, None until it has ``min_windows`` clean windows."""
        per_run = [
            [w["samples_per_s"] for w in self.windows.get(run, []) if w["clean"]]
            for run in self.groups[group]
        ]
        per_run = [v for v in per_run if v]
        values = [x for v in per_run for x in v]
        if len(values) < self.plan.min_windows:
            return None
        means = [statistics.fmean(v) for v in per_run]
        mean = statistics.fmean(means)
        half = self.plan.noise_floor * mean
        q = (1 + self.plan.confidence) / 2
        if len(values) > 1:
            half = max(half, _t(q, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5)
        if len(means) > 1:
            half = max(half, _t(q, len(means) - 1) * statistics.stdev(means) / len(means) ** 0.5)
        return {"mean": mean, "low": mean - half, "high": mean + half, "windows": len(values),
                "runs": len(means)}  # fmt: skip

    def _decide(self, run: str) -> None:
        """Stop every group whose upper bound is below the best reference's lower bound. A
        reference is a group in the race with a finished (hence stable so far) run."""
        refs = {}
        for group in self.groups:
            if group in self.eliminated:
                continue
            if any(r in self.finished for r in self.groups[group]):
                b = self.bounds(group)
                if b is not None:
                    refs[group] = b
        if not refs:
            return
        best = max(refs, key=lambda g: refs[g]["low"])
        low = refs[best]["low"]
        for group in self.groups:
            if group == best or group in self.eliminated:
                continue
            b = self.bounds(group)
            if b is not None and b["high"] < low:
                self._eliminate(
                    group,
                    "slower",
                    f"upper bound {b['high']:.2f} samples/s (mean {b['mean']:.2f}, "
                    f"{b['windows']} windows of {b['runs']} run(s)) < {best}'s lower bound "
                    f"{low:.2f}",
                )

    def _check_unstable_midway(self, run: str) -> None:
        """A run whose clean windows so far (``min_windows`` or more) have a median iter
        p90/p50 above ``max_iter_ratio_max`` is unstable before it ends (the median limit is
        judged on the finished run's tail, as platform.stability does)."""
        clean = [w for w in self.windows[run] if w["clean"]]
        if len(clean) < self.plan.min_windows:
            return
        ratio = statistics.median(w["iter_ratio"] for w in clean)
        if ratio > self.plan.max_iter_ratio_max:
            self._eliminate(
                self.runs[run].group,
                "unstable",
                f"iter p90/p50 median {ratio:.2f} > {self.plan.max_iter_ratio_max:g} over "
                f"{len(clean)} windows of {run}",
            )

    def _check_unstable(self, group: str) -> None:
        """The Phase B limits over the group's finished runs (platform.stability)."""
        done = [self.finished[r] for r in self.groups[group] if r in self.finished]
        if not done:
            return
        ratios = [d["iter_ratio"] for d in done]
        p = self.plan
        failures = []
        if statistics.median(ratios) > p.max_iter_ratio_median:
            failures.append(
                f"iter p90/p50 median {statistics.median(ratios):.3f} > {p.max_iter_ratio_median:g}"
            )
        if max(ratios) > p.max_iter_ratio_max:
            failures.append(f"iter p90/p50 max {max(ratios):.3f} > {p.max_iter_ratio_max:g}")
        if len(done) > 1:
            p50 = [d["iter_p50"] for d in done]
            cv = statistics.stdev(p50) / statistics.fmean(p50)
            if cv > p.max_iter_p50_cv:
                failures.append(f"iter p50 CV {cv:.4f} > {p.max_iter_p50_cv:g}")
        if failures:
            self._eliminate(group, "unstable", "; ".join(failures))

    def _eliminate(self, group: str, kind: str, reason: str) -> None:
        self.eliminated[group] = {"kind": kind, "reason": reason, "ts": time.time()}
        for run in self.groups[group]:
            if run in self.running and run not in self.schedule.stops:
                last = self.windows.get(run) or [{}]
                self.schedule.stops[run] = {
                    "by": "race",
                    "step": last[-1].get("step"),
                    "window": len(self.windows.get(run, [])),
                    "reason": f"{kind}: {reason}",
                    "ts": time.time(),
                }
        self.schedule.save()
        self.echo(f"race: group {group} leaves the race ({kind}): {reason}")


def _window(
    result: dict[str, Any], history: list[dict[str, Any]], alert_ratio: float, warmup: int
) -> dict[str, Any]:
    """One window as the race sees it; ``clean``: past the warm-up, no stall alert (the
    recorder's rule, platform/stats.py) and no epoch boundary inside it."""
    p50 = float(result.get("iter_ms_p50") or math.nan)
    p90 = float(result.get("iter_ms_p90") or math.nan)
    epoch = result.get("epoch")
    boundary = bool(history) and epoch != history[-1]["epoch"]
    alert = stats.stall_alert([w["iter_ms_p50"] for w in history], p50, alert_ratio)
    return {
        "step": result.get("step"),
        "epoch": epoch,
        "samples_per_s": float(result.get("samples_per_s") or math.nan),
        "iter_ms_p50": p50,
        "iter_ratio": stats.window_ratio(p90, p50),
        "clean": len(history) >= warmup and not boundary and alert is None and math.isfinite(p50),
    }


def _tail_figures(history: list[dict[str, Any]], cfg) -> dict[str, float] | None:
    """A finished run's tail (its last ``tail_timing_points`` windows) as platform/stats.py
    defines it: mean iter p90/p50 (p50 floored) and mean iter p50."""
    tail = history[-cfg.tail_timing_points :]
    if not tail:
        return None
    return {
        "iter_ratio": statistics.fmean(w["iter_ratio"] for w in tail),
        "iter_p50": statistics.fmean(w["iter_ms_p50"] for w in tail),
    }


def _t(q: float, dof: int) -> float:
    from scipy.stats import t

    return float(t.ppf(q, dof))


class SweepStopper(RunTimeout):
    """Tune's stopper for a sweep: ``run_timeout_s`` (platform.callbacks.RunTimeout) and, with
    ``scheduler: race``, the race's decisions (every window goes through the race first)."""

    def __init__(self, runs: list[RunSpec], trial_runs: dict[str, str], race: Race | None):
        super().__init__(runs, trial_runs)
        self.race = race

    def __call__(self, trial_id, result) -> bool:
        run = self.trial_runs.get(trial_id, "")
        if self.race is not None and run and self.race.observe(run, result):
            return True
        return super().__call__(trial_id, result)


class WarmASHA(ASHAScheduler):
    """Tune's ASHAScheduler on the mean samples/s of a run's windows after the warm-up
    (``time_attr``: windows after the warm-up); its stops go into the schedule."""

    def __init__(self, space: SearchSpace, runs: list[RunSpec], schedule: Schedule,
                 trial_runs: dict[str, str]):  # fmt: skip
        plan = space.scheduler
        windows = max(math.ceil(r.config.max_steps / r.config.log_every) for r in runs)
        max_t = max(1, windows - plan.warmup_windows)
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


class PlannedSearcher(Searcher):
    """Hands out the planned runs in order (``search: grid`` or ``random``), passing over the
    runs of groups that left the race (they are ``skipped``)."""

    def __init__(self, runs: list[RunSpec], param: Callable[[RunSpec], dict],
                 trial_runs: dict[str, str], race: Race | None = None):  # fmt: skip
        super().__init__()
        self.todo = list(runs)
        self.param = param
        self.trial_runs = trial_runs
        self.race = race

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True

    def suggest(self, trial_id: str):
        while self.todo:
            run = self.todo.pop(0)
            if self.race is not None and not self.race.runnable(run.name):
                self.race.skip(run.name)
                continue
            self.trial_runs[trial_id] = run.name
            return {"run": self.param(run)}
        return Searcher.FINISHED

    def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
        run = self.trial_runs.get(trial_id)
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
        return {"run": self.param(run)}

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
                statistics.fmean(seen[-cfg.tail_timing_points :])
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
