"""Seek-crop reading against full-file decoding, same manifest, same crops, one run.

    python -m benchmarks.probes.loader_bench [--files 64] [--workers 1] [--batches 40] [--repeats 3]

The corpus is synthetic with LibriSpeech-like lengths (9-18 s before trimming, ~12 s after, as LibriSpeech: the
ratio grows with file length, so it is printed). Both variants run trainables.data.manifest.ManifestDataset through a torch DataLoader with
``--workers`` loader processes (limit_longest crops of 1-3 s, micro-batch 8): `seek` reads only
the crop (soundfile seek + read), `full` decodes the whole file and then crops. Repeats alternate
the variants; medians of samples/s per loader worker and their ratio are printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from torch.utils.data import DataLoader, RandomSampler

from data_prep import synth
from data_prep.audio import TrimSettings
from data_prep.layout import discover
from data_prep.librispeech import write_outputs
from data_prep.pipeline import make_tasks, run_serial
from stage1_common.fileio import write_json
from trainables.data.crops import CropSettings
from trainables.data.manifest import ManifestDataset, collate_padded


def prepared_manifest(files: int, root: Path) -> Path:
    manifest = root / "prepared" / "manifest_16k_trim.tsv"
    if not manifest.exists():
        utts = -(-files // 8)
        print(f"generating and preparing {8 * utts} files under {root} ...", flush=True)
        # LibriSpeech-like lengths (its utterances average ~12 s): the ratio depends on them.
        synth.make_corpus(
            root / "raw", speakers=4, chapters=2, utts=utts, seed=11, durations=(9.0, 18.0)
        )
        found = discover(root / "raw")
        tasks = make_tasks(
            found.utterances,
            root / "raw",
            manifest.parent,
            target_sr=16_000,
            trim=True,
            settings=TrimSettings(),
            force=False,
        )
        write_outputs(manifest, manifest.parent, found, list(run_serial(tasks)))
    return manifest


def samples_per_s(ds: ManifestDataset, workers: int, batches: int, batch_size: int) -> float:
    loader = DataLoader(
        ds,
        batch_size=batch_size,
        sampler=RandomSampler(ds, replacement=True, num_samples=batches * batch_size),
        num_workers=workers,
        prefetch_factor=4 if workers else None,
        collate_fn=collate_padded,
    )
    it = iter(loader)
    next(it)  # worker start-up is not part of the reading rate
    start = time.perf_counter()
    n = sum(1 for _ in it)
    return n * batch_size / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=64)
    p.add_argument("--workers", type=int, default=1, help="DataLoader worker processes")
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--corpus", type=Path, help="reuse (or create) the prepared corpus here")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    manifest = prepared_manifest(
        args.files, args.corpus or Path(tempfile.mkdtemp(prefix="loader_bench_"))
    )
    rates: dict[str, list[float]] = {"seek": [], "full": []}
    for rep in range(1, args.repeats + 1):
        for read in rates:
            crop = CropSettings(seed=rep)
            ds = ManifestDataset(manifest, vocab_size=1000, max_tokens=32, read=read, crop=crop)
            rates[read].append(samples_per_s(ds, args.workers, args.batches, args.batch_size))
            print(f"  repeat {rep} {read:<4} {rates[read][-1]:8.1f} samples/s", flush=True)
    per_worker = max(args.workers, 1)
    med = {k: statistics.median(v) / per_worker for k, v in rates.items()}
    ratio = med["seek"] / med["full"]
    durations = ManifestDataset(manifest, vocab_size=1000, max_tokens=32).num_samples / 16_000
    print(
        f"\n{len(durations)} files of {durations.mean():.1f} s mean, crops of 1-3 s, "
        f"{args.workers} loader worker(s), batch {args.batch_size}"
    )
    print(
        f"seek: {med['seek']:.1f} samples/s per worker   full: {med['full']:.1f} samples/s per worker"
    )
    print(f"seek / full: {ratio:.2f}x")
    if args.json:
        write_json(
            args.json,
            {
                "files": len(durations),
                "mean_file_s": float(durations.mean()),
                "workers": args.workers,
                "per_worker_samples_per_s": med,
                "ratio": ratio,
                "runs": rates,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
