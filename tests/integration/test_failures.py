"""A trial that fails inside its workers: the sweep goes on, the manifest says why, exit 1."""

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.integration.helpers import run_tune

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def test_a_failed_run_is_recorded_with_its_reason_and_the_sweep_goes_on(tmp_path):
    root = tmp_path / "out"
    # 32 utterances over 2 workers give 16 each: micro_batch 64 can never be filled.
    out = run_tune("smoke", root, "micro_batch=[64,4]", "max_steps=10")
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False).set_index(
        "micro_batch"
    )
    assert manifest.loc[64, "status"] == "failed" and manifest.loc[4, "status"] == "ok"
    assert "gives no full batch of 64 per worker" in manifest.loc[64, "failure_reason"]
    assert float(manifest.loc[64, "duration_sec"]) > 0
    assert json.loads((root / "best_config.json").read_text())["swept"] == {"micro_batch": 4}
    assert "1/2 runs ok" in out.stdout
