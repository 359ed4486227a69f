"""The run manifest's run figures on hand-made timing rows."""

import pandas as pd
import pytest

from platform.analysis import run_figures


def rows(run, sps, iter_p50, rank=0, startup=5.0):
    return [
        {
            "run": run,
            "rank": rank,
            "window": i,
            "step": 10 * (i + 1),
            "samples_per_s": s,
            "iter_ms_p50": it,
            "startup_s": startup,
        }
        for i, (s, it) in enumerate(zip(sps, iter_p50, strict=True))
    ]


def test_tail_figures_use_the_last_n_windows_of_rank_0():
    timing = pd.DataFrame(
        rows("a", [10, 100, 200, 300], [9, 8, 7, 6])
        + rows("a", [1, 1, 1, 1], [1, 1, 1, 1], rank=1)
        + rows("b", [50, 60], [20, 30], startup=7.5)
    ).sample(frac=1.0, random_state=0)  # order on disk must not matter
    figs = run_figures(timing, {"a": 2, "b": 5})
    assert figs["a"]["tail_samples_per_sec_mean"] == pytest.approx(250.0)
    assert figs["a"]["tail_mean_iter_p50_ms"] == pytest.approx(6.5)
    assert figs["a"]["last_step"] == 40 and figs["a"]["windows"] == 4
    assert figs["b"]["tail_samples_per_sec_mean"] == pytest.approx(55.0)  # fewer windows than n
    assert figs["b"]["startup_s"] == 7.5
