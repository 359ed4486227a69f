"""Duration batches (``batching: duration``), computed without torch: the duration bins of a run
(``DurationBins``, from its config by ``duration_bins``), every epoch's steps (``epoch_steps``:
each rank's micro-batch of each step), how many steps an epoch holds (``steps_per_epoch``) and
which batch shapes a run can see (``batch_shapes``). The driver checks a corpus with them before
Ray starts; the sampler (trainables/data/loader.py: ``DurationBatchSampler``) draws with them.

How an epoch is cut, like NeMo's 2D buckets (a bucket per duration bin, its batch size set by
the budget) and fairseq's ``max_tokens`` (a budget of padded frames):

- Bins: lengths ``max_audio_s / (1 + batch_max_pad)^k`` in whole 20 ms frames, from the longest
  down to the first at or below ``min_audio_s``. An utterance goes to the shortest bin that holds
  it and a batch is padded to its bin's length, so no row is padded beyond ``1 + batch_max_pad``
  times its length (those shorter than ``min_audio_s`` excepted).
- Rank-batches: bin ``k``'s utterances of the epoch (in its shuffled order) are split into the
  fewest near-equal rank-batches of at most ``batch_audio_s // length_k`` rows, plus one more
  in the bins with the fullest ones until every rank gets as many (the counts depend on the
  corpus alone, so every epoch has the same steps and shapes).
- Steps: the rank-batches in bin order, ``world`` at a time, so one step's ranks hold the same
  bin (or two neighbours: ranks wait for no longer batch); each step's batches go to the ranks
  in a random order, and the steps are shuffled.

Every utterance is in exactly one rank-batch of the epoch. Only when no bin can be split any
further (every rank-batch holds one utterance: a budget below twice the longest bin, or a corpus
of a few utterances per bin) and the count still does not divide among the ranks are the last
``< world`` rank-batches, drawn anew each epoch, left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from trainables.config import TrialConfig
from trainables.data.crops import SAMPLE_RATE

__all__ = [
    "FRAME",
    "DurationBins",
    "StepFacts",
    "batch_shapes",
    "duration_bins",
    "epoch_steps",
    "rank_batches_per_bin",
    "step_facts",
    "steps_per_epoch",
]

FRAME = 320  # samples per wav2vec2 frame (its convolutions' total stride): 20 ms at 16 kHz


@dataclass(frozen=True, kw_only=True)
class DurationBins:
    """A run's duration bins: their lengths in samples (ascending) and the budget of a rank's
    micro-batch in padded samples. Called with a batch's longest row, the length the batch is
    padded to (the collate's ``audio_to``)."""

    edges: tuple[int, ...]
    budget: int

    def bin_of(self, lengths: np.ndarray) -> np.ndarray:
        """The bin of each length: the shortest that holds it (the longest for a longer one)."""
        found = np.searchsorted(np.asarray(self.edges), np.asarray(lengths), side="left")
        return np.minimum(found, len(self.edges) - 1)

    @property
    def caps(self) -> np.ndarray:
        """The most rows of a rank-batch of each bin: the budget over the bin's length."""
        return np.asarray(self.budget // np.asarray(self.edges), dtype=np.int64)

    def __call__(self, longest: int) -> int:
        return int(self.edges[int(self.bin_of(np.asarray([longest]))[0])])


def duration_bins(cfg: TrialConfig) -> DurationBins:
    """The bins of a run's keys (max_audio_s, min_audio_s, batch_max_pad, batch_audio_s): each
    length at most ``1 + batch_max_pad`` times the next shorter one, in whole frames."""
    top = math.ceil(cfg.max_audio_s * SAMPLE_RATE / FRAME) * FRAME
    floor = int(round(cfg.min_audio_s * SAMPLE_RATE))
    edges = [top]
    while edges[-1] > floor:
        shorter = math.ceil(edges[-1] / (1.0 + cfg.batch_max_pad) / FRAME) * FRAME
        edges.append(min(shorter, edges[-1] - FRAME))  # at least a frame shorter
    return DurationBins(
        edges=tuple(sorted(edges)), budget=int(round(cfg.batch_audio_s * SAMPLE_RATE))
    )


def rank_batches_per_bin(counts: np.ndarray, caps: np.ndarray, world: int) -> np.ndarray:
    """How many rank-batches each bin's ``counts`` utterances are split into: the fewest of at
    most ``caps`` rows, then one more at a time in the bin whose rank-batches are fullest (and
    can still be split) until the total divides among ``world`` ranks, or no bin can be split."""
    counts = np.asarray(counts, dtype=np.int64)
    parts = -(-counts // np.asarray(caps, dtype=np.int64))
    while parts.sum() % world:
        fullness = np.where(counts > parts, counts / np.maximum(parts, 1), -1.0)
        k = int(np.argmax(fullness))
        if fullness[k] < 0:
            break  # every rank-batch holds one utterance: the plan leaves the remainder out
        parts[k] += 1
    return parts


def steps_per_epoch(lengths: np.ndarray, bins: DurationBins, world: int) -> int:
    """Steps of every epoch (the same in each: the split depends on the bins' counts alone)."""
    counts = np.bincount(bins.bin_of(lengths), minlength=len(bins.edges))
    return int(rank_batches_per_bin(counts, bins.caps, world).sum()) // world


def batch_shapes(lengths: np.ndarray, bins: DurationBins, world: int) -> list[tuple[int, int]]:
    """Every (rows, padded samples) a rank-batch of the run can have, ascending: one or two row
    counts per bin, the same every epoch (what a compile warm-up compiles ahead)."""
    counts = np.bincount(bins.bin_of(lengths), minlength=len(bins.edges))
    parts = rank_batches_per_bin(counts, bins.caps, world)
    shapes = set()
    for count, part, edge in zip(counts, parts, bins.edges, strict=True):
        if count:
            shapes.add((int(count // part), edge))
            shapes.add((int(-(-count // part)), edge))
    return sorted(shapes)


def epoch_steps(
    lengths: np.ndarray, bins: DurationBins, world: int, rng: np.random.Generator
) -> list[list[np.ndarray]]:
    """One epoch's steps: for each, every rank's micro-batch (item indices), in rank order."""
    lengths = np.asarray(lengths)
    order = rng.permutation(len(lengths))
    which = bins.bin_of(lengths[order])
    counts = np.bincount(which, minlength=len(bins.edges))
    parts = rank_batches_per_bin(counts, bins.caps, world)
    batches: list[np.ndarray] = []
    for k, part in enumerate(parts):
        if part:
            batches += np.array_split(order[which == k], part)
    extra = len(batches) % world  # only when no bin can be split any further
    if extra:
        left_out = set(rng.choice(len(batches), extra, replace=False).tolist())
        batches = [b for i, b in enumerate(batches) if i not in left_out]
    steps = [batches[i : i + world] for i in range(0, len(batches), world)]
    steps = [[step[j] for j in rng.permutation(world)] for step in steps]
    return [steps[i] for i in rng.permutation(len(steps))]


@dataclass(frozen=True)
class StepFacts:
    """What one micro-step of every rank holds, known on every rank from the plan: each rank's
    rows (in rank order), their real audio in samples and the sum of their squared lengths in
    seconds (the MFU's attention term)."""

    rows: tuple[int, ...]
    audio_samples: int
    audio_sq_s: float

    @property
    def samples(self) -> int:
        return sum(self.rows)


def step_facts(step: list[np.ndarray], lengths: np.ndarray) -> StepFacts:
    """The facts of one step of ``epoch_steps``."""
    every = np.concatenate(step)
    seconds = lengths[every].astype(np.float64) / SAMPLE_RATE
    return StepFacts(
        rows=tuple(len(b) for b in step),
        audio_samples=int(lengths[every].sum()),
        audio_sq_s=float((seconds**2).sum()),
    )
