"""The CPU strategies space: DDP and DeepSpeed ZeRO 0-3 through Ray Train on gloo, tiny models,
the generated corpus. ZeRO changes where state lives, not the maths: the stages must agree."""

import math
from pathlib import Path

import pandas as pd
import pytest

from tests.integration.helpers import run_tune

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("strategies") / "out"
    out = run_tune("cpu_strategies", root, "max_steps=10", timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return pd.read_csv(root / "run_manifest.tsv", sep="\t"), pd.read_parquet(
        root / "timing.parquet"
    )


def test_every_strategy_completes_with_what_it_asked_for(sweep):
    manifest, _ = sweep
    assert list(manifest["status"]) == ["ok"] * 5
    assert list(zip(manifest["strategy_effective"], manifest["zero_stage"], strict=True)) == [
        ("ddp", 0),
        ("deepspeed", 0),
        ("deepspeed", 1),
        ("deepspeed", 2),
        ("deepspeed", 3),
    ]
    assert set(manifest["precision"]) == {"auto"} and set(manifest["precision_effective"]) == {
        "fp32"
    }
    assert (manifest["last_step"] == 10).all() and (manifest["tail_samples_per_sec_mean"] > 0).all()


def test_zero_stages_train_the_same_model(sweep):
    _, timing = sweep
    loss = timing.pivot(index="window", columns="run", values="loss")
    assert loss.map(math.isfinite).all().all()
    ds = [c for c in loss.columns if "_ds_" in c]
    for run in ds[1:]:
        assert (loss[run] - loss[ds[0]]).abs().max() < 1e-4, run
    ddp = next(c for c in loss.columns if "_ddp_" in c)
    assert abs(loss.loc[0, ddp] - loss.loc[0, ds[0]]) < 1e-3
