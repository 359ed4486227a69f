"""profile_steps: rank 0 records a torch profiler window after the first timing window, its
steps' forward, backward and optimizer marked, into runs/<run>/profile-rank0.json, which
benchmarks/step_profile.py summarises; the window must end before the tail windows."""

import pytest

from benchmarks.step_profile import read_trace, summarise
from stage1_common.output_root import RunFolder
from tests.test_checkpoint_resume import BASE, train
from trainables.config import ConfigError, TrialConfig


def test_the_profiler_window_stays_in_the_second_window_and_out_of_the_tail():
    # Steps 6-9 (a warm-up step, then 3) inside the second window (6-10), the tail from 11.
    TrialConfig(max_steps=20, log_every=5, tail_timing_points=2, profile_steps=3)
    with pytest.raises(
        ConfigError,
        match=r"^profile_steps: 5 steps and the profiler's warm-up step do not fit in the second "
        r"timing window \(steps 6-10\); set log_every to at least 6 or lower profile_steps",
    ):
        TrialConfig(max_steps=40, log_every=5, tail_timing_points=2, profile_steps=5)
    with pytest.raises(
        ConfigError,
        match=r"^profile_steps: the profiler's steps 6-9 reach the tail windows \(from step 7\); "
        r"set max_steps to at least 19 or lower profile_steps",
    ):
        TrialConfig(max_steps=16, log_every=5, tail_timing_points=2, profile_steps=3)
    with pytest.raises(ConfigError, match="profile_steps"):
        TrialConfig(profile_steps=-1)


def test_a_profiled_run_gets_processes_of_its_own():
    from trainables.config.checks import needs_own_processes

    assert "profile_steps" in needs_own_processes(TrialConfig(max_steps=30, profile_steps=3))
    with pytest.raises(ConfigError, match="^executor: resident cannot run this run: it runs the"):
        TrialConfig(max_steps=30, profile_steps=3, executor="resident")


def test_rank_0_writes_a_trace_of_the_window_with_the_steps_phases_marked(tmp_path):
    # Steps 5 (the profiler's warm-up) and 6-8: the second window; the tail is steps 9-12.
    config = {**BASE, "max_steps": 12, "log_every": 4, "tail_timing_points": 1, "profile_steps": 3}
    windows = train(config, tmp_path)
    assert [w["step"] for w in windows] == [4, 8, 12]  # every window still reported
    folder = RunFolder(tmp_path)
    assert [p.name for p in sorted(tmp_path.glob(folder.PROFILE.format(rank="*")))] == [
        folder.profile(0).name
    ]
    events = read_trace(folder.profile(0))
    names = {e.get("name") for e in events}
    assert {"forward", "backward", "optimizer"} <= names
    steps = sorted(e["name"] for e in events if str(e.get("name")).startswith("ProfilerStep#"))
    assert len(steps) == 3
    summary = summarise(events)
    # On a CPU nothing runs on a GPU: a step's time is all the host's.
    assert summary["steps"] == 3 and summary["step"] > 0
    assert summary["gpu_idle"] == pytest.approx(summary["step"], abs=0.02)
