"""The stage-1 loop learns, and is reproducible: two repeats of one group with the same seed on
the smoke space's generated corpus (real files through the manifest reader)."""

from pathlib import Path

import pandas as pd
import pytest

from tests.integration.helpers import run_tune

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def two_repeats(tmp_path_factory):
    root = tmp_path_factory.mktemp("learn") / "out"
    out = run_tune(
        "smoke", root, "micro_batch=4", "repeats=2", "max_steps=100", "log_every=10", "lr=0.001"
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return pd.read_parquet(root / "timing.parquet").pivot(
        index="window", columns="run", values="loss"
    )


def test_loss_is_finite_and_falls_over_100_steps(two_repeats):
    for run, loss in two_repeats.items():
        assert loss.notna().all() and len(loss) == 10, run
        assert loss.iloc[-2:].mean() < 0.85 * loss.iloc[:2].mean(), loss.tolist()


def test_same_seed_gives_the_same_first_window_loss(two_repeats):
    r1, r2 = two_repeats.columns
    assert two_repeats.loc[0, r1] == two_repeats.loc[0, r2]
