"""batching duration (issue 56): whole utterances, each rank's micro-batch filled to a budget of
padded audio from one duration bin (trainables/data/durations.py, loader.DurationBatchSampler).
A batch never exceeds its budget nor its padding bound, every utterance is trained on once per
epoch across the ranks, the ranks take as many steps, a resumed epoch gives the same remaining
batches, bad keys are one line, the loss over uneven ranks is the single-process loss, and the
window counts what each step held."""

import math
import re
import socket

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from tests import _gloo_loss_worker
from tests._forked import start
from tests.test_tune_cli import tune
from trainables.config import ConfigError, TrialConfig
from trainables.data.crops import crop_lengths, crop_settings
from trainables.data.durations import (
    FRAME,
    batch_shapes,
    duration_bins,
    epoch_steps,
    steps_per_epoch,
)
from trainables.data.loader import (
    DurationBatchSampler,
    EpochIterator,
    EpochsBatchSampler,
    collate_for,
)
from trainables.model.stage1 import contrastive_loss

RATE = 16_000


def duration_config(**values) -> TrialConfig:
    values = {"batch_audio_s": 12.0, "text_tokens": 8, **values}
    return TrialConfig(dataset="manifest", batching="duration", **values)


def corpus_lengths(n: int = 301, seed: int = 0, low_s: float = 0.4, high_s: float = 6.0):
    """Utterance lengths in samples, some shorter than min_audio_s, many longer than max."""
    return np.random.default_rng(seed).integers(int(low_s * RATE), int(high_s * RATE), size=n)


class Utterances(Dataset):
    """Items of given lengths (audio, its valid length, a few token ids), as ManifestDataset
    gives them, without files."""

    def __init__(self, lengths: np.ndarray):
        self.lengths = lengths

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        n = int(self.lengths[i])
        return {
            "audio": torch.full((n,), float(i)),
            "audio_len": n,
            "input_ids": torch.tensor([1, 3 + i % 7, 2]),
        }


def loader_of(cfg: TrialConfig, lengths: np.ndarray, rank: int, world: int) -> DataLoader:
    sampler = DurationBatchSampler(
        lengths, bins=duration_bins(cfg), world_size=world, rank=rank, seed=cfg.seed
    )
    return DataLoader(
        Utterances(lengths),
        batch_sampler=EpochsBatchSampler(sampler),
        collate_fn=collate_for(cfg, pad_id=0),
    )


@pytest.mark.parametrize("pad, budget", [(0.1, 12.0), (0.25, 7.0), (0.05, 40.0)])
def test_a_batch_never_exceeds_its_budget_of_padded_audio_nor_its_padding_bound(pad, budget):
    """The budget holds for padded audio (rows x the bin's length: what the GPU computes, so
    the real audio too); the bound padded <= (1 + batch_max_pad) x real for every batch whose
    rows are at least min_audio_s (shorter ones pad to the shortest bin); the collate pads to
    the bin, with a mask, and transcripts to text_tokens."""
    cfg = duration_config(batch_max_pad=pad, batch_audio_s=budget)
    bins = duration_bins(cfg)
    edges = np.asarray(bins.edges)
    assert edges[0] <= RATE * cfg.min_audio_s < edges[1] and edges[-1] == 3 * RATE
    assert np.all(edges % FRAME == 0) and np.all(edges[1:] / edges[:-1] <= 1 + pad + 1e-9)
    lengths = crop_lengths(corpus_lengths(), crop_settings(cfg))
    assert lengths.max() == 3 * RATE  # longer utterances give a max_audio_s window
    for world in (1, 2, 3):
        for epoch in range(3):
            for step in epoch_steps(lengths, bins, world, np.random.default_rng([0, epoch])):
                for batch in step:
                    real = lengths[batch]
                    padded = len(batch) * bins(int(real.max()))
                    assert padded <= bins.budget
                    if real.min() >= cfg.min_audio_s * RATE:
                        assert padded <= (1 + pad) * real.sum()
    it = EpochIterator(loader_of(cfg, lengths, rank=0, world=2), 1).start()
    for _ in range(it.batches_per_epoch):
        batch = next(it)
        rows, width = batch["audio"].shape
        assert width in bins.edges and rows * width <= bins.budget
        items = batch["audio"][:, 0].long().numpy()  # item i's audio is all i
        assert batch["audio_mask"].sum(1).tolist() == lengths[items].tolist()
        assert batch["input_ids"].shape[1] == 8


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_utterance_once_per_epoch_across_ranks_with_equal_steps(world):
    cfg = duration_config(seed=7)
    lengths = crop_lengths(corpus_lengths(n=157, seed=world), crop_settings(cfg))
    bins = duration_bins(cfg)
    samplers = [
        DurationBatchSampler(lengths, bins=bins, world_size=world, rank=r, seed=7)
        for r in range(world)
    ]
    epochs = []
    for epoch in range(3):
        per_rank = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
            per_rank.append(list(sampler))
        steps = {len(batches) for batches in per_rank}
        assert steps == {len(samplers[0])} == {steps_per_epoch(lengths, bins, world)}
        seen = sorted(i for batches in per_rank for batch in batches for i in batch)
        assert seen == list(range(len(lengths)))  # every utterance once, none left out
        shapes = set(batch_shapes(lengths, bins, world))
        for batches in per_rank:
            assert all(batch for batch in batches)  # no rank is ever given an empty batch
            assert {(len(b), bins(int(lengths[b].max()))) for b in batches} <= shapes
        epochs.append(per_rank)
        # The facts every rank knows of each step without a collective: each rank's rows.
        for index in range(len(per_rank[0])):
            facts = samplers[0].step(epoch, index)
            assert facts.rows == tuple(len(batches[index]) for batches in per_rank)
            every = [i for batches in per_rank for i in batches[index]]
            assert facts.audio_samples == int(lengths[every].sum())
    again = DurationBatchSampler(lengths, bins=bins, world_size=world, rank=world - 1, seed=7)
    again.set_epoch(2)
    assert list(again) == epochs[2][world - 1]  # deterministic per seed and epoch
    assert epochs[0] != epochs[1]  # reshuffled per epoch


def test_a_budget_that_holds_one_utterance_leaves_fewer_than_world_out_and_says_so():
    """No bin can be split further (one utterance per rank-batch): the remainder that does not
    divide among the ranks is left out, fewer than world, drawn anew each epoch."""
    cfg = duration_config(batch_audio_s=3.0, max_audio_s=3.0)
    lengths = np.full(7, 3 * RATE)
    bins = duration_bins(cfg)
    assert steps_per_epoch(lengths, bins, 2) == 3
    left = []
    for epoch in range(4):
        steps = epoch_steps(lengths, bins, 2, np.random.default_rng([0, epoch]))
        seen = {int(i) for step in steps for batch in step for i in batch}
        assert len(seen) == 6
        left.append(next(iter(set(range(7)) - seen)))
    assert len(set(left)) > 1


def test_a_resumed_epoch_gives_the_same_remaining_batches_and_step_facts():
    cfg = duration_config(seed=3)
    lengths = crop_lengths(corpus_lengths(n=97, seed=5), crop_settings(cfg))

    def taken(it, n):
        out = []
        for _ in range(n):
            batch = next(it)
            out.append((batch["audio"][:, 0].tolist(), it.step, dict(it.position)))
        return out

    first = EpochIterator(loader_of(cfg, lengths, rank=1, world=2), 1).start()
    per_epoch = first.batches_per_epoch
    whole = taken(first, per_epoch + 4)  # into the second epoch
    cut = per_epoch - 2
    resumed = EpochIterator(loader_of(cfg, lengths, rank=1, world=2), 1)
    resumed.start(**{"epoch": whole[cut - 1][2]["epoch"], "offset": whole[cut - 1][2]["offset"]})
    assert taken(resumed, len(whole) - cut) == whole[cut:]


@pytest.mark.parametrize("pad", [0.021, 0.05, 0.2])
def test_bins_reach_min_audio_s_and_bound_the_padding_at_any_allowed_pad(pad):
    bins = duration_bins(duration_config(min_audio_s=1.0, max_audio_s=3.0, batch_max_pad=pad))
    edges = list(bins.edges)
    assert edges[0] <= RATE  # down to min_audio_s: a 1 s utterance pads at most to the next bin
    assert all(b / a <= 1 + pad + 1e-9 for a, b in zip(edges, edges[1:], strict=False))


@pytest.mark.parametrize(
    "values, key, fragment",
    [
        ({"batching": "tokens"}, "batching", "one of 'count', 'duration'"),
        ({"batching": "duration", "batch_audio_s": 60}, "batching", "set dataset=manifest"),
        ({"batching": "duration", "dataset": "manifest"}, "batch_audio_s", "is not set"),
        (
            {"batching": "duration", "dataset": "manifest", "batch_audio_s": 2.5},
            "batch_audio_s",
            "2.5 s is too small",
        ),
        (
            {"batching": "duration", "dataset": "manifest", "batch_audio_s": 60, "batch_max_pad": 0},
            "batch_max_pad",
            "within 0.0204-1",
        ),
        (
            {"batching": "duration", "dataset": "manifest", "batch_audio_s": 60, **{
                "crop_buckets_s": "1,2"}},
            "batching",
            "set crop_buckets_s=''",
        ),
        (
            {"batching": "duration", "dataset": "manifest", "batch_audio_s": 60, **{
                "crop_policy": "fixed_slice"}},
            "batching",
            "crop_policy=limit_longest",
        ),
    ],
)  # fmt: skip
def test_bad_duration_keys_fail_with_one_line_naming_the_key(values, key, fragment):
    with pytest.raises(ConfigError) as info:
        TrialConfig.from_dict(values)
    message = str(info.value)
    assert message.startswith(f"{key}:") and fragment in message and "\n" not in message


def test_a_bad_duration_key_exits_2_with_one_line_before_ray(tmp_path):
    out = tune(
        "--space", "smoke", "--output-root", tmp_path / "out", "--dry-run",
        "--set", "batching=duration", "--set", "batch_audio_s=2", probe=True,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "batch_audio_s: 2 s is too small" in lines[0], lines
    assert not (tmp_path / "out").exists()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("scope", ["global", "local"])
def test_the_uneven_all_gather_gives_the_single_process_loss(scope):
    """Three gloo ranks holding 2, 5 and 1 rows: the mean of their losses (what DDP's average
    optimises) is the single-process loss over all 8 rows (global: every row against all 8;
    local: each against its own rank's), and each rank's gradient is world x the reference
    gradient of its rows (DDP divides by world): every row weighs the same."""
    torch.manual_seed(0)
    rows = (2, 5, 1)
    speech = F.normalize(torch.randn(sum(rows), 16), dim=-1)
    text = F.normalize(torch.randn(sum(rows), 16), dim=-1)
    cuts = np.cumsum((0, *rows))
    ref_s, ref_t = speech.clone().requires_grad_(True), text.clone().requires_grad_(True)
    scale = torch.tensor([10.0])
    if scope == "global":
        reference = contrastive_loss(ref_s, ref_t, scale, scope="local")
    else:  # the mean over every row of each rank's own-batch losses
        per_row = [
            contrastive_loss(ref_s[a:b], ref_t[a:b], scale, scope="local") * (b - a)
            for a, b in zip(cuts[:-1], cuts[1:], strict=True)
        ]
        reference = sum(per_row) / sum(rows)
    reference.backward()
    out = mp.Manager().dict()
    args = (len(rows), _free_port(), speech, text, rows, scope, out)
    start(_gloo_loss_worker.run_uneven, args, nprocs=len(rows))
    losses = [out[r][0] for r in range(len(rows))]
    assert sum(losses) / len(rows) == pytest.approx(reference.item(), rel=1e-5)
    for r, (a, b) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)):
        assert torch.allclose(out[r][1], len(rows) * ref_s.grad[a:b], atol=1e-6)
        assert torch.allclose(out[r][2], len(rows) * ref_t.grad[a:b], atol=1e-6)


def test_equal_rows_give_the_loss_of_the_count_path():
    torch.manual_seed(1)
    s, t = F.normalize(torch.randn(6, 8), dim=-1), F.normalize(torch.randn(6, 8), dim=-1)
    scale = torch.tensor([5.0])
    plain = contrastive_loss(s, t, scale, scope="global")
    assert contrastive_loss(s, t, scale, scope="global", rows=(6,)).item() == pytest.approx(
        plain.item(), rel=1e-6
    )
    with pytest.raises(ValueError, match="holds 6 rows, its step's plan says 5"):
        contrastive_loss(s, t, scale, rows=(5,))


def test_the_window_counts_what_every_rank_held_and_the_mfu_by_audio_seconds():
    """samples/s and audio s/s from the steps' facts (every rank's), not micro_batch x world;
    FLOPs from the per-sample, per-second and per-squared-second terms."""
    from trainables.data.durations import StepFacts
    from trainables.observe.window_metrics import Window, WindowMetrics

    class Worker:
        world_size, rank, node, node_id, start_ts = 2, 0, "n", "id", 0.0
        device = torch.device("cpu")

    class Engine:
        flops_per_sample, flops_terms, peak_tflops = 1.0, (100.0, 10.0, 1.0), 1.0
        effective: dict = {}

        def lr(self):
            return 1e-4

    window = Window.on(torch.device("cpu"))
    steps = [StepFacts((3, 4), 7 * 2 * RATE, 7 * 4.0), StepFacts((6, 6), 12 * RATE, 12 * 1.0)]
    for facts in steps:
        window.timer.add(data_ms=1.0, step_ms=100.0, iter_ms=100.0)  # two steps: 0.2 s
        window.add_step(facts)
    window.audio_valid += 1  # rank 0's mask count: only the padding ratio reads it
    cfg = TrialConfig(dataset="manifest", batching="duration", batch_audio_s=60.0, micro_batch=99)
    built = WindowMetrics(cfg, Worker(), Engine(), {}, None)
    assert built.step_batch(window) == 19 / 2  # not micro_batch 99 x 2 ranks
    summary = window.timer.summary(built.step_batch(window))
    assert summary["samples_per_s"] == pytest.approx(19 / 0.2)
    metrics = built._throughput(summary, window)
    assert metrics["audio_s_per_s"] == pytest.approx((14 + 12) / 0.2)
    flops = 100.0 * 19 + 10.0 * 26 + 1.0 * (28 + 12)
    assert metrics["flops_per_sample"] == pytest.approx(flops / 19)
    assert metrics["model_tflops_per_s"] == pytest.approx(flops / 0.2 / 1e12)


def test_flops_terms_fit_the_counted_flops_between_their_lengths():
    from trainables.engine.mfu import flops_per_sample, flops_terms
    from trainables.engine.shapes import shape_batch
    from trainables.model.stage1 import build_model

    torch.manual_seed(0)
    cfg = duration_config(text_tokens=16)
    model = build_model("tiny", 16)
    cpu = torch.device("cpu")
    a, b, c = flops_terms(cfg, model, cpu, "fp32", {}, None)
    for seconds in (1.3, 2.6):
        counted = flops_per_sample(model, shape_batch(2, int(seconds * RATE), 16, cpu))
        assert a + b * seconds + c * seconds**2 == pytest.approx(counted, rel=0.01)
    assert c > 0 and math.isfinite(a)


def test_the_loop_trains_duration_batches_on_two_ranks_and_counts_their_samples(
    tmp_path, prepared_corpus
):
    """The real loop on two gloo ranks: the loss gathers the ranks' uneven batches, and each
    window's global batch and samples/s are what its steps held (the plan's), not micro_batch
    x world."""
    from platform.spaces.preflight import train_crop_lengths

    manifest, _ = prepared_corpus
    config = dict(
        model_size="tiny", proj_dim=16, use_gpu=False, train_workers=2, micro_batch=64,
        text_tokens=8, telemetry=False, log_every=2, max_steps=4, stall_timeout_s=0,
        dataset="manifest", manifest_path=str(manifest), batching="duration",
        batch_audio_s=6.5, min_audio_s=1.0, max_audio_s=3.0, batch_max_pad=0.5,
    )  # fmt: skip
    out = mp.Manager().dict()
    start(_gloo_loss_worker.train, (2, _free_port(), config, str(tmp_path), out), nprocs=2)
    windows = out[0]
    cfg = TrialConfig.from_dict(config)
    sampler = DurationBatchSampler(
        train_crop_lengths(cfg, 0), bins=duration_bins(cfg), world_size=2, rank=0, seed=0
    )
    per_epoch = len(sampler)
    held = [sampler.step(i // per_epoch, i % per_epoch).samples for i in range(4)]
    assert [w["global_batch"] for w in windows] == [
        round(sum(held[:2]) / 2),
        round(sum(held[2:]) / 2),
    ]
    for w, pair in zip(windows, (held[:2], held[2:]), strict=True):
        assert w["samples_per_s"] == pytest.approx(sum(pair) / (2 * w["iter_ms_mean"] / 1e3))
        assert w["audio_s_per_s"] > 0 and math.isfinite(w["loss"])


def test_the_driver_counts_the_samplers_steps_and_refuses_a_corpus_too_small_for_the_ranks(
    prepared_corpus,
):
    """Before Ray: a corpus with fewer utterances than ranks is one line naming the fix; the
    epochs-to-steps count is the sampler's own."""
    from platform.errors import UsageError
    from platform.spaces.expand import RunSpec
    from platform.spaces.preflight import check_full_batches, train_crop_lengths
    from platform.train import epochs_to_steps

    manifest, _ = prepared_corpus
    values = dict(
        dataset="manifest", manifest_path=str(manifest), batching="duration", batch_audio_s=7.0
    )

    def run(**more) -> RunSpec:
        return RunSpec("r", "g", 1, TrialConfig(**values, **more), {})

    check_full_batches([run(train_workers=12)])  # 12 utterances: one each
    with pytest.raises(UsageError) as info:
        check_full_batches([run(train_workers=13)])
    assert "gives 12 training utterances, too few for one step of 13 workers" in str(info.value)
    cfg = run(train_workers=2).config
    per_epoch = len(
        DurationBatchSampler(
            train_crop_lengths(cfg, 0), bins=duration_bins(cfg), world_size=2, rank=0, seed=0
        )
    )
    (planned,) = epochs_to_steps([run(train_workers=2, epochs=3)])
    assert planned.config.max_steps == 3 * per_epoch


@pytest.mark.parametrize("scope", ["layers", "model"])
def test_the_compile_warm_up_compiles_the_corpus_shapes_and_the_steps_compile_nothing(scope):
    """With torch_compile (regional, as h200_fastest's, or the whole model) the warm-up compiles
    every (rows, bin) a micro-batch can have (the loader's compile_shapes, masked as the collate
    always masks); an epoch of real batches, padded audio and text, then compiles nothing more
    (the masks are built the same whether a batch pads anything: trainables/model/padding.py)."""
    import os

    import torch._dynamo
    import torch.distributed as dist
    from torch._dynamo.utils import counters

    from trainables.data.loader import compile_shapes
    from trainables.engine import build_engine

    torch._dynamo.reset()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        cfg = duration_config(
            model_size="tiny", proj_dim=16, use_gpu=False, torch_compile=True,
            compile_backend="aot_eager", compile_scope=scope, batch_audio_s=4.0,
            batch_max_pad=0.5, min_audio_s=1.4, max_audio_s=2.0,
        )  # fmt: skip
        lengths = crop_lengths(corpus_lengths(n=8, seed=2, high_s=3.0), crop_settings(cfg))
        loader = loader_of(cfg, lengths, rank=0, world=1)
        shapes = compile_shapes(cfg, loader)
        assert len(shapes) >= 2 and shapes == [
            (r, n, 8) for r, n in batch_shapes(lengths, duration_bins(cfg), 1)
        ]
        counters.clear()
        engine = build_engine(cfg, torch.device("cpu"))
        assert engine.warm_up(cfg, shapes).seconds > 0 and engine.effective["fallbacks"] == ""
        graphs = counters["stats"]["unique_graphs"]
        it = EpochIterator(loader, 1).start()
        for _ in range(it.batches_per_epoch):
            speech, text, scale = engine(next(it))
            loss = contrastive_loss(speech, text, scale, rows=it.step.rows)
            engine.backward(loss)
            engine.step()
        assert counters["stats"]["unique_graphs"] == graphs  # nothing compiled in the steps
    finally:
        dist.destroy_process_group()


def test_a_checkpoint_of_duration_batches_resumes_only_into_the_same_plan(tmp_path):
    """Its data position is a step of a plan the budget, the bins and the world size decide:
    another budget or world size is refused (no resharding of the position); a count run's
    checkpoint, without the keys, resumes as before."""
    from trainables.checkpoint.files import check_shape

    count = dict(world_size=2, micro_batch=8, grad_accum_steps=1, strategy="ddp", zero_stage=0)
    count["seed"] = 0
    duration = dict(count, batching="duration", batch_audio_s=60.0, batch_max_pad=0.1)
    duration.update(max_audio_s=3.0, min_audio_s=1.0)
    assert check_shape(count, dict(count), tmp_path) == ""
    assert check_shape(duration, dict(duration), tmp_path) == ""
    for now, said in (
        (dict(duration, batch_audio_s=30.0), "batch_audio_s 60.0 (now 30.0)"),
        (dict(duration, world_size=4), "world_size 2 (now 4)"),
        (count, "batching duration (now None)"),
    ):
        with pytest.raises(ValueError, match=re.escape(said)):
            check_shape(duration, now, tmp_path)


def test_a_duration_run_that_recompiles_is_told_its_own_fix():
    from platform.analysis.verdicts.cliffs import judge

    figs = {"tail_recompiles": 3, "cliff_windows": 2}
    duration = judge(figs, {"batching": "duration", "crop_buckets_s": ""})
    assert "batch_max_pad" in duration["try"] and "crop_buckets_s" not in duration["try"]
    assert "crop_buckets_s puts every batch" in judge(figs, {"crop_buckets_s": ""})["try"]
