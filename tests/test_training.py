"""Training building blocks without Ray: the lr schedule, retrieval metrics, checkpoint
completeness, the resume scan, resharding and a checkpoint's reported times, the overhead
shares, the resumable data position, the training config keys, the
platform.train plan and its bad input, and the learnable corpus."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.cli import run_module
from trainables.checkpoint.files import best_checkpoint, find_resume_checkpoint, is_complete
from trainables.config import ConfigError, TrialConfig
from trainables.data.loader import build_loader
from trainables.engine import lr_factor
from trainables.validation import retrieval_metrics


def test_lr_schedule_warms_up_linearly_then_follows_the_cosine_to_its_floor():
    cfg = TrialConfig(lr_schedule="cosine", warmup_steps=10, max_steps=110, min_lr_ratio=0.1)
    assert [lr_factor(s, cfg) for s in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    assert lr_factor(10, cfg) == pytest.approx(1.0)
    assert lr_factor(60, cfg) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way down the cosine
    assert lr_factor(110, cfg) == pytest.approx(0.1) and lr_factor(500, cfg) == pytest.approx(0.1)
    constant = TrialConfig(warmup_steps=4, max_steps=20)
    assert [lr_factor(s, constant) for s in (0, 3, 4, 19)] == pytest.approx([0.25, 1, 1, 1])


def test_retrieval_metrics_count_ranks_both_ways_and_match_the_loss_by_hand():
    torch.manual_seed(0)
    speech = F.normalize(torch.randn(8, 4), dim=-1)
    assert retrieval_metrics(speech, speech, 10.0)["val_mean_r1"] == 1.0  # each pair is best
    text = speech.clone()
    text[[0, 1]] = text[[1, 0]]  # utterances 0 and 1 now have each other's transcript
    m = retrieval_metrics(speech, text, 10.0)
    assert m["val_s2t_r1"] == pytest.approx(6 / 8) and m["val_t2s_r1"] == pytest.approx(6 / 8)
    assert m["val_items"] == 8 and m["val_chance_r1"] == pytest.approx(1 / 8)
    sims = 10.0 * speech @ text.T
    labels = torch.arange(8)
    by_hand = (F.cross_entropy(sims, labels) + F.cross_entropy(sims.T, labels)) / 2
    assert m["val_loss"] == pytest.approx(float(by_hand), rel=1e-6)
    assert m["val_s2t_r5"] >= m["val_s2t_r1"]


def _checkpoint(folder, step, world=2, score=None, drop=None, cut=None):
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(
        json.dumps({"step": step, "world_size": world, "score": score})
    )
    for rank in range(world):
        (folder / f"rng-rank{rank}.pt").write_bytes(b"x" * 10)
        files = {f"rng-rank{rank}.pt": 10}
        if rank != drop:
            (folder / f"done-rank{rank}.json").write_text(json.dumps({"files": files}))
    if cut:
        (folder / cut).write_bytes(b"x" * 3)  # shorter than its done file says


def test_resume_takes_the_newest_complete_checkpoint_and_names_the_ones_it_skips(tmp_path):
    _checkpoint(tmp_path / "checkpoint_step0000010", 10, score=0.5)
    _checkpoint(tmp_path / "checkpoint_step0000020", 20, score=0.4)
    _checkpoint(tmp_path / "checkpoint_step0000030", 30, drop=1)
    _checkpoint(tmp_path / "checkpoint_step0000040", 40, cut="rng-rank0.pt")
    (tmp_path / "checkpoint_step0000050").mkdir()  # a save that never got to meta.json
    assert is_complete(tmp_path / "checkpoint_step0000020") == (True, "")
    folder, skipped = find_resume_checkpoint(tmp_path)
    assert folder.name == "checkpoint_step0000020"
    assert skipped == [
        "skipped checkpoint_step0000050: incomplete (meta.json missing or unreadable)",
        "skipped checkpoint_step0000040: incomplete (rank 0's rng-rank0.pt is missing or cut short)",
        "skipped checkpoint_step0000030: incomplete (rank 1's part is missing (done-rank1.json))",
    ]
    assert find_resume_checkpoint(tmp_path / "none") == (None, [])
    best, score = best_checkpoint(tmp_path, "max")
    assert best.endswith("checkpoint_step0000010") and score == 0.5
    assert best_checkpoint(tmp_path, "min")[0].endswith("checkpoint_step0000020")


@pytest.mark.parametrize("bucketing", [False, True])
def test_a_resumed_loader_continues_the_same_sample_sequence(prepared_corpus, bucketing):
    manifest, _ = prepared_corpus
    cfg = TrialConfig(
        dataset="manifest",
        manifest_path=str(manifest),
        micro_batch=2,
        model_size="tiny",
        length_bucketing=bucketing,
        length_bucketing_pool=2,
        seed=3,
    )

    def ids(batches, n):
        return [batches.__next__()["input_ids"][:, 1].tolist() for _ in range(n)]

    loader = build_loader(cfg, rank=1, world_size=2, pin_memory=False)
    from trainables.data.loader import EpochIterator

    whole = EpochIterator(loader, cfg.micro_batch).start()
    expected = ids(whole, 7)  # 3 batches per epoch: crosses two epoch boundaries
    assert whole.position == {"epoch": 2, "offset": 1}
    for epoch, offset, skip in ((0, 2, 2), (1, 1, 4)):
        again = build_loader(cfg, rank=1, world_size=2, pin_memory=False)
        resumed = EpochIterator(again, cfg.micro_batch)
        assert ids(resumed.start(epoch, offset), 7 - skip) == expected[skip:]


@pytest.mark.parametrize(
    "values, message",
    [
        ({"val_every": 7, "log_every": 5, "max_steps": 20}, "val_every: 7 is not a multiple"),
        ({"checkpoint_every": 12, "log_every": 5, "max_steps": 20}, "set checkpoint_every=10"),
        ({"val_every": 5, "log_every": 5, "max_steps": 20}, "validation needs a held-out split"),
        ({"val_speakers": 2}, "validation reads a manifest"),
        ({"export_model": "best"}, "export_model: best needs validation and checkpoints"),
        ({"lr_schedule": "cosine", "warmup_steps": 30, "max_steps": 30}, "leaves no step"),
        ({"grad_clip": -1.0}, "grad_clip: must be >= 0"),
        ({"max_failures": -2}, "max_failures: must be >= -1"),
        ({"best_metric": "val_r1"}, "best_metric: expected one of"),
    ],
)
def test_training_keys_are_validated(values, message):
    with pytest.raises(ConfigError, match=message):
        TrialConfig(**values)


def test_train_plan_turns_training_on_only_where_the_user_did_not_set_it():
    from platform.train import build_parser, plan

    args = build_parser().parse_args(
        ["--space", "train_smoke", "--set", "max_steps=100", "--set", "checkpoint_every=50"]
    )
    space, runs = plan(args)
    cfg = runs[0].config
    assert len(runs) == 1 and runs[0].name == "train_z0_mb16_nw0_pf2_r1"
    assert cfg.checkpoint_every == 50  # the user's
    assert (cfg.val_every, cfg.max_failures, cfg.lr_schedule) == (20, 3, "cosine")
    assert cfg.warmup_steps == 5 and cfg.export_model == "best"


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "pass --config OUTPUT_ROOT/best_config.json or --space NAME"),
        (["--config", "/nonexistent/best_config.json"], "not a best_config.json"),
        (["--space", "smoke"], "micro_batch is swept; pin it with --set"),
        (["--space", "train_smoke", "--resume"], "holds no sweep (run_manifest.tsv is missing)"),
        (["--space", "train_smoke", "--set", "val_every=3"], "val_every: 3 is not a multiple"),
    ],
)
def test_train_cli_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    done = run_module("platform.train", *args, "--output-root", tmp_path / "out")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("platform.train: error")
    assert not (tmp_path / "out").exists()


def test_the_learnable_corpus_spells_each_word_with_its_own_tones(tmp_path):
    import soundfile as sf

    from data_prep import synth

    made = synth.make_corpus(tmp_path / "a", speakers=2, chapters=2, utts=16, mode="learnable")
    again = synth.make_corpus(
        tmp_path / "b", speakers=2, chapters=2, utts=16, mode="learnable", workers=1
    )
    assert [u.transcript for u in made] == [u.transcript for u in again]  # any worker count
    assert made[5].path.read_bytes() == again[5].path.read_bytes()
    utt = made[0]
    audio, rate = sf.read(utt.path)
    spectrum = np.abs(np.fft.rfft(audio))
    freqs = np.fft.rfftfreq(len(audio), 1 / rate)

    def power_near(tones):  # within 8 % (speaker pitch is within 5 %)
        return np.mean([spectrum[np.abs(freqs - f) < 0.08 * f].max() for f in tones])

    words = set(utt.transcript.split())
    own = np.concatenate([synth.word_pattern(w) for w in words])
    others = [w for w in synth.WORDS if w not in words]
    foreign = np.concatenate([synth.word_pattern(w) for w in others[:10]])
    foreign = foreign[np.min(np.abs(foreign[:, None] - own[None]) / own[None], axis=1) > 0.2]
    assert power_near(own) > 5 * power_near(foreign)


def test_epochs_become_max_steps_from_the_training_split(prepared_corpus, capsys):
    from platform.spaces.expand import expand_runs
    from platform.spaces.space import SearchSpace
    from platform.train import epochs_to_steps

    manifest, made = prepared_corpus  # 12 utterances of 2 speakers
    space = SearchSpace(
        name="t",
        fixed={
            "dataset": "manifest",
            "manifest_path": str(manifest),
            "micro_batch": 2,
            "train_workers": 1,
            "epochs": 3,
            "log_every": 1,
        },
    )
    (run,) = epochs_to_steps(expand_runs(space, prefix="train"))
    assert run.config.max_steps == 3 * (12 // 2)
    # Said on the console, with which of the two keys won.
    assert "epochs 3 x 6 steps = max_steps 18 (epochs wins over max_steps 30)" in (
        capsys.readouterr().out
    )
    held_out = SearchSpace(name="t", fixed={**space.fixed, "val_speakers": 1})
    (run,) = epochs_to_steps(expand_runs(held_out, prefix="train"))
    assert run.config.max_steps == 3 * (6 // 2)  # one of the two speakers is validation's


def test_a_dcp_checkpoint_reshards_to_another_world_size_and_deepspeeds_does_not(tmp_path):
    from trainables.checkpoint.files import check_shape

    shape = dict(world_size=2, micro_batch=4, grad_accum_steps=1, zero_stage=0, seed=0)
    (tmp_path / "dcp-1a2b").mkdir()
    meta = {**shape, "strategy": "fsdp2", "dcp_dir": "dcp-1a2b"}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    assert check_shape(meta, {**shape, "strategy": "fsdp2"}, tmp_path) == ""
    one = {**shape, "world_size": 1, "strategy": "fsdp2"}
    assert check_shape(meta, one, tmp_path) == "resharded from 2 ranks to 1"
    with pytest.raises(ValueError, match=r"micro_batch 4 \(now 8\)"):
        check_shape(meta, {**one, "micro_batch": 8}, tmp_path)
    ds = {**meta, "strategy": "deepspeed"}
    with pytest.raises(ValueError, match=r"world_size 2 \(now 1\)"):
        check_shape(ds, {**one, "strategy": "deepspeed"}, tmp_path)


def test_a_complete_checkpoint_reports_its_slowest_ranks_times_and_all_bytes(tmp_path):
    from trainables.checkpoint.files import finish_part
    from trainables.checkpoint.state import registered_fields

    folder = tmp_path / "checkpoint_step0000200"
    folder.mkdir()
    (folder / "meta.json").write_text(json.dumps({"step": 200, "world_size": 2, "score": None}))
    for rank, (save_s, block_s) in enumerate([(3.0, 0.02), (4.0, 0.05)]):
        (folder / f"__{rank}_0.distcp").write_bytes(b"x" * (100 + rank))
        finish_part(folder, rank, save_s=save_s, block_s=block_s, wait_s=0.0)
    assert is_complete(folder) == (True, "")
    meta = json.loads((folder / "meta.json").read_text())
    fields = registered_fields(folder, meta, worst=-1.0)
    assert fields["checkpoint_step"] == 200 and fields["checkpoint_score"] == -1.0
    assert (fields["checkpoint_save_s"], fields["checkpoint_block_s"]) == (4.0, 0.05)
    # rank 0 owns meta.json too; each rank its own shard file and nothing of the other's
    assert fields["checkpoint_size_bytes"] == 100 + 101 + len((folder / "meta.json").read_bytes())
    assert not list(folder.parent.glob(".*tmp"))  # the done files were renamed into place


def test_the_overhead_shares_are_held_seconds_over_seconds_in_steps():
    from platform.record.recorder import _overheads

    status: dict = {}
    window = {"steps_in_window": 20, "iter_ms_mean": 100.0}  # 2 s of steps each
    _overheads(status, {**window, "step": 20})
    _overheads(status, {**window, "step": 40, "val_step": 40, "val_s": 0.5})
    registered = {"checkpoint_step": 40, "checkpoint_block_s": 0.04, "checkpoint_wait_s": 0.0}
    _overheads(status, {**window, "step": 60, **registered})
    overtaken = [{"checkpoint_step": 60, "checkpoint_block_s": 0.02}]  # deleted, still held
    last = {"checkpoint_step": 80, "checkpoint_wait_s": 3.0, "checkpoints_superseded": overtaken}
    _overheads(status, {**window, "step": 80, **last})
    assert status["ckpt_overhead_share"] == pytest.approx(0.06 / 8)
    assert status["val_overhead_share"] == pytest.approx(0.5 / 8)
    assert status["ckpt_end_wait_s"] == 3.0


def test_the_stager_copies_into_the_same_host_buffers_at_every_save():
    from trainables.checkpoint.asynchronous import kept_open, make_stager

    stager = make_stager(torch.device("cpu"), pinned=True, shared=True)  # CPU: never pinned
    handed = kept_open(stager)
    state = {"model": {"w": torch.ones(3)}, "optimizer": {"param_groups": [{"betas": (0.9, 1)}]}}
    first = handed.stage(state)
    assert torch.equal(first["model"]["w"], torch.ones(3)) and first["model"]["w"].is_shared()
    state["model"]["w"].mul_(5)  # training goes on: the staged copy keeps the old values
    assert torch.equal(first["model"]["w"], torch.ones(3))
    handed.close()  # what async_save may do when its upload is done: the buffers stay
    second = handed.stage(state)
    assert torch.equal(second["model"]["w"], torch.full((3,), 5.0))
    assert second["model"]["w"].data_ptr() == first["model"]["w"].data_ptr()  # reused
    assert second["optimizer"]["param_groups"][0]["betas"] == (0.9, 1)
    stager.close()
    assert stager._buffers is None


def test_the_host_buffers_are_made_ahead_and_the_first_save_copies_into_them():
    from trainables.checkpoint.asynchronous import make_stager

    stager = make_stager(torch.device("cpu"), pinned=True, shared=True)
    state = {"model": {"w": torch.ones(3)}, "optimizer": {"state": {"w": {"step": torch.ones(())}}}}
    stager.prepare(state)
    made = stager._buffers["model"]["w"]
    assert made.is_shared() and made.data_ptr() != state["model"]["w"].data_ptr()
    state["model"]["w"].mul_(3)  # training went on after they were made: the save copies now
    staged = stager.stage(state)
    assert staged["model"]["w"].data_ptr() == made.data_ptr()
    assert torch.equal(staged["model"]["w"], torch.full((3,), 3.0))
    stager.prepare(state)  # once per run
    assert stager._buffers["model"]["w"].data_ptr() == made.data_ptr()
    stager.close()


def test_the_writer_makes_the_buffers_before_the_first_step_and_the_steps_are_unchanged():
    """Before the first optimizer step DCP's state dict makes the optimizer's state with a step
    of its own (lr 0, but Adam's step count moves): the writer drops that state again, so the
    run's steps are bit-identical to a run without it."""
    import copy
    from types import SimpleNamespace

    from trainables.checkpoint.files import dcp_state
    from trainables.checkpoint.state import CheckpointWriter

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    twin = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    twin_optimizer = torch.optim.AdamW(twin.parameters(), lr=0.05, weight_decay=0.1)
    engine = SimpleNamespace(kind="ddp", bare=model, optimizer=optimizer, effective={})
    cfg = TrialConfig(model_size="tiny", checkpoint_every=10, checkpoint_async=False)
    writer = CheckpointWriter(cfg, engine, rank=0, world_size=1, device=torch.device("cpu"))
    assert writer.mode == "sync" and writer.prepare() is False and writer._stager is None
    writer.mode = "thread"  # what an asynchronous writer does before the first step:
    assert writer.prepare() is True
    buffers = writer._stager._buffers["optimizer"]["state"]
    assert {"step", "exp_avg", "exp_avg_sq"} <= set(next(iter(buffers.values())))
    assert not optimizer.state and all(p.grad is None for p in model.parameters())
    x = torch.randn(16, 4)
    for net, opt in ((model, optimizer), (twin, twin_optimizer)):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            net(x).pow(2).mean().backward()
            opt.step()
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters(), strict=True)
    )
    assert int(next(iter(optimizer.state.values()))["step"]) == 3
    first = writer._stager._buffers["model"]["0.weight"].data_ptr()
    staged = writer._stager.stage(dcp_state(engine))  # the save copies into them
    assert staged["model"]["0.weight"].data_ptr() == first
    assert torch.equal(staged["model"]["0.weight"], model[0].weight.detach())
    writer.close()
