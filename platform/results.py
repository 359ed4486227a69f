"""Files of an output root. Every write goes to a temporary name in the same folder and is then
renamed, so a crash or Ctrl-C never leaves a truncated file behind."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from data_prep.fileio import atomic_write_bytes, atomic_write_text, tsv_text, write_json

__all__ = [
    "TIMING_SCHEMA",
    "atomic_write_text",
    "read_dataset",
    "write_json",
    "write_part",
    "write_tsv",
]

TIMING_DIR = "timing.parquet"
MANIFEST = "run_manifest.tsv"
BEST_CONFIG = "best_config.json"

# What a run actually used, as its workers report it (requested values are in its config).
EFFECTIVE_KEYS = (
    "strategy_effective",
    "precision_effective",
    "speech_attention_effective",
    "text_attention_effective",
    "model_load_dtype_effective",
    "compile_effective",
    "fallbacks",
)

# One row per reported window. Fixed schema, so every part file of the dataset agrees.
TIMING_SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("group", pa.string()),
        ("repeat", pa.int32()),
        ("rank", pa.int32()),
        ("window", pa.int32()),
        ("step", pa.int64()),
        ("max_steps", pa.int64()),
        ("steps_in_window", pa.int32()),
        ("world_size", pa.int32()),
        ("global_batch", pa.int32()),
        ("data_ms_p50", pa.float64()),
        ("data_ms_p90", pa.float64()),
        ("data_ms_mean", pa.float64()),
        ("step_ms_p50", pa.float64()),
        ("step_ms_p90", pa.float64()),
        ("step_ms_mean", pa.float64()),
        ("iter_ms_p50", pa.float64()),
        ("iter_ms_p90", pa.float64()),
        ("iter_ms_mean", pa.float64()),
        ("samples_per_s", pa.float64()),
        ("audio_s_per_s", pa.float64()),
        ("padding_ratio", pa.float64()),
        ("flops_per_sample", pa.float64()),
        ("model_tflops_per_s", pa.float64()),
        ("mfu", pa.float64()),
        ("peak_mem_gib", pa.float64()),
        ("report_ms", pa.float64()),
        ("rank_skew", pa.float64()),
        ("loss", pa.float64()),
        ("startup_s", pa.float64()),
        ("elapsed_s", pa.float64()),
        ("window_end_ts", pa.float64()),
    ]
)


def write_tsv(path: Path, rows: Iterable[dict[str, Any]], columns: list[str]) -> None:
    atomic_write_text(path, tsv_text(rows, columns))


def write_part(dataset_dir: Path, name: str, rows: list[dict[str, Any]], schema: pa.Schema) -> Path:
    """Write ``rows`` as one part file ``<dataset_dir>/<name>.parquet`` of a Parquet dataset."""
    table = pa.Table.from_pylist(rows, schema=schema)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    path = Path(dataset_dir) / f"{name}.parquet"
    atomic_write_bytes(path, sink.getvalue().to_pybytes())
    return path


def read_dataset(dataset_dir: Path, schema: pa.Schema):
    """All part files as one pandas DataFrame (empty, with the schema's columns, if none)."""
    dataset_dir = Path(dataset_dir)
    parts = sorted(dataset_dir.glob("*.parquet")) if dataset_dir.is_dir() else []
    if not parts:
        return schema.empty_table().to_pandas()
    return pq.ParquetDataset(dataset_dir, schema=schema).read().to_pandas()
