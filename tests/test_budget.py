"""A sweep within a time budget (platform/control/budget.py, costs.py): the duration's words,
the planner's order of what it keeps, and a sweep of 4090_mainline's eight runs played against a
clock from recorded costs, re-planned as its windows arrive (no Ray: the driver's side alone)."""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest

from platform.control.budget import MIN_TAIL, Ask, Budget, plan
from platform.control.costs import Costs, cost_key, memory_of
from platform.execution.resources import resolve_executors
from platform.spaces.expand import expand_runs
from platform.spaces.load import load_space
from stage1_common.durations import parse_duration


@pytest.mark.parametrize(
    "text, seconds", [("90s", 90), ("4m", 240), ("1h30m", 5400), ("1.5h", 5400), ("600", 600)]
)
def test_a_duration_in_its_usual_words(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "4x", "m", "0s", "four minutes", "1h30", "1m1m"])
def test_a_duration_that_is_none_names_the_forms(text):
    with pytest.raises(ValueError, match="90s, 4m, 1h30m|no time"):
        parse_duration(text)


def asks(groups=4, repeats=2, step=0.2, start=3.0):
    """The planned order: repeat 1 of every group, then repeat 2 (expand_runs's order)."""
    return [
        Ask(f"g{g}_r{r}", f"g{g}", r, 20.0 if (g, r) == (0, 1) else start, step)
        for r in range(1, repeats + 1)
        for g in range(groups)
    ]


PLAN = dict(max_steps=600, log_every=50, warmup=2, tail=10)


def test_the_planner_covers_every_group_first_then_length_then_repeats():
    tight = plan(asks(), seconds=150, **PLAN)
    assert tight.groups == ("g0", "g1", "g2", "g3") and tight.repeats == 1
    assert len(tight.runs) == 4 and tight.estimate_s <= 150
    assert (2 + 10) * 10 <= tight.steps < 600  # its own measurement in 2 s windows, no repeat
    assert tight.steps // tight.window - 2 >= MIN_TAIL  # still ranked on its tail
    roomy = plan(asks(), seconds=900, **PLAN)
    assert roomy.repeats == 2 and len(roomy.runs) == 8 and roomy.estimate_s <= 900
    assert roomy.steps >= 500 and roomy.window >= 40  # long runs keep long windows
    assert plan(asks(), seconds=5000, **PLAN).steps == 600  # never past max_steps


def test_a_budget_too_small_for_every_group_says_which_it_left_unrun():
    small = plan(asks(), seconds=45, **PLAN)
    assert 1 <= len(small.groups) < 4
    assert set(small.groups_left_out) == {"g0", "g1", "g2", "g3"} - set(small.groups)
    assert all(name not in small.runs for name in small.left_out)
    # Even no time at all runs the first group once: a budget never answers with nothing.
    assert plan(asks(), seconds=0, **PLAN).runs == ("g0_r1",)


def test_runs_share_the_time_of_concurrent_slots_and_of_runs_still_going():
    alone = plan(asks(), seconds=200, **PLAN)
    two = plan(asks(), seconds=200, concurrency=2, **PLAN)
    busy = plan(asks(), seconds=200, busy_s=100, **PLAN)
    assert (len(two.runs), two.steps) > (len(alone.runs), alone.steps)
    assert (len(busy.runs), busy.steps) < (len(alone.runs), alone.steps)


def test_with_runs_at_once_no_run_is_planned_past_the_time_left():
    one = plan(asks(groups=1, repeats=1), seconds=100, concurrency=4, **PLAN)
    assert one.runs and 20.0 + one.steps * 0.2 <= 100  # one run cannot use four slots
    unknown = [dataclasses.replace(a, step_s=None) for a in asks(groups=1, repeats=1)]
    boxed = plan(unknown, seconds=100, concurrency=2, **PLAN)
    assert boxed.share_s <= 100 - 20.0


def test_boxed_repeats_of_groups_handed_out_already_still_run():
    # Every group's first run is out (none measured yet): their repeats are planned, not left.
    later = [dataclasses.replace(a, step_s=None) for a in asks() if a.rank == 2]
    boxed = plan(later, seconds=600, concurrency=8, at_least_one=False, **PLAN)
    assert set(boxed.runs) == {a.name for a in later} and not boxed.left_out


def test_unknown_step_times_box_the_runs_in_equal_shares():
    unknown = [dataclasses.replace(a, step_s=None) for a in asks()]
    boxed = plan(unknown, seconds=200, **PLAN)
    assert boxed.share_s is not None and boxed.groups == ("g0", "g1", "g2", "g3")
    assert boxed.share_s * len(boxed.runs) + sum(
        a.start_s for a in unknown if a.name in boxed.runs
    ) == pytest.approx(200)


def mainline():
    space = load_space("4090_mainline").with_overrides(["max_steps=600"])
    return space, resolve_executors(expand_runs(space), training=False)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def play(budget_s, memory, true_step, true_start=(17.0, 2.5), launch=12.0):
    """4090_mainline's runs handed out, run and ended one at a time against a clock: each run
    costs its true start and true seconds per step, reports a window every ``log_every``
    steps, and the budget may stop it. Returns the budget, the handed-out specs, the seconds
    the runs ended at (from the command's start)."""
    space, runs = mainline()
    clock = Clock()
    costs = Costs(memory=memory)
    budget = Budget(budget_s, clock.now, runs, warmup=space.scheduler.warmup_windows,
                    concurrency=1, costs=costs, echo=lambda line: None, clock=clock)  # fmt: skip
    clock.now += launch
    ran = []
    for run in runs:
        spec = budget.admit(run)
        if spec is None:
            continue
        cfg = spec.config
        step_s = true_step[run.group]
        startup = true_start[0] if not ran else true_start[1]
        clock.now += startup
        step, window = 0, -1  # windows are numbered from 0, as the trainable numbers them
        while step < cfg.max_steps:
            before, step = step, min(cfg.max_steps, step + cfg.log_every)
            window += 1
            clock.now += (step - before) * step_s
            result = {"window": window, "step": step, "startup_s": startup,
                      "iter_ms_mean": step_s * 1000, "elapsed_s": step * step_s}  # fmt: skip
            if budget.observe(run.name, result):
                break
        clock.now += 1.0
        budget.ended(run.name)
        ran.append(budget.handed[run.name])
    budget.finish()
    return budget, ran, clock.now - 1000.0


# What 2x H200 measured of 4090_mainline (benchmarks/results/levers_check_2xh200/): 0.20 s a step
# at micro-batch 160, a group's start 17 s, a resident run's 2-3 s.
H200 = {"sweep_z0_mb160_nw6_pf4": 0.200, "sweep_z0_mb160_nw8_pf4": 0.201,
        "sweep_z0_mb192_nw6_pf4": 0.236, "sweep_z0_mb192_nw8_pf4": 0.237}  # fmt: skip


def recorded(step=H200):
    _, runs = mainline()
    first = {}
    for r in runs:
        first.setdefault(cost_key(r.config), {"step_s": step[r.group], "next_start_s": 2.5,
                                              "first_start_s": 17.0})  # fmt: skip
    return first


@pytest.mark.parametrize("budget_s", [240, 480])
def test_a_sweep_from_recorded_costs_ends_within_its_budget_with_every_group(budget_s):
    budget, ran, ended = play(budget_s, recorded(), H200)
    assert ended <= budget_s - budget.end_s + 1.0  # the sweep's end reserved
    assert {r.group for r in ran} == set(H200)  # every group measured
    assert all(r.config.max_steps // r.config.log_every - 2 >= r.config.tail_timing_points
               for r in ran)  # fmt: skip  # the tail never holds a warm-up window
    assert not budget.record["cut"]  # planned to fit: nothing stopped by the deadline
    if budget_s == 480:
        assert len(ran) == 8  # room for the repeats
    assert budget.record["plans"] and budget.record["used_s"] == pytest.approx(ended, abs=0.1)


def test_a_slower_machine_than_recorded_is_replanned_and_still_fits():
    slower = {g: s * 1.5 for g, s in H200.items()}
    budget, ran, ended = play(240, recorded(), slower)
    last_window = max(r.config.log_every for r in ran) * max(slower.values())
    assert ended <= 240 - budget.end_s + last_window + 1.0  # at most its last window late
    assert {r.group for r in ran} == set(H200) and not budget.record["cut"]
    assert len(budget.record["plans"]) >= 2  # the first windows changed the plan
    # The run the budget's end caught had its windows: it ends as a finished, shorter run.
    for run, box in budget.record["boxed"].items():
        assert (
            box["why"] == "the budget's end" and budget.handed[run].config.max_steps == box["step"]
        )


def test_with_nothing_recorded_the_first_run_is_boxed_and_the_rest_planned_in_steps():
    budget, ran, ended = play(240, {}, H200)
    assert ended <= 240 - budget.end_s + 5.0
    first = ran[0]
    assert budget.record["boxed"][first.name]["step"] == first.config.max_steps < 600
    assert all(r.name not in budget.record["boxed"] for r in ran[1:])
    assert {r.group for r in ran} == set(H200)


def test_a_deadline_passed_stops_the_run_going_and_leaves_the_rest_unrun():
    space, runs = mainline()
    clock = Clock()
    budget = Budget(60, clock.now, runs, warmup=2, concurrency=1, costs=Costs(memory=recorded()),
                    end_s=10, echo=lambda line: None, clock=clock)  # fmt: skip
    assert budget.admit(runs[0]) is not None
    clock.now += 55
    # One window and no other run to answer with: it goes on to its shortest ranked length.
    assert budget.observe(runs[0].name, {"window": 1, "step": 50, "elapsed_s": 30}) == ""
    for i in (2, 3, 4):
        assert budget.observe(runs[0].name, {"window": i, "step": 50 * i, "elapsed_s": 30}) == ""
    assert budget.observe(runs[0].name, {"window": 5, "step": 250, "elapsed_s": 40}) == "boxed"
    assert not budget.record["cut"]
    assert budget.admit(runs[1]) is None and budget.past_deadline()
    unrun = budget.unrun()
    assert set(unrun) == {r.name for r in runs[1:]}


def test_a_sweep_ended_before_its_budget_leaves_its_runs_pending():
    _, runs = mainline()
    clock = Clock()
    budget = Budget(600, clock.now, runs, warmup=2, concurrency=1, costs=Costs(memory=recorded()),
                    echo=lambda line: None, clock=clock)  # fmt: skip
    assert budget.admit(runs[0]) is not None
    budget.ended(runs[0].name, ok=False)
    clock.now += 30  # Ctrl-C or an error long before the deadline: nothing is the budget's
    assert budget.unrun() == {} and not budget.spent()


def test_the_memory_is_what_ok_runs_on_this_host_measured_per_configuration():
    import time

    from platform.storage.catalogue import fingerprint

    _, runs = mainline()
    host = {"gpu": "NVIDIA H200", "gpus": 2, "torch": "2.11.0+cu130"}
    other = {**host, "torch": "2.12.0+cu130"}

    def row(run, i, starts, where=host, status="ok"):
        return {"host": fingerprint(where), "cost_key": cost_key(run.config), "group": run.group,
                "status": status, "tail_mean_iter_p50_ms": 200.0 + i, "starts_group": starts,
                "startup_s": 17.0 if starts else 2.0 + i / 10, "ts": time.time() + i}  # fmt: skip

    rows = pd.DataFrame(
        [row(r, i, i == 0) for i, r in enumerate(runs[:4])]
        + [row(runs[0], 4, False), row(runs[1], 5, False, status="failed"),
           row(runs[1], 9, True, where=other)]
    )  # fmt: skip
    memory = memory_of(rows, fingerprint(host))
    first = memory[cost_key(runs[0].config)]
    assert first["first_start_s"] == 17.0 and first["step_s"] == pytest.approx((0.200 + 0.204) / 2)
    assert first["next_start_s"] == pytest.approx(2.4)  # its repeat, on the resident group
    later = memory[cost_key(runs[1].config)]  # its failed run and another host's: not counted
    assert "first_start_s" not in later and later["next_start_s"] == pytest.approx(2.1)
    assert later["step_s"] == pytest.approx(0.201)


def test_a_compile_inside_the_windows_is_part_of_a_measured_start():
    """A compiled run without the warm-up (4090_mainline: limit_longest, no known shapes)
    compiles in its first window, which the steps' seconds leave out: its start holds it."""
    import time

    from platform.storage.catalogue import fingerprint

    _, runs = mainline()
    host = {"gpu": "NVIDIA H200", "gpus": 2, "torch": "2.11.0+cu130"}
    run = runs[0]
    rows = pd.DataFrame(
        [{"host": fingerprint(host), "cost_key": cost_key(run.config), "group": run.group,
          "status": "ok", "tail_mean_iter_p50_ms": 180.0, "starts_group": starts,
          "startup_s": start, "compile_in_windows_s": compiled, "ts": time.time() + i}
         for i, (starts, start, compiled) in enumerate([(True, 62.5, 110.0), (False, 21.0, 52.0)])]
    )  # fmt: skip
    memory = memory_of(rows, fingerprint(host))[cost_key(run.config)]
    assert memory["first_start_s"] == 172.5 and memory["next_start_s"] == 73.0
    costs = Costs(memory={cost_key(run.config): memory})
    assert costs.start(run.config, starts_group=False) == pytest.approx(73.0 + 1.0)
    # Measured by the sweep: a later run's first window compiled for 50 s.
    costs = Costs()
    costs.handed_out("a", run.config)
    costs.observe("a", run.config, {"window": 0, "startup_s": 20.0}, warmup=2)
    costs.handed_out("b", run.config)  # its repeat, on the resident group "a" started
    costs.observe("b", run.config, {"window": 0, "startup_s": 3.0, "compile_in_windows_s": 50.0}, 2)
    assert costs.start(run.config, starts_group=False) == pytest.approx(53.0 + 1.0)


def test_the_stopper_ends_runs_at_the_budgets_end_finished_or_cut(tmp_path):
    from platform.control.race import Schedule
    from platform.control.stoppers import SweepStopper
    from stage1_common.output_root import OutputRoot

    space, runs = mainline()
    clock = Clock()
    budget = Budget(100, clock.now, runs, warmup=2, concurrency=2, costs=Costs(memory=recorded()),
                    end_s=10, echo=lambda line: None, clock=clock)  # fmt: skip
    schedule = Schedule(OutputRoot(tmp_path), space, runs)
    schedule.budget = budget.record
    stopper = SweepStopper(runs, {"t1": runs[0].name, "t2": runs[1].name}, None, budget, schedule)
    first, second = budget.admit(runs[0]), budget.admit(runs[1])
    window = first.config.log_every
    for i in range(5):  # the first run: its warm-up and 3 tail windows measured
        assert not stopper("t1", {"window": i, "step": (i + 1) * window, "elapsed_s": i})
    assert not stopper("t2", {"window": 0, "step": window, "elapsed_s": 1})
    clock.now += 95  # past the deadline (100 s less 10 s for the sweep's end)
    assert not stopper.stop_all()  # each run stops at its next window
    assert stopper("t1", {"window": 5, "step": 6 * window, "elapsed_s": 6})
    assert stopper("t2", {"window": 1, "step": 2 * window, "elapsed_s": 2})
    clock.now += 10
    assert stopper.stop_all()  # the whole budget spent: Tune ends what never reported again
    # The first had its windows: it ends where it is, a finished run of 6 windows whose tail
    # is its 4 after the warm-up; the second had two windows: cut short.
    assert schedule.ended_by_budget(runs[0].name) and runs[0].name not in schedule.stops
    assert budget.handed[runs[0].name].config.max_steps == 6 * window
    assert budget.handed[runs[0].name].config.tail_timing_points == 4
    assert schedule.stops[runs[1].name]["by"] == "budget" and budget.record["cut"] == [runs[1].name]
    assert second is not None and budget.admit(runs[2]) is None
    saved = json.loads((tmp_path / "schedule.json").read_text())
    assert saved["budget"]["boxed"][runs[0].name]["why"] == "the budget's end"


def test_the_sweeps_last_line_counts_what_ran_and_what_was_left_unrun():
    """Issue 57's GPU check: 2 of 8 runs ran, the budget left 6 unrun (manifest status
    skipped), and the last line said "8/8 runs ok"."""
    from platform.tune import runs_line

    def manifest(*statuses):
        return [{"run": f"r{i}", "status": s} for i, s in enumerate(statuses)]

    budget = {"budget": {"left_unrun": {f"r{i}": "not run: no time" for i in range(2, 8)}}}
    assert runs_line(manifest("ok", "ok", *["skipped"] * 6), budget) == (
        "2 of 8 runs ran, 2 ok; 6 left unrun by the budget"
    )
    race = manifest("ok", "stopped_early", "failed", "skipped", "pending")
    assert runs_line(race, {}) == (
        "3 of 5 runs ran, 1 ok, 1 stopped early by the scheduler, 1 failed or cut short; "
        "1 skipped by the race or as known to fail here, 1 never started"
    )
    assert runs_line(manifest("ok", "ok"), {}) == "2/2 runs ok"
