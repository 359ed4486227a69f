"""The real data path: utterances of a data_prep manifest, cropped as they are read.

Only the cropped part of each file is read (soundfile seek + read), not the whole file. The
manifest's columns are held as numpy arrays (paths as fixed-width bytes, tokens as one flat
int32 array with offsets), never as lists of Python objects: forked DataLoader workers would
otherwise copy every page they touch (reference counts) and grow with the corpus.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from trainables.data.crops import (
    DEFAULT_CROP,
    SAMPLE_RATE,
    CropSettings,
    crop_lengths,
    crop_window,
)
from trainables.data.manifest_table import (
    check_missing,
    existing_files,
    read_manifest_table,
    speaker_split,
)

__all__ = ["ManifestDataset", "collate_padded", "crop_window"]


class ManifestDataset(Dataset):
    """Item ``i``: a crop of utterance ``i`` (float32 at 16 kHz) and its token ids.

    The crop of an item depends only on (seed, i), so it is the same in every loader worker
    and every run with the same seed (the sampler varies the order per epoch).
    """

    def __init__(
        self,
        manifest_path: Path,
        *,
        vocab_size: int,
        max_tokens: int,
        crop: CropSettings = DEFAULT_CROP,
        audio_root: Path | None = None,
        read: Literal["seek", "full"] = "seek",
        text_path: str = "",
        tokenizer_path: str = "",
        max_missing_fraction: float | None = None,
        tokenizer_manifest: Path | None = None,
        val_speakers: int = 0,
        split: Literal["train", "val"] = "train",
    ):
        """``crop``: how items are cropped (a run's: ``crop_settings``); ``tokenizer_manifest``:
        the manifest whose tokenizer encodes the transcripts (the training manifest, for a
        validation split); ``val_speakers``: the last N speakers (in sorted order) are the
        ``val`` split, the others the ``train`` split."""
        from trainables.data.text import text_tokenizer

        table = read_manifest_table(manifest_path)
        tok_table = table if tokenizer_manifest is None else read_manifest_table(tokenizer_manifest)
        rates = np.unique(table.column("sample_rate").to_numpy())
        if rates.size and (rates.size > 1 or int(rates[0]) != SAMPLE_RATE):
            raise ValueError(
                f"manifest {manifest_path} has sample rates {rates.tolist()}; the models expect {SAMPLE_RATE}"
            )
        root = Path(audio_root) if audio_root else Path(manifest_path).parent
        paths = [str(root / p) for p in table.column("path").to_pylist()]
        keep = np.ones(len(paths), dtype=bool)
        if max_missing_fraction is not None:
            keep = existing_files(paths)
            check_missing(manifest_path, paths, keep, max_missing_fraction)
        # Rows whose audio file is missing are skipped (and counted); the tokenizer is still the
        # manifest's, built over every transcript (the same file for every run of the sweep).
        self.missing_files = int((~keep).sum())
        if val_speakers:
            keep &= speaker_split(table, val_speakers) == (split == "val")
        self.paths = np.array([p.encode() for p, k in zip(paths, keep, strict=True) if k])
        self.num_samples = table.column("num_samples").to_numpy().astype(np.int64)[keep]
        all_transcripts = [str(t) for t in table.column("transcript").to_pylist()]
        transcripts = [t for t, k in zip(all_transcripts, keep, strict=True) if k]
        tokenizer, self.pad_id = text_tokenizer(
            Path(tokenizer_manifest or manifest_path),
            [str(t) for t in tok_table.column("transcript").to_pylist()],
            vocab_size,
            text_path,
            tokenizer_path,
        )
        encoded = tokenizer.encode_batch(transcripts)
        lengths = np.array([min(len(e.ids), max_tokens) for e in encoded], dtype=np.int64)
        self.token_offsets = np.concatenate([[0], np.cumsum(lengths)])
        self.tokens = np.empty(int(self.token_offsets[-1]), dtype=np.int32)
        for i, e in enumerate(encoded):
            ids = (
                e.ids[: max_tokens - 1] + [e.ids[-1]] if len(e.ids) > max_tokens else e.ids
            )  # keep [SEP]
            self.tokens[self.token_offsets[i] : self.token_offsets[i + 1]] = ids
        self.crop, self.read = crop, read

    def __len__(self) -> int:
        return len(self.num_samples)

    def crop_lengths(self) -> np.ndarray:
        """The padded length in samples of every item's crop, without reading audio (a crop
        depends only on the seed, the item and its manifest length)."""
        return crop_lengths(self.num_samples, self.crop)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        import soundfile as sf

        start, frames, length = self.crop.window(int(self.num_samples[index]), index)
        path = self.paths[index].decode()
        if self.read == "seek":
            with sf.SoundFile(path) as f:
                f.seek(start)
                audio = f.read(frames, dtype="float32")
        else:  # decode the whole file, then crop (the baseline of benchmarks/probes/loader_bench.py)
            audio = sf.read(path, dtype="float32")[0][start : start + frames]
        valid = len(audio)  # fewer than asked for only if the file is shorter than its manifest row
        if valid < length:
            audio = np.pad(audio, (0, length - valid))
        tokens = self.tokens[self.token_offsets[index] : self.token_offsets[index + 1]]
        return {
            "audio": torch.from_numpy(audio),
            "audio_len": valid,
            "input_ids": torch.from_numpy(tokens.astype(np.int64)),
        }


def collate_padded(
    items: list[dict],
    pad_id: int = 0,
    text_to: int | None = None,
    audio_to: Callable[[int], int] | None = None,
) -> dict[str, torch.Tensor]:
    """Pad audio (zeros) and token ids (``pad_id``) to the longest in the batch (token ids to
    ``text_to`` when given: one text shape for every batch; audio to ``audio_to(longest)`` when
    given: batching duration's bin length, a few shapes for a run); masks come from each item's valid
    length (items carry a length, not a mask as long as their audio). The audio mask is bool:
    as long as the audio, an int64 one was twice the audio's bytes (61 MB of a 91 MB batch at
    mb 160 and 3 s), all of it pinned and copied to the GPU by the loader, and the model reads
    only its lengths (transformers' feature-vector mask takes a bool one as it is).

    No row padded (crop buckets, equal crops): no audio mask at all. An all-true mask changes
    nothing the model computes but costs wav2vec2 its frame mask, a masked fill and masked
    attention (when the fill was a boolean index, a host sync: 7 % of an eager step at mb 256
    and 2 s on an H200, benchmarks/results/mfu_budget_2xh200/; now without one,
    trainables/model/padding.py). With ``audio_to`` (batching duration, whose
    batches nearly all hold padding) always a mask: one compiled graph per shape, not two."""
    from torch.nn.utils.rnn import pad_sequence

    audio = pad_sequence([it["audio"] for it in items], batch_first=True)
    if audio_to is not None and audio_to(audio.shape[1]) > audio.shape[1]:
        audio = torch.nn.functional.pad(audio, (0, audio_to(audio.shape[1]) - audio.shape[1]))
    ids = pad_sequence([it["input_ids"] for it in items], batch_first=True, padding_value=pad_id)
    if text_to is not None and ids.shape[1] < text_to:
        ids = torch.nn.functional.pad(ids, (0, text_to - ids.shape[1]), value=pad_id)
    lengths = [it["audio_len"] for it in items]
    text_len = torch.tensor([len(it["input_ids"]) for it in items])
    batch = {
        "audio": audio,
        "input_ids": ids,
        "text_mask": (torch.arange(ids.shape[1]) < text_len[:, None]).long(),
    }
    if min(lengths) < audio.shape[1] or audio_to is not None:
        batch["audio_mask"] = torch.arange(audio.shape[1]) < torch.tensor(lengths)[:, None]
    return batch
