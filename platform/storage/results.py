"""Files of an output root: the Parquet schemas, atomic writes and the readers of what was
written. Every write goes to a temporary name in the same folder and is then renamed, so a crash
or Ctrl-C never leaves a truncated file behind. The files' names live in
``stage1_common.output_root.OutputRoot``; the constants here are aliases of them."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from platform.errors import UsageError
from stage1_common.fileio import atomic_write_bytes, atomic_write_text, tsv_text, write_json
from stage1_common.output_root import OutputRoot

__all__ = [
    "DATASETS",
    "GPU_TELEMETRY_SCHEMA",
    "HOST_TELEMETRY_SCHEMA",
    "TIMING_SCHEMA",
    "atomic_write_text",
    "read_dataset",
    "read_json",
    "read_manifest",
    "write_json",
    "write_part",
    "write_tsv",
]

TIMING_DIR = OutputRoot.TIMING
GPU_TELEMETRY_DIR = OutputRoot.GPU_TELEMETRY
HOST_TELEMETRY_DIR = OutputRoot.HOST_TELEMETRY
VALIDATION_DIR = OutputRoot.VALIDATION
CHECKPOINTS_DIR = OutputRoot.CHECKPOINTS
TENSORBOARD_DIR = OutputRoot.TENSORBOARD
MANIFEST = OutputRoot.MANIFEST
BEST_CONFIG = OutputRoot.BEST_CONFIG

# What a run actually used, as its workers report it (requested values are in its config).
EFFECTIVE_KEYS = (
    "strategy_effective",
    "precision_effective",
    "speech_attention_effective",
    "text_attention_effective",
    "model_load_dtype_effective",
    "compile_effective",
    "telemetry_effective",
    "intra_op_threads_effective",
    "extractor_norm_effective",
    "residual_dtype_effective",
    "fallbacks",
    "missing_files",
    "resident_group",
    "checkpoint_mode",
)

# What a training run's manifest row adds (platform.train; empty for sweep runs).
# Where each rank of a run ran ("0=10.0.0.5 1=10.0.0.6"), and on how many nodes.
PLACEMENT_KEYS = ("rank_nodes", "nodes_used")

# Where a run's start-up went ("ray_workers=4.1 loader_start=0.3 imports=3.9 ...", seconds per
# part, trainables/observe/startup.py: StartupClock), and the compile warm-up ahead of the timed
# windows: its seconds, where they went ("trace=6.0 guards=1.1 backend=4.9 dynamo_other=0.3
# passes=8.2", trainables/engine/compile.py: compile_parts) and what the compile caches held;
# and the seconds the run compiled in its timed windows (no warm-up, a recompile: trainables/
# engine/compile_watch.py), its last window's.
STARTUP_KEYS = (
    "startup_breakdown",
    "compile_s",
    "compile_parts",
    "compile_cache",
    "compile_in_windows_s",
)

TRAINING_KEYS = (
    "restarts",
    "resumed_from_step",
    "checkpoints",
    "last_checkpoint",
    "best_checkpoint_metric",
    "val_mean_r1_last",
    # Training time held by checkpoints (checkpoint_block_s) and spent in validation (val_s),
    # as shares of the time in steps; the run's end waiting for its last save, in seconds.
    "ckpt_overhead_share",
    "val_overhead_share",
    "ckpt_end_wait_s",
)

# One row per reported window. Fixed schema, so every part file of the dataset agrees.
TIMING_SCHEMA = pa.schema(
    [
        ("run", pa.string()),
        ("group", pa.string()),
        ("repeat", pa.int32()),
        ("attempt", pa.int32()),
        ("rank", pa.int32()),
        # Where the rank ran: Ray's node IP and node id (raylets of one machine share a hostname).
        ("node", pa.string()),
        ("node_id", pa.string()),
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
        ("cpu_ms_mean", pa.float64()),
        ("gc_ms", pa.float64()),
        ("gc_collections", pa.int32()),
        # What torch's compiler did in the window's steps (trainables/engine/compile_watch.py):
        # frames compiled again, graph breaks met, CUDA graphs recorded again and skipped, and
        # the first reason torch gave.
        ("recompiles", pa.int32()),
        ("graph_breaks", pa.int32()),
        ("cudagraph_records", pa.int32()),
        ("cudagraph_skips", pa.int32()),
        ("cliff_reason", pa.string()),
        ("rank_skew", pa.float64()),
        ("eta_s", pa.float64()),
        ("loss", pa.float64()),
        ("lr", pa.float64()),
        ("epoch", pa.int32()),
        ("startup_s", pa.float64()),
        ("elapsed_s", pa.float64()),
        ("window_end_ts", pa.float64()),
    ]
)


_RUN_KEYS = [("run", pa.string()), ("group", pa.string()), ("repeat", pa.int32())]

# One row per NVML sample of one GPU (trainables/observe/telemetry.py: NvmlGpu).
GPU_TELEMETRY_SCHEMA = pa.schema(
    [
        *_RUN_KEYS,
        ("rank", pa.int32()),
        ("node", pa.string()),
        ("node_id", pa.string()),
        ("gpu_index", pa.int32()),
        ("gpu_uuid", pa.string()),
        ("ts", pa.float64()),
        ("util_gpu_pct", pa.float64()),
        ("util_mem_pct", pa.float64()),
        ("mem_used_mib", pa.float64()),
        ("power_w", pa.float64()),
        ("sm_clock_mhz", pa.float64()),
        ("mem_clock_mhz", pa.float64()),
        ("temp_c", pa.float64()),
        ("throttle_reasons", pa.int64()),
        ("energy_j", pa.float64()),
    ]
)

# One row per host sample of one node (trainables/observe/telemetry.py: HostSampler).
HOST_TELEMETRY_SCHEMA = pa.schema(
    [
        *_RUN_KEYS,
        ("rank", pa.int32()),
        ("node", pa.string()),
        ("node_id", pa.string()),
        ("ts", pa.float64()),
        ("mem_total_mib", pa.float64()),
        ("mem_available_mib", pa.float64()),
        ("swap_total_mib", pa.float64()),
        ("swap_used_mib", pa.float64()),
        ("load_1", pa.float64()),
        ("load_5", pa.float64()),
        ("load_15", pa.float64()),
        ("trainer_pids", pa.int32()),
        ("trainer_procs", pa.int32()),
        ("trainer_rss_mib", pa.float64()),
        ("trainer_vsz_mib", pa.float64()),
    ]
)

# One row per validation of a training run (trainables/validation.py).
VALIDATION_SCHEMA = pa.schema(
    [
        *_RUN_KEYS,
        ("attempt", pa.int32()),
        ("step", pa.int64()),
        ("epoch", pa.int32()),
        ("val_loss", pa.float64()),
        ("val_s2t_r1", pa.float64()),
        ("val_s2t_r5", pa.float64()),
        ("val_t2s_r1", pa.float64()),
        ("val_t2s_r5", pa.float64()),
        ("val_mean_r1", pa.float64()),
        ("val_items", pa.int64()),
        ("val_chance_r1", pa.float64()),
        ("val_s", pa.float64()),
        ("window_end_ts", pa.float64()),
    ]
)

# One row per checkpoint of a training run (trainables/checkpoint/files.py), recorded at the window
# where it was complete on every rank; the slowest rank's times: checkpoint_save_s from its start
# to its files being whole, checkpoint_block_s training held by it (the call, the staging copy,
# the next save waiting for it), checkpoint_wait_s the run's end waiting for it.
# checkpoint_registered: given to Ray Train (kept under keep_checkpoints), or false: a newer one
# was complete at the same window (an asynchronous save and the run's last), so this one was
# recorded and deleted.
CHECKPOINTS_SCHEMA = pa.schema(
    [
        *_RUN_KEYS,
        ("attempt", pa.int32()),
        ("step", pa.int64()),
        ("checkpoint_save_s", pa.float64()),
        ("checkpoint_block_s", pa.float64()),
        ("checkpoint_wait_s", pa.float64()),
        ("checkpoint_size_bytes", pa.int64()),
        ("checkpoint_score", pa.float64()),
        ("checkpoint_path", pa.string()),
        ("checkpoint_registered", pa.bool_()),
        ("window_end_ts", pa.float64()),
    ]
)

# Parquet datasets the recorder writes, by the kind of row.
DATASETS = {
    "timing": (TIMING_DIR, TIMING_SCHEMA),
    "gpu": (GPU_TELEMETRY_DIR, GPU_TELEMETRY_SCHEMA),
    "host": (HOST_TELEMETRY_DIR, HOST_TELEMETRY_SCHEMA),
    "validation": (VALIDATION_DIR, VALIDATION_SCHEMA),
    "checkpoints": (CHECKPOINTS_DIR, CHECKPOINTS_SCHEMA),
}


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


def next_part(dataset_dir: Path, run: str) -> int:
    """The number of the next part file of ``run`` (a resumed training run adds to its
    earlier attempts' parts instead of overwriting them)."""
    numbers = [
        int(p.stem.rsplit("-", 1)[1])
        for p in Path(dataset_dir).glob(f"{run}-*.parquet")
        if p.stem.rsplit("-", 1)[1].isdigit()
    ]
    return max(numbers, default=-1) + 1


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file's object; {} when it is missing or unreadable (files of an older or
    interrupted sweep)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def read_dataset(dataset_dir: Path, schema: pa.Schema) -> pd.DataFrame:
    """All part files as one pandas DataFrame (empty, with the schema's columns, if none)."""
    dataset_dir = Path(dataset_dir)
    parts = sorted(dataset_dir.glob("*.parquet")) if dataset_dir.is_dir() else []
    if not parts:
        return schema.empty_table().to_pandas()
    return pq.ParquetDataset(dataset_dir, schema=schema).read().to_pandas()


def read_manifest(root: OutputRoot) -> pd.DataFrame:
    """A sweep's run manifest (one row per run); UsageError when the folder holds no sweep or
    the file is not a run manifest."""
    if not root.manifest.is_file():
        raise UsageError(
            f"{root} holds no sweep ({MANIFEST} is missing); give the output root "
            "of a platform.tune sweep"
        )
    try:
        manifest = pd.read_csv(root.manifest, sep="\t")
    except (ValueError, OSError) as exc:
        raise UsageError(
            f"{root.manifest} cannot be read ({exc}); rerun the sweep with --resume"
        ) from None
    missing = [c for c in ("run", "group", "repeat", "status") if c not in manifest]
    if missing:
        raise UsageError(
            f"{root.manifest} lacks column(s) {', '.join(missing)}; it is not a run manifest"
        )
    return manifest
