"""The fault injector (trainables/faults.py): built once per rank, a no-op object when no
``inject_*`` key aims at the rank, and the same steps, ranks and messages when one does."""

import time

import pytest

from trainables.config import TrialConfig
from trainables.faults import _LEAKED, NoFaults, build_faults


def test_a_run_without_injection_gets_the_no_op_injector():
    assert type(build_faults(TrialConfig(), rank=0)) is NoFaults
    aimed_elsewhere = TrialConfig(
        inject_sleep_at_step=3, inject_sleep_rank=1, inject_error_at_step=4, inject_error_rank=1
    )
    assert type(build_faults(aimed_elsewhere, rank=0)) is NoFaults
    assert type(build_faults(aimed_elsewhere, rank=1)) is not NoFaults


def test_the_error_is_raised_at_its_step_on_its_rank_only():
    faults = build_faults(TrialConfig(inject_error_at_step=3, inject_error_rank=1), rank=1)
    faults.after_step(2)
    with pytest.raises(RuntimeError, match=r"^injected error at step 3 on rank 1 \(inject_error"):
        faults.after_step(3)
    faults.after_step(4)


def test_the_sleep_covers_its_window_every_nth_step(monkeypatch):
    slept = []
    monkeypatch.setattr(time, "sleep", lambda s: slept.append(s))
    cfg = TrialConfig(
        inject_sleep_at_step=2, inject_sleep_steps=5, inject_sleep_every=2, inject_sleep_s=0.5
    )
    faults = build_faults(cfg, rank=0)
    steps = []
    for step in range(1, 10):
        before = len(slept)
        faults.after_step(step)
        steps += [step] * (len(slept) - before)
    assert steps == [2, 4, 6] and slept == [0.5, 0.5, 0.5]


def test_the_leak_keeps_its_allocation_every_step():
    faults = build_faults(TrialConfig(inject_leak_mb_per_step=0.5), rank=0)
    before = len(_LEAKED)
    faults.after_step(1)
    faults.after_step(2)
    assert len(_LEAKED) == before + 2 and len(_LEAKED[-1]) == 2**19
    del _LEAKED[before:]


def test_faults_act_in_a_runs_first_attempt_only_unless_every_attempt_is_asked(tmp_path):
    """A drill's kill at step 250 must not kill every restarted attempt at step 250 again."""
    cfg = TrialConfig(inject_error_at_step=3, inject_error_rank=1)
    first = build_faults(cfg, rank=1, run_dir=tmp_path)
    with pytest.raises(RuntimeError, match="injected error at step 3"):
        first.after_step(3)
    assert (tmp_path / "faults_armed-rank1.json").is_file()
    # Another rank of the same attempt, starting later, still arms its own faults.
    assert (
        type(build_faults(TrialConfig(inject_error_at_step=3), rank=0, run_dir=tmp_path))
        is not NoFaults
    )
    # The restarted worker group (and a training resumed with --resume) trains on.
    assert type(build_faults(cfg, rank=1, run_dir=tmp_path)) is NoFaults
    again = build_faults(
        TrialConfig(inject_error_at_step=3, inject_every_attempt=True), rank=1, run_dir=tmp_path
    )
    with pytest.raises(RuntimeError):
        again.after_step(3)
    # A rank no fault aims at leaves no mark: its run's other ranks still arm theirs.
    other = tmp_path / "other"
    other.mkdir()
    assert type(build_faults(cfg, rank=0, run_dir=other)) is NoFaults
    assert not list(other.iterdir())


def test_a_sweeps_rerun_arms_its_faults_again_and_a_resumed_training_does_not(tmp_path):
    from platform.execution.resume import drop_rows
    from stage1_common.output_root import OutputRoot

    root = OutputRoot.of(tmp_path)
    mark = root.run_folder("r1").faults_armed(1)
    mark.parent.mkdir(parents=True)
    mark.write_text("{}")
    drop_rows(root, ["r1"], keep_parts=True)  # platform.train --resume: from its checkpoint
    assert mark.exists()
    drop_rows(root, ["r1"])  # platform.tune --resume: the run trains again from its start
    assert not mark.exists()
