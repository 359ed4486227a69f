"""Files of an output root. Every write goes to a temporary name in the same folder and is then
renamed, so a crash or Ctrl-C never leaves a truncated file behind."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

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
        ("report_ms", pa.float64()),
        ("loss", pa.float64()),
        ("startup_s", pa.float64()),
        ("elapsed_s", pa.float64()),
        ("window_end_ts", pa.float64()),
    ]
)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # A dot-prefixed temporary name: pyarrow's dataset reader skips it, should it ever be left.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _FILE_MODE)  # mkstemp creates 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    _atomic_write_bytes(Path(path), text.encode())


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def write_tsv(path: Path, rows: Iterable[dict[str, Any]], columns: list[str]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(
        buf, fieldnames=columns, delimiter="\t", extrasaction="ignore", lineterminator="\n"
    )
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _tsv_value(row.get(k)) for k in columns})
    atomic_write_text(path, buf.getvalue())


def _tsv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, str):
        return value.replace("\t", " ").replace("\n", " ")
    return value


def write_part(dataset_dir: Path, name: str, rows: list[dict[str, Any]], schema: pa.Schema) -> Path:
    """Write ``rows`` as one part file ``<dataset_dir>/<name>.parquet`` of a Parquet dataset."""
    table = pa.Table.from_pylist(rows, schema=schema)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    path = Path(dataset_dir) / f"{name}.parquet"
    _atomic_write_bytes(path, sink.getvalue().to_pybytes())
    return path


def read_dataset(dataset_dir: Path, schema: pa.Schema):
    """All part files as one pandas DataFrame (empty, with the schema's columns, if none)."""
    dataset_dir = Path(dataset_dir)
    parts = sorted(dataset_dir.glob("*.parquet")) if dataset_dir.is_dir() else []
    if not parts:
        return schema.empty_table().to_pandas()
    return pq.ParquetDataset(dataset_dir, schema=schema).read().to_pandas()
