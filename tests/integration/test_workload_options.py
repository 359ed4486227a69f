"""Workload options through a real sweep: local checkpoints loaded inside the Ray workers,
torch.compile, every rank's timing windows, and length bucketing against plain batching."""

import pandas as pd
import pytest
from safetensors.torch import load_file, save_file

from tests.checkpoints import save_tiny_checkpoints
from tests.integration.helpers import run_tune

pytestmark = pytest.mark.integration
DROPPED = "feature_projection.projection.weight"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("options")
    speech, text = save_tiny_checkpoints(tmp / "ckpt", ["one two three four five six seven"])
    # Leave one weight out of the speech checkpoint: the run manifest must say the worker
    # loaded this folder and initialised that weight itself.
    weights = load_file(speech / "model.safetensors")
    save_file({k: v for k, v in weights.items() if k != DROPPED}, speech / "model.safetensors")
    root = tmp / "out"
    out = run_tune(
        "smoke",
        root,
        "micro_batch=4",
        "length_bucketing=[false, true]",
        "timing_ranks=all",
        "torch_compile=true",
        "compile_backend=aot_eager",
        f"speech_pretrained_path={speech}",
        f"text_pretrained_path={text}",
        "max_steps=20",
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False)
    return root, manifest, pd.read_parquet(root / "timing.parquet")


def test_runs_record_compile_and_the_checkpoint_they_loaded(sweep):
    root, manifest, _ = sweep
    assert list(manifest["status"]) == ["ok", "ok"]
    assert set(manifest["compile_effective"]) == {"aot_eager/default"}
    assert set(manifest["model_load_dtype_effective"]) == {"fp32"}
    for note in manifest["fallbacks"]:
        assert "speech: 1 weight(s) not in" in note and DROPPED in note
    # The text checkpoint brought a tokenizer, so the driver built none for the corpus.
    assert not list((root / "data").rglob("*.tokenizer-*.json"))


def test_every_rank_has_a_row_per_window_with_the_skew(sweep):
    _, manifest, timing = sweep
    for _, rows in timing.groupby("run"):
        assert sorted(rows["rank"].unique()) == [0, 1]
        per_rank = rows.groupby("rank")["window"].apply(sorted)
        assert per_rank[0] == per_rank[1] == [0, 1, 2, 3]
        assert (rows["samples_per_s"] > 0).all() and (rows["rank_skew"] >= 1).all()
        assert (rows.groupby("window")["rank_skew"].nunique() == 1).all()
    # Run figures still come from rank 0's windows only (tail: the last 3 windows).
    for run, tail in zip(manifest["run"], manifest["tail_samples_per_sec_mean"], strict=True):
        rank0 = timing[(timing["run"] == run) & (timing["rank"] == 0)].sort_values("window")
        # run_manifest.tsv holds 6 significant digits (.6g): up to 5e-6 relative off.
        assert tail == pytest.approx(rank0["samples_per_s"].tail(3).mean(), rel=1e-5)


def test_length_bucketing_cuts_padding(sweep):
    _, manifest, timing = sweep
    bucketed = manifest.loc[manifest["length_bucketing"].astype(str) == "True", "run"].item()
    plain = manifest.loc[manifest["length_bucketing"].astype(str) == "False", "run"].item()
    padding = timing.groupby("run")["padding_ratio"].mean()
    assert padding[bucketed] < 0.5 * padding[plain], padding.to_dict()
