"""The race: which run stops early, in the driver's Tune loop, and the sweep's record of it.

- ``Schedule``: what the scheduler and the searcher decided, ``schedule.json`` in the output root:
  the plans, the full grid's size, every early stop (run, step, window, why), every eliminated
  group (and, for a slower one, the group whose lower bound it fell under), every group let
  back into the race and why, and every run skipped. Written atomically at each decision;
  ``--resume`` reads it back. ASHA (platform.control.asha) and the searchers
  (platform.control.searchers) write into it too.
- ``Race`` (``scheduler: race``): noise-aware successive racing of the groups. Runs start in the
  planned order (repeat 1 of every group, then repeat 2 of the groups still in the race, ...). A
  group's estimate is the mean over its runs of their clean windows' samples/s (after the
  warm-up windows; a window with a stall alert, a stall inside it (its samples/s under the
  run's median so far / ``stall_alert_ratio``) or an epoch boundary where boundaries are the
  exception is not clean, see below); its bounds
  add and subtract the largest of three half-widths: Student's t over the windows, Student's t
  over the runs' means (two or more runs), and ``noise_floor`` x the mean. A group is stopped
  when its upper bound falls below the highest lower bound of the groups that have a finished,
  stable run (the leader); a group breaking a Phase B limit (platform.stability) is stopped as
  unstable. Decisions are taken only on a clean window or when a run ends. Stopped runs keep
  their windows (``stopped_early``); the group's later repeats are ``skipped``.

An elimination stands only while its leader can still win. A leader with one finished run is
stable so far, not for good: its later repeats may break a Phase B limit (the iter p50 CV
needs two) or fail. When a group leaves the race as unstable or failed, every group it knocked
out as slower comes back (``readmitted``, with the verdict revoked and why): its skipped runs
are handed out again, its stopped runs keep their windows, and it is judged at once against
the leaders still valid, so what is still clearly slower leaves again, now on a valid leader's
bound. Without this, a group stopped on one run as slower than a leader that later fell could
win untested (2x H100, issue 53: benchmarks/results/race_2xh100/). A group that leaves as
slower keeps its own eliminations: what fell under its lower bound is slower than the group
that beat it too. The other fix, taking decisions only on leaders that ran all their repeats,
would wait for the last round of the planned order (repeat 1 of every group runs first), so
every group's first repeat would run to its end: the race's saving gone to guard against a
case that re-admission pays for only when it happens. A run already stopped stays stopped
(Tune ended its trial), so a re-admitted group may end with fewer finished repeats than
planned; the ranking's ok/runs shows it.

Epoch boundaries. Where a run's epoch is longer than a window, a boundary is the exception: the
window holding it pays the one-off re-shuffle and is not clean. Where every window of the run
holds one or more boundaries (an epoch no longer than a window, as on a small corpus: 4-5 steps
against windows of 50 in benchmarks/results/warm_race_2xh200/), they are part of the steady state
and the window counts: every window pays them alike. The rule is the run's own, from its windows
so far: boundaries disqualify a window once any window of the run held none (the first window
counts from epoch 0). Leaving out every window there judged nothing and silently made the race
a full grid. A group that cannot reach ``min_windows`` clean windows any more (its runs' windows
left, all clean at best, would not make up the rest) is said once, on the console and in the
schedule's ``unjudged``: it runs its repeats as in a grid.

Priors (a warm start from the machine's catalogue, ``--history confirm`` or ``order``): what
they decide, and how, is platform/control/race_priors.py's (``WarmStart``, which ``Race``
inherits).

The window and tail statistics are platform.analysis.stats' (one definition of each).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict
from typing import Any

from platform.analysis import stats
from platform.analysis.priors import Priors
from platform.control.race_priors import WarmStart
from platform.spaces.expand import RunSpec
from platform.spaces.space import SearchSpace
from platform.storage import results
from stage1_common.output_root import OutputRoot
from stage1_common.tail import tail_start

__all__ = ["METRIC", "SCHEDULE", "Race", "Schedule"]

SCHEDULE = OutputRoot.SCHEDULE
METRIC = "platform_samples_per_s"  # what ASHA and Optuna rank runs by (set by the driver)


class Schedule:
    """What the scheduler and the searcher decided, kept in ``schedule.json``."""

    def __init__(self, root: OutputRoot, space: SearchSpace, runs: list[RunSpec]):
        self.path = root.schedule
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
            "eliminated": {},  # group -> {kind, reason, by (the leader, when slower), ts}
            "readmitted": [],  # {group, revoked (its elimination), why, runs (again), ts}
            "skipped": {},  # run -> reason
            "picked": [],  # optuna: groups in the order it picked them
        }
        # --budget: its plans, the runs it left unrun, boxed or cut (platform/control/budget.py)
        self.budget: dict[str, Any] | None = None

    def load(self) -> None:
        """``--resume``: the decisions of the earlier attempt."""
        if self.path.is_file():
            old = json.loads(self.path.read_text())
            for key in ("stops", "eliminated", "readmitted", "skipped", "picked"):
                self.state[key] = old.get(key, self.state[key])
            for key in ("priors", "unjudged", "history"):  # a race's, when it had any
                if key in old:
                    self.state[key] = old[key]

    def save(self) -> None:
        state = self.state if self.budget is None else {**self.state, "budget": self.budget}
        results.write_json(self.path, state)

    def ended_by_budget(self, run: str) -> bool:
        """Whether ``run`` ended at its budget share (a finished run, platform/control/budget.py)."""
        return bool(((self.budget or {}).get("boxed") or {}).get(run, {}).get("step"))

    @property
    def stops(self) -> dict[str, dict[str, Any]]:
        return self.state["stops"]

    def stop(self, run: str, by: str, step: int, window: int, reason: str) -> None:
        self.stops[run] = {"by": by, "step": step, "window": window, "reason": reason,
                           "ts": time.time()}  # fmt: skip
        self.save()


class Race(WarmStart):
    """``scheduler: race``; see the module docstring. ``echo`` prints a decision."""

    def __init__(self, runs: list[RunSpec], space: SearchSpace, schedule: Schedule, echo=print,
                 priors: Priors | None = None, history: str = "confirm"):  # fmt: skip
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
        self.ended: set[str] = set()  # runs complete() was told of
        self.told: set[str] = set()  # runs observe has told to stop
        self.again: list[str] = []  # passed-over runs of re-admitted groups, to hand out
        self.order = {name: i for i, name in enumerate(self.runs)}
        # The catalogue's figures of the groups (a warm start), never counted as this sweep's
        # measurements; ``history`` says what the race does with them (the module docstring).
        self.priors = priors
        self.history = history if priors is not None else "off"
        if priors is not None:
            self._hold_priors(priors)
        for group in self.groups:  # a run too short for min_windows is known before it starts
            self._check_judgeable(group)

    # --- what the searcher asks ---
    @property
    def eliminated(self) -> dict[str, dict[str, Any]]:
        return self.schedule.state["eliminated"]

    @property
    def prior_state(self) -> dict[str, dict[str, Any]]:
        """Group -> its prior's record in the schedule (``priors``; empty without a warm start)."""
        return self.schedule.state.get("priors", {})

    @property
    def scale(self) -> float:
        """The factor the catalogue runs' samples/s are scaled by where they count as measured
        here (the shift this host shows, kept in the schedule's ``history``: ``_rescale``; 1
        before any group was judged)."""
        kept = (self.schedule.state.get("history") or {}).get("scale") or {}
        return float(kept.get("factor", 1.0))

    @property
    def settled(self) -> set[str]:
        """Groups whose catalogue runs stand in for their repeats (``--history confirm``: their
        prior confirmed here)."""
        return {g for g, r in self.prior_state.items() if r.get("state") == "confirmed"}

    def runnable(self, run: str) -> bool:
        group = self.runs[run].group
        return group not in self.eliminated and group not in self.settled

    def skip(self, run: str) -> None:
        group = self.runs[run].group
        if group in self.eliminated:
            why = f"group {group} left the race ({self.eliminated[group]['kind']})"
        else:
            why = f"group {group}'s catalogue runs stand in for its repeats (its prior confirmed)"
        self.schedule.state["skipped"][run] = f"not run: {why}"
        self.schedule.save()

    def rerun(self) -> str | None:
        """The next passed-over run of a re-admitted group, to hand out again (None: none)."""
        return self.again.pop(0) if self.again else None

    # --- what the stopper and the searcher tell ---
    def observe(self, run: str, result: dict[str, Any]) -> bool:
        """One window of ``run``; True when the run is to stop now."""
        self.running.add(run)
        history = self.windows.setdefault(run, [])
        window = _window(result, history, self.runs[run].config.stall_alert_ratio,
                         self.plan.warmup_windows)  # fmt: skip
        history.append(window)
        if run not in self.schedule.stops and window["clean"]:
            # never decide on a window with a stall alert, a stall or an exceptional boundary
            self._check_unstable_midway(run)
            self._judge()
        self._check_judgeable(self.runs[run].group)
        if run in self.schedule.stops:
            self.told.add(run)  # from here on its stop cannot be taken back
            return True
        return False

    def complete(self, run: str, outcome: str) -> None:
        """``run`` ended: ``ok`` (at max_steps), ``error`` (it failed), ``timeout`` (stopped by
        run_timeout_s) or ``cut`` (the sweep was interrupted: --resume runs it again)."""
        self.running.discard(run)
        group = self.runs[run].group
        if outcome != "cut":
            self.ended.add(run)
        # Never settled on the catalogue alone: a settled group's run that failed, or ended
        # short before it was told its stop (a trial told to stop ends ``cut``: its stop landed).
        lost = outcome in ("error", "timeout") or (outcome == "cut" and run not in self.told)
        if lost and group in self.settled:
            what = "was interrupted" if outcome == "cut" else f"did not finish ({outcome})"
            self._unsettle(group, f"its run {run} {what} before its stop was recorded")
        if run in self.schedule.stops or outcome == "cut":
            return
        if outcome != "ok":
            if group not in self.eliminated:
                self._eliminate(group, "failed", f"run {run} did not finish ({outcome})")
            return
        figures = _tail_figures(self.windows.get(run, []), self.runs[run].config)
        if figures:  # kept also when its group is out: it counts should the group come back
            self.finished[run] = figures
        if group not in self.eliminated:
            self._check_unstable(group)
            self._judge()
        self._check_judgeable(group)

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
            if st.get("status") in ("ok", "stopped_early"):
                self.ended.add(run)
        # A settled group whose run the earlier attempt lost before its stop was recorded (no
        # run of it ok or stopped here) would rank on its catalogue runs alone: un-settled.
        for group in sorted(self.settled):
            if not any(done.get(r, {}).get("status") in ("ok", "stopped_early")
                       for r in self.groups[group]):  # fmt: skip
                self._unsettle(group, "its run here was interrupted before its stop was "
                               "recorded (--resume)")  # fmt: skip
        # A run the earlier attempt recorded as skipped whose group came back after that (the
        # schedule no longer skips it) runs in this one.
        skipped = self.schedule.state["skipped"]
        again = [r for r in self.runs if done.get(r, {}).get("status") == "skipped"
                 and r not in skipped]  # fmt: skip
        self.again = sorted({*self.again, *again}, key=self.order.__getitem__)

    # --- the statistics ---
    def bounds(self, group: str) -> dict[str, float] | None:
        """The group's estimate and bounds, None until it has ``min_windows`` clean windows."""
        per_run = [
            [w["samples_per_s"] for w in self.windows.get(run, []) if w["clean"]]
            for run in self.groups[group]
        ]
        if group in self.settled and self.priors is not None:  # pooled, as its ranking is
            scale = self.scale  # at this host's level today (the module docstring)
            per_run += [[x * scale for x in r.windows] for r in self.priors.groups[group].runs]
        per_run = [v for v in per_run if v]
        values = [x for v in per_run for x in v]
        if len(values) < self.plan.min_windows:
            return None
        means = [statistics.fmean(v) for v in per_run]
        mean = statistics.fmean(means)
        half = self.plan.noise_floor * mean
        q = (1 + self.plan.confidence) / 2
        for sample in (values, means):  # Student's t over the windows, then over the runs
            if len(sample) > 1:
                t = stats.t_quantile(q, len(sample) - 1)
                half = max(half, t * statistics.stdev(sample) / len(sample) ** 0.5)
        return {"mean": mean, "low": mean - half, "high": mean + half, "windows": len(values),
                "runs": len(means)}  # fmt: skip

    def _decide(self) -> None:
        """Stop every group whose upper bound is below the best reference's lower bound. A
        reference is a group in the race with a finished (hence stable so far) run, or a
        settled one (its confirmed catalogue runs finished; its bounds pool them). A settled
        group has nothing left to stop."""
        refs = {}
        settled = self.settled
        for group in self.groups:
            if group in self.eliminated:
                continue
            if group in settled or any(r in self.finished for r in self.groups[group]):
                b = self.bounds(group)
                if b is not None:
                    refs[group] = b
        if not refs:
            return
        best = max(refs, key=lambda g: refs[g]["low"])
        low = refs[best]["low"]
        for group in self.groups:
            if group == best or group in self.eliminated or group in settled:
                continue
            b = self.bounds(group)
            if b is not None and b["high"] < low:
                pooled = best in settled  # its bounds pool catalogue runs, scaled
                self._eliminate(
                    group,
                    "slower",
                    f"upper bound {b['high']:.2f} samples/s (mean {b['mean']:.2f}, "
                    f"{b['windows']} windows of {b['runs']} run(s)) < {best}'s lower bound "
                    f"{low:.2f}"
                    + (f" (its catalogue runs scaled by {self.scale:.3f})" if pooled else ""),
                    by=best,
                    scale=self.scale if pooled else None,
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
        """The Phase B limits over the group's finished runs (platform.stability); a settled
        group's are pooled: its runs here as far as they ran and its catalogue runs."""
        done = self._phase_b_runs(group)
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
            settled = group in self.settled  # its catalogue iter p50 / the factor
            pooled = " (over its runs here and in the catalogue)" if settled else ""
            self._eliminate(group, "unstable", "; ".join(failures) + pooled,
                            scale=self.scale if settled else None)  # fmt: skip

    def _phase_b_runs(self, group: str) -> list[dict[str, float]]:
        """The tail figures the Phase B limits judge: the group's finished runs; for a settled
        group also its other runs here (as far as they ran) and its catalogue runs."""
        done = [self.finished[r] for r in self.groups[group] if r in self.finished]
        if group not in self.settled or self.priors is None:
            return done
        for run in self.groups[group]:
            if run not in self.finished and self.windows.get(run):
                figures = _tail_figures(self.windows[run], self.runs[run].config)
                if figures:
                    done.append(figures)
        scale = self.scale  # at this host's level today: an iter p50 / the factor
        for r in self.priors.groups[group].runs:
            if math.isfinite(r.iter_ratio) and math.isfinite(r.iter_p50_ms):
                done.append({"iter_ratio": r.iter_ratio, "iter_p50": r.iter_p50_ms / scale})
        return done

    def _eliminate(self, group: str, kind: str, reason: str, by: str | None = None,
                   prior: bool = False, scale: float | None = None) -> None:  # fmt: skip
        """``group`` leaves the race; ``by``: the leader it is slower than (under its lower
        bound, or with ``prior``: on the catalogue's figures, confirmed here); ``scale``: the
        factor the pooled catalogue runs it was judged on (the leader's, or its own for the
        Phase B limits) were scaled by."""
        self.eliminated[group] = {"kind": kind, "reason": reason, "ts": time.time()}
        if by is not None:
            self.eliminated[group]["by"] = by
        if prior:
            self.eliminated[group]["prior"] = True
        if scale is not None:
            self.eliminated[group]["scale"] = scale
        for run in self.groups[group]:
            if run in self.running and run not in self.schedule.stops:
                self._stop(run, f"{kind}: {reason}")
        self.schedule.save()
        self.echo(f"race: group {group} leaves the race ({kind}): {reason}")
        if kind != "slower":
            out = self.eliminated[group]
            self._readmit(group, f"{group} left the race ({out['kind']}): {out['reason']}")

    def _readmit(self, leader: str, why: str) -> None:
        """``leader`` left the race unstable or failed, so it cannot win: the groups it knocked
        out as slower (on their bounds or on the catalogue's figures) come back (see the module
        docstring) and are judged again at once (their finished runs against the Phase B
        limits, their bounds and priors against the leaders still valid)."""
        knocked = [g for g, e in self.eliminated.items() if e.get("by") == leader]
        skipped, stops = self.schedule.state["skipped"], self.schedule.stops
        for group in knocked:
            revoked = self.eliminated.pop(group)
            runs = [r for r in self.groups[group] if r in skipped]
            for run in runs:
                del skipped[run]
            # A running run told nothing yet goes on: its stop is taken back.
            for run in self.groups[group]:
                if run in stops and run in self.running and run not in self.told:
                    del stops[run]
            self.again = sorted({*self.again, *runs}, key=self.order.__getitem__)
            self.schedule.state["readmitted"].append(
                {"group": group, "revoked": revoked, "why": why, "runs": runs, "ts": time.time()}
            )
            again = f"; runs again: {', '.join(runs)}" if runs else ""
            if revoked.get("prior"):  # judged again, against the leaders still valid
                record = self.prior_state[group]
                record.update(state="held", line=record["line"] + f"; back in the race ({why})")
            self.echo(f"race: group {group} is back in the race ({why}){again}")
        if knocked:
            self.schedule.save()
            for group in knocked:  # a run may have finished while it was out
                if group not in self.eliminated:
                    self._check_unstable(group)
            self._judge()

    # --- the windows and stops ---
    def _clean(self, group: str) -> list[dict[str, Any]]:
        """The group's clean windows here, run after run."""
        return [w for run in self.groups[group] for w in self.windows.get(run, []) if w["clean"]]

    def _stop(self, run: str, reason: str) -> None:
        """Record the race's stop of ``run`` at its last window (told at its next report)."""
        last = self.windows.get(run) or [{}]
        self.schedule.stops[run] = {
            "by": "race",
            "step": last[-1].get("step"),
            "window": len(self.windows.get(run, [])),
            "reason": reason,
            "ts": time.time(),
        }

    # --- a group that can never be judged ---
    def _check_judgeable(self, group: str) -> None:
        """Say once (console and the schedule's ``unjudged``) when ``group`` can no longer reach
        ``min_windows`` clean windows: those it has and every window its runs have left,
        each counted clean, fall short."""
        unjudged = self.schedule.state.get("unjudged", {})
        if group in self.eliminated or group in unjudged or group in self.settled:
            return
        p = self.plan
        skipped = self.schedule.state["skipped"]
        have, left, unclean = 0, 0, {}
        for run in self.groups[group]:
            seen = self.windows.get(run, [])
            have += sum(w["clean"] for w in seen)
            for w in seen:
                if w.get("unclean"):
                    unclean[w["unclean"]] = unclean.get(w["unclean"], 0) + 1
            if run in self.ended or run in self.schedule.stops or run in skipped:
                continue
            cfg = self.runs[run].config
            total = -(-cfg.max_steps // max(1, cfg.log_every))  # the run's windows
            left += max(0, total - max(len(seen), p.warmup_windows))
        if have + left >= p.min_windows:
            return
        why = ", ".join(f"{n} {kind}" for kind, n in unclean.items()) or "none left out yet"
        line = (
            f"cannot be judged: {have} clean window(s) and at most {left} to come, under "
            f"min_windows {p.min_windows} (windows left out: {why}); it runs as in a grid"
        )
        self.schedule.state["unjudged"] = {**unjudged, group: line}
        self.schedule.save()
        self.echo(f"race: group {group} {line}")


def _window(
    result: dict[str, Any], history: list[dict[str, Any]], alert_ratio: float, warmup: int
) -> dict[str, Any]:
    """One window as the race sees it; ``clean``: past the warm-up, no stall alert (the
    recorder's rule, platform.analysis.stats), no stall inside it and no epoch boundary where
    boundaries are the exception (``unclean`` says which one kept it out).

    A stall inside a window (the host paused the process for a second: one long step, which
    leaves the window's iter p50 alone) shows as its samples/s falling below the run's median
    so far divided by the same ``alert_ratio``; such a window would widen the group's bounds
    and keep a clearly slower group in the race.

    Boundaries (the module docstring): ``boundaries`` is how many the window holds (its epoch
    less the previous window's; the first window's, from epoch 0). They make it unclean unless
    every window of the run so far, this one included, holds one or more. A result handed
    again for the same step (Tune repeats the last one with ``done``) holds none and does not
    count for the rule."""
    p50 = float(result.get("iter_ms_p50") or math.nan)
    p90 = float(result.get("iter_ms_p90") or math.nan)
    sps = float(result.get("samples_per_s") or math.nan)
    epoch = _epoch(result.get("epoch"))
    again = bool(history) and result.get("step") == history[-1]["step"]
    before = history[-1]["epoch"] if history else 0
    boundaries = 0 if again or epoch is None or before is None else max(0, epoch - before)
    steady = boundaries > 0 and all(w["boundaries"] > 0 for w in history if not w["again"])
    alert = stats.stall_alert([w["iter_ms_p50"] for w in history], p50, alert_ratio)
    earlier = [w["samples_per_s"] for w in history if math.isfinite(w["samples_per_s"])]
    stalled = len(earlier) >= 2 and sps * alert_ratio < statistics.median(earlier)
    unclean = (
        "warm-up" if len(history) < warmup
        else "epoch boundary" if boundaries and not steady
        else "stall alert" if alert is not None
        else "stall" if stalled
        else "no iter time" if not math.isfinite(p50)
        else None
    )  # fmt: skip
    return {
        "step": result.get("step"),
        "epoch": epoch,
        "boundaries": boundaries,
        "again": again,
        "samples_per_s": sps,
        "iter_ms_p50": p50,
        "iter_ms_p90": p90,
        "iter_ratio": stats.window_ratio(p90, p50),
        "clean": unclean is None,
        "unclean": unclean,
    }


def _epoch(value: Any) -> int | None:
    """A window's epoch (None where the run reports none)."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return int(number) if math.isfinite(number) else None


def _tail_figures(history: list[dict[str, Any]], cfg) -> dict[str, float] | None:
    """A finished run's tail (its last ``tail_timing_points`` windows after the first) as
    platform.analysis.stats defines it: mean iter p90/p50 (p50 floored) and mean iter p50."""
    tail = history[tail_start(len(history), cfg.tail_timing_points) :]
    if not tail:
        return None
    return {
        "iter_ratio": stats.tail_ratio(
            [w["iter_ms_p90"] for w in tail], [w["iter_ms_p50"] for w in tail]
        ),
        "iter_p50": statistics.fmean(w["iter_ms_p50"] for w in tail),
    }
