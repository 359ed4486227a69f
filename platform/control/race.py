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

Priors (a warm start, platform/analysis/history.py: ``race_priors``). On a host fingerprint seen
before, a group may come with what the catalogue measured of the same configuration there: its
earlier runs, their windows after the warm-up and their tail figures. What the race does with
them is the sweep's history mode (``--history``, kept in the schedule's ``history``):

``confirm`` (the default). The catalogue's runs of a group stand in for its repeats once this
host confirms them: when the group has ``confirm_windows`` clean windows here, their mean over
the catalogue's mean must fall in the prior's band (``Priors.confirms``: a prediction band of a
new run's first windows from the catalogue alone, the run-to-run spread pooled over the priors,
the group's window spread there and ``noise_floor``; few windows here never widen it). Inside,
the group settles (``settled``): its run going stops there, its later repeats are not run
(``skipped``: its catalogue runs stand in), the Phase B limits judge its runs here and its
catalogue runs together (unstable over them, it leaves as unstable instead), and it is a
reference for the groups still racing, its bounds over those pooled runs. The sweep's ranking
pools the same runs and says so (platform/analysis/pooled.py). Outside the band, the prior is
dropped for good and the group runs as cold, every repeat: a host that changed since (clocks, a
noisy neighbour) is caught per group. A change every group shares, small enough to fall inside
each band alone, is caught across them (``_check_shift``: once two or more groups were judged,
the median of their ratios must lie within ``shift_tolerance`` of 1, else every prior is dropped
and the settled groups un-settled, in one line). Within it, that median (``host_shift``; one
judged group's own ratio) is the level this host shows against the catalogue today, and the
catalogue runs are scaled by it wherever they count as measured here: a settled group's pooled
bounds (its catalogue windows' samples/s x the factor), its Phase B checks (their iter p50 /
the factor) and the ranking (platform/analysis/pooled.py); unscaled, a host 2.5 % slower today
would rank a settled group up to 2.5 % above a group that raced cold. The factor at each
decision is kept (a settled prior's ``scale``, an elimination on pooled figures' ``scale``), the
latest in the schedule's ``history``' ``scale``, which the ranking and ``--resume`` read. The
band test itself stays on the unscaled catalogue: it is what measures the shift. A settled
group never ranks on its catalogue runs alone: when the run that confirmed it fails, or ends
before its stop was told (or, on --resume, was recorded), it is un-settled (``_unsettle``: its
prior dropped, its repeats handed out again). A prior the sweep cannot pool (runs of another or an unknown platform
commit, or an unknown corpus: ``order_only``) is used as ``order`` uses it. A
settled group is never stopped as slower; its pooled figures rank it. Every point still runs
here, as in a cold race (no point is ranked on the catalogue alone), but only as long as it
takes to tell that the host still measures what it measured before.

``order``. The priors decide what stops early and nothing else: the bounds, the Phase B checks,
the ranking and the winner use the sweep's own windows alone. The prior leader is the steady
group in the race with the highest prior mean whose prior was not dropped; a group within noise
of it in the catalogue (``Priors.versus``: the band of ``platform.catalogue compare``, holding
1) races as it would cold and runs its repeats. A group the catalogue measured clearly slower
than it (the band under 1) is judged once it and the leader have ``confirm_windows`` clean
windows here: its ratio here is the median of its first ones over the median of the leader's
clean windows so far. It agrees when that ratio is no higher than the catalogue's band allows
(the group is no closer to the leader here than measured before; slower still agrees): the
group is stopped as slower ``by`` the leader, its verdict marked ``prior``. Higher, the prior
is dropped (for good) and the group races cold. The ratio, not the group's own figure, is
compared so that a host running a few percent slower or faster than on the catalogue's day
(benchmarks/results/warm_race_2xh200/: every group 1-3 % slower in race 2) moves both sides
alike. A prior leader that leaves the race unstable or failed lets back the groups it stopped
this way, as any leader does; their priors are judged again against the next one.

Each group's prior, its state (held, confirmed or dropped; in ``order`` held, agreed or
dropped), the catalogue runs it holds and what it decided are in the schedule's ``priors``.

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
from platform.analysis.history import Priors, host_shift
from platform.spaces.expand import RunSpec
from platform.spaces.space import SearchSpace
from platform.storage import results
from stage1_common.output_root import OutputRoot
from stage1_common.tail import tail_start

__all__ = ["METRIC", "SCHEDULE", "Race", "Schedule"]

SCHEDULE = OutputRoot.SCHEDULE
METRIC = "platform_samples_per_s"  # what ASHA and Optuna rank runs by (set by the driver)
_UNJUDGED = "not judged here"  # a prior's line before the race used it


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


class Race:
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

    # --- priors (a warm start): see the module docstring ---
    def _hold_priors(self, priors: Priors) -> None:
        """Each group's prior into the schedule (``priors``: its figures, the catalogue runs it
        holds, held until judged here; a resumed sweep's as its first attempt left them) and
        the mode and noise (``history``): what the analysis pools and ``--resume`` rebuilds (a
        resumed race keeps what its ``history`` holds besides: the shift, the scale)."""
        before = self.schedule.state.get("priors") or {}
        held = {}
        for group in self.groups:
            prior = priors.groups.get(group)
            if prior is None:
                continue
            held[group] = before.get(group) or {
                "state": "held",
                "catalogue": prior.describe(),
                "mean": prior.mean,
                "runs": len(prior.runs),
                "windows": len(prior.windows),
                "sweeps": list(prior.sweeps),
                "jittery": prior.jittery,
                "line": _order_line(prior.order_only, _UNJUDGED),
                "order_only": prior.order_only,
                "catalogue_runs": [r.record() for r in prior.runs],
            }
        if held:
            self.schedule.state["priors"] = held
            kept = self.schedule.state.get("history") or {}
            self.schedule.state["history"] = {**kept, "mode": self.history, **priors.record()}
            self.schedule.save()

    def _clean(self, group: str) -> list[dict[str, Any]]:
        """The group's clean windows here, run after run."""
        return [w for run in self.groups[group] for w in self.windows.get(run, []) if w["clean"]]

    def _prior_leader(self) -> str | None:
        """The steady group in the race with the highest prior mean, its prior not dropped."""
        held = [
            g for g, r in self.prior_state.items()
            if g not in self.eliminated and r["state"] != "dropped" and not r.get("jittery")
        ]  # fmt: skip
        return max(held, key=lambda g: self.prior_state[g]["mean"]) if held else None

    def _judge(self) -> None:
        """What a clean window or a run's end may decide: with ``confirm`` priors, those first
        (a group settled on its confirmed prior is a reference and is never stopped as
        slower, so it settles before the bounds judge it), then the bounds; else the bounds,
        then the priors."""
        if self.history == "confirm":
            self._decide_prior()
            self._decide()
        else:
            self._decide()
            self._decide_prior()

    def _decide_prior(self) -> None:
        """The priors' decisions, by the history mode: ``confirm`` (``_confirm_priors``) or
        ``order`` (``_stop_on_priors``)."""
        if self.priors is None:
            return
        if self.history == "confirm":
            self._confirm_priors()
            if any(r.get("order_only") for r in self.prior_state.values()):
                self._stop_on_priors()  # the priors it cannot pool, as --history order
        else:
            self._stop_on_priors()

    def _confirm_priors(self) -> None:
        """``--history confirm``: each held prior whose group has ``confirm_windows`` clean
        windows here is judged on their mean over its catalogue mean (``Priors.confirms``).
        Inside the band, the group settles (``_settle``); outside, its prior is dropped for
        good and it runs as cold, every repeat."""
        if (self.schedule.state.get("history") or {}).get("shift"):
            return  # every prior dropped (``_check_shift``)
        k = self.plan.confirm_windows
        for group, record in self.prior_state.items():
            if record["state"] != "held" or group in self.eliminated or record.get("order_only"):
                continue
            if group not in self.priors.groups:
                continue
            mine = self._clean(group)[:k]
            if len(mine) < k:
                continue
            ratio, low, high = self.priors.confirms(group, [w["samples_per_s"] for w in mine])
            prior = self.priors.groups[group]
            at = f"its first {k} judged window(s) here (to step {mine[-1]['step']})"
            band = (f"{ratio:.3f}x its catalogue runs' first {k} judged windows "
                    f"({prior.first_mean(k):.1f} samples/s; band {low:.3f}-{high:.3f})")  # fmt: skip
            if low <= ratio <= high:
                self._settle(group, record, f"{at} put it at {band}", ratio)
                continue
            record.update(state="dropped", here=ratio, line=(
                f"dropped: {at} put it at {band}; it ran as cold, every repeat"))  # fmt: skip
            self._rescale()
            self.schedule.save()
            self.echo(f"race: group {group}: catalogue prior dropped: {at} put it at {band}; it "
                      "runs as cold, every repeat")  # fmt: skip
        self._check_shift()

    def _check_shift(self) -> None:
        """The shift every group shares: once two or more groups were judged against their
        priors (confirmed or dropped), the median of their ratios here over the catalogue must
        lie within ``shift_tolerance`` of 1 (3 %: the same host measured the same groups 1-3 %
        apart from one race to the next, benchmarks/results/warm_race_2xh200, and a median of
        two or three groups' first windows is no closer than that; a tighter tolerance would
        send most warm races on an unchanged host cold, a looser one would pool runs of a host
        that changed. Within it, the catalogue runs are scaled by the shift wherever they are
        pooled, ``_rescale``, so the pooled groups sit at this host's level, as the groups
        that race cold do). Outside it, this host measures differently from the
        catalogue's day as a whole (clocks, a driver, a neighbour: every group 5 % slower fits
        inside each group's own band, and would pool runs of two hosts): every prior is
        dropped, the settled groups un-settled, and every group races cold, said in one line
        (kept in the schedule's ``history``' ``shift``)."""
        kept = self.schedule.state.get("history") or {}
        if kept.get("shift"):
            return
        shift, judged = host_shift(self.prior_state)
        if judged < 2:
            return
        tolerance = self.plan.shift_tolerance
        if abs(shift - 1) <= tolerance:
            return
        line = (f"catalogue priors dropped: the {judged} group(s) judged so far put this "
                f"host at {shift:.3f}x their catalogue runs' (median), outside the shift "
                f"tolerance (+-{tolerance:.0%}): the host measures differently from the catalogue's day as a "
                "whole; every group races cold, every repeat")  # fmt: skip
        kept["shift"] = line
        self.schedule.state["history"] = kept
        for group, record in self.prior_state.items():
            if record["state"] == "confirmed":
                self._unsettle(group, f"the shift every group shares ({shift:.3f}x)", say=False)
            elif record["state"] == "held":
                record.update(state="dropped", line=f"dropped: the shift every group shares "
                              f"({shift:.3f}x); it ran as cold, every repeat")  # fmt: skip
        self.schedule.save()
        self.echo(f"race: {line}")

    def _settle(self, group: str, record: dict[str, Any], why: str, ratio: float) -> None:
        """A confirmed prior: the group's runs going stop here, its later repeats are not run
        (``runnable``), its catalogue runs stand in for them, in the Phase B checks at once and
        in the ranking (platform/analysis/pooled.py). Unstable over those pooled runs, it
        leaves the race as unstable instead."""
        prior = self.priors.groups[group]
        going = [
            r for r in self.groups[group] if r in self.running and r not in self.schedule.stops
        ]
        steps = [self.windows[r][-1]["step"] for r in going if self.windows.get(r)]
        stop = f"stopped at step {steps[0]}" if steps else "no run going"
        stands = (f"its {len(prior.runs)} catalogue run(s) (sweep(s) {', '.join(prior.sweeps)}) "
                  "stand in for its repeats, pooled in the ranking")  # fmt: skip
        record.update(state="confirmed", here=ratio, line=f"confirmed: {why}; {stop}; {stands}")
        record["scale"] = self._rescale()  # its pooled figures' factor, as it settled
        self._check_unstable(group)
        if group in self.eliminated:  # its run was stopped as unstable
            record["line"] += "; then left the race as unstable over those runs"
            self.schedule.save()
            return
        for run in going:
            self._stop(run, f"prior confirmed: {why}; {stands}")
        self.schedule.save()
        self.echo(f"race: group {group}: catalogue prior confirmed: {why}; {stop}, {stands}")

    def _rescale(self) -> float:
        """The shift this host shows now (``host_shift`` over the groups judged so far),
        kept in the schedule's ``history`` as ``scale`` (its ``factor`` and the groups it is
        the median of, ``judged``): the factor the catalogue runs are scaled by wherever they
        count as measured here, in the race and in the ranking (the module docstring)."""
        factor, judged = host_shift(self.prior_state)
        kept = self.schedule.state.setdefault("history", {})
        kept["scale"] = {"factor": factor, "judged": judged}
        return factor

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

    def _unsettle(self, group: str, why: str, say: bool = True) -> None:
        """A settled group whose prior no longer stands: it lost the run that confirmed it
        (failed, or interrupted before its stop was told or recorded; with no measured run
        here its catalogue runs would stand in for every run), or the shift every group
        shares dropped every prior. Its prior is dropped and it races cold: a stop not told
        yet is taken back (an interrupted run runs again on --resume), a run told its stop
        stays stopped (its windows count as a cold race's would), and the repeats the prior
        skipped are handed out again; the groups it knocked out as slower on its pooled bounds
        come back (``_readmit``). ``say``: its own line (the shift says one for all)."""
        record = self.prior_state[group]
        stops, skipped = self.schedule.stops, self.schedule.state["skipped"]
        for run in self.groups[group]:
            reason = str(stops.get(run, {}).get("reason", ""))
            if reason.startswith("prior confirmed") and run not in self.told:
                del stops[run]
        runs = [r for r in self.groups[group] if r in skipped and "catalogue runs stand in"
                in skipped[r]]  # fmt: skip
        for run in runs:
            del skipped[run]
        self.again = sorted({*self.again, *runs}, key=self.order.__getitem__)
        record.update(state="dropped", line=f"{record['line']}; then un-settled: {why}; it "
                      "raced cold, every repeat")  # fmt: skip
        self.schedule.save()
        if say:
            self.echo(f"race: group {group}: catalogue prior dropped: {why}; it runs as cold, "
                      "every repeat")  # fmt: skip
        # What it knocked out as slower on bounds pooled with its catalogue runs comes back,
        # judged again against the references still valid.
        self._readmit(group, f"{group}'s catalogue prior was dropped ({why})")

    def _stop_on_priors(self) -> None:
        """``--history order``: each held prior of a group the catalogue measured clearly
        slower than the prior leader, once both have ``confirm_windows`` clean windows here:
        the group's first ones' median over the leader's clean windows' median is its ratio
        here. No higher than the catalogue's band of their ratio allows, it agrees and the
        group is stopped; higher, its prior is dropped and it races cold. In ``confirm``, the
        priors it cannot pool (``order_only``) alone, each line saying why."""
        confirm = self.history == "confirm"
        leader = self._prior_leader()
        k = self.plan.confirm_windows
        lead = [w["samples_per_s"] for w in self._clean(leader)] if leader else []
        if len(lead) < k:
            return
        ahead = self.prior_state[leader]
        if (
            ahead["state"] == "held"
            and not ahead.get("leads")
            and (not confirm or ahead.get("order_only"))
        ):
            said = "the prior leader: runs its repeats"
            ahead.update(leads=True, line=_order_line(ahead.get("order_only"), said)
                         if ahead["line"].endswith(_UNJUDGED) else f"{ahead['line']}; then {said}")  # fmt: skip
        for group, record in self.prior_state.items():
            mine = self._clean(group)[:k]
            if group == leader or group in self.eliminated or record["state"] != "held":
                continue
            why = record.get("order_only")
            if confirm and not why:
                continue
            ratio, low, high = self.priors.versus(group, leader)
            band = f"{ratio:.2f}x in the catalogue (band {low:.2f}-{high:.2f})"
            if high >= 1.0:  # within noise of the leader there: its repeats run
                if record["line"].endswith(_UNJUDGED):
                    record["line"] = _order_line(
                        why, f"within noise of the leader {leader}: {band}; runs its repeats"
                    )
                continue
            if len(mine) < k:
                continue
            here = statistics.median(w["samples_per_s"] for w in mine) / statistics.median(lead)
            at = f"its first {k} judged window(s) here (to step {mine[-1]['step']})"
            if here > high:
                record.update(state="dropped", here=here, line=_order_line(why, (
                    f"dropped: {at} put it at {here:.2f}x the leader {leader}, above {band}; "
                    "raced cold")))  # fmt: skip
                self.schedule.save()
                self.echo(f"race: group {group}: catalogue prior dropped ({at}: {here:.2f}x the "
                          f"leader {leader}, above {band}); it races cold")  # fmt: skip
                continue
            steps = [self.windows[r][-1]["step"] for r in self.groups[group]
                     if r in self.running and self.windows.get(r)]  # fmt: skip
            stop = f"stopped at step {steps[0]}" if steps else "stopped before its next repeat"
            reason = f"{stop}: {here:.2f}x the leader here and {band}; {at} agree"
            record.update(state="agreed", here=here,
                          line=_order_line(why, f"agreed; {reason} (leader {leader})"))  # fmt: skip
            self._eliminate(group, "slower", reason, by=leader, prior=True)

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


def _order_line(why: str | None, line: str) -> str:
    """A prior's line; for one ``--history confirm`` cannot pool (``why``), saying so first."""
    return f"as --history order, never pooled ({why}): {line}" if why else line


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
