"""A data_prep manifest as a table: its required columns, read with pyarrow, the rows whose audio
file exists, the held-out speakers. No torch here: the driver reads manifests too (its tokenizer,
its checks), and importing torch cost each driver 2.6 s of CPU on 2 cores."""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = [
    "MANIFEST_REQUIRED",
    "check_missing",
    "existing_files",
    "read_manifest_table",
    "speaker_split",
]

MANIFEST_REQUIRED = ("utt_id", "path", "num_samples", "sample_rate", "transcript")


def read_manifest_table(manifest_path: Path):
    """The manifest as a pyarrow Table: the Parquet copy beside the TSV when it exists."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    manifest_path = Path(manifest_path)
    parquet = manifest_path.with_suffix(".parquet")
    if parquet.is_file():
        table = pq.read_table(parquet)
    else:
        table = pacsv.read_csv(
            manifest_path,
            parse_options=pacsv.ParseOptions(delimiter="\t"),
            convert_options=pacsv.ConvertOptions(
                strings_can_be_null=False, quoted_strings_can_be_null=False
            ),
        )
    missing = [c for c in MANIFEST_REQUIRED if c not in table.column_names]
    if missing:
        raise ValueError(
            f"manifest {manifest_path} lacks column(s) {', '.join(missing)}; "
            "make it with python -m data_prep.librispeech"
        )
    return table


def existing_files(paths: list[str]) -> np.ndarray:
    """Which of ``paths`` exist, by listing each folder once (a LibriSpeech manifest has ~281k
    files in ~2.5k chapter folders: far fewer calls than one stat per file)."""
    import os

    listed: dict[str, set[str] | None] = {}
    keep = np.zeros(len(paths), dtype=bool)
    for i, path in enumerate(paths):
        folder, name = os.path.split(path)
        if folder not in listed:
            try:
                listed[folder] = set(os.listdir(folder or "."))
            except OSError:  # a missing or unreadable folder: none of its files can be read
                listed[folder] = None
        names = listed[folder]
        keep[i] = names is not None and name in names
    return keep


def check_missing(manifest_path, paths: list[str], keep: np.ndarray, max_fraction: float) -> None:
    """Fail when more than ``max_fraction`` of the rows point at missing files."""
    missing = int((~keep).sum())
    if missing == 0 or missing <= max_fraction * len(paths):
        return
    first = next(p for p, k in zip(paths, keep, strict=True) if not k)
    raise ValueError(
        f"manifest {manifest_path}: {missing} of {len(paths)} rows ({missing / len(paths):.1%}) "
        f"point at missing audio files (first: {first}), more than max_missing_files_fraction "
        f"{max_fraction:g}; check audio_root, or remake the manifest with python -m "
        "data_prep.librispeech"
    )


def speaker_split(table, val_speakers: int) -> np.ndarray:
    """True for the rows of the last ``val_speakers`` speakers in sorted order (held out)."""
    if "speaker" not in table.column_names:
        raise ValueError("val_speakers: the manifest has no speaker column; use val_manifest_path")
    speakers = np.array([str(s) for s in table.column("speaker").to_pylist()])
    unique = sorted(set(speakers))
    if val_speakers >= len(unique):
        raise ValueError(
            f"val_speakers: {val_speakers} of the manifest's {len(unique)} speakers would leave "
            "none to train on; lower val_speakers"
        )
    return np.isin(speakers, unique[len(unique) - val_speakers :])
