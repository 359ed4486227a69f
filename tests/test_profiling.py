"""profile_steps: rank 0 records a torch profiler window after the first timing window, its
steps' forward, backward and optimizer marked, into runs/<run>/profile-rank0.json, which
benchmarks/step_profile.py summarises; the window must end before the tail windows."""

import pytest

from benchmarks.step_profile import read_trace, summarise
from stage1_common.output_root import RunFolder
from tests.test_checkpoint_resume import BASE, train
from trainables.config import ConfigError, TrialConfig


def test_the_profiler_window_must_end_before_the_tail_windows():
    # Steps 6-9 (a warm-up step, then 3) against a tail that starts at step 11: fine.
    TrialConfig(max_steps=20, log_every=5, tail_timing_points=2, profile_steps=3)
    with pytest.raises(
        ConfigError,
        match=r"^profile_steps: the profiler's steps 6-12 reach .*"
        r"from step 11\); set max_steps to at least 22 or lower profile_steps",
    ):
        TrialConfig(max_steps=20, log_every=5, tail_timing_points=2, profile_steps=6)
    with pytest.raises(ConfigError, match="profile_steps"):
        TrialConfig(profile_steps=-1)


def test_rank_0_writes_a_trace_of_the_window_with_the_steps_phases_marked(tmp_path):
    # Steps 3 (the profiler's warm-up) and 4-6, before the tail window (7-8).
    config = {**BASE, "max_steps": 8, "tail_timing_points": 1, "profile_steps": 3}
    windows = train(config, tmp_path)
    assert [w["step"] for w in windows] == [2, 4, 6, 8]  # every window still reported
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
