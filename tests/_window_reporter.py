"""A Tune function trainable that reports the platform's window rows without training (for the
run_timeout_s test). It lives apart from the test module, which imports ``platform``: Ray
workers import this module, and cannot import ``platform.*``."""

import time

from ray import tune


def report_windows(config: dict) -> None:
    run = config["run"]
    step, start = 0, time.time()
    while step < run["max_steps"]:
        time.sleep(0.2)
        step += 5
        tune.report(
            {
                "step": step,
                "max_steps": run["max_steps"],
                "window": step // 5 - 1,
                "rank": 0,
                "iter_ms_p50": 40.0,
                "data_ms_p50": 1.0,
                "samples_per_s": 100.0,
                "loss": 1.0,
                "eta_s": 0.0,
                "attempt_start_ts": start,
            }
        )
