"""The workload learns: on the learnable corpus, tiny models trained by the real loop (one gloo
rank, no Ray) bring the validation contrastive loss on held-out speakers well below chance
(ln of the split's size) and their recall@1 above chance, with the training loss falling. The
same check with the audio shuffled against its transcripts stays at chance: the test can tell a
model that learns from one that does not. The validation loss is the criterion because it is a
smooth figure: recall@1 over 160 held-out items counts a handful of hits, and varied from 3.5x
to 5x chance across seeds and dropout draws of the same learning run (shuffled: 1x, val loss
at ln 160 to 3 decimals)."""

import math
import os
import time

import pandas as pd
import pytest
import torch
import torch.distributed as dist

from tests.conftest import prepare_serial
from tests.test_model import free_port
from trainables.config import TrialConfig
from trainables.loop import WorkerContext, run_training

STEPS = 300


@pytest.fixture(scope="module")
def learnable(tmp_path_factory):
    from data_prep import synth

    root = tmp_path_factory.mktemp("learnable")
    synth.make_corpus(root / "raw", speakers=16, chapters=2, utts=40, seed=0, mode="learnable")
    return prepare_serial(root / "raw", root / "prepared")


def train(manifest) -> list[dict]:
    """300 steps of 32 utterances; 2 of the 16 speakers (160 utterances) held out."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    windows: list[dict] = []
    cfg = TrialConfig(
        model_size="tiny",
        proj_dim=64,
        use_gpu=False,
        train_workers=1,
        dataset="manifest",
        manifest_path=str(manifest),
        micro_batch=32,
        lr=3e-3,
        lr_schedule="cosine",
        warmup_steps=10,
        max_steps=STEPS,
        log_every=10,
        val_every=150,
        val_speakers=2,
        telemetry=False,
        stall_timeout_s=0,
    )
    try:
        run_training(
            cfg,
            WorkerContext(
                rank=0,
                world_size=1,
                device=torch.device("cpu"),
                report=lambda metrics, checkpoint=None: windows.append(metrics),
                start_ts=time.time(),
            ),
        )
    finally:
        dist.destroy_process_group()
    return windows


def learned(windows: list[dict]) -> bool:
    val = windows[-1]
    losses = [w["loss"] for w in windows]
    falling = sum(losses[-5:]) / 5 < 0.85 * sum(losses[:5]) / 5
    # 4.24-4.3 when it learns, 5.075 (= ln 160) at chance
    return falling and val["val_loss"] < math.log(val["val_items"]) - 0.4


def test_the_model_learns_and_not_with_shuffled_audio(learnable, tmp_path):
    windows = train(learnable)
    val = windows[-1]
    assert val["val_items"] == 160 and val["val_step"] == STEPS
    assert learned(windows), [(w["step"], round(w["loss"], 3)) for w in windows] + [val]
    assert val["val_mean_r1"] >= 2 * val["val_chance_r1"], val
    # The same corpus with every utterance given another one's transcript.
    df = pd.read_csv(learnable, sep="\t", keep_default_na=False)
    df["path"] = [str((learnable.parent / p).resolve()) for p in df["path"]]
    df["transcript"] = df["transcript"].sample(frac=1.0, random_state=0).to_numpy()
    shuffled = tmp_path / "shuffled.tsv"
    df.to_csv(shuffled, sep="\t", index=False)
    windows = train(shuffled)
    assert not learned(windows), windows[-1]
    assert windows[-1]["val_mean_r1"] < 3 * windows[-1]["val_chance_r1"]
