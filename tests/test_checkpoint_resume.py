"""Checkpoints of the real loop on two gloo ranks without Ray: DeepSpeed ZeRO-1 (with gradient
accumulation) and ZeRO-3 (synchronous), FSDP2 with gradient accumulation
(torch.distributed.checkpoint, asynchronous: a writer process per rank) save their state (a
part from every rank). Rank 1 is killed with SIGKILL mid-run; a rerun resumes from the newest
complete checkpoint, skipping one whose asynchronous write the kill cut off, and ends exactly
where an uninterrupted run ends. FSDP2's DCP checkpoint of the two ranks loads into one. (DDP's
asynchronous DCP checkpoints, a kill and a resume under Ray Train:
tests/integration/test_train.py; FSDP2 trained with either fsdp_reshard_after_forward:
tests/test_strategies.py.)

The ranks are forked from a server that imported the training code once (tests/_forked.py):
each run still starts new processes, ~8 s sooner."""

import json
import shutil

import pytest
import torch
import torch.multiprocessing as mp

from tests import _forked, _gloo_loss_worker
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


def train(config: dict, run_dir, world: int = 2) -> list[dict]:
    out = mp.Manager().dict()
    args = (world, free_port(), config, str(run_dir), out)
    _forked.start(_gloo_loss_worker.train, args, nprocs=world)
    return out[0]


def exported(folder):
    from trainables.model.export import load_exported

    return load_exported(folder / "export")


def assert_same_model(a, b) -> None:
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


FSDP2 = {"strategy": "fsdp2", "export_model": "final"}


@pytest.mark.parametrize(
    "strategy",
    [
        {"strategy": "deepspeed", "zero_stage": 1, "grad_accum_steps": 2},
        {"strategy": "deepspeed", "zero_stage": 3},
        # The save of step 4 is still being written when rank 1 is killed at step 5: each save
        # waits 3 s before it writes, and the kill comes one step after that save started.
        {**FSDP2, "grad_accum_steps": 2, "inject_save_delay_s": 3.0},
    ],
    ids=["zero1-accum2", "zero3", "fsdp2-accum2-cut-mid-save"],
)
def test_resume_after_a_kill_ends_like_an_uninterrupted_run(tmp_path, strategy):
    # dataset synthetic: SyntheticSpeechText holds max_steps x batch items, so both runs get
    # the same dataset by fixing max_steps; the first is cut short by the kill.
    config = {**BASE, **strategy, "max_steps": 6, "checkpoint_every": 2, "lr_schedule": "cosine"}
    delayed = config.pop("inject_save_delay_s", 0.0)
    whole = train(config, tmp_path / "whole")
    assert [w["step"] for w in whole] == [2, 4, 6]
    # The same run, rank 1 killed with SIGKILL after step 5 (after the checkpoint of step 4) ...
    cut = {**config, "inject_kill_at_step": 5, "inject_error_rank": 1}
    if delayed:  # ... with the checkpoints' writes slowed: step 4's is cut off
        cut["inject_save_delay_s"] = delayed
    else:  # ... once step 4's write is done (rank 1's step 5 takes 3 s longer)
        cut.update(inject_sleep_at_step=5, inject_sleep_s=3.0, inject_sleep_rank=1)
    with pytest.raises(mp.ProcessExitedException, match="SIGKILL"):
        train(cut, tmp_path / "cut")
    folders = sorted(p.name for p in (tmp_path / "cut").glob("checkpoint_step*"))
    assert folders == ["checkpoint_step0000002", "checkpoint_step0000004"]
    meta = json.loads((tmp_path / "cut" / "checkpoint_step0000004" / "meta.json").read_text())
    assert meta["step"] == 4 and meta["world_size"] == 2
    complete = tmp_path / "cut" / folders[-1 if not delayed else 0]
    if strategy["strategy"] == "deepspeed":  # every rank saved its own shard
        shards = sorted(p.name for p in (complete / "ds").iterdir())
        assert any("zero_pp_rank_0_" in s for s in shards), shards
        assert any("zero_pp_rank_1_" in s for s in shards), shards
    else:  # torch.distributed.checkpoint: every rank wrote its part, rank 0 the metadata
        shards = {p.name for p in next(complete.glob("dcp-*")).iterdir()}
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= shards, shards
        done = json.loads((complete / "done-rank1.json").read_text())
        assert (
            any(f.endswith("/__1_0.distcp") for f in done["files"])
            and done["save_s"] >= done["block_s"] > 0
        )
    if delayed:  # no done file from the killed rank: never resumed from
        assert not (tmp_path / "cut" / folders[-1] / "done-rank1.json").exists()
    # ... and run again: it resumes from the newest complete checkpoint and ends with the
    # uninterrupted run's loss.
    resumed = train(config, tmp_path / "cut")
    start = 2 if delayed else 4
    assert [w["step"] for w in resumed] == list(range(start + 2, 7, 2))
    assert resumed[0]["resumed_from_step"] == start
    if delayed:
        assert "skipped checkpoint_step0000004: incomplete" in resumed[0]["resume_notes"]
    assert resumed[-1]["loss"] == pytest.approx(whole[-1]["loss"], rel=1e-6, abs=1e-7)
    assert resumed[-1]["lr"] == pytest.approx(whole[-1]["lr"])
    if strategy.get("export_model") != "final":
        return
    a, _ = exported(tmp_path / "whole")
    b, source = exported(tmp_path / "cut")
    assert source["strategy"] == strategy["strategy"]
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-6), name
    # Both ranks' rows are there (FSDP2: rank 1 holds the second half of every dim 0).
    for w in (b.speech_proj.weight, b.text_proj.weight):
        assert (w.abs().sum(dim=1) > 0).all()
    # The two ranks' last checkpoint (step 6) loads into one rank (DCP reshards): nothing is
    # left to train, and its export is the two ranks' final model, exactly.
    one = tmp_path / "one"
    one.mkdir()
    shutil.copytree(tmp_path / "whole" / "checkpoint_step0000006", one / "checkpoint_step0000006")
    assert train(config, one, world=1) == []
    c, _ = exported(one)
    assert_same_model(a, c)
