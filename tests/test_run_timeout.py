"""run_timeout_s through a real Tune experiment: the RunTimeout stopper ends a run that goes on
too long at its next window report, and the recorder calls it a timeout (exit code 124) with the
step it reached; a run within its limit is ok. The trainable only reports windows (no
training), so this costs seconds, not a sweep."""

import pandas as pd
import pytest

from platform.control.stoppers import RunTimeout
from platform.record.failures import exit_code
from platform.record.recorder import SweepRecorder
from platform.spaces.expand import RunSpec
from stage1_common.output_root import OutputRoot
from tests._window_reporter import report_windows
from trainables.config import TrialConfig


def test_a_run_past_run_timeout_s_is_stopped_and_recorded_as_a_timeout(tmp_path):
    import ray
    from ray import tune

    runs = [
        RunSpec(
            name=name,
            group=name,
            repeat=1,
            swept={},
            config=TrialConfig(use_gpu=False, max_steps=steps, log_every=5, run_timeout_s=limit),
        )
        for name, steps, limit in (("slow", 1000, 1.0), ("quick", 10, 30.0))
    ]
    recorder = SweepRecorder(OutputRoot(tmp_path), runs, echo=lambda line: None)
    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
    try:
        tune.Tuner(
            report_windows,
            param_space={
                "run": tune.grid_search(
                    [{"name": r.name, "max_steps": r.config.max_steps} for r in runs]
                )
            },
            tune_config=tune.TuneConfig(max_concurrent_trials=1),
            run_config=tune.RunConfig(
                storage_path=str(tmp_path / "tune"),
                callbacks=[recorder],
                stop=RunTimeout(runs, recorder.trial_runs),
                verbose=0,
            ),
        ).fit()
    finally:
        ray.shutdown()
    recorder.drain()  # its writer thread: every row handed over is on disk
    slow, quick = recorder.status["slow"], recorder.status["quick"]
    assert slow["status"] == "timeout" and exit_code("timeout") == 124
    reached = int(slow["failure_reason"].rsplit(" ", 1)[1])
    assert slow["failure_reason"] == f"run_timeout_s 1 reached at step {reached}"
    assert 5 <= reached < 1000  # stopped at a report after the limit, long before the end
    assert quick["status"] == "ok"
    # What the stopped run measured is on disk.
    timing = pd.read_parquet(tmp_path / "timing.parquet")
    assert timing.loc[timing["run"] == "slow", "step"].max() == pytest.approx(reached)
