"""Datasets and loaders of the per-worker loop."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from trainables.config import TrialConfig
from trainables.manifest import collate_padded
from trainables.model import text_vocab_size

__all__ = [
    "EpochIterator",
    "LengthBucketBatchSampler",
    "ResumableDistributedSampler",
    "SyntheticSpeechText",
    "build_dataset",
    "build_loader",
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


class LengthBucketBatchSampler(Sampler[list[int]]):
    """This rank's micro-batches, drawn so that each step's global batch holds crops of similar
    length (less padding, and no rank waits for another's longer batch).

    Every rank draws the same epoch permutation (seed, epoch), cuts it into pools of
    ``pool_batches`` global batches, sorts each pool by length and cuts it into global batches;
    the global batches are shuffled, and each is shuffled inside before rank r takes slice r (so
    no rank is always given the longest crops). Like DistributedSampler with drop_last, the
    remainder that fills no global batch is left out of the epoch.
    """

    def __init__(
        self,
        lengths: np.ndarray,
        *,
        micro_batch: int,
        world_size: int,
        rank: int,
        seed: int,
        pool_batches: int,
    ):
        self.lengths = np.asarray(lengths)
        self.micro_batch, self.world_size, self.rank = micro_batch, world_size, rank
        self.seed, self.pool_batches = seed, pool_batches
        self.epoch = 0
        self.skip = 0  # batches of this epoch already trained on (a resumed run)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths) // (self.micro_batch * self.world_size)

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        global_batch = self.micro_batch * self.world_size
        order = rng.permutation(len(self.lengths))[: len(self) * global_batch]
        pool = self.pool_batches * global_batch
        batches = []
        for start in range(0, len(order), pool):
            chunk = order[start : start + pool]
            chunk = chunk[np.argsort(self.lengths[chunk], kind="stable")]
            batches += [chunk[i : i + global_batch] for i in range(0, len(chunk), global_batch)]
        for n, index in enumerate(rng.permutation(len(batches))):
            members = rng.permutation(batches[index])  # drawn for skipped batches too
            if n < self.skip:
                continue
            mine = members[self.rank * self.micro_batch : (self.rank + 1) * self.micro_batch]
            yield [int(i) for i in mine]


class ResumableDistributedSampler(DistributedSampler):
    """DistributedSampler that can start an epoch past its first ``skip`` indices, so a resumed
    run continues the same sample sequence without reading the batches it already trained on."""

    skip = 0

    def __iter__(self):
        return itertools.islice(super().__iter__(), self.skip, None)


class EpochIterator:
    """Batches forever: a corpus smaller than the run is read again, reshuffled per epoch. Its
    position (``epoch`` and ``offset``, the batches taken in this epoch) goes into checkpoints,
    and ``start(epoch, offset)`` continues from one."""

    def __init__(self, loader: DataLoader):
        self.loader = loader
        self.epoch = self.offset = 0
        self._it = None

    def start(self, epoch: int = 0, offset: int = 0) -> EpochIterator:
        """Begin (or resume) at ``offset`` batches into ``epoch``; the loader's iterator is made
        here, before a resumed run restores its RNG states."""
        self.epoch, self.offset = epoch, offset
        for sampler in (self.loader.sampler, self.loader.batch_sampler):
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
            if hasattr(sampler, "skip"):
                sampler.skip = offset * (1 if sampler is self.loader.batch_sampler else self._bs)
        self._it = iter(self.loader)
        return self

    @property
    def _bs(self) -> int:
        return self.loader.batch_size or 1

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self._it is None:
            self.start()
        try:
            batch = next(self._it)
        except StopIteration:
            if self.offset == 0:
                size = self.loader.batch_size or getattr(
                    self.loader.batch_sampler, "micro_batch", "?"
                )
                raise ValueError(
                    f"the dataset gives no full batch of {size} per worker; use a larger corpus "
                    "or a smaller micro_batch"
                ) from None
            self.start(self.epoch + 1, 0)
            return next(self)
        self.offset += 1
        return batch

    @property
    def position(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}


def manifest_options(cfg: TrialConfig) -> dict:
    """What every ManifestDataset of a run shares (training and validation splits)."""
    return dict(
        vocab_size=text_vocab_size(cfg.model_size, cfg.text_pretrained_path),
        max_tokens=cfg.text_tokens,
        policy=cfg.crop_policy,
        min_audio_s=cfg.min_audio_s,
        max_audio_s=cfg.max_audio_s,
        fixed_slice_s=cfg.fixed_slice_s,
        seed=cfg.seed,
        read=cfg.audio_read,
        text_path=cfg.text_pretrained_path,
        tokenizer_path=cfg.tokenizer_path,
        max_missing_fraction=cfg.max_missing_files_fraction,
    )


def build_dataset(cfg: TrialConfig, *, world_size: int) -> tuple[Dataset, Callable]:
    """The run's dataset and its collate function."""
    if cfg.dataset == "manifest":
        from trainables.manifest import ManifestDataset

        ds = ManifestDataset(
            Path(cfg.manifest_path),
            audio_root=Path(cfg.audio_root) if cfg.audio_root else None,
            # Held-out speakers are validation's (trainables/validation.py), never trained on.
            val_speakers=0 if cfg.val_manifest_path else cfg.val_speakers,
            split="train",
            **manifest_options(cfg),
        )
        return ds, functools.partial(collate_padded, pad_id=ds.pad_id)
    # One epoch covers max_steps steps of every rank.
    ds = SyntheticSpeechText(
        num_items=cfg.max_steps * cfg.micro_batch * world_size,
        audio_samples=cfg.audio_samples,
        text_tokens=cfg.text_tokens,
        vocab_size=text_vocab_size(cfg.model_size, cfg.text_pretrained_path),
        seed=cfg.seed,
    )
    return ds, collate_padded


def epochs(loader: DataLoader) -> EpochIterator:
    """Batches forever (see :class:`EpochIterator`)."""
    return EpochIterator(loader)


def build_loader(cfg: TrialConfig, *, rank: int, world_size: int, pin_memory: bool) -> DataLoader:
    """DataLoader with a DistributedSampler (or the length-bucketing batch sampler); persistent
    workers, so a new epoch does not restart them inside a timed window."""
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
    if cfg.length_bucketing:
        batches = LengthBucketBatchSampler(
            dataset.crop_lengths(),
            micro_batch=cfg.micro_batch,
            world_size=world_size,
            rank=rank,
            seed=cfg.seed,
            pool_batches=cfg.length_bucketing_pool,
        )
        return DataLoader(dataset, batch_sampler=batches, **workers)
    sampler = ResumableDistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg.seed, drop_last=True
    )
    return DataLoader(
        dataset, batch_size=cfg.micro_batch, sampler=sampler, drop_last=True, **workers
    )
