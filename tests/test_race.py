"""platform.control (race, asha, searchers) without Ray: the race's decisions on made-up windows, ASHA after the
warm-up, the searchers' order, and the spaces' scheduler, search and conditional keys."""

import dataclasses
import itertools
import json
import re
import textwrap
from pathlib import Path

import pytest
from ray.tune.schedulers import TrialScheduler
from ray.tune.search import Searcher

from platform.analysis import stats
from platform.control.asha import WarmASHA
from platform.control.race import SCHEDULE, Race, Schedule
from platform.control.searchers import PlannedSearcher
from platform.errors import UsageError
from platform.spaces.expand import expand_runs, space_points
from platform.spaces.load import load_space
from stage1_common.output_root import OutputRoot

SPACE = """
    description: race unit test
    repeats: 2
    resources: {train_workers: 1, use_gpu: false, cpus_per_worker: 1}
    cases:
      - {inject_sleep_s: 0.01}
      - {inject_sleep_s: 0.02}
      - {inject_sleep_s: 0.03}
    fixed: {max_steps: 30, log_every: 3, tail_timing_points: 4}
    scheduler: {name: race, warmup_windows: 2, min_windows: 3, noise_floor: 0.02}
"""


def space_from(tmp_path, text=SPACE, name="s"):
    (tmp_path / f"{name}.yaml").write_text(textwrap.dedent(text))
    return load_space(name, tmp_path)


@pytest.fixture
def race(tmp_path):
    space = space_from(tmp_path)
    runs = expand_runs(space)
    schedule = Schedule(OutputRoot(tmp_path), space, runs)
    lines = []
    r = Race(runs, space, schedule, echo=lines.append)
    r.lines = lines
    r.names = [run.name for run in runs]  # A r1, B r1, C r1, A r2, B r2, C r2
    return r


def window(step, sps, p50=10.0, p90=11.0, epoch=0):
    return {"step": step, "samples_per_s": sps, "iter_ms_p50": p50, "iter_ms_p90": p90,
            "epoch": epoch}  # fmt: skip


def feed(race, run, values, **kw):
    """Windows of ``run`` with these samples/s; the decisions (observe's answers)."""
    return [race.observe(run, window(3 * (i + 1), v, **kw)) for i, v in enumerate(values)]


def finish(race, run, values):
    feed(race, run, values)
    race.complete(run, "ok")


def test_a_slower_group_stops_once_its_upper_bound_is_below_a_finished_groups_lower_bound(race):
    a1, b1, c1, a2, b2, c2 = race.names
    finish(race, a1, [100, 101, 99, 100, 100, 101, 99, 100, 100, 100])
    # B: 20 % slower. Two warm-up windows, then judged after 3 clean ones: stopped there.
    assert feed(race, b1, [10, 10, 80, 80, 80, 80]) == [False] * 4 + [True, True]
    stop = race.schedule.stops[b1]
    assert (stop["by"], stop["step"], stop["window"]) == ("race", 15, 5)
    assert stop["reason"].startswith("slower: upper bound")
    assert race.eliminated[race.runs[b1].group]["kind"] == "slower"
    # C within the noise floor of A (0.5 % apart): never stopped, gets its repeats.
    assert not any(feed(race, c1, [99.5] * 10))
    race.complete(c1, "ok")
    # The searcher skips B's second repeat and hands out A's and C's.
    trial_runs = {}
    searcher = PlannedSearcher(
        [race.runs[n] for n in (a2, b2, c2)], lambda r: {"name": r.name}, trial_runs, race
    )
    names = [searcher.suggest(f"t{i}") for i in range(3)]
    assert names[:2] == [{"name": a2}, {"name": c2}]
    # Not finished while A's second repeat runs: should it make A unstable, B comes back.
    assert names[2] is None
    for i, run in enumerate((a2, c2)):
        feed(race, run, [100] * 10)
        searcher.on_trial_complete(f"t{i}", result={"step": 30})
    assert searcher.suggest("t3") == Searcher.FINISHED
    assert "left the race (slower)" in race.schedule.state["skipped"][b2]
    saved = json.loads((race.schedule.path.parent / SCHEDULE).read_text())
    assert set(saved["stops"]) == {b1} and b2 in saved["skipped"]


def test_no_decision_before_a_group_has_a_finished_run(race):
    a1, b1, *_ = race.names
    feed(race, a1, [100] * 10)  # A still running: no reference yet
    assert not any(feed(race, b1, [50] * 10))
    assert not race.eliminated


def test_never_decides_on_a_window_with_an_epoch_boundary_or_a_stall_alert(race):
    a1, b1, *_ = race.names
    finish(race, a1, [100] * 10)
    assert feed(race, b1, [10, 10, 80, 80]) == [False] * 4
    # The deciding window holds an epoch boundary: no decision there, nor on the stall alert
    # (iter p50 4x the median) after it; the next clean window decides.
    assert not race.observe(b1, window(15, 80, epoch=1))
    assert not race.observe(b1, window(18, 80, p50=40.0, p90=41.0, epoch=1))
    assert race.observe(b1, window(21, 80, epoch=1))
    assert race.schedule.stops[b1]["step"] == 21


def test_a_window_the_host_stalled_in_is_not_clean(race):
    """A's fourth window ran at a fifth of its throughput with its iter p50 unchanged (the host
    paused the process inside it: one long step). Counted, it would widen A's bounds (low 66
    samples/s) and keep B, 20 % slower, in the race; left out, B stops at its first decision."""
    a1, b1, *_ = race.names
    finish(race, a1, [100, 100, 100, 20, 100, 100, 100, 100, 100, 100])
    assert [w["clean"] for w in race.windows[a1]][2:5] == [True, False, True]
    assert race.bounds(race.runs[a1].group)["low"] > 95
    assert feed(race, b1, [10, 10, 80, 80, 80]) == [False] * 4 + [True]


def test_an_unstable_group_stops_even_when_it_is_the_fastest(race):
    a1, b1, *_ = race.names
    finish(race, a1, [100] * 10)
    decisions = feed(race, b1, [130] * 10, p50=10.0, p90=30.0)  # p90/p50 3 > 2.5
    assert decisions.index(True) == 4
    assert race.eliminated[race.runs[b1].group]["kind"] == "unstable"
    assert "iter p90/p50 median 3.00 > 2.5" in race.schedule.stops[b1]["reason"]
    # Above the median limit (1.5) but below the max (2.5): judged when the run ends, on its
    # tail, as platform.stability does.
    c1 = race.names[2]
    assert not any(feed(race, c1, [130] * 10, p50=10.0, p90=20.0))
    race.complete(c1, "ok")
    assert "iter p90/p50 median 2.000 > 1.5" in race.eliminated[race.runs[c1].group]["reason"]


def test_phase_b_cv_across_repeats_makes_a_finished_group_unstable(race):
    a1, b1, c1, a2, *_ = race.names
    finish(race, a1, [100] * 10)
    assert race.runs[a1].group not in race.eliminated
    feed(race, a2, [100] * 10, p50=20.0, p90=21.0)  # its iter p50 doubled: CV 0.47 > 0.05
    race.complete(a2, "ok")
    verdict = race.eliminated[race.runs[a1].group]
    assert verdict["kind"] == "unstable" and "iter p50 CV" in verdict["reason"]


def test_a_readmission_survives_a_resume(race, tmp_path):
    """B falls as slower than A on A's first run; A's second makes A unstable, so B comes back
    and its skipped repeat runs. The sweep is cut before it starts, after the manifest recorded
    it skipped: the resumed race (schedule.json read back) hands it out first."""
    import pandas as pd

    a1, b1, c1, a2, b2, c2 = race.names
    a, b = race.runs[a1].group, race.runs[b1].group
    finish(race, a1, [100] * 10)
    assert feed(race, b1, [10, 10, 80, 80, 80])[-1]
    race.complete(b1, "cut")
    race.skip(b2)
    feed(race, a2, [100] * 10, p50=20.0, p90=21.0)  # iter p50 doubled: CV 0.47 > 0.05
    race.complete(a2, "ok")
    assert race.eliminated[a]["kind"] == "unstable" and b not in race.eliminated
    (back,) = race.schedule.state["readmitted"]
    assert (back["group"], back["runs"], back["revoked"]["by"]) == (b, [b2], a)
    assert back["why"].startswith(f"{a} left the race (unstable): iter p50 CV")
    assert b2 not in race.schedule.state["skipped"] and b1 in race.schedule.stops
    line = f"race: group {b} is back in the race ({back['why']}); runs again: {b2}"
    assert race.lines[-1] == line

    space = space_from(tmp_path)
    runs = expand_runs(space)
    schedule = Schedule(OutputRoot(tmp_path), space, runs)
    schedule.load()
    resumed = Race(runs, space, schedule, echo=lambda line: None)
    done = {a1: {"status": "ok"}, b1: {"status": "stopped_early"}, a2: {"status": "ok"},
            b2: {"status": "skipped"}}  # fmt: skip
    resumed.restore(pd.DataFrame(columns=["run", "rank", "window"]), done)
    assert resumed.runnable(b2) and resumed.eliminated[a]["kind"] == "unstable"
    searcher = PlannedSearcher(
        [r for r in runs if r.name not in done], lambda r: {"name": r.name}, {}, resumed
    )
    assert [searcher.suggest(f"t{i}")["name"] for i in range(3)] == [b2, c1, c2]


def test_a_stop_not_told_yet_is_taken_back_when_its_group_comes_back(race):
    """B runs beside A: A's first run ends and B falls under its lower bound before B's next
    window; then A's second run fails, so A cannot win, and B's run goes on."""
    a1, b1, _, a2, *_ = race.names
    b = race.runs[b1].group
    assert not any(feed(race, b1, [10, 10, 80, 80, 80]))  # no leader yet
    finish(race, a1, [100] * 10)
    assert race.eliminated[b]["by"] == race.runs[a1].group and b1 in race.schedule.stops
    race.complete(a2, "error")
    assert b not in race.eliminated and b1 not in race.schedule.stops
    assert not race.observe(b1, window(18, 80))
    assert race.lines[-1] == (
        f"race: group {b} is back in the race ({race.runs[a2].group} left the race (failed): "
        f"run {a2} did not finish (error))"
    )


def test_a_failed_run_takes_its_group_out_an_interrupted_one_does_not(race):
    a1, b1, *_ = race.names
    feed(race, b1, [100] * 3)
    race.complete(b1, "cut")  # interrupted: --resume runs it again, the group stays
    assert not race.eliminated
    feed(race, a1, [100] * 3)
    race.complete(a1, "error")
    assert race.eliminated[race.runs[a1].group]["kind"] == "failed"
    assert a1 not in race.schedule.stops  # it ended by itself


def test_bounds_use_the_widest_of_window_run_and_floor_noise(race):
    a1, _, _, a2, *_ = race.names
    feed(race, a1, [100] * 10)
    b = race.bounds(race.runs[a1].group)
    assert b["mean"] == 100 and b["high"] - b["mean"] == pytest.approx(2.0)  # the 2 % floor
    feed(race, a2, [90] * 10)  # two runs 10 apart: Student's t over the run means, 1 dof
    b = race.bounds(race.runs[a1].group)
    assert b["runs"] == 2 and b["mean"] == 95
    assert b["high"] - b["mean"] == pytest.approx(12.706 * 7.0711 / 2**0.5, rel=1e-3)


def test_restore_rebuilds_the_windows_of_kept_runs(race, tmp_path):
    import pandas as pd

    a1, b1, *_ = race.names
    rows = [
        {
            "run": a1,
            "rank": 0,
            "window": i,
            "step": 3 * i,
            "epoch": 0,
            "samples_per_s": 100.0,
            "iter_ms_p50": 10.0,
            "iter_ms_p90": 11.0,
        }  # fmt: skip
        for i in range(1, 11)
    ]
    race.restore(pd.DataFrame(rows), {a1: {"status": "ok"}})
    assert race.finished[a1]["iter_ratio"] == pytest.approx(1.1)
    assert feed(race, b1, [10, 10, 80, 80, 80]) == [False] * 4 + [True]


# --- the 2x H100 race replayed (benchmarks/results/race_2xh100/) ---
H100 = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "race_2xh100"
_WINDOW = re.compile(r"\] (\S+): step (\d+)/\d+  iter p50 ([\d.]+) ms .*?  ([\d.]+) samples/s")
_NUMBER = re.compile(r"(?<![\w.])\d+\.\d+")


def h100_log():
    """race.log's windows per run (step, iter p50 ms, samples/s), the grid's sweep and then the
    race's, and the race's decision lines."""
    grid, race = (H100 / "race.log").read_text().split("output root: /tmp/race_race_a8_gpu/race")

    def windows(text):
        out = {}
        for m in _WINDOW.finditer(text):
            out.setdefault(m[1], []).append((int(m[2]), float(m[3]), float(m[4])))
        return out

    return windows(grid), windows(race), [x for x in race.splitlines() if x.startswith("race: ")]


def h100_race(tmp_path):
    """The race of race_a8_gpu as the 2x H100 run set it (race_vs_grid.json's --set), the
    searcher that hands its runs out, and the grid's winner."""
    record = json.loads((H100 / "race_vs_grid.json").read_text())
    space = load_space("race_a8_gpu").with_overrides([*record["sets"], "scheduler=race"])
    runs = expand_runs(space)
    lines = []
    race = Race(runs, space, Schedule(OutputRoot(tmp_path), space, runs), echo=lines.append)
    race.lines = lines
    searcher = PlannedSearcher(runs, lambda r: {"run": r.name}, {}, race)
    return race, searcher, record["grid"]["winner"]


def replay(race, searcher, windows_of):
    """The runs in the order the searcher hands them out, one at a time (the space's
    max_concurrent_trials: 1), each fed its windows until the race stops it. race.log keeps no
    iter p90: 1.2 x the p50 (the rankings' tail p90/p50 were 1.09-1.28, far under the limits).
    A run that ends shows its last window twice: Tune hands the stopper the last result again
    with done=True (RESULT_DUPLICATE); so did the H100 race (mb64's "11 windows" of 10)."""
    handed = []
    for i in itertools.count():
        param = searcher.suggest(f"t{i}")
        if param == Searcher.FINISHED:
            return handed
        run = param["run"]
        handed.append(run)
        for step, p50, sps in windows_of(run):
            result = {"step": step, "iter_ms_p50": p50, "iter_ms_p90": 1.2 * p50,
                      "samples_per_s": sps, "epoch": 0}  # fmt: skip
            if race.observe(run, result):
                break
        else:
            race.observe(run, dict(result, done=True))
        searcher.on_trial_complete(f"t{i}", result=result)


def standing(race):
    """The race's answer: the groups still in it that ran every planned repeat to its end (so
    judged stable over all of them), fastest first."""
    done = [
        g for g, runs in race.groups.items()
        if g not in race.eliminated and all(r in race.finished for r in runs)
    ]  # fmt: skip
    return sorted(done, key=lambda g: -race.bounds(g)["mean"])


def test_the_2xh100_race_replayed_names_only_a_winner_that_ran_all_its_repeats(tmp_path):
    """Issue 53 item 6. On 2x H100 the race stopped mb64 and both DeepSpeed groups as slower
    than ddp mb128; mb128's second repeat then made it unstable (iter p50 CV 0.09 > 0.05), and
    mb64, judged on one run and never tested for stability, won. Replayed with the race's own
    windows (and, for a run the race did not run to its end, the grid's windows of that run,
    measured on the same machine minutes before), the race takes race.log's decisions until
    mb128 falls; then the groups mb128 knocked out come back, DeepSpeed mb64 falls again at
    once (under mb64's lower bound), mb64 runs its second repeat and passes the Phase B
    limits, and the race's answer is mb64 on both its repeats.

    The grid named mb128. The race cannot: mb128's own two repeats in the race were 9 % apart,
    over Phase B's CV limit (platform.stability's rule; the grid's ranking does not apply it).
    On the grid's windows the race names the grid's winner (the next test)."""
    grid_w, race_w, recorded = h100_log()
    race, searcher, grid_winner = h100_race(tmp_path)
    ddp64, ddp128, ds64, ds128 = race.groups

    def windows_of(run):
        ran = race_w.get(run, [])
        return ran + [w for w in grid_w[run] if w[0] > (ran[-1][0] if ran else 0)]

    handed = replay(race, searcher, windows_of)
    # race.log's four decisions, its numbers within their rounding (p50, samples/s to 0.1).
    for line, logged in zip(race.lines[:4], recorded, strict=True):
        assert _NUMBER.sub("#", line) == _NUMBER.sub("#", logged)
        got, want = ([float(x) for x in _NUMBER.findall(t)] for t in (line, logged))
        assert got == pytest.approx(want, abs=0.2)
    assert race.eliminated[ddp128]["kind"] == "unstable" and ddp128 == grid_winner
    assert handed == [f"{ddp64}_r1", f"{ddp128}_r1", f"{ds64}_r1", f"{ds128}_r1",
                      f"{ddp128}_r2", f"{ddp64}_r2", f"{ds128}_r2"]  # fmt: skip
    assert standing(race) == [ddp64]
    back = race.schedule.state["readmitted"]
    assert [e["group"] for e in back] == [ddp64, ds64, ds128]
    assert all(e["why"].startswith(f"{ddp128} left the race (unstable)") for e in back)
    assert back[0]["runs"] == [f"{ddp64}_r2"] and back[0]["revoked"]["by"] == ddp128
    assert race.eliminated[ds64]["by"] == ddp64
    assert set(race.schedule.state["skipped"]) == {f"{ds64}_r2"}
    saved = json.loads(race.schedule.path.read_text())
    assert [e["group"] for e in saved["readmitted"]] == [ddp64, ds64, ds128]


def test_the_2xh100_grids_windows_raced_name_the_grids_winner(tmp_path):
    """The same race on the grid's windows (mb128's repeats 0.6 % apart): mb128 stays stable,
    what it knocked out stays out, and the race names the grid's winner in 5 runs of 8."""
    grid_w, _, _ = h100_log()
    race, searcher, grid_winner = h100_race(tmp_path)
    handed = replay(race, searcher, lambda run: grid_w[run])
    assert standing(race) == [grid_winner]
    assert len(handed) == 5 and not race.schedule.state.get("readmitted")


class _Trial:
    def __init__(self, trial_id):
        self.trial_id = trial_id


def test_asha_ignores_the_warm_up_and_records_its_stops(tmp_path):
    space = space_from(tmp_path).with_overrides(
        ["scheduler={name: asha, warmup_windows: 2, grace_windows: 2, reduction_factor: 2}"]
    )
    runs = expand_runs(space)
    schedule = Schedule(OutputRoot(tmp_path), space, runs)
    trial_runs = {"a": runs[0].name, "b": runs[1].name}
    asha = WarmASHA(space, runs, schedule, trial_runs)
    a, b = _Trial("a"), _Trial("b")
    asha.on_trial_add(None, a)
    asha.on_trial_add(None, b)
    for i in range(10):
        asha.on_trial_result(None, a, {"samples_per_s": 100.0, "step": 3 * (i + 1)})
    asha.on_trial_complete(None, a, {})
    # b: very slow warm-up windows never count; slower after the warm-up: stopped at the
    # first rung (2 windows after the warm-up).
    decisions = [
        asha.on_trial_result(None, b, {"samples_per_s": v, "step": 3 * (i + 1)})
        for i, v in enumerate([1, 1, 50, 50, 50])
    ]
    assert decisions[:3] == [TrialScheduler.CONTINUE] * 3
    assert decisions[3] == TrialScheduler.STOP
    stop = schedule.stops[runs[1].name]
    assert (stop["by"], stop["step"], stop["window"]) == ("asha", 12, 4)
    assert runs[0].name not in schedule.stops  # a reached max_t: finished, not stopped


def test_planned_searcher_hands_out_every_run_in_order_without_a_race(tmp_path):
    runs = expand_runs(space_from(tmp_path))
    trial_runs = {}
    searcher = PlannedSearcher(runs, lambda r: {"run": r.name}, trial_runs)
    got = [searcher.suggest(f"t{i}") for i in range(len(runs) + 1)]
    assert got[:-1] == [{"run": r.name} for r in runs] and got[-1] == Searcher.FINISHED
    assert trial_runs["t0"] == runs[0].name


# --- spaces: scheduler, search, conditional keys ---
COND = """
    description: conditional keys
    resources: {train_workers: 1, use_gpu: false, cpus_per_worker: 1}
    cases:
      - {strategy: ddp, zero_stage: 0, grid: {bucket_mb: [25, 100]}}
      - {strategy: deepspeed, grid: {zero_stage: [1, 2]}}
    grid:
      micro_batch: [4, 8]
    fixed: {max_steps: 10, log_every: 5}
    baseline: {strategy: ddp, bucket_mb: 25, micro_batch: 4}
"""


def test_a_case_grid_sweeps_keys_only_within_its_case(tmp_path):
    space = space_from(tmp_path, COND)
    points = space_points(space)
    assert len(points) == 8
    assert all("bucket_mb" not in p for p in points if p["strategy"] == "deepspeed")
    assert {p["zero_stage"] for p in points if p["strategy"] == "ddp"} == {0}
    runs = expand_runs(space)
    assert len({r.group for r in runs}) == 8
    assert sum(r.baseline for r in runs) == 1
    # --set of a key a case sweeps pins it there; the case's grid goes when it is empty.
    pinned = space.with_overrides(["bucket_mb=50"])
    assert pinned.cases[0] == {"strategy": "ddp", "zero_stage": 0}
    assert len(space_points(pinned)) == 6


def test_random_search_draws_num_samples_groups_with_the_baseline(tmp_path):
    space = space_from(tmp_path, COND).with_overrides(["search={name: random, num_samples: 3}"])
    groups = list(dict.fromkeys(r.group for r in expand_runs(space)))
    assert len(groups) == 3
    assert groups == list(dict.fromkeys(r.group for r in expand_runs(space)))  # seeded
    assert any("ddp" in g and "bk25" in g and "mb4" in g for g in groups)
    samples = {
        tuple(
            dict.fromkeys(r.group for r in expand_runs(space.with_overrides([f"search.seed={k}"])))
        )
        for k in range(5)
    }
    assert len(samples) > 1  # the seed picks the sample
    with pytest.raises(UsageError, match="num_samples 9 exceeds the space's 8 groups"):
        expand_runs(space.with_overrides(["search.num_samples=9"]))


def test_scheduler_and_search_errors_name_the_fix(tmp_path):
    space = space_from(tmp_path, COND)
    with pytest.raises(UsageError, match="scheduler race needs every group planned ahead"):
        expand_runs(
            space.with_overrides(["scheduler=race", "search={name: optuna, num_samples: 2}"])
        )
    with pytest.raises(UsageError, match=r"scheduler\.confidence must be within 0\.5-1"):
        space.with_overrides(["scheduler.confidence=2"])
    with pytest.raises(UsageError, match=r"scheduler\.min_windows must be a int"):
        space.with_overrides(["scheduler.min_windows=1.5"])
    bad = COND.replace(
        "{strategy: deepspeed, grid: {zero_stage: [1, 2]}}", "{strategy: deepspeed, grid: []}"
    )
    with pytest.raises(UsageError, match="a case's 'grid' must be a mapping"):
        space_from(tmp_path, bad, "bad")


def test_stopped_groups_rank_after_every_finished_group():
    import pandas as pd

    per_run = pd.DataFrame(
        [
            {"run": "a_r1", "group": "a", "status": "ok", "tail_samples_per_sec_mean": 50.0,
             "tail_mean_iter_p50_ms": 10.0, "iter_p90_over_p50": 1.1, "unstable_run_flag": False},
            {"run": "b_r1", "group": "b", "status": "stopped_early",
             "tail_samples_per_sec_mean": 90.0, "tail_mean_iter_p50_ms": 5.0,
             "iter_p90_over_p50": 1.1, "unstable_run_flag": False},
            {"run": "c_r1", "group": "c", "status": "stopped_early",
             "tail_samples_per_sec_mean": 95.0, "tail_mean_iter_p50_ms": 5.0,
             "iter_p90_over_p50": 1.1, "unstable_run_flag": False},
        ]
    )  # fmt: skip
    ranked = stats.rank(stats.group_summary(per_run))
    assert list(ranked["group"]) == ["a", "c", "b"]
    assert list(ranked["runs_stopped"]) == [0, 1, 1]
    assert ranked.loc[1, "partial_samples_per_sec"] == 95.0


def test_a_group_with_only_stopped_runs_shows_its_partial_figure_in_brackets():
    from platform.analysis.analyze import format_ranked

    rows = [
        {"rank": 1, "group": "a", "runs_ok": 2, "runs": 2, "tail_samples_per_sec_robust": 50.0,
         "tail_samples_per_sec_std": 1.0, "tail_mean_iter_p50_ms": 10.0, "unstable_group": False,
         "partial_samples_per_sec": float("nan")},
        {"rank": 2, "group": "b", "runs_ok": 0, "runs": 2, "tail_samples_per_sec_robust": float("nan"),
         "tail_samples_per_sec_std": float("nan"), "tail_mean_iter_p50_ms": float("nan"),
         "unstable_group": False, "partial_samples_per_sec": 41.25},
    ]  # fmt: skip
    lines = format_ranked(rows).splitlines()
    assert "50.0" in lines[2] and "(41.2)" in lines[3]


def test_a_finished_runs_tail_is_the_analysis_tail_even_with_a_gap_window():
    """One definition of the tail ratio (issue 23): the race judges a finished run on the same
    figure per_run_metrics.csv gets from stats.run_figures, a window without an iter p50
    (NaN) left out by both, where the race's own mean used to turn the whole tail NaN."""
    import math

    import pandas as pd

    from platform.control.race import _tail_figures
    from trainables.config import TrialConfig

    windows = [(10.0, 11.0), (math.nan, math.nan), (10.0, 40.0), (12.0, 13.0)]
    history = [{"iter_ms_p50": p50, "iter_ms_p90": p90} for p50, p90 in windows]
    race_tail = _tail_figures(history, TrialConfig(tail_timing_points=3))
    timing = pd.DataFrame(
        {
            "run": "r",
            "window": range(4),
            "step": range(5, 25, 5),
            "startup_s": 1.0,
            "samples_per_s": 1.0,
            "iter_ms_p50": [w[0] for w in windows],
            "iter_ms_p90": [w[1] for w in windows],
            **{f"{k}_ms_p{q}": 1.0 for k in ("data", "step") for q in (50, 90)},
            "data_ms_mean": 1.0,
            "iter_ms_mean": 1.0,
            "peak_mem_gib": 0.0,
            "mfu": 0.0,
        }
    )
    analysis = stats.run_figures(timing, {"r": 3})["r"]["iter_p90_over_p50"]
    assert race_tail["iter_ratio"] == pytest.approx(analysis) == (4.0 + 13 / 12) / 2


# --- epoch boundaries, groups never judged, and priors from the catalogue (issue 58) ---
def test_boundaries_in_every_window_are_the_steady_state_and_count(race):
    """An epoch shorter than a window (a small corpus): every window holds boundaries, so they
    count, and the race judges; an epoch longer than a window: the one window holding the
    boundary is left out, as before."""
    a1, b1, *_ = race.names
    for i in range(10):  # 10 epochs a window
        race.observe(a1, window(3 * (i + 1), 100, epoch=10 * (i + 1) - 1))
    race.complete(a1, "ok")
    assert [w["clean"] for w in race.windows[a1]] == [False] * 2 + [True] * 8
    assert {w["boundaries"] for w in race.windows[a1][1:]} == {10}
    decisions = [race.observe(b1, window(3 * (i + 1), 80, epoch=10 * (i + 1) - 1))
                 for i in range(5)]  # fmt: skip
    assert decisions == [False] * 4 + [True]  # judged on its 3 clean windows
    # An epoch of 4 windows: the first window holds none, so a boundary is the exception.
    c1 = race.names[2]
    for i, epoch in enumerate([0, 0, 0, 1, 1, 1, 1, 2]):
        race.observe(c1, window(3 * (i + 1), 100, epoch=epoch))
    assert [w["unclean"] for w in race.windows[c1]] == (
        ["warm-up"] * 2 + [None, "epoch boundary", None, None, None, "epoch boundary"]
    )
    # Tune's last result handed again (done) holds no boundary and leaves the rule alone.
    race.observe(c1, window(24, 100, epoch=2))
    assert race.windows[c1][-1]["again"] and race.windows[c1][-1]["boundaries"] == 0


def test_a_group_that_can_never_be_judged_is_said_once(race):
    """Epochs just longer than a window: every window after the first holds a boundary and is
    left out. Once the group's windows left cannot make min_windows, one line says so (console
    and schedule), never again; the summary lists it."""
    from platform.analysis.analyze import _early_stopping, _notes

    a1, _, _, a2, *_ = race.names
    group = race.runs[a1].group
    for run in (a1, a2):
        for i in range(10):
            race.observe(run, window(3 * (i + 1), 100, epoch=i))
        race.complete(run, "ok")
    said = [line for line in race.lines if "cannot be judged" in line]
    assert len(said) == 1 and said[0].startswith(f"race: group {group} cannot be judged: 0 ")
    assert "epoch boundary" in said[0] and group in race.schedule.state["unjudged"]
    assert race.bounds(group) is None and group not in race.eliminated
    import pandas as pd

    manifest = pd.DataFrame({"status": ["ok", "ok"]})
    per_run = pd.DataFrame({"last_step": [30, 30]})
    early = _early_stopping(manifest, per_run, race.schedule.state)
    assert "1 group(s) never judged by the race" in early["line"]
    notes = _notes({"early_stopping": early, "not_ok_runs": []})
    assert any(line.startswith(f"- group {group} cannot be judged") for line in notes)


def test_a_run_too_short_to_judge_is_said_before_it_starts(tmp_path):
    space = space_from(tmp_path).with_overrides(["scheduler.min_windows=17"])  # 2 x (10 - 2) = 16
    runs = expand_runs(space)
    lines = []
    Race(runs, space, Schedule(OutputRoot(tmp_path), space, runs), echo=lines.append)
    assert len(lines) == 3 and all("at most 16 to come, under min_windows 17" in x for x in lines)


def priors_of(spread=(0.0, 0.0), **means):
    """Priors for the race fixture's groups A, B, C: two earlier runs each (sweep ``old``),
    windows +-1 about the mean, the runs ``spread`` apart (relative to it), iter p50 10 ms."""
    from platform.analysis.history import run_noise
    from platform.analysis.priors import Prior, PriorRun, Priors

    groups = {}
    for group, mean in means.items():
        runs = []
        for i, d in enumerate(spread):
            windows = tuple(mean * (1 + d) + w for w in (-1, 1, 0, -1, 1, 0))
            runs.append(PriorRun("old", f"{group}_old_r{i + 1}", windows, windows[1:],
                                 sum(windows[1:]) / 5, 10.0, 1.1))  # fmt: skip
        groups[group] = Prior(group, tuple(runs), ("old",))
    return Priors(groups, run_noise([p.run_means for p in groups.values()]))


def warm_race(tmp_path, history="order", spread=(0.0, 0.0), **means):
    """The race fixture warm-started from ``priors_of``; ``history``: the mode."""
    space = space_from(tmp_path)
    runs = expand_runs(space)
    names = list(dict.fromkeys(r.group for r in runs))
    priors = priors_of(spread, **{names["ABC".index(k)]: v for k, v in means.items()})
    lines = []
    race = Race(runs, space, Schedule(OutputRoot(tmp_path), space, runs), lines.append, priors,
                history)  # fmt: skip
    race.lines, race.names = lines, [r.name for r in runs]
    return race


def test_a_group_measured_clearly_slower_stops_once_its_first_windows_agree(tmp_path):
    """Prior leader A (100), B measured at 80 (clearly slower), C at 99.5 (within noise). A's
    first run is still going: the cold rule has no reference yet, the prior stops B after its
    2 confirming windows. C runs on; ranking and bounds never see the priors."""
    race = warm_race(tmp_path, A=100, B=80, C=99.5)
    a1, b1, c1, *_ = race.names
    a, b, c = (race.runs[n].group for n in (a1, b1, c1))
    feed(race, a1, [10, 10, 100, 101])  # the leader's 2 judged windows here
    assert feed(race, b1, [10, 10, 81]) == [False] * 3  # one judged window: not yet
    assert race.observe(b1, window(12, 79))  # the second agrees: stopped at step 12
    verdict = race.eliminated[b]
    assert verdict["by"] == a and verdict["prior"] and verdict["kind"] == "slower"
    assert verdict["reason"].startswith("stopped at step 12: 0.80x the leader here and 0.80x in")
    assert race.schedule.stops[b1]["step"] == 12
    assert race.prior_state[b]["state"] == "agreed"
    assert not any(feed(race, c1, [10, 10, 99, 99, 100, 99]))  # within noise: runs on
    assert "within noise of the leader" in race.prior_state[c]["line"]
    assert race.prior_state[a]["line"] == "the prior leader: runs its repeats"
    # The priors' 12 windows a group count nowhere: A's own 2 are under min_windows.
    assert race.bounds(a) is None and len(race._clean(a)) == 2


def test_a_group_closer_to_the_leader_than_the_catalogue_allows_drops_its_prior(tmp_path):
    """B was 0.80x of A in the catalogue; here its first windows are 0.97x: the prior is
    dropped (one line), B races cold and is not stopped on it."""
    race = warm_race(tmp_path, A=100, B=80)
    a1, b1, *_ = race.names
    b = race.runs[b1].group
    feed(race, a1, [10, 10, 100, 100])
    assert not any(feed(race, b1, [10, 10, 97, 97, 97]))
    assert race.prior_state[b]["state"] == "dropped" and b not in race.eliminated
    (said,) = [x for x in race.lines if "catalogue prior dropped" in x]
    assert "0.97x the leader" in said and "it races cold" in said
    # Cold from here: against A's finished run, 3 % slower is within its noise floor: no stop.
    feed(race, a1, [100] * 6)
    race.complete(a1, "ok")
    assert not race.observe(b1, window(18, 97)) and b not in race.eliminated


def test_slower_still_agrees_and_the_prior_leader_falling_lets_it_back(tmp_path):
    """B even slower here than in the catalogue (0.70x against 0.80x) agrees. A's second run
    then makes A unstable: B comes back, its prior held again for the next leader."""
    race = warm_race(tmp_path, A=100, B=80)
    a1, b1, _, a2, b2, _ = race.names
    a, b = race.runs[a1].group, race.runs[b1].group
    finish(race, a1, [10, 10] + [100] * 8)
    assert feed(race, b1, [10, 10, 70, 70]) == [False] * 3 + [True]
    race.complete(b1, "ok")
    race.skip(b2)
    feed(race, a2, [100] * 10, p50=20.0, p90=21.0)  # iter p50 doubled: CV 0.47 > 0.05
    race.complete(a2, "ok")
    assert race.eliminated[a]["kind"] == "unstable" and b not in race.eliminated
    record = race.prior_state[b]
    assert record["state"] == "held" and "back in the race" in record["line"]
    assert record["line"].endswith("then the prior leader: runs its repeats")  # B leads now


# --- --history confirm (the default): the catalogue's runs stand in for a group's repeats ---
def test_a_confirmed_prior_stops_the_run_and_its_catalogue_runs_stand_in_for_its_repeats(tmp_path):
    """A measured at 100 in the catalogue (2 runs); its first 2 judged windows here average
    100.5: inside the band, so the run stops there (step 12), its second repeat is not run,
    and the schedule keeps the catalogue runs the ranking pools. Nothing here is eliminated."""
    race = warm_race(tmp_path, "confirm", A=100)
    a1, _, _, a2, *_ = race.names
    a = race.runs[a1].group
    assert feed(race, a1, [10, 10, 100]) == [False] * 3  # one judged window: not yet
    assert race.observe(a1, window(12, 101))  # the second: confirmed, stopped here
    record = race.prior_state[a]
    assert record["state"] == "confirmed" and a in race.settled and a not in race.eliminated
    assert record["line"].startswith("confirmed: its first 2 judged window(s) here (to step 12)")
    assert "1.005x its catalogue runs' first 2 judged windows (100.0" in record["line"]
    assert "its 2 catalogue run(s) (sweep(s) old) stand in for its repeats" in record["line"]
    assert [r["run"] for r in record["catalogue_runs"]] == [f"{a}_old_r1", f"{a}_old_r2"]
    stop = race.schedule.stops[a1]
    assert stop["step"] == 12 and stop["reason"].startswith("prior confirmed:")
    race.complete(a1, "ok")  # Tune ends the stopped trial
    assert not race.runnable(a2)
    race.skip(a2)
    assert "catalogue runs stand in for its repeats" in race.schedule.state["skipped"][a2]
    (said,) = [x for x in race.lines if "catalogue prior confirmed" in x]
    assert said.startswith(f"race: group {a}: catalogue prior confirmed: its first 2")
    saved = json.loads((tmp_path / SCHEDULE).read_text())  # what the analysis and --resume read
    assert saved["history"]["mode"] == "confirm" and saved["priors"][a]["state"] == "confirmed"


def test_a_prior_this_host_measures_outside_its_band_is_dropped_and_every_repeat_runs(tmp_path):
    """A measured at 100 before, at 80 here (a host that changed under the same fingerprint):
    the prior is dropped for good, one line says so, the run goes on and the second repeat
    runs, as in a cold race; the ranking will not pool it."""
    race = warm_race(tmp_path, "confirm", A=100)
    a1, _, _, a2, *_ = race.names
    a = race.runs[a1].group
    assert not any(feed(race, a1, [10, 10, 80, 80, 80, 80, 80, 80, 80, 80]))
    race.complete(a1, "ok")
    record = race.prior_state[a]
    assert record["state"] == "dropped" and a not in race.settled and race.runnable(a2)
    assert "0.800x its catalogue runs' first 2 judged windows (100.0" in record["line"]
    (said,) = [x for x in race.lines if "catalogue prior dropped" in x]
    assert said.endswith("it runs as cold, every repeat")
    assert not any(feed(race, a2, [10, 10, 100, 100]))  # dropped for good: never judged again
    assert race.prior_state[a]["state"] == "dropped"


def test_the_band_is_the_catalogues_alone_and_the_run_to_run_spread_widens_it():
    """3 % off the catalogue's mean: outside the floor's band (2 %) when the catalogue's runs
    agree with each other, inside when they spread 4 % apart (the run term, pooled over the
    groups' 3 degrees of freedom); two noisy windows here do not widen it."""
    tight = priors_of(A=100, B=80, C=60)
    ratio, low, high = tight.confirms("A", [103.0, 103.0])
    assert ratio == pytest.approx(1.03) and high < 1.03
    assert tight.confirms("A", [93.0, 113.0])[1:] == (low, high)  # noisy here: the same band
    spread = priors_of((-0.02, 0.02), A=100, B=80, C=60)
    assert spread.noise[1] == 3 and spread.confirms("A", [103.0, 103.0])[2] > 1.03


def test_the_band_leaves_jittery_groups_and_partial_runs_out_of_the_noise_and_is_capped():
    """The run-to-run term pools the steady groups' whole runs only: a jittery group with runs
    at 80 and 96, or a partial run, leaves A's band as it was. A band whose catalogue runs
    spread 6 % apart is capped at 3 noise floors (+-6 %)."""

    from platform.analysis.priors import BAND_CAP, Prior, PriorRun, Priors, prior_noise

    steady = priors_of((-0.01, 0.01), A=100, B=80)
    band = steady.confirms("A", [100.0, 100.0])
    w = (79, 81, 80, 79, 81, 80)
    jumpy = Prior("J", (PriorRun("old", "j1", w, w[1:], 80.0), PriorRun("old", "j2",
                  tuple(x * 1.2 for x in w), w[1:], 96.0)), ("old",), jittery=True)  # fmt: skip
    part = PriorRun("old", "a3", (100.0, 99.0, 101.0), (99.0, 101.0), 100.0, status="stopped_early")
    a = dataclasses.replace(steady.groups["A"], runs=(*steady.groups["A"].runs, part))
    groups = {**steady.groups, "A": a, "J": jumpy}
    noisy = Priors(groups, prior_noise(groups.values()))
    assert noisy.noise == steady.noise
    assert Priors(groups, prior_noise(groups.values())).confirms("A", [100.0, 100.0])[1] == (
        pytest.approx(band[1], abs=0.005))  # fmt: skip
    wide = priors_of((-0.03, 0.03), A=100, B=80, C=60)
    assert wide.confirms("A", [100.0, 100.0])[1:] == pytest.approx((1 - BAND_CAP * 0.02,
                                                                    1 + BAND_CAP * 0.02))  # fmt: skip


def test_a_shift_every_group_shares_drops_every_prior(tmp_path):
    """A and B each confirm at 0.965x (inside their own band, +-6 %): once both were judged,
    the median of their ratios, 0.965, is outside the shift tolerance (3 %): every prior is
    dropped in one line, A and B un-settled (A's run, told its stop, stays stopped and its
    repeat runs again; B's run, not told yet, goes on), C's prior dropped before it was judged; all race cold."""
    race = warm_race(tmp_path, "confirm", (-0.03, 0.03), A=100, B=100, C=100)
    a1, b1, c1, a2, b2, c2 = race.names
    a, b, c = (race.runs[n].group for n in (a1, b1, c1))
    assert feed(race, a1, [10, 10, 96.5, 96.5])[-1] and race.settled == {a}
    race.complete(a1, "cut")
    race.skip(a2)
    assert not any(feed(race, b1, [10, 10, 96.5, 96.5]))  # its stop not told yet: taken back
    assert not race.settled and {r["state"] for r in race.prior_state.values()} == {"dropped"}
    (said,) = [x for x in race.lines if "catalogue priors dropped" in x]
    assert said.startswith("race: catalogue priors dropped: the 2 group(s) judged so far put "
                           "this host at 0.965x")  # fmt: skip
    assert not [x for x in race.lines if "catalogue prior dropped" in x]  # one line for all
    assert "shift" in race.schedule.state["history"]
    assert a1 in race.schedule.stops and b1 not in race.schedule.stops
    assert race.rerun() == a2 and race.runnable(b2)
    assert not any(feed(race, c1, [10, 10, 100, 100]))  # C races cold: not settled
    assert race.prior_state[c]["state"] == "dropped" and c not in race.settled


def test_a_shift_within_the_tolerance_keeps_the_priors(tmp_path):
    """A and B each confirm at 0.975x: their median is beyond the noise floor (2 %) but within
    the shift tolerance (3 %), the spread one host shows from one race to the next: both stay
    settled, no prior is dropped. With the tolerance at 2 %, the same windows drop them all."""
    for tolerance, kept in ((0.03, True), (0.02, False)):
        folder = tmp_path / str(tolerance)
        folder.mkdir()
        race = warm_race(folder, "confirm", (-0.03, 0.03), A=100, B=100, C=100)
        race.plan = dataclasses.replace(race.plan, shift_tolerance=tolerance)
        a1, b1, *_ = race.names
        a, b = race.runs[a1].group, race.runs[b1].group
        assert feed(race, a1, [10, 10, 97.5, 97.5])[-1]
        race.complete(a1, "cut")
        feed(race, b1, [10, 10, 97.5, 97.5])
        assert (race.settled == {a, b}) is kept
        assert ("shift" in (race.schedule.state.get("history") or {})) is not kept


def test_a_settled_group_is_a_reference_for_the_groups_racing_cold(tmp_path):
    """A (prior 100) settles on its first judged windows; C has no prior and is 20 % slower:
    against A's bounds pooled over its run here and its catalogue runs, C leaves the race as
    slower once it has min_windows clean windows, though no run of this sweep finished."""
    race = warm_race(tmp_path, "confirm", A=100)
    a1, _, c1, *_ = race.names
    a, c = race.runs[a1].group, race.runs[c1].group
    feed(race, a1, [10, 10, 100, 100])
    assert a in race.settled and not race.finished
    assert feed(race, c1, [10, 10, 80, 80, 80]) == [False] * 4 + [True]
    assert race.eliminated[c]["kind"] == "slower" and race.eliminated[c]["by"] == a
    assert race.bounds(a)["runs"] == 3  # 1 here + 2 from the catalogue
    assert race.eliminated[c]["scale"] == 1.0  # A's ratio here: its catalogue runs as they were
    assert race.eliminated[c]["reason"].endswith("(its catalogue runs scaled by 1.000)")


def test_a_settled_groups_pooled_bounds_sit_at_this_hosts_level_and_a_resume_keeps_the_factor(
    tmp_path,
):
    """Every group 2.5 % slower here today (inside the shift tolerance): A (prior 100, runs 3 %
    apart) settles at 0.975x, and its bounds pool its catalogue windows x 0.975 (the shift this
    host shows: A's own ratio, one group judged), so their mean is this host's 97.5, not the
    catalogue's 100; the Phase B checks take its catalogue iter p50 / 0.975. The factor is kept
    in the schedule; a resumed race (schedule.json read back) uses the kept one."""
    from platform.analysis.priors import Priors

    race = warm_race(tmp_path, "confirm", (-0.03, 0.03), A=100, C=100)
    a1, _, c1, *_ = race.names
    a = race.runs[a1].group
    assert feed(race, a1, [10, 10, 97.5, 97.5])[-1] and race.settled == {a}
    assert race.scale == pytest.approx(0.975)
    assert race.schedule.state["history"]["scale"] == {"factor": pytest.approx(0.975), "judged": 1}
    assert race.prior_state[a]["scale"] == pytest.approx(0.975)
    assert race.bounds(a)["mean"] == pytest.approx(97.5, rel=0.005)
    assert [d["iter_p50"] for d in race._phase_b_runs(a)][-2:] == [pytest.approx(10 / 0.975)] * 2
    # C judged too, at 0.985x: the factor is the median of the two, 0.98.
    feed(race, c1, [10, 10, 98.5, 98.5])
    assert race.scale == pytest.approx(0.98)
    assert race.prior_state[a]["scale"] == pytest.approx(0.975)  # as it settled
    space = space_from(tmp_path)
    runs = expand_runs(space)
    schedule = Schedule(OutputRoot(tmp_path), space, runs)
    schedule.load()
    again = Race(runs, space, schedule, lambda _: None, Priors.of_schedule(schedule.state),
                 schedule.state["history"]["mode"])  # fmt: skip
    assert again.scale == pytest.approx(0.98)
    assert again.schedule.state["history"]["scale"]["judged"] == 2
    # A's run here not restored (no timing given): its catalogue runs (97 and 103) x 0.98.
    assert again.bounds(a)["mean"] == pytest.approx(100 * 0.98)
    again.windows[a1] = race.windows[a1]
    assert again.bounds(a)["mean"] == pytest.approx((97 * 0.98 + 103 * 0.98 + 97.5) / 3)


def test_a_group_unstable_over_its_pooled_runs_leaves_as_unstable(tmp_path):
    """The Phase B limits judge a settled group's runs here and its catalogue runs together:
    A's catalogue runs had an iter p50 of 10 ms, its run here 20 ms (CV over the three 0.43 >
    0.05): it leaves as unstable, saying over which runs, and is not settled."""
    race = warm_race(tmp_path, "confirm", A=100)
    a1, *_ = race.names
    a = race.runs[a1].group
    assert feed(race, a1, [10, 10, 100, 100], p50=20.0, p90=21.0)[-1]
    verdict = race.eliminated[a]
    assert verdict["kind"] == "unstable" and "iter p50 CV" in verdict["reason"]
    assert verdict["reason"].endswith("(over its runs here and in the catalogue)")
    assert verdict["scale"] == 1.0  # its catalogue iter p50 as it was: A confirmed at 1.000x
    assert race.schedule.stops[a1]["reason"].startswith("unstable:")


def test_a_resumed_warm_race_keeps_its_priors_and_what_they_decided(tmp_path):
    """--resume rebuilds the priors and the mode from schedule.json (Priors.of_schedule), not
    from the catalogue as it is now: A, confirmed before the interrupt, stays settled and its
    repeat is not handed out; B's prior, held, is judged as before."""
    from platform.analysis.priors import Priors

    race = warm_race(tmp_path, "confirm", A=100, B=80)
    a1, b1, _, a2, *_ = race.names
    feed(race, a1, [10, 10, 100, 100])
    space = space_from(tmp_path)
    runs = expand_runs(space)
    schedule = Schedule(OutputRoot(tmp_path), space, runs)
    schedule.load()
    priors = Priors.of_schedule(schedule.state)
    assert priors.groups == race.priors.groups and priors.noise == race.priors.noise
    again = Race(runs, space, schedule, lambda _: None, priors,
                 schedule.state["history"]["mode"])  # fmt: skip
    a, b = race.runs[a1].group, race.runs[b1].group
    assert again.settled == {a} and not again.runnable(a2)
    assert again.prior_state[b]["state"] == "held"
    assert feed(again, b1, [8, 8, 80, 80])[-1] and b in again.settled


def test_a_settled_group_whose_run_then_fails_or_is_cut_races_cold(tmp_path):
    """A confirms and its run is told to stop; the run then fails before its stop is
    recorded: no run of A measured here, so its catalogue runs may not stand in for it. Its
    prior is dropped (one line) and it races cold: the run told its stop stays stopped (as a
    cold race's stopped run that then fails), its repeat runs. A run told its stop that Tune ends short (``cut``) is the ordinary end of a stopped
    trial: still settled. Cut before it was told (the sweep interrupted): its stop is taken
    back (--resume runs it again) and its repeat, skipped for the catalogue, is handed out
    again."""
    (tmp_path / "failed").mkdir()
    (tmp_path / "cut").mkdir()
    (tmp_path / "lost").mkdir()
    race = warm_race(tmp_path / "failed", "confirm", A=100)
    a1, _, _, a2, *_ = race.names
    a = race.runs[a1].group
    assert feed(race, a1, [10, 10, 100, 100])[-1] and a in race.settled
    race.skip(a2)
    race.complete(a1, "error")
    assert a not in race.settled and race.prior_state[a]["state"] == "dropped"
    assert "then un-settled: its run" in race.prior_state[a]["line"]
    assert a not in race.eliminated and race.rerun() == a2 and race.runnable(a2)
    (said,) = [x for x in race.lines if "catalogue prior dropped" in x]
    assert f"its run {a1} did not finish (error)" in said

    race = warm_race(tmp_path / "cut", "confirm", A=100)
    assert feed(race, a1, [10, 10, 100, 100])[-1]
    race.skip(a2)
    race.complete(a1, "cut")  # told to stop, Tune ends it short: the stop landed, still settled
    assert a in race.settled and a1 in race.schedule.stops
    race = warm_race(tmp_path / "lost", "confirm", A=100)
    feed(race, a1, [10, 10, 100, 100])
    race.skip(a2)
    race.told.discard(a1)  # the stop decided, the sweep interrupted before it was told
    race.complete(a1, "cut")
    assert a not in race.settled and a not in race.eliminated
    assert a1 not in race.schedule.stops and a2 not in race.schedule.state["skipped"]
    assert race.rerun() == a2 and race.runnable(a2)


def test_a_group_knocked_out_by_a_settled_group_comes_back_when_it_is_unsettled(tmp_path):
    """C (no prior, 20 % slower) left as slower against A's bounds pooled with A's catalogue
    runs; A's run then fails: A is un-settled, so C comes back (no valid reference is left to
    stop it again)."""
    race = warm_race(tmp_path, "confirm", A=100)
    a1, _, c1, *_ = race.names
    a, c = race.runs[a1].group, race.runs[c1].group
    feed(race, a1, [10, 10, 100, 100])
    assert feed(race, c1, [10, 10, 80, 80, 80])[-1] and race.eliminated[c]["by"] == a
    race.complete(a1, "error")
    assert a not in race.settled and c not in race.eliminated
    assert race.schedule.state["readmitted"][-1]["why"].startswith(
        f"{a}'s catalogue prior was dropped (its run {a1} did not finish (error)")  # fmt: skip


def test_a_resume_unsettles_a_group_whose_confirmed_run_was_lost(tmp_path):
    """The sweep was killed after A confirmed (its stop in schedule.json) but before its run
    was recorded stopped: on --resume no run of A is ok or stopped here, so A is un-settled,
    its stop taken back and its skipped repeat handed out again; B, whose run was recorded,
    stays settled."""
    import pandas as pd

    from platform.analysis.priors import Priors

    race = warm_race(tmp_path, "confirm", A=100, B=80)
    a1, b1, _, a2, b2, _ = race.names
    a, b = race.runs[a1].group, race.runs[b1].group
    feed(race, a1, [10, 10, 100, 100])
    feed(race, b1, [8, 8, 80, 80])
    race.skip(a2)
    race.skip(b2)
    assert race.settled == {a, b}
    space = space_from(tmp_path)
    runs = expand_runs(space)
    schedule = Schedule(OutputRoot(tmp_path), space, runs)
    schedule.load()
    again = Race(runs, space, schedule, lambda _: None, Priors.of_schedule(schedule.state),
                 "confirm")  # fmt: skip
    done = {b1: {"status": "stopped_early"}, a2: {"status": "skipped"}, b2: {"status": "skipped"}}
    again.restore(pd.DataFrame(columns=["run", "window", "rank"]), done)
    assert again.settled == {b} and again.prior_state[a]["state"] == "dropped"
    assert "(--resume)" in again.prior_state[a]["line"] and a1 not in schedule.stops
    assert again.runnable(a2) and again.rerun() == a2 and not again.runnable(b2)


def test_a_prior_it_cannot_pool_works_as_history_order_in_confirm(tmp_path):
    """--history confirm with B's prior of another commit (``order_only``): A (the same
    commit) confirms and settles; B, measured clearly slower, is never settled nor pooled: it
    is stopped as --history order stops it, its line saying why."""

    race = warm_race(tmp_path, "confirm", A=100, B=80)
    a1, b1, *_ = race.names
    a, b = race.runs[a1].group, race.runs[b1].group
    why = "catalogue run(s) of commit def, this sweep abc"
    race.priors.groups[b] = dataclasses.replace(race.priors.groups[b], order_only=why)
    race.prior_state[b].update(order_only=why)
    feed(race, a1, [10, 10, 100, 100])
    assert race.settled == {a}
    assert feed(race, b1, [8, 8, 80, 80])[-1] and b not in race.settled
    record = race.prior_state[b]
    assert record["state"] == "agreed" and race.eliminated[b]["prior"]
    assert record["line"].startswith(f"as --history order, never pooled ({why}): agreed;")
    assert "here" not in race.prior_state[a] or race.prior_state[a]["here"] == pytest.approx(1.0)


def test_without_history_the_race_is_cold(tmp_path):
    """--no-history hands the race no priors: mode off, nothing of the catalogue in the
    schedule, every run runnable until the bounds decide; its ranking is its own."""
    space = space_from(tmp_path)
    runs = expand_runs(space)
    race = Race(runs, space, Schedule(OutputRoot(tmp_path), space, runs), lambda _: None)
    assert race.history == "off" and not race.settled
    feed(race, runs[0].name, [10, 10, 100, 100])
    assert not {"history", "priors"} & set(race.schedule.state)
    assert all(race.runnable(r.name) for r in runs)


def test_a_group_stopped_on_its_prior_never_ranks_first():
    """The ranking is the sweep's own figures; a group that left as slower (a prior's stop
    after its first run finished, say) ranks after the steady groups still in the race even
    when its own run was faster."""
    import pandas as pd

    from platform.analysis.analyze import ranked_groups

    per_run = pd.DataFrame([
        {"run": "a_r1", "group": "a", "status": "ok", "tail_samples_per_sec_mean": 100.0,
         "tail_mean_iter_p50_ms": 10.0, "iter_p90_over_p50": 1.1, "unstable_run_flag": False},
        {"run": "b_r1", "group": "b", "status": "ok", "tail_samples_per_sec_mean": 101.0,
         "tail_mean_iter_p50_ms": 10.0, "iter_p90_over_p50": 1.1, "unstable_run_flag": False},
    ])  # fmt: skip
    schedule = {"eliminated": {"b": {"kind": "slower", "by": "a", "prior": True}}}
    assert list(ranked_groups(per_run, schedule)["group"]) == ["a", "b"]
    assert list(ranked_groups(per_run, {})["group"]) == ["b", "a"]


def test_the_2xh200_races_replayed_cold_and_warm():
    """benchmarks/race_replay.py on the committed consoles (benchmarks/results/warm_race_2xh200/):
    cold, every window judged (epochs of 4-5 steps in windows of 50), 1,800 of 2,400 steps.
    Warm with --history confirm (the default): every group's first 2 judged windows fall in its
    prior's band, so each runs once, to step 200, its catalogue runs standing in for its
    repeats: 800 steps, under half the cold race's modelled wall, the same winner from the
    pooled ranking. Warm with --history order (priors only stop the groups measured clearly
    slower): both mb160 groups stopped at step 200 on their priors, 1,600 steps. Each group's
    first judged windows are compared with its catalogue runs' same windows."""
    from benchmarks.race_replay import COMMIT, RESULTS, SETS, catalogue_rows, read_epochs, read_log
    from benchmarks.race_replay import replay as replay_race
    from platform.analysis.priors import race_priors, warm_start

    space = load_space("4090_mainline").with_overrides(SETS)
    runs = expand_runs(space)
    first, second = (read_log(RESULTS / f"race{n}.log") for n in (1, 2))
    first.epochs = read_epochs(RESULTS / "race_replay.txt", "race1")
    second.epochs = read_epochs(RESULTS / "race_replay.txt", "race2")
    assert first.epochs[runs[0].name] == [9, 19, 29, 39, 49, 59]
    cold = replay_race("cold", runs, space, first)
    rows = catalogue_rows(runs, first)
    ordered, _, _ = warm_start(runs, rows, "replay")
    priors = race_priors(ordered, rows, "replay", space.scheduler, COMMIT)
    warm = replay_race("warm", ordered, space, second, priors)
    assert (cold.steps, warm.steps) == (1800, 800)
    assert cold.winner == warm.winner == "sweep_z0_mb192_nw8_pf4"
    assert {p["state"] for p in warm.state["priors"].values()} == {"confirmed"}
    assert set(warm.stopped.values()) == {200} and len(warm.skipped) == 4
    assert warm.wall_s / cold.wall_s <= 0.5
    pooled = warm.ranking.set_index("group")
    assert set(pooled["runs_ok"]) == {3} and set(pooled["runs_catalogue"]) == {2}
    assert set(cold.ranking["runs_catalogue"]) == {0}  # a cold race ranks on its own runs
    order = replay_race("warm", ordered, space, second, priors, history="order")
    assert order.steps == 1600 and order.winner == cold.winner
    prior_stops = {g for g, e in order.state["eliminated"].items() if e.get("prior")}
    assert prior_stops == {"sweep_z0_mb160_nw6_pf4", "sweep_z0_mb160_nw8_pf4"}
    assert set(order.stopped.values()) == {200} and not order.state.get("unjudged")
    assert 0.85 < order.wall_s / cold.wall_s < 0.95
    assert set(order.ranking["runs_catalogue"]) == {0}
    # A host 5 % slower (--warm-scale 0.95): the mb192 groups confirm alone (0.961x, 0.970x,
    # inside their +-5.3 % bands), but their median is outside the 3 % shift tolerance: every prior is
    # dropped, the race runs cold and names the cold winner, never pooling two hosts' runs.
    from benchmarks.race_replay import scaled

    slower = replay_race("warm", ordered, space, scaled(second, 0.95), priors)
    assert slower.state["history"]["shift"].startswith("catalogue priors dropped: the 2 group")
    assert {p["state"] for p in slower.state["priors"].values()} == {"dropped"}
    assert slower.winner == cold.winner and set(slower.ranking["runs_catalogue"]) == {0}
