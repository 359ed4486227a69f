"""Checkpoints of the real loop on two gloo ranks without Ray: DeepSpeed ZeRO-1 (with gradient
accumulation) and ZeRO-3, and FSDP2 with accumulation (torch.distributed.checkpoint),
save their state (a shard from every rank), and a rerun resumes from the newest complete
checkpoint and ends exactly where an uninterrupted run ends. (DDP's resume is
tested through platform.train in tests/integration/test_train.py.)"""

import json

import pytest
import torch
import torch.multiprocessing as mp

from tests import _gloo_loss_worker
from tests.test_model import free_port

BASE = dict(
    model_size="tiny",
    proj_dim=16,
    use_gpu=False,
    train_workers=2,
    micro_batch=2,
    text_tokens=8,
    audio_s=0.5,
    telemetry=False,
    log_every=2,
    lr=1e-3,
    warmup_steps=2,
    grad_clip=1.0,
    stall_timeout_s=0,
)


def train(config: dict, run_dir) -> list[dict]:
    out = mp.Manager().dict()
    mp.spawn(_gloo_loss_worker.train, args=(2, free_port(), config, str(run_dir), out), nprocs=2)
    return out[0]


@pytest.mark.parametrize(
    "strategy",
    [
        {"strategy": "deepspeed", "zero_stage": 1, "grad_accum_steps": 2},
        {"strategy": "deepspeed", "zero_stage": 3},
        {
            "strategy": "fsdp2",
            "fsdp_reshard_after_forward": True,
            "grad_accum_steps": 2,
            "export_model": "final",
        },
    ],
    ids=["zero1-accum2", "zero3", "fsdp2-accum2"],
)
def test_resume_from_a_checkpoint_ends_like_an_uninterrupted_run(tmp_path, strategy):
    # dataset synthetic: SyntheticSpeechText holds max_steps x batch items, so both runs get
    # the same dataset by fixing max_steps; the first stops early through inject_error.
    config = {**BASE, **strategy, "max_steps": 6, "checkpoint_every": 2, "lr_schedule": "cosine"}
    whole = train(config, tmp_path / "whole")
    assert [w["step"] for w in whole] == [2, 4, 6]
    # The same run, killed inside step 5 (after the checkpoint of step 4) ...
    with pytest.raises(mp.ProcessRaisedException, match="injected error at step 5"):
        train({**config, "inject_error_at_step": 5}, tmp_path / "cut")
    folders = sorted(p.name for p in (tmp_path / "cut").glob("checkpoint_step*"))
    assert folders == ["checkpoint_step0000002", "checkpoint_step0000004"]
    meta = json.loads((tmp_path / "cut" / "checkpoint_step0000004" / "meta.json").read_text())
    assert meta["step"] == 4 and meta["world_size"] == 2
    if strategy["strategy"] == "deepspeed":  # every rank saved its own shard
        shards = sorted(p.name for p in (tmp_path / "cut" / folders[-1] / "ds").iterdir())
        assert any("zero_pp_rank_0_" in s for s in shards), shards
        assert any("zero_pp_rank_1_" in s for s in shards), shards
    else:  # torch.distributed.checkpoint: every rank wrote its shards, rank 0 the metadata
        shards = sorted(p.name for p in (tmp_path / "cut" / folders[-1] / "dcp").iterdir())
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(shards), shards
    # ... and run again: it resumes from step 4 and ends with the uninterrupted run's loss.
    resumed = train(config, tmp_path / "cut")
    assert [w["step"] for w in resumed] == [6] and resumed[0]["resumed_from_step"] == 4
    assert resumed[0]["loss"] == pytest.approx(whole[-1]["loss"], rel=1e-6, abs=1e-7)
    assert resumed[0]["lr"] == pytest.approx(whole[-1]["lr"])
    if strategy.get("export_model") == "final":  # FSDP2: the shards gathered into one model
        from trainables.export import load_exported

        a, _ = load_exported(tmp_path / "whole" / "export")
        b, source = load_exported(tmp_path / "cut" / "export")
        assert source["strategy"] == "fsdp2"
        for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
            assert torch.allclose(x, y, rtol=1e-5, atol=1e-6), name
        # Both ranks' rows are there (rank 1 holds the second half of every dim 0).
        for w in (b.speech_proj.weight, b.text_proj.weight):
            assert (w.abs().sum(dim=1) > 0).all()
