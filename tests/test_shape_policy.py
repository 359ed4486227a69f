"""Issue 14's data and compile levers: the crop-bucket shape policy, one loader iterator across
epochs (no stall at an epoch boundary), the compile warm-up and the start-up clock."""

import time

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from trainables.config import ConfigError, TrialConfig
from trainables.data.loader import EpochIterator, ShapeBucketBatchSampler, build_loader
from trainables.data.manifest import crop_window

BUCKETS = (1.0, 1.5, 2.0, 2.5, 3.0)


def _crops(num_samples, *, buckets=(), seed=0):
    return (
        np.array(
            [
                crop_window(
                    int(n),
                    np.random.default_rng([seed, i]),
                    policy="limit_longest",
                    min_s=1.0,
                    max_s=3.0,
                    fixed_s=2.0,
                    buckets=buckets,
                )[2]
                for i, n in enumerate(num_samples)
            ]
        )
        / 16_000
    )


def test_bucketed_crops_keep_limit_longests_distribution_within_the_bucket_granularity():
    rng = np.random.default_rng(0)
    # LibriSpeech-like: most utterances longer than any window, some shorter than some.
    lengths = np.concatenate([rng.uniform(4, 20, 3000), rng.uniform(1.1, 3.0, 600)]) * 16_000
    plain, bucketed = _crops(lengths), _crops(lengths, buckets=BUCKETS)
    assert set(np.round(bucketed, 6)) == set(BUCKETS)  # every crop one of five shapes
    # Never longer than the utterance: a short one takes the longest bucket it fills.
    assert (bucketed * 16_000 <= lengths + 1).all()
    # The same distribution within the granularity (buckets 0.5 s apart): a drawn window moves
    # to the nearest bucket (at most 0.25 s), a short utterance down to the bucket it fills.
    qs = np.linspace(0.02, 0.98, 49)
    assert abs(bucketed.mean() - plain.mean()) < 0.04
    assert np.max(np.abs(np.quantile(bucketed, qs) - np.quantile(plain, qs))) <= 0.5
    long = np.full(4000, 10 * 16_000)
    plain, long_only = _crops(long), _crops(long, buckets=BUCKETS)
    assert abs(long_only.mean() - plain.mean()) < 0.01
    assert np.max(np.abs(np.quantile(long_only, qs) - np.quantile(plain, qs))) <= 0.25 + 1e-6
    # Nearest rounding of a uniform 1-3 s window: the ends get half the mass of the middle.
    share = [np.mean(np.isclose(long_only, b)) for b in BUCKETS]
    assert share == pytest.approx([0.125, 0.25, 0.25, 0.25, 0.125], abs=0.03)


def test_an_utterance_shorter_than_every_bucket_is_padded_to_the_shortest():
    start, frames, length = crop_window(
        12_000,
        np.random.default_rng(1),
        policy="limit_longest",
        min_s=1.0,
        max_s=3.0,
        fixed_s=2.0,
        buckets=BUCKETS,
    )
    assert (start, frames, length) == (0, 12_000, 16_000)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"crop_buckets_s": "1,2", "dataset": "synthetic"}, "set dataset=manifest"),
        ({"crop_buckets_s": "1,3.5"}, "within min_audio_s-max_audio_s"),
        ({"crop_buckets_s": "1,x"}, "not a comma list of seconds"),
        ({"crop_buckets_s": "1,2", "length_bucketing": True}, "set length_bucketing=false"),
        ({"crop_buckets_s": [1, "2"]}, "expected a list of numbers"),
    ],
)
def test_crop_buckets_are_validated(values, message):
    with pytest.raises(ConfigError, match=message):
        TrialConfig(**{"dataset": "manifest", **values})


def test_crop_buckets_take_a_yaml_list_and_give_one_static_shape_each():
    cfg = TrialConfig(dataset="manifest", crop_buckets_s=[2.5, 1, 1.5], text_tokens=48)
    assert cfg.crop_buckets_s == "1,1.5,2.5" and cfg.crop_buckets == (1.0, 1.5, 2.5)
    assert cfg.static_shapes == [(16_000, 48), (24_000, 48), (40_000, 48)]
    assert TrialConfig(dataset="manifest").static_shapes is None


def test_shape_buckets_put_one_length_in_every_global_batch():
    lengths = np.random.default_rng(2).choice([16_000, 24_000, 32_000], size=1001)
    world, mb = 2, 8

    def batches(rank, epoch, seed=0):
        s = ShapeBucketBatchSampler(lengths, micro_batch=mb, world_size=world, rank=rank, seed=seed)
        s.set_epoch(epoch)
        out = list(s)
        assert len(out) == len(s)
        return out

    steps = list(zip(batches(0, 0), batches(1, 0), strict=True))
    counts = np.unique(lengths, return_counts=True)[1]
    assert len(steps) == sum(c // (world * mb) for c in counts)
    for step in steps:
        assert len({int(lengths[i]) for b in step for i in b}) == 1  # one shape per global batch
        assert all(len(b) == mb for b in step)
    seen = [i for step in steps for b in step for i in b]
    assert len(seen) == len(set(seen))  # no utterance twice in an epoch, ranks disjoint
    order = [int(lengths[b[0]]) for b, _ in steps]
    assert order != sorted(order)  # buckets interleaved, not one after the other
    assert batches(0, 3) == batches(0, 3) and batches(0, 3) != batches(0, 4)
    assert batches(0, 3) != batches(0, 3, seed=1)


def test_a_bucketed_loader_gives_static_shapes_and_no_padding(prepared_corpus):
    manifest, _ = prepared_corpus
    cfg = TrialConfig(
        dataset="manifest",
        manifest_path=str(manifest),
        micro_batch=1,
        crop_buckets_s="1,2,3",
        text_tokens=40,
    )
    loaders = [build_loader(cfg, rank=r, world_size=2, pin_memory=False) for r in (0, 1)]
    its = [EpochIterator(loader, cfg.micro_batch).start() for loader in loaders]
    for _ in range(3 * len(loaders[0])):  # three epochs
        a, b = next(its[0]), next(its[1])
        assert a["audio"].shape[1] == b["audio"].shape[1]  # the ranks' shapes agree at each step
        assert a["audio"].shape[1] in (16_000, 32_000, 48_000)
        assert a["input_ids"].shape == (1, 40) and b["input_ids"].shape == (1, 40)
        assert "audio_mask" not in a  # no row padded (the corpus is 2-20 s): no mask
    assert its[0].position["epoch"] == 2


class _SlowItems(Dataset):
    """Items that take ``delay_s`` each to read (a disk or a decoder)."""

    def __init__(self, n: int, delay_s: float):
        self.n, self.delay_s = n, delay_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay_s)
        return {"x": torch.tensor([i])}


def test_the_loader_keeps_prefetching_across_epoch_boundaries():
    """One iterator over every epoch: the first batches of an epoch are ready when the last
    ones of the previous epoch are taken. A new iterator per epoch (what DataLoader does
    without the epochs batch sampler) starts with an empty queue: each epoch's first batch then
    waits a whole batch's read time."""
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

    from trainables.data.loader import EpochsBatchSampler, ResumableDistributedSampler

    ds = _SlowItems(16, delay_s=0.05)  # a batch of 4 takes 0.2 s to read in one worker

    def waits(loader_iter, n, work_s):
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            next(loader_iter)
            out.append(time.perf_counter() - t0)
            time.sleep(work_s)  # the step: longer than a worker needs for a batch
        return out

    inner = BatchSampler(
        ResumableDistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0), 4, True
    )
    common = dict(num_workers=2, prefetch_factor=2, persistent_workers=True)
    loader = DataLoader(ds, batch_sampler=EpochsBatchSampler(inner, per_batch=4), **common)
    it = EpochIterator(loader, 4).start()
    time.sleep(0.6)  # the queue fills, as it does while the model builds
    ours = waits(it, 16, 0.3)  # four epochs of four batches
    boundary_ours = [ours[i] for i in (4, 8, 12)]

    plain = DataLoader(
        ds, batch_sampler=BatchSampler(DistributedSampler(ds, 1, 0, seed=0), 4, True), **common
    )
    boundary_plain = []
    for epoch in range(3):
        plain.batch_sampler.sampler.set_epoch(epoch)
        epoch_iter = iter(plain)
        time.sleep(0.6) if epoch == 0 else None
        got = waits(epoch_iter, 4, 0.3)
        if epoch:
            boundary_plain.append(got[0])
    assert max(boundary_ours) < 0.05, ours
    assert min(boundary_plain) > 0.15, boundary_plain  # the stall this removes
    assert it.position == {"epoch": 3, "offset": 4}


def test_the_startup_clock_splits_the_time_to_the_first_step():
    from trainables.observe.startup import StartupClock

    start = time.time()
    clock = StartupClock(start - 2.0, start)
    time.sleep(0.05)
    clock.lap("model_build")
    time.sleep(0.02)
    clock.lap("first_step")
    clock.add("first_batch", 0.01)
    parts = dict(p.split("=") for p in clock.breakdown().split())
    assert float(parts["ray_workers"]) == pytest.approx(2.0, abs=0.01)
    assert float(parts["model_build"]) >= 0.05 and float(parts["first_step"]) >= 0.02
    assert list(parts) == ["ray_workers", "model_build", "first_step", "first_batch"]
    # With the worker process's start time, Ray's part splits into the controller's and the
    # worker process's; a process older than the trial (Ray's idle pool) cannot split it.
    split = StartupClock(start - 2.0, start, process_ts=start - 0.5)
    assert split.parts == pytest.approx({"ray_controller": 1.5, "ray_worker": 0.5})
    assert StartupClock(start - 2.0, start, process_ts=start - 9.0).parts == pytest.approx(
        {"ray_workers": 2.0}
    )


def test_the_device_warm_up_runs_the_steps_kinds_of_ops_and_never_raises(monkeypatch, capsys):
    import types

    import torch

    from trainables.observe import startup

    # Nothing to warm on a CPU: no thread, nothing waited for.
    assert startup.DeviceWarmUp(torch.device("cpu")).join() == 0.0
    # The ops it runs (forward, backward, a fused AdamW step on a GPU) in both precisions.
    for dtype in (None, torch.bfloat16):
        startup._first_uses(torch.device("cpu"), dtype)
    # A failure on its thread (here: no CUDA to ask for the precision) is a note for the
    # record; the first step meets a real problem itself.
    monkeypatch.setattr(startup.DeviceWarmUp, "_warmed", set())
    fake = types.SimpleNamespace(type="cuda", index=7)
    warm = startup.DeviceWarmUp(fake)
    warm.join()
    assert warm.error and f"device warm-up failed (the first step pays it): {warm.error}" in (
        capsys.readouterr().err
    )
    # A device is warmed once per process (a resident worker's later runs start no thread).
    assert startup.DeviceWarmUp(fake)._thread is None
