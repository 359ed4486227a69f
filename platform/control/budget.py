"""A sweep within a time budget (``--budget DURATION``): which runs, how long each, and the stop.

``plan`` decides, from what each run costs (platform/control/costs.py: its start, its seconds
per step) and the seconds left, which of the runs still to hand out run and how many steps
each, in this order of what matters to the answer:

1. every group measured once: as many groups as fit at the shortest run that still ranks (the
   warm-up windows and ``MIN_TAIL`` tail windows); the groups that do not fit are left unrun,
   said in the plan and the report;
2. each run as long as the space's own measurement: its warm-up and ``tail_timing_points``
   windows, each as short as a window may be (``MIN_WINDOW_S``), up to ``max_steps``;
3. the space's repeats (a second run shows the run-to-run noise one run cannot);
4. each run up to ``max_steps``.

A short run keeps its windows countable: its window (``log_every``) shrinks so that it holds
the space's windows, never under ``MIN_WINDOW_S`` seconds; its tail is what follows the
warm-up. Steps and windows are set on a run when it is handed out, so ``Budget`` re-plans at
every hand-out with what the sweep has measured since (its windows, its runs' starts): the
first estimates are the machine's memory or priors, and the plan follows the measurements.

A run handed out before any step time is known (a configuration the machine never ran, first
in its sweep) cannot be given steps: it runs with short windows and its share of the seconds
(``boxed``), and the stopper ends it there as a finished run whose tail is its windows after
the warm-up. At the deadline less the sweep's end (the analysis, the report, the groups'
close), every run still going is stopped with its windows kept (``stopped_early``), nothing
more is handed out, and the sweep ends as a finished one does: every table written. The
planned runs not run are ``skipped``, with the budget as the reason.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from platform.control.costs import Costs, cost_key, read_memory
from platform.spaces.expand import RunSpec
from stage1_common.durations import shown
from stage1_common.machine_cache import configured_cache
from trainables.resident.shape import starts_group

__all__ = ["MIN_TAIL", "Budget", "Plan", "dry_plan", "plan"]

MIN_TAIL = 3  # tail windows a run needs to be ranked
MIN_WINDOW_S = 2.0  # the shortest window a budget gives a run, in seconds
UNKNOWN_WINDOW = 10  # steps per window of a run whose step time is not known yet
BOXED_FLOOR_S = 10.0  # the fewest seconds of steps a run of unknown step time is given


@dataclass(frozen=True)
class Ask:
    """A run still to hand out, as the planner sees it: its group, its repeat's rank among the
    group's runs still to run (1: the group's next), its start and its seconds per step (None:
    not known yet)."""

    name: str
    group: str
    rank: int
    start_s: float
    step_s: float | None


@dataclass(frozen=True)
class Plan:
    """Which runs run (``runs``), ``steps`` each in windows of ``window`` steps, ``tail``
    windows ranked; the groups and runs left unrun; the seconds it is estimated to take.
    ``share_s``: a run whose step time is unknown gets these seconds of steps (boxed)."""

    runs: tuple[str, ...]
    groups: tuple[str, ...]  # the groups of ``runs``
    steps: int
    window: int
    tail: int
    repeats: int
    left_out: tuple[str, ...]
    groups_left_out: tuple[str, ...]
    estimate_s: float
    capacity_s: float
    share_s: float | None = None

    def line(self) -> str:
        covered, total_groups = len(self.groups), len(self.groups) + len(self.groups_left_out)
        length = (
            f"{self.share_s:.0f} s of steps each (step time not known yet)"
            if self.share_s is not None
            else f"{self.steps} steps each in windows of {self.window}"
        )
        out = (
            f"{len(self.runs)} run(s): {covered} of {total_groups} group(s) x up to "
            f"{self.repeats} repeat(s), {length}; about {shown(self.estimate_s)} of "
            f"{shown(self.capacity_s)}"
        )
        if self.left_out:
            out += f"; left unrun: {len(self.left_out)} run(s)"
            if self.groups_left_out:
                out += f" (groups never measured: {', '.join(self.groups_left_out)})"
        return out


def plan(
    asks: list[Ask],
    *,
    seconds: float,
    busy_s: float = 0.0,
    concurrency: int = 1,
    max_steps: int,
    log_every: int,
    warmup: int,
    tail: int,
    at_least_one: bool = True,
) -> Plan:
    """The plan for ``asks`` (in the order they would be handed out) within ``seconds`` (the
    time left less the sweep's end), ``busy_s`` of it already taken by runs still going, with
    ``concurrency`` runs at once. See the module's doc for the order of what it keeps. An
    ask's ``rank`` 1 is its group's first run (a group not measured yet). ``at_least_one``
    (nothing handed out yet): a budget too small for any run still runs the first, as short as
    it ranks; later, what does not fit is left unrun."""
    capacity = max(0.0, seconds * concurrency - busy_s)
    new = list(dict.fromkeys(a.group for a in asks if a.rank == 1))  # never measured
    known = [a.step_s for a in asks if a.step_s]
    if not known:
        return _boxed(asks, new, capacity, seconds, at_least_one)

    def step_of(a: Ask) -> float:
        return a.step_s or max(known)

    def chosen(k: int, r: int) -> list[Ask]:
        """The first runs of the first ``k`` new groups, and the runs up to repeat ``r`` of
        every group measured or chosen."""
        out = set(new[:k])
        return [a for a in asks if (a.group in out if a.rank == 1 else
                                    a.rank <= r and (a.group not in new or a.group in out))]  # fmt: skip

    def cost(runs: list[Ask], n: int) -> float:
        return sum(a.start_s + n * step_of(a) for a in runs)

    def shortest(runs: list[Ask]) -> int:
        return min(full, (warmup + MIN_TAIL) * _window_floor(runs, step_of, log_every))

    def fits(k: int, r: int, n: int) -> bool:
        """The runs' seconds fit the slots' (``concurrency`` at once), and the longest run
        fits the time left on its own."""
        runs = chosen(k, r)
        longest = max((a.start_s + n * step_of(a) for a in runs), default=0.0)
        return cost(runs, n) <= capacity and longest <= seconds

    # The space's own measurement: its warm-up and tail windows, in windows as short as they
    # may be (the window count is what the tail's statistics count).
    full = min(max_steps, (warmup + tail) * _window_floor(asks, step_of, log_every))
    # The most new groups that fit, each once (with no new group: the repeats alone).
    floor_k = 1 if at_least_one and new else 0
    k = next((k for k in range(len(new), floor_k, -1) if fits(k, 1, shortest(chosen(k, 1)))),
             floor_k)  # fmt: skip
    repeats = 1
    if k == 0 and (new or not fits(0, 2, shortest(chosen(0, 2)))):
        return _nothing(asks, new, capacity, seconds)  # not even the shortest run fits
    n = _longest(lambda n: fits(k, 1, n), shortest(chosen(k, 1) or asks), full)
    top_rank = max(a.rank for a in asks)
    if n >= full or not chosen(k, 1):
        while repeats < top_rank and fits(k, repeats + 1, min(n, full)):
            repeats += 1
        n = _longest(lambda n: fits(k, repeats, n), min(n, full), max_steps)
    runs = chosen(k, repeats)
    if not runs:
        return _nothing(asks, new, capacity, seconds)
    window = _window(n, warmup, tail, _window_floor(runs, step_of, log_every), log_every)
    return Plan(
        runs=tuple(a.name for a in runs),
        groups=tuple(dict.fromkeys(a.group for a in runs)),
        steps=n,
        window=window,
        tail=max(1, min(tail, n // window - warmup)),
        repeats=repeats,
        left_out=tuple(a.name for a in asks if a not in runs),
        groups_left_out=tuple(new[k:]),
        estimate_s=(cost(runs, n) + busy_s) / concurrency,
        capacity_s=seconds,
    )


def _nothing(asks: list[Ask], new: list[str], capacity: float, seconds: float) -> Plan:
    """No run fits: every ask is left unrun."""
    return Plan((), (), 0, 1, 0, 0, tuple(a.name for a in asks), tuple(new), 0.0, seconds)


def _boxed(asks, new, capacity, seconds, at_least_one) -> Plan:
    """Nothing's step time known: equal shares of the seconds, the most runs whose share is at
    least ``BOXED_FLOOR_S`` (every new group first, then repeats, those of groups handed out
    already too); with ``at_least_one``, at least the first run. A share never outlasts the
    time left."""
    for repeats in sorted({a.rank for a in asks}, reverse=True):
        for k in range(len(new), -1, -1):
            out = set(new[:k])
            runs = [a for a in asks if a.rank <= repeats and (a.group in out or a.group not in new)]
            if not runs:
                continue
            starts = max(a.start_s for a in runs)
            share = min((capacity - sum(a.start_s for a in runs)) / len(runs), seconds - starts)
            first_only = k == 1 and repeats == 1 and at_least_one
            if (share >= BOXED_FLOOR_S or first_only) and (k == len(new) or repeats == 1):
                return Plan(
                    runs=tuple(a.name for a in runs),
                    groups=tuple(dict.fromkeys(a.group for a in runs)),
                    steps=0,
                    window=UNKNOWN_WINDOW,
                    tail=1,
                    repeats=repeats,
                    left_out=tuple(a.name for a in asks if a not in runs),
                    groups_left_out=tuple(new[k:]),
                    estimate_s=seconds,
                    capacity_s=seconds,
                    share_s=max(share, 0.0),
                )
    return _nothing(asks, new, capacity, seconds)


def _window_floor(runs: list[Ask], step_of, log_every: int) -> int:
    """The fewest steps a window may have: ``MIN_WINDOW_S`` at the slowest... of the fastest
    run's steps (a slower run's windows are longer still), never over ``log_every``."""
    fastest = min(step_of(a) for a in runs) if runs else 1.0
    return max(1, min(log_every, math.ceil(MIN_WINDOW_S / max(fastest, 1e-6))))


def _window(n: int, warmup: int, tail: int, floor: int, log_every: int) -> int:
    """Steps per window for a run of ``n`` steps: the space's window count where it can hold
    them, never under ``floor`` steps nor over ``log_every``."""
    return max(floor, min(log_every, n // (warmup + tail) or 1))


def _longest(fits: Callable[[int], bool], low: int, high: int) -> int:
    """The largest n in [low, high] that fits (low when none does: the caller checked it)."""
    if high <= low or not fits(low):
        return low
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


class Budget:
    """The budget of one sweep: the deadline, the costs measured as it goes, the plan made again
    at every hand-out (``admit``), the boxed runs ended at their share and every run stopped at
    the deadline (``observe``, ``past_deadline``), and the record (``state``: schedule.json's
    ``budget``)."""

    def __init__(
        self,
        seconds: float,
        started_at: float,
        runs: list[RunSpec],
        *,
        warmup: int,
        concurrency: int,
        costs: Costs,
        end_s: float | None = None,
        echo: Callable[[str], None] = print,
        clock: Callable[[], float] = time.time,
        on_spec: Callable[[RunSpec], None] = lambda spec: None,
    ):
        self.seconds, self.started_at = seconds, started_at
        self.end_s = costs.prior.end_s if end_s is None else end_s
        self.deadline = started_at + seconds - self.end_s
        self.runs = {r.name: r for r in runs}
        self.order = [r.name for r in runs]
        self.warmup = max(1, warmup)
        self.concurrency = max(1, concurrency)
        self.costs, self.echo, self.clock = costs, echo, clock
        self.on_spec = on_spec  # a run's spec as planned: the sweep's records take it
        self.handed: dict[str, RunSpec] = {}  # run -> the spec it was handed out with
        self.going: dict[str, dict[str, Any]] = {}  # run -> {started, step, windows}
        self.gone: set[str] = set()  # runs ended, skipped or passed over
        self.boxes: dict[str, float] = {}  # run -> its share of seconds of steps
        self.record: dict[str, Any] = {
            "seconds": seconds,
            "end_s": self.end_s,
            "plans": [],
            "boxed": {},
            "left_unrun": {},
            "cut": [],
            "used_s": None,
        }
        self._last_plan: tuple | None = None
        self.answered = False  # a run with windows enough to rank has ended

    # --- the plan ---
    def plan_now(self, first: str | None = None) -> Plan:
        """The plan for the runs not handed out yet (``first``: the run about to be)."""
        now = self.clock()
        names = [n for n in self.order if n not in self.handed and n not in self.gone]
        if first is not None and first not in names:
            names.insert(0, first)
        rank: dict[str, int] = {}  # runs of the group handed out before (measured or going)
        for done in self.handed:
            group = self.runs[done].group
            rank[group] = rank.get(group, 0) + 1
        asks = []
        up = set(self.costs.groups_up)
        for name in names:
            spec = self.runs[name]
            rank[spec.group] = rank.get(spec.group, 0) + 1
            starts = starts_group(spec.config, up)
            asks.append(Ask(name, spec.group, rank[spec.group],
                            self.costs.start(spec.config, starts), self.costs.step(spec.config)))  # fmt: skip
        busy = sum(self._left_of(run, now) for run in self.going)
        first_spec = self.runs[names[0]].config if names else None
        return plan(
            asks,
            seconds=max(0.0, self.deadline - now),
            busy_s=busy,
            concurrency=self.concurrency,
            max_steps=first_spec.max_steps if first_spec else 0,
            log_every=first_spec.log_every if first_spec else 1,
            warmup=self.warmup,
            tail=first_spec.tail_timing_points if first_spec else 1,
            at_least_one=not self.handed,
        )

    def _left_of(self, run: str, now: float) -> float:
        """Seconds ``run`` (going) still takes, as planned."""
        spec, seen = self.handed[run], self.going[run]
        if run in self.boxes:
            start = 0.0 if seen.get("windows") else self.costs.start(spec.config, False)
            return start + max(0.0, self.boxes[run] - seen.get("elapsed", 0.0)) + 1.0
        step = self.costs.step(spec.config) or 0.0
        if not seen.get("windows"):
            return self.costs.start(spec.config, False) + spec.config.max_steps * step
        return max(0, spec.config.max_steps - seen["step"]) * step + 1.0

    # --- what the searcher asks ---
    def admit(self, run: RunSpec) -> RunSpec | None:
        """``run`` as the plan has it (its steps, windows and tail), or None when the plan
        leaves it unrun (then recorded as such)."""
        if self.clock() >= self.deadline:
            self._leave(run.name, "the budget's time was up")
            return None
        p = self.plan_now(first=run.name)
        self._note(p)
        if run.name not in p.runs:
            why = (
                f"group {run.group} did not fit the budget"
                if run.group in p.groups_left_out
                else f"repeat {run.repeat} did not fit the budget"
            )
            self._leave(run.name, why)
            return None
        cfg = run.config
        if p.share_s is not None:  # step time unknown: boxed in seconds
            self.boxes[run.name] = p.share_s
            self.record["boxed"][run.name] = {"share_s": round(p.share_s, 1)}
            new = dataclasses.replace(cfg, log_every=min(cfg.log_every, p.window))
        else:
            new = dataclasses.replace(
                cfg,
                max_steps=min(cfg.max_steps, p.steps),
                log_every=min(cfg.log_every, p.window),
                tail_timing_points=min(cfg.tail_timing_points, p.tail),
            )
        spec = dataclasses.replace(run, config=new)
        self.handed[run.name] = spec
        self.on_spec(spec)
        self.going[run.name] = {"started": self.clock(), "step": 0, "windows": 0}
        self.costs.handed_out(run.name, new)
        return spec

    def pass_over(self, run: str) -> None:
        """A run the search passed over for another reason (its group left the race)."""
        self.gone.add(run)

    def _leave(self, run: str, why: str) -> None:
        self.gone.add(run)
        self.record["left_unrun"][run] = why

    def _note(self, p: Plan) -> None:
        """Say and record a plan that differs from the last one said."""
        shape = (bool(p.runs), p.steps, p.window, p.repeats, p.groups_left_out)
        if self._last_plan is not None and (shape == self._last_plan or not p.runs):
            return  # the same plan for the runs left, or nothing more to run: said already
        self._last_plan = shape
        line = p.line()
        self.record["plans"].append(
            {
                "at_s": round(self.clock() - self.started_at, 1),
                "line": line,
                "runs": list(p.runs),
                "steps": p.steps,
                "window": p.window,
                "tail": p.tail,
                "share_s": p.share_s,
                "left_out": list(p.left_out),
            }  # fmt: skip
        )
        self.echo(f"budget plan at {shown(self.clock() - self.started_at)}: {line}")

    # --- what the stopper asks ---
    def observe(self, run: str, result: dict[str, Any]) -> str:
        """One window of ``run`` seen (its costs, where it stands) and decided (``decide``)."""
        if not self.seen(run, result):
            return ""
        return self.decide(run)

    def seen(self, run: str, result: dict[str, Any]) -> bool:
        """One window of ``run``: its costs and where it stands (False: not a run of ours)."""
        spec = self.handed.get(run) or self.runs.get(run)
        if spec is None:
            return False
        self.costs.observe(run, spec.config, result, self.warmup)
        seen = self.going.setdefault(run, {"started": self.clock(), "step": 0, "windows": 0})
        seen.update(step=int(result.get("step") or 0), windows=seen["windows"] + 1,
                    elapsed=float(result.get("elapsed_s") or 0.0), last=self.clock())  # fmt: skip
        return True

    def decide(self, run: str) -> str:
        """After a window of ``run``: '' to go on; ``boxed`` when it ends now as a finished run
        (its share of seconds spent, or the budget's end with its warm-up and ``MIN_TAIL``
        windows measured); ``deadline`` when the budget's end cuts it short."""
        seen = self.going.get(run)
        if seen is None:
            return ""
        if self.clock() >= self.deadline:
            return self.end_now(run)
        share = self.boxes.get(run)
        if share is not None and seen["elapsed"] >= share and self._ranked(seen):
            return self._finish_here(run, "its share of the budget spent")
        return ""

    def end_now(self, run: str) -> str:
        """The budget's end for ``run`` (going): ``boxed`` (finished where it is, its windows
        enough to rank) or ``deadline`` (cut short, recorded as such); '' for the sweep's only
        hope of an answer (no run has windows enough to rank yet), which goes on to its
        shortest ranked length (the whole budget's end still stops it: ``spent``)."""
        seen = self.going.get(run, {})
        if self._ranked(seen):
            return self._finish_here(run, "the budget's end")
        if not self.answered and not any(self._ranked(other) for other in self.going.values()):
            return ""
        if run not in self.record["cut"]:
            self.record["cut"].append(run)
        return "deadline"

    def _ranked(self, seen: dict[str, Any]) -> bool:
        return seen.get("windows", 0) >= self.warmup + MIN_TAIL

    def _finish_here(self, run: str, why: str) -> str:
        """``run`` ends at its last window as a finished run of that length: its spec's steps
        and tail (what follows the warm-up) say so in the sweep's records."""
        spec, seen = self.handed.get(run) or self.runs[run], self.going[run]
        windows = seen["windows"]
        self.record["boxed"].setdefault(run, {}).update(step=seen["step"], windows=windows, why=why)
        tail = min(spec.config.tail_timing_points, windows - self.warmup)
        config = dataclasses.replace(spec.config, max_steps=seen["step"], tail_timing_points=tail)
        self.handed[run] = dataclasses.replace(spec, config=config)
        self.on_spec(self.handed[run])
        return "boxed"

    def ended(self, run: str, ok: bool = True) -> None:
        """``run``'s trial ended (``ok``: finished, not failed nor stopped by the race)."""
        seen = self.going.pop(run, None)
        self.gone.add(run)
        if ok and seen and self._ranked(seen) and run not in self.record["cut"]:
            self.answered = True  # a run with windows enough to rank finished
        if seen and seen.get("last"):
            self.costs.ended(self.clock() - seen["last"])

    def unrun(self) -> dict[str, str]:
        """Every run the budget left unrun or never reached: run -> why (the sweep's
        ``skipped``)."""
        out = {run: f"not run: {why}" for run, why in self.record["left_unrun"].items()}
        if not self.past_deadline():  # the sweep ended otherwise (Ctrl-C, an error): pending
            return out
        for run in self.order:
            if run not in self.handed and run not in self.gone:
                out[run] = "not run: the budget's time was up"
                self.record["left_unrun"][run] = "the budget's time was up"
        return out

    def past_deadline(self) -> bool:
        return self.clock() >= self.deadline

    def spent(self) -> bool:
        """The whole budget spent, the sweep's end's share too."""
        return self.clock() >= self.started_at + self.seconds

    def settle(self, run: str) -> tuple[str, str]:
        """A run still going when the sweep ended at the budget's safety stop: its status and
        reason (finished where it was when its windows rank it, else cut short)."""
        if self.end_now(run) == "boxed":
            return "ok", ""
        if run not in self.record["cut"]:
            self.record["cut"].append(run)
        return "stopped_early", "stopped early by budget: the budget's time was up"

    def finish(self) -> dict[str, Any]:
        """The record at the sweep's end: the seconds used until the runs ended."""
        self.record["used_s"] = round(self.clock() - self.started_at, 1)
        return self.record


def dry_plan(space, runs: list[RunSpec], seconds: float) -> str:
    """``--dry-run --budget``: the plan the sweep would start with on this machine (its
    remembered costs, else the priors, which it names), after the launch's own seconds.
    ``runs``: with their executors resolved (a resident run reuses its group's start)."""
    configured = configured_cache(r.config for r in runs)
    costs = Costs(memory=read_memory(configured))
    now = time.time()
    budget = Budget(seconds, now - costs.prior.launch_s, runs, warmup=space.scheduler.warmup_windows,
                    concurrency=space.max_concurrent_trials, costs=costs, echo=lambda line: None,
                    clock=lambda: now)  # fmt: skip
    first = budget.plan_now()
    keys = {cost_key(r.config) for r in runs}
    known = sum(1 for k in keys if costs.memory.get(k, {}).get("step_s"))
    p = costs.prior
    source = f"costs remembered on this machine for {known} of {len(keys)} configuration(s)" + (
        f"; priors for the rest: a group's start {p.first_start_s:g} s, a resident run's "
        f"{p.next_start_s:g} s, a compile {p.compile_cold_s:g} s cold / {p.compile_warm_s:g}"
        " s warm"
        if known < len(keys)
        else ""
    )
    return (
        f"budget {shown(seconds)} (less {p.launch_s:g} s to launch and {budget.end_s:g} s for "
        f"the sweep's end): {first.line()}\n  {source}; the plan is made again at every "
        "run handed out, from what the sweep measures"
    )
