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
