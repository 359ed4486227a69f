"""What an output root holds, as a comparable record: every file (names that carry a time stamp,
a hash or a counter are folded into a pattern) with its columns (Parquet schema, CSV/TSV
header) or top-level JSON keys.

The integration tests compare a fresh smoke sweep's and a train_smoke run's layout with the one
recorded before the restructuring of issue 23 (``tests/data/layout_*.json``), so a refactor that
drops, renames or reshapes a file fails. ``RECORD_OUTPUT_LAYOUT=1`` writes the record instead
(that is how the committed files were made, on the commit before the change).

Changed on purpose since (edited by hand, so the diff shows it): issue 24 added the manifest's
``executor``, ``resident_group`` and ``compile_cache`` columns and the sweep's ``groups.json``;
a resident sweep run has no Ray Train storage marker of its own (its group's is under tune/).
Issue 24 also added the timing columns ``cpu_ms_mean``, ``gc_ms`` and ``gc_collections``.
Issue 25 moved DDP's model and optimizer out of ``state.pt`` into ``dcp-*/`` (DCP), added the
done files' and ``meta.json``'s times and folder name, ``checkpoints.parquet``'s
``checkpoint_block_s`` and ``checkpoint_wait_s``, and the manifest's overhead shares and
``checkpoint_mode``. Issue 27 added ``summary.json``'s ``written_by`` (the version that wrote it).
Issue 40 moved the FLOPs cache (``cache/flops-*.json``) out of the output root into the machine's
cache folder, added the config key ``compile_cache_dir`` and the manifest's ``compile_parts``.
Issue 43 added ``checkpoints.parquet``'s ``checkpoint_registered`` (false: overtaken, deleted).
Issue 42 added the config key ``profile_steps`` (a manifest column like every key).
Issue 53 added the timing columns ``recompiles``, ``graph_breaks``, ``cudagraph_records``,
``cudagraph_skips`` and ``cliff_reason``, the manifest's and per_run_metrics.csv's ``cliff`` and
summary.json's ``cliffs``; issue 53 item 5 added summary.json's ``calibration``, item 6
schedule.json's ``readmitted``, and the config key ``intra_op_threads`` with the manifest's
``intra_op_threads_effective``. Issue 54 item 6 added summary.json's ``partial``. Issue 56 added
the config key ``dropout``; issue 57 summary.json's ``confidence`` and ranked_groups.csv's
``p_fastest``, ``vs_best_low`` and ``vs_best_high``, and summary.json's ``budget``; issue 58
the root's ``catalogue.parquet`` (the sweep's rows of the machine's catalogue). Issue 56's
duration batches added the config keys ``batching``, ``batch_audio_s`` and ``batch_max_pad`` and
per_run_metrics.csv's ``tail_audio_s_per_s``; its convolution levers the config keys
``pos_conv`` and ``extractor_layout``. Issue 57's GPU check added the manifest's and the
catalogue's ``compile_in_windows_s`` (seconds compiled inside the timed windows). Issue 58's
pooled ranking (``--history confirm``) added group_summary.csv's and ranked_groups.csv's
``runs_catalogue`` and ``catalogue_sweeps``, best_config.json's ``runs_catalogue`` and
summary.json's ``pooled``; its review the catalogue's ``git_commit`` and ``manifest_path`` (what
a prior must share with the sweep to be pooled). Issue 56's Triton GroupNorm added the config key
``extractor_norm`` and the manifest's ``extractor_norm_effective``; its q/k/v fusion the config
key ``compile_fuse_linears``; its compiled positional convolution the config key
``compile_pos_conv``; its masks without a host sync the config key ``padding_masks``; its bf16 residual stream the config key
``residual_dtype`` and the manifest's ``residual_dtype_effective``.
"""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path

import pyarrow.parquet as pq

__all__ = ["check_layout", "differences", "layout"]

RECORDS = Path(__file__).resolve().parent / "data"
SKIPPED = ("data/", "tune/")  # the generated corpus; Ray Tune's own experiment state
FOLDS = [
    (re.compile(r"^(.*\.parquet)/[^/]+\.parquet$"), r"\1/*.parquet"),  # part files
    (re.compile(r"^cache/flops-[0-9a-f]+\.json$"), "cache/flops-*.json"),
    (re.compile(r"^tokenizers/.+\.json$"), "tokenizers/*.json"),
    (re.compile(r"events\.out\.tfevents\..*$"), "events.out.tfevents.*"),
    (re.compile(r"checkpoint_step\d+"), "checkpoint_step*"),
    (re.compile(r"/dcp-[0-9a-f]+/"), "/dcp-*/"),  # a new DCP folder name for every save
]
NO_KEYS = ("tokenizers/", "cache/", "/export/")  # JSON whose keys are data, not a format


def _fold(rel: str) -> str:
    for pattern, repl in FOLDS:
        rel = pattern.sub(repl, rel)
    return rel


def _columns(path: Path, rel: str) -> list[str]:
    if path.suffix == ".parquet":
        return list(pq.read_schema(path).names)
    if path.suffix in (".csv", ".tsv"):
        with path.open(newline="") as f:
            return next(csv.reader(f, delimiter="\t" if path.suffix == ".tsv" else ","), [])
    if path.suffix == ".json" and not any(part in rel for part in NO_KEYS):
        data = json.loads(path.read_text())
        return sorted(data) if isinstance(data, dict) else []
    return []


def layout(root: Path) -> dict[str, list[str]]:
    """Folded relative path -> its columns or keys, for every file under ``root``."""
    out: dict[str, list[str]] = {}
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(SKIPPED):
            continue
        folded = _fold(rel)
        cols = _columns(path, rel)
        if folded in out and out[folded] != cols:  # part files that disagree: their union
            cols = sorted(set(out[folded]) | set(cols))
        out[folded] = cols
    return out


def differences(recorded: dict[str, list[str]], now: dict[str, list[str]]) -> list[str]:
    """One line per file that is missing, new, or whose columns changed."""
    out = [f"missing: {p}" for p in sorted(set(recorded) - set(now))]
    out += [f"new: {p}" for p in sorted(set(now) - set(recorded))]
    for p in sorted(set(recorded) & set(now)):
        if recorded[p] != now[p]:
            gone = [c for c in recorded[p] if c not in now[p]]
            added = [c for c in now[p] if c not in recorded[p]]
            out.append(f"{p}: columns changed (gone {gone}, added {added}, or reordered)")
    return out


def check_layout(root: Path, name: str) -> list[str]:
    """The differences between ``root`` and ``tests/data/layout_<name>.json``; with
    RECORD_OUTPUT_LAYOUT=1 the record is (re)written from ``root`` first."""
    record = RECORDS / f"layout_{name}.json"
    now = layout(root)
    if os.environ.get("RECORD_OUTPUT_LAYOUT") == "1":
        record.write_text(json.dumps(now, indent=1, sort_keys=True) + "\n")
    return differences(json.loads(record.read_text()), now)
