"""The manifest data path: crop policies, seek reading, tokenizer, memory layout, collate."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import soundfile as sf
import torch

from trainables.config import TrialConfig
from trainables.data.crops import CropSettings
from trainables.data.loader import build_dataset
from trainables.data.manifest import ManifestDataset, collate_padded, crop_window

RATE = 16_000


@pytest.mark.parametrize("num_samples", [8_000, 16_000, 47_999, 48_000, 320_000])
def test_limit_longest_windows_obey_the_bounds(num_samples):
    rng = np.random.default_rng(0)
    for _ in range(300):
        start, frames, length = crop_window(
            num_samples, rng, policy="limit_longest", min_s=1.0, max_s=3.0, fixed_s=2.0
        )
        assert frames == length and 0 <= start and start + frames <= num_samples
        if frames < num_samples:
            assert RATE <= frames <= 3 * RATE
        else:  # kept whole only when shorter than the drawn window (<= 3 s)
            assert num_samples <= 3 * RATE and start == 0


def test_limit_longest_window_lengths_spread_over_the_range():
    rng = np.random.default_rng(1)
    lengths = [
        crop_window(10 * RATE, rng, policy="limit_longest", min_s=1.0, max_s=3.0, fixed_s=2.0)[1]
        for _ in range(2000)
    ]
    assert min(lengths) < 1.1 * RATE and max(lengths) > 2.9 * RATE
    assert np.mean(lengths) == pytest.approx(2 * RATE, rel=0.05)


@pytest.mark.parametrize("num_samples", [RATE, 2 * RATE, 5 * RATE])
def test_fixed_slice_is_always_exactly_the_slice(num_samples):
    rng = np.random.default_rng(2)
    for _ in range(100):
        start, frames, length = crop_window(
            num_samples, rng, policy="fixed_slice", min_s=1.0, max_s=3.0, fixed_s=2.0
        )
        assert length == 2 * RATE and frames == min(num_samples, 2 * RATE)
        assert start + frames <= num_samples


def dataset(manifest, **kw):
    args = dict(vocab_size=1000, max_tokens=12, crop=CropSettings(policy="limit_longest", seed=3))
    args.update(kw)
    return ManifestDataset(manifest, **args)


def test_items_are_crops_of_the_prepared_files_read_by_seek(prepared_corpus):
    manifest, _ = prepared_corpus
    table = pd.read_csv(manifest, sep="\t", keep_default_na=False)
    seek, full = dataset(manifest), dataset(manifest, read="full")
    for i in range(len(seek)):
        a, b = seek[i], full[i]
        assert torch.equal(a["audio"], b["audio"])  # same crop, read two ways
        n = len(a["audio"])
        duration = table.loc[i, "num_samples"]
        assert min(duration, RATE) <= n <= min(duration, 3 * RATE)
        whole, _ = sf.read(manifest.parent / table.loc[i, "path"], dtype="float32")
        start = next(
            s
            for s in range(len(whole) - n + 1)
            if np.array_equal(whole[s : s + n], a["audio"].numpy())
        )
        assert 0 <= start <= len(whole) - n
        assert a["audio_len"] == n


def test_crops_are_deterministic_per_seed(prepared_corpus):
    manifest, _ = prepared_corpus
    a, b, c = (dataset(manifest, crop=CropSettings(seed=seed)) for seed in (3, 3, 4))
    assert all(torch.equal(a[i]["audio"], b[i]["audio"]) for i in range(len(a)))
    assert any(len(a[i]["audio"]) != len(c[i]["audio"]) for i in range(len(a)))


def test_fixed_slice_items_are_padded_to_the_slice_with_a_mask(prepared_corpus):
    manifest, _ = prepared_corpus
    ds = dataset(manifest, crop=CropSettings(policy="fixed_slice", fixed_s=10.0, seed=3))
    table = pd.read_csv(manifest, sep="\t")
    for i in range(len(ds)):
        item = ds[i]
        assert len(item["audio"]) == 10 * RATE
        assert item["audio_len"] == min(10 * RATE, table.loc[i, "num_samples"])


def test_tokens_are_cls_text_sep_truncated_and_the_tokenizer_is_cached(prepared_corpus):
    manifest, made = prepared_corpus
    ds = dataset(manifest, max_tokens=6)
    caches = list(manifest.parent.glob("*.tokenizer-1000-*.json"))
    assert len(caches) == 1
    stamp = caches[0].stat().st_mtime_ns
    for i in range(len(ds)):
        ids = ds[i]["input_ids"]
        assert 3 <= len(ids) <= 6 and ids[0] == 2 and ids[-1] == 3  # [CLS] ... [SEP]
        assert (ids < 1000).all()
    dataset(manifest, max_tokens=6)
    assert caches[0].stat().st_mtime_ns == stamp  # reused, not rebuilt


def test_manifest_columns_are_arrays_not_python_objects(prepared_corpus):
    ds = dataset(prepared_corpus[0])
    assert ds.paths.dtype.kind == "S" and ds.num_samples.dtype == np.int64
    assert ds.tokens.dtype == np.int32 and ds.token_offsets.dtype == np.int64
    assert not any(
        isinstance(v, list) or (isinstance(v, np.ndarray) and v.dtype == object)
        for v in vars(ds).values()
    )


def test_collate_pads_audio_and_text_with_masks():
    items = [
        {"audio": torch.ones(5), "audio_len": 5, "input_ids": torch.tensor([2, 7, 3])},
        {"audio": torch.ones(3), "audio_len": 3, "input_ids": torch.tensor([2, 3])},
        {
            "audio": torch.ones(4),
            "audio_len": 2,
            "input_ids": torch.tensor([2, 3]),
        },  # zero-padded item
    ]
    batch = collate_padded(items, pad_id=0)
    assert batch["audio"].shape == (3, 5) and batch["audio"][1, 3:].abs().sum() == 0
    assert batch["audio_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]]
    assert batch["input_ids"].tolist() == [[2, 7, 3], [2, 3, 0], [2, 3, 0]]
    assert batch["text_mask"].tolist() == [[1, 1, 1], [1, 1, 0], [1, 1, 0]]


def test_a_batch_with_no_padded_row_has_no_audio_mask_and_the_model_agrees():
    """An all-true audio mask changes nothing the model computes but costs wav2vec2 a masked
    fill and a host sync (7 % of an eager step on an H200, issue 56): such a batch carries
    none, and the model's embeddings are the same either way."""
    from trainables.model.stage1 import build_model

    items = [
        {"audio": torch.randn(4000), "audio_len": 4000, "input_ids": torch.tensor([2, 7, 3])},
        {"audio": torch.randn(4000), "audio_len": 4000, "input_ids": torch.tensor([2, 3])},
    ]
    batch = collate_padded(items, pad_id=0)
    assert sorted(batch) == ["audio", "input_ids", "text_mask"]
    torch.manual_seed(0)
    model = build_model("tiny", 16).eval()
    with torch.no_grad():
        unmasked = model(**batch)
        masked = model(**batch, audio_mask=torch.ones(2, 4000, dtype=torch.bool))
    for a, b in zip(unmasked, masked, strict=True):
        torch.testing.assert_close(a, b)


def test_bad_manifests_are_refused(tmp_path):
    (tmp_path / "m.tsv").write_text("utt_id\tpath\n")
    with pytest.raises(ValueError, match="lacks column"):
        ManifestDataset(tmp_path / "m.tsv", vocab_size=100, max_tokens=8)
    (tmp_path / "r.tsv").write_text(
        "utt_id\tpath\tnum_samples\tsample_rate\ttranscript\na\tx.flac\t10\t8000\tHI\n"
    )
    with pytest.raises(ValueError, match="sample rates \\[8000\\]"):
        ManifestDataset(tmp_path / "r.tsv", vocab_size=100, max_tokens=8)


def test_build_dataset_from_config_and_a_model_step_on_real_crops(prepared_corpus):
    from trainables.model.stage1 import build_model, contrastive_loss

    cfg = TrialConfig(dataset="manifest", manifest_path=str(prepared_corpus[0]), text_tokens=10)
    ds, collate = build_dataset(cfg, world_size=1)
    batch = collate([ds[i] for i in range(4)])
    torch.manual_seed(0)
    loss = contrastive_loss(*build_model("tiny", proj_dim=16)(**batch))
    assert torch.isfinite(loss) and loss.item() == pytest.approx(np.log(4), rel=0.3)


def test_a_corpus_gives_the_same_tokenizer_in_every_build_and_every_process(prepared_corpus):
    # tokenizers' WordPiece trainer numbered its continuing pieces ("##e") in a hash map's order,
    # new in every map, and broke ties between merges by those ids: each build of one corpus
    # could differ, so two sweeps of one space (a resident and a fresh one, each building its
    # tokenizer) trained on different tokens and gave different losses from the first window.
    import subprocess
    import sys

    from trainables.data.text import build_tokenizer

    manifest = prepared_corpus[0]
    transcripts = pd.read_csv(manifest, sep="\t", keep_default_na=False)["transcript"].tolist()
    here = {build_tokenizer(transcripts, 1000).to_str() for _ in range(8)}
    assert len(here) == 1
    code = (
        "import sys, pandas as pd\n"
        "from trainables.data.text import build_tokenizer\n"
        "t = pd.read_csv(sys.argv[1], sep='\\t', keep_default_na=False)['transcript'].tolist()\n"
        "print(build_tokenizer(t, 1000).to_str())\n"
    )
    other = subprocess.run(
        [sys.executable, "-c", code, str(manifest)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parent.parent,
    ).stdout.strip()
    assert other == here.pop()
    ids = json.loads(other)["model"]["vocab"]
    assert [ids[t] for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")] == [0, 1, 2, 3, 4]


def test_crop_lengths_are_the_lengths_the_items_have(prepared_corpus):
    ds = dataset(prepared_corpus[0])
    lengths = ds.crop_lengths()
    assert list(lengths) == [len(ds[i]["audio"]) for i in range(len(ds))]
    assert lengths.min() < lengths.max()  # the corpus gives the sampler something to sort


def _bucket_batches(lengths, *, world, mb, pool, epoch=0, seed=0):
    from trainables.data.loader import LengthBucketBatchSampler

    per_rank = []
    for rank in range(world):
        sampler = LengthBucketBatchSampler(
            lengths, micro_batch=mb, world_size=world, rank=rank, seed=seed, pool_batches=pool
        )
        sampler.set_epoch(epoch)
        per_rank.append(list(sampler))
        assert len(per_rank[-1]) == len(sampler)
    return per_rank


def test_length_bucketing_partitions_the_epoch_into_similar_length_steps():
    rng = np.random.default_rng(0)
    lengths = rng.integers(16_000, 48_000, size=1003)
    world, mb = 2, 8
    per_rank = _bucket_batches(lengths, world=world, mb=mb, pool=10)
    steps = list(zip(*per_rank, strict=True))
    assert len(steps) == 1003 // (world * mb)  # the remainder is dropped, as DistributedSampler
    seen = [i for step in steps for batch in step for i in batch]
    assert len(seen) == len(set(seen)) == len(steps) * world * mb
    assert all(len(batch) == mb for step in steps for batch in step)
    # Each step's global batch spans a narrow band of lengths; random batches span most of it.
    spread = np.mean([np.ptp(lengths[[i for b in step for i in b]]) for step in steps])
    random_spread = np.mean([np.ptp(lengths[rng.permutation(1003)[:16]]) for _ in range(200)])
    assert spread < 0.2 * random_spread
    # The rank holding a step's longest crop varies (no rank is always the slow one).
    longest = [int(np.argmax([lengths[b].max() for b in step])) for step in steps]
    assert 0.3 < np.mean(longest) < 0.7


def test_length_bucketing_is_deterministic_per_epoch_and_differs_across_epochs():
    lengths = np.random.default_rng(1).integers(16_000, 48_000, size=200)
    a = _bucket_batches(lengths, world=2, mb=4, pool=5, epoch=3)
    assert a == _bucket_batches(lengths, world=2, mb=4, pool=5, epoch=3)
    assert a != _bucket_batches(lengths, world=2, mb=4, pool=5, epoch=4)
    assert a != _bucket_batches(lengths, world=2, mb=4, pool=5, epoch=3, seed=1)


def test_length_bucketing_lowers_the_loaders_padding(prepared_corpus):
    from trainables.data.loader import build_loader, epochs

    def padding(bucketing: bool) -> float:
        cfg = TrialConfig(
            dataset="manifest",
            manifest_path=str(prepared_corpus[0]),
            micro_batch=4,
            length_bucketing=bucketing,
        )
        loader = build_loader(cfg, rank=0, world_size=1, pin_memory=False)
        batches = epochs(loader, cfg.micro_batch)
        audio = [next(batches) for _ in range(3 * len(loader))]
        # A batch with no padded row carries no mask.
        masks = [b.get("audio_mask", torch.ones_like(b["audio"], dtype=torch.bool)) for b in audio]
        return 1.0 - sum(int(m.sum()) for m in masks) / sum(m.numel() for m in masks)

    plain, bucketed = padding(False), padding(True)
    # About half on this 12-utterance corpus (0.52x since synth draws each chapter from its own
    # random stream; 0.5x before): a clear cut, not a fixed ratio.
    assert bucketed < 0.6 * plain, (plain, bucketed)


def test_the_dataset_tokenises_with_the_text_checkpoints_tokenizer(prepared_corpus, tmp_path):
    from tests.checkpoints import save_tiny_checkpoints
    from trainables.model.pretrained import load_tokenizer

    manifest = prepared_corpus[0]
    transcripts = pd.read_csv(manifest, sep="\t", keep_default_na=False)["transcript"].tolist()
    # A tokenizer trained on other text: its ids differ from the manifest's own tokenizer.
    _, text_path = save_tiny_checkpoints(tmp_path, ["zebra quartz " + t[::-1] for t in transcripts])
    cfg = TrialConfig(
        dataset="manifest",
        manifest_path=str(manifest),
        text_tokens=64,
        text_pretrained_path=str(text_path),
    )
    ds, _ = build_dataset(cfg, world_size=1)
    tok, _ = load_tokenizer(text_path)
    own, _ = build_dataset(
        TrialConfig(dataset="manifest", manifest_path=str(manifest), text_tokens=64), world_size=1
    )
    for i in range(len(ds)):
        full = tok.encode(transcripts[i]).ids
        expected = full if len(full) <= 64 else full[:63] + full[-1:]  # truncated, [SEP] kept
        assert ds[i]["input_ids"].tolist() == expected
    assert any(ds[i]["input_ids"].tolist() != own[i]["input_ids"].tolist() for i in range(len(ds)))


def test_a_corpus_smaller_than_one_global_batch_says_so(prepared_corpus):
    from trainables.data.loader import build_loader, epochs

    for bucketing in (False, True):
        cfg = TrialConfig(
            dataset="manifest",
            manifest_path=str(prepared_corpus[0]),
            micro_batch=64,
            length_bucketing=bucketing,
        )
        loader = build_loader(cfg, rank=0, world_size=1, pin_memory=False)
        with pytest.raises(ValueError, match="gives no full batch of 64 per worker"):
            next(epochs(loader, cfg.micro_batch))


def test_rows_with_missing_audio_are_skipped_and_counted_up_to_the_fraction(
    prepared_corpus, tmp_path
):
    import shutil

    manifest, _ = prepared_corpus
    copy = tmp_path / "prepared"
    shutil.copytree(manifest.parent, copy)
    manifest = copy / manifest.name
    table = pd.read_csv(manifest, sep="\t")
    intact = dataset(manifest)
    gone = copy / table["path"].iloc[4]
    gone.unlink()
    full = len(table)
    ds = dataset(manifest, max_missing_fraction=0.1)
    assert len(ds) == full - 1 and ds.missing_files == 1
    assert str(gone).encode() not in set(ds.paths)
    assert all(ds[i]["audio"].numel() > 0 for i in range(len(ds)))  # every kept row reads

    # The tokens still belong to the right utterances: item 4 is now the manifest's row 5.
    def tokens(d, i):
        return d.tokens[d.token_offsets[i] : d.token_offsets[i + 1]].tolist()

    assert tokens(ds, 4) == tokens(intact, 5) != tokens(intact, 4)
    assert ds.num_samples[4] == intact.num_samples[5]
    with pytest.raises(
        ValueError,
        match=r"1 of \d+ rows .* missing audio files \(first: .*max_missing_files_fraction 0",
    ):
        dataset(manifest, max_missing_fraction=0.0)
    # Without the check (the loader benchmark), nothing is dropped and the read fails later.
    assert len(dataset(manifest)) == full
