"""trainables/host_settings.py: the intra-op threads a run's process gets (issue 53)."""

import torch

from trainables import host_settings
from trainables.config import TrialConfig


def test_a_gpu_rank_gets_one_intra_op_thread_as_torchrun_gives_it_and_a_cpu_rank_its_cpus():
    cfg = TrialConfig(num_workers=4)  # 5 CPUs reserved: Ray's OMP_NUM_THREADS for the worker
    assert host_settings.intra_op_threads(cfg, on_gpu=True, started_with=5) == 1
    assert host_settings.intra_op_threads(cfg, on_gpu=False, started_with=5) == 5
    # A resident group's figure is its most demanding run's: a smaller run gets its own.
    assert host_settings.intra_op_threads(cfg, on_gpu=False, started_with=9) == 5
    # A process started with fewer (a user's OMP_NUM_THREADS) keeps that cap on a CPU.
    assert host_settings.intra_op_threads(cfg, on_gpu=False, started_with=2) == 2
    # The key wins everywhere.
    both = TrialConfig(num_workers=4, intra_op_threads=3)
    assert host_settings.intra_op_threads(both, on_gpu=True, started_with=5) == 3
    assert host_settings.intra_op_threads(both, on_gpu=False, started_with=1) == 3


def test_the_setting_is_applied_per_run_from_the_process_start_figure(monkeypatch):
    """A resident worker serves many runs: each run's figure comes from what the process
    started with, not from what the previous run set."""
    before = torch.get_num_threads()
    monkeypatch.setattr(host_settings, "_STARTED_WITH", [2])
    try:
        got = host_settings.apply_host_settings(TrialConfig(num_workers=0), torch.device("cpu"))
        assert got == {"intra_op_threads_effective": 1} and torch.get_num_threads() == 1
        got = host_settings.apply_host_settings(TrialConfig(num_workers=3), torch.device("cpu"))
        assert got == {"intra_op_threads_effective": 2} and torch.get_num_threads() == 2
        cfg = TrialConfig(num_workers=3, intra_op_threads=1)
        assert (
            host_settings.apply_host_settings(cfg, torch.device("cpu"))[
                "intra_op_threads_effective"
            ]
            == 1
        )
    finally:
        torch.set_num_threads(before)
