"""Datasets and loaders of the per-worker loop."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, Sampler

from trainables.config import TrialConfig, global_batch
from trainables.data.crops import crop_settings
from trainables.data.durations import (
    DurationBins,
    StepFacts,
    batch_shapes,
    duration_bins,
    epoch_steps,
    step_facts,
    steps_per_epoch,
)
from trainables.data.manifest import collate_padded
from trainables.data.text import text_vocab_size

__all__ = [
    "DurationBatchSampler",
    "EpochIterator",
    "EpochsBatchSampler",
    "LengthBucketBatchSampler",
    "ResumableDistributedSampler",
    "ShapeBucketBatchSampler",
    "SyntheticSpeechText",
    "build_dataset",
    "build_loader",
    "collate_for",
    "compile_shapes",
    "epochs",
    "manifest_options",
]


class SyntheticSpeechText(Dataset):
    """Fixed random utterances and token ids: item ``i`` is the same on every call and worker.

    Generating items in ``__getitem__`` (instead of one tensor per step in the loop) keeps the
    DataLoader settings (workers, prefetch, pinning) doing real work, so they can be swept.
    """

    def __init__(
        self, num_items: int, audio_samples: int, text_tokens: int, vocab_size: int, seed: int
    ):
        self.num_items = num_items
        self.audio_samples = audio_samples
        self.text_tokens = text_tokens
        self.vocab_size = vocab_size
        self.seed = seed

    def __len__(self) -> int:
        return self.num_items

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        audio = 0.1 * torch.randn(self.audio_samples, generator=g)
        # Ids 0-999 are reserved in BERT vocabularies ([PAD], [CLS], ...); start at 1000 when possible.
        low = 1000 if self.vocab_size > 2000 else 1
        ids = torch.randint(low, self.vocab_size, (self.text_tokens,), generator=g)
        ids[0] = 101 if self.vocab_size > 2000 else 0  # [CLS] of bert-base-uncased / tiny vocab
        return {"audio": audio, "audio_len": self.audio_samples, "input_ids": ids}


class _GlobalBatchSampler(Sampler[list[int]]):
    """This rank's micro-batches, cut from global batches that every rank draws alike: the
    same epoch RNG (seed, epoch) makes the same global batches (``_global_batches``), shuffled,
    and rank r takes slice r of each. ``skip``: batches of this epoch already trained on (a
    resumed run); their random draws are still made, so the rest come out the same."""

    def __init__(
        self, lengths: np.ndarray, *, micro_batch: int, world_size: int, rank: int, seed: int
    ):
        self.lengths = np.asarray(lengths)
        self.micro_batch, self.world_size, self.rank = micro_batch, world_size, rank
        self.seed = seed
        self.epoch = 0
        self.skip = 0

    @property
    def global_batch(self) -> int:
        """Items of one micro-step of every rank (the batches ``_global_batches`` makes)."""
        return global_batch(micro_batch=self.micro_batch, world_size=self.world_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _global_batches(self, rng: np.random.Generator) -> list[np.ndarray]:
        raise NotImplementedError

    def _members(self, rng: np.random.Generator, batch: np.ndarray) -> np.ndarray:
        return batch

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        batches = self._global_batches(rng)
        for n, index in enumerate(rng.permutation(len(batches))):
            members = self._members(rng, batches[index])  # drawn for skipped batches too
            if n < self.skip:
                continue
            mine = members[self.rank * self.micro_batch : (self.rank + 1) * self.micro_batch]
            yield [int(i) for i in mine]


class LengthBucketBatchSampler(_GlobalBatchSampler):
    """Each step's global batch holds crops of similar length (less padding, and no rank waits
    for another's longer batch).

    The epoch permutation is cut into pools of ``pool_batches`` global batches, each pool
    sorted by length and cut into global batches; each global batch is shuffled inside before
    rank r takes slice r (so no rank is always given the longest crops). Like
    DistributedSampler with drop_last, the remainder that fills no global batch is left out of
    the epoch.
    """

    def __init__(self, lengths: np.ndarray, *, pool_batches: int, **kwargs):
        super().__init__(lengths, **kwargs)
        self.pool_batches = pool_batches

    def __len__(self) -> int:
        return len(self.lengths) // self.global_batch

    def _global_batches(self, rng: np.random.Generator) -> list[np.ndarray]:
        size = self.global_batch
        order = rng.permutation(len(self.lengths))[: len(self) * size]
        pool = self.pool_batches * size
        batches = []
        for start in range(0, len(order), pool):
            chunk = order[start : start + pool]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches += [chunk[i : i + size] for i in range(0, len(chunk), size)]
        return batches

    def _members(self, rng: np.random.Generator, batch: np.ndarray) -> np.ndarray:
        return rng.permutation(batch)


class ResumableDistributedSampler(DistributedSampler):
    """DistributedSampler that can start an epoch past its first ``skip`` indices, so a resumed
    run continues the same sample sequence without reading the batches it already trained on."""

    skip = 0

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.skip, None)


class ShapeBucketBatchSampler(_GlobalBatchSampler):
    """``crop_buckets_s``: every global batch holds crops of one length (one of a few shapes,
    no padding between them), so a compiled step sees a handful of static shapes.

    The epoch permutation is grouped by crop length and each group cut into global batches (its
    remainder is left out of this epoch; the permutation differs next epoch); the global
    batches of all groups are shuffled together.
    """

    def __init__(self, lengths: np.ndarray, **kwargs):
        super().__init__(lengths, **kwargs)
        _, counts = np.unique(self.lengths, return_counts=True)
        self._len = int(sum(c // self.global_batch for c in counts))

    def __len__(self) -> int:
        return self._len

    def _global_batches(self, rng: np.random.Generator) -> list[np.ndarray]:
        size = self.global_batch
        order = rng.permutation(len(self.lengths))
        batches = []
        for length in np.unique(self.lengths):
            members = order[self.lengths[order] == length]
            full = len(members) // size * size
            batches += [members[i : i + size] for i in range(0, full, size)]
        return batches


class DurationBatchSampler(Sampler[list[int]]):
    """batching duration: this rank's micro-batch of each step of an epoch, as
    trainables/data/durations.py cuts them (one duration bin per batch, at most the budget of
    padded audio, every utterance once). Every rank draws the same plan from (seed, epoch) and
    takes its own part, so the ranks agree on each step's counts without a collective
    (``step``). ``skip``: steps of this epoch already trained on (a resumed run)."""

    def __init__(
        self, lengths: np.ndarray, *, bins: DurationBins, world_size: int, rank: int, seed: int
    ):
        self.lengths = np.asarray(lengths)
        self.bins, self.world_size, self.rank, self.seed = bins, world_size, rank, seed
        self.epoch = 0
        self.skip = 0
        self._plans: dict[int, list[list[np.ndarray]]] = {}
        self._len = steps_per_epoch(self.lengths, bins, world_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def plan(self, epoch: int) -> list[list[np.ndarray]]:
        """Epoch ``epoch``'s steps, every rank's part of each (the last two epochs kept: the
        loader's workers prefetch across an epoch's end while the loop finishes it)."""
        if epoch not in self._plans:
            rng = np.random.default_rng([self.seed, epoch])
            self._plans[epoch] = epoch_steps(self.lengths, self.bins, self.world_size, rng)
            for old in [e for e in self._plans if e < epoch - 1]:
                del self._plans[old]
        return self._plans[epoch]

    def step(self, epoch: int, index: int) -> StepFacts:
        """Step ``index`` of epoch ``epoch`` on every rank: its rows and audio."""
        return step_facts(self.plan(epoch)[index], self.lengths)

    def shapes(self) -> list[tuple[int, int]]:
        """Every (rows, padded samples) a micro-batch of the run can have."""
        return batch_shapes(self.lengths, self.bins, self.world_size)

    def __len__(self) -> int:
        return self._len

    def __iter__(self):
        for step in self.plan(self.epoch)[self.skip :]:
            yield [int(i) for i in step[self.rank]]


class EpochsBatchSampler(Sampler[list[int]]):
    """One pass over every epoch: the per-epoch batch sampler ``inner``, epoch after epoch,
    without end. The DataLoader's iterator therefore never ends, and its workers keep
    prefetching across an epoch boundary (a new iterator per epoch would start with an empty
    queue: the first steps of every epoch would wait for data). ``epoch`` and ``skip`` (batches
    of that epoch already trained on) say where the next iterator starts."""

    def __init__(self, inner: Sampler, *, per_batch: int = 1):
        self.inner = inner
        # ``inner.skip`` counts batches (a batch sampler) or samples (a sampler under BatchSampler)
        self.per_batch = per_batch
        self.epoch = 0
        self.skip = 0

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self.inner)

    def _target(self):
        return getattr(self.inner, "sampler", self.inner)

    def __iter__(self):
        epoch, skip = self.epoch, self.skip
        target = self._target()
        while True:
            target.set_epoch(epoch)
            target.skip = skip * self.per_batch
            yield from self.inner
            epoch, skip = epoch + 1, 0


class EpochIterator:
    """Batches forever: a corpus smaller than the run is read again, reshuffled per epoch. Its
    position (``epoch`` and ``offset``, the batches taken in that epoch) goes into checkpoints,
    and ``start(epoch, offset)`` continues from one. The loader's batch sampler is an
    :class:`EpochsBatchSampler`, so one iterator runs across epochs and the position is counted
    here from the batches taken. ``micro_batch``: the run's, named when the dataset gives no
    full batch. ``step``: with batching duration, what the batch just taken and the other
    ranks' of its step hold (:class:`StepFacts`: the loss's gather and the throughput count
    them); None otherwise (every rank holds micro_batch)."""

    def __init__(self, loader: DataLoader, micro_batch: int):
        self.loader, self.micro_batch = loader, micro_batch
        self.epoch = self.offset = 0
        self._start = (0, 0)
        self._taken = 0
        self._it = None
        self.step: StepFacts | None = None

    @property
    def batches_per_epoch(self) -> int:
        return len(self.loader.batch_sampler)

    def start(self, epoch: int = 0, offset: int = 0) -> EpochIterator:
        """Begin (or resume) at ``offset`` batches into ``epoch``; the loader's iterator (and its
        workers' prefetching) starts here, before a resumed run restores its RNG states."""
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"the dataset gives no full batch of {self.micro_batch} per worker; use a larger "
                "corpus or a smaller micro_batch"
            )
        self.epoch, self.offset = epoch, offset
        self._start, self._taken = (epoch, offset), 0
        sampler = self.loader.batch_sampler
        sampler.epoch, sampler.skip = epoch, offset
        self._it = iter(self.loader)
        return self

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self._it is None:
            self.start()
        batch = next(self._it)
        self._taken += 1
        # Position after this batch: its epoch, and the batches taken in it (1..per epoch).
        per_epoch = self.batches_per_epoch
        done = self._start[0] * per_epoch + self._start[1] + self._taken
        self.epoch, self.offset = (done - 1) // per_epoch, (done - 1) % per_epoch + 1
        inner = self.loader.batch_sampler.inner
        if isinstance(inner, DurationBatchSampler):
            self.step = inner.step(self.epoch, self.offset - 1)
        return batch

    @property
    def position(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}


def manifest_options(cfg: TrialConfig) -> dict:
    """What every ManifestDataset of a run shares (training and validation splits)."""
    return dict(
        vocab_size=text_vocab_size(cfg.model_size, cfg.text_pretrained_path),
        max_tokens=cfg.text_tokens,
        crop=crop_settings(cfg),
        read=cfg.audio_read,
        text_path=cfg.text_pretrained_path,
        tokenizer_path=cfg.tokenizer_path,
        max_missing_fraction=cfg.max_missing_files_fraction,
    )


def collate_for(cfg: TrialConfig, pad_id: int) -> Callable:
    """The collate of a run's manifest batches (training and validation): padded, and with
    crop_buckets_s or batching duration transcripts padded to text_tokens (one text shape for
    every batch); batching duration pads audio to the batch's duration bin."""
    duration = cfg.batching == "duration"
    text_to = cfg.text_tokens if cfg.crop_buckets or duration else None
    audio_to = duration_bins(cfg) if duration else None
    return functools.partial(collate_padded, pad_id=pad_id, text_to=text_to, audio_to=audio_to)


def build_dataset(cfg: TrialConfig, *, world_size: int) -> tuple[Dataset, Callable]:
    """The run's dataset and its collate function."""
    if cfg.dataset == "manifest":
        from trainables.data.manifest import ManifestDataset

        ds = ManifestDataset(
            Path(cfg.manifest_path),
            audio_root=Path(cfg.audio_root) if cfg.audio_root else None,
            # Held-out speakers are validation's (trainables/validation.py), never trained on.
            val_speakers=0 if cfg.val_manifest_path else cfg.val_speakers,
            split="train",
            **manifest_options(cfg),
        )
        return ds, collate_for(cfg, ds.pad_id)
    # One epoch covers max_steps steps of every rank.
    ds = SyntheticSpeechText(
        num_items=cfg.max_steps * global_batch(micro_batch=cfg.micro_batch, world_size=world_size),
        audio_samples=cfg.audio_samples,
        text_tokens=cfg.text_tokens,
        vocab_size=text_vocab_size(cfg.model_size, cfg.text_pretrained_path),
        seed=cfg.seed,
    )
    return ds, collate_padded


def compile_shapes(cfg: TrialConfig, loader: DataLoader) -> list[tuple[int, int, int]] | None:
    """(rows, audio samples, text tokens) of every batch shape a compile warm-up compiles when
    the corpus decides them (batching duration: each bin's one or two row counts); None: the
    config's own (``TrialConfig.static_shapes``)."""
    inner = loader.batch_sampler.inner
    if isinstance(inner, DurationBatchSampler):
        return [(rows, audio_n, cfg.text_tokens) for rows, audio_n in inner.shapes()]
    return None


def epochs(loader: DataLoader, micro_batch: int) -> EpochIterator:
    """Batches forever (see :class:`EpochIterator`) of the loader ``build_loader`` made with
    ``micro_batch``."""
    return EpochIterator(loader, micro_batch)


def build_loader(cfg: TrialConfig, *, rank: int, world_size: int, pin_memory: bool) -> DataLoader:
    """DataLoader over every epoch (:class:`EpochsBatchSampler`) of a DistributedSampler, the
    length-bucketing sampler, the shape-bucket sampler (crop_buckets_s) or the duration sampler
    (batching duration); persistent workers that keep prefetching across epoch boundaries."""
    dataset, collate = build_dataset(cfg, world_size=world_size)
    workers = dict(
        # Its own generator: making an iterator draws the workers' base seed from it, not from
        # the global RNG, whose state a checkpoint restores (dropout masks stay the same).
        generator=torch.Generator().manual_seed(cfg.seed),
        num_workers=cfg.num_workers,
        prefetch_factor=cfg.prefetch_factor if cfg.num_workers > 0 else None,
        persistent_workers=cfg.num_workers > 0,
        pin_memory=pin_memory,
        collate_fn=collate,
    )
    ranks = dict(world_size=world_size, rank=rank, seed=cfg.seed)
    per_batch = 1  # the skip's unit: the bucket samplers skip batches, a DistributedSampler samples
    if cfg.batching == "duration":
        inner: Sampler = DurationBatchSampler(
            dataset.crop_lengths(), bins=duration_bins(cfg), **ranks
        )
    elif cfg.crop_buckets:
        inner = ShapeBucketBatchSampler(
            dataset.crop_lengths(), micro_batch=cfg.micro_batch, **ranks
        )
    elif cfg.length_bucketing:
        inner = LengthBucketBatchSampler(
            dataset.crop_lengths(),
            micro_batch=cfg.micro_batch,
            pool_batches=cfg.length_bucketing_pool,
            **ranks,
        )
    else:
        sampler = ResumableDistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg.seed, drop_last=True
        )
        inner = BatchSampler(sampler, cfg.micro_batch, drop_last=True)
        per_batch = cfg.micro_batch
    batches = EpochsBatchSampler(inner, per_batch=per_batch)
    return DataLoader(dataset, batch_sampler=batches, **workers)
