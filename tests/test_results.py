"""Output-root files: atomic writes, fixed-schema Parquet datasets, TSV."""

import os
import stat

import pandas as pd
import pyarrow as pa
import pytest

from platform.storage import results


def timing_row(run, window, **extra):
    row = {name: None for name in results.TIMING_SCHEMA.names}
    row.update(
        run=run,
        group=run[:-3],
        repeat=1,
        rank=0,
        window=window,
        step=5 * (window + 1),
        iter_ms_p50=10.0 + window,
        samples_per_s=100.0,
    )
    row.update(extra)
    return row


def test_parts_read_back_as_one_dataset_and_temp_files_are_ignored(tmp_path):
    ds = tmp_path / "timing.parquet"
    results.write_part(
        ds, "a_r1-00000", [timing_row("a_r1", 0), timing_row("a_r1", 1)], results.TIMING_SCHEMA
    )
    results.write_part(ds, "b_r1-00000", [timing_row("b_r1", 0, loss=2.5)], results.TIMING_SCHEMA)
    (ds / ".b_r1-00001.parquet.x.tmp").write_bytes(b"half a file")  # left by a crash
    df = pd.read_parquet(ds)
    assert sorted(df["run"]) == ["a_r1", "a_r1", "b_r1"]
    assert list(df.columns) == results.TIMING_SCHEMA.names
    assert df.loc[df["run"] == "b_r1", "loss"].item() == 2.5
    assert results.read_dataset(ds, results.TIMING_SCHEMA).shape == (3, len(results.TIMING_SCHEMA))


def test_read_dataset_of_a_missing_folder_is_empty_with_columns(tmp_path):
    df = results.read_dataset(tmp_path / "nope", results.TIMING_SCHEMA)
    assert df.empty and list(df.columns) == results.TIMING_SCHEMA.names


def test_rows_with_wrong_types_are_refused_not_coerced(tmp_path):
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        results.write_part(
            tmp_path, "x", [timing_row("a_r1", 0, step="five")], results.TIMING_SCHEMA
        )
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "run_manifest.tsv"
    results.atomic_write_text(path, "old\n")

    class Boom:
        def get(self, key):
            raise RuntimeError("crash while writing")

    with pytest.raises(RuntimeError):
        results.write_tsv(path, [Boom()], ["a"])
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["run_manifest.tsv"]


def test_written_files_follow_the_umask_not_mkstemps_0600(tmp_path):
    path = tmp_path / "x.json"
    results.write_json(path, {"a": 1})
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask


def test_tsv_escapes_tabs_and_blanks_none(tmp_path):
    path = tmp_path / "m.tsv"
    results.write_tsv(path, [{"a": "x\ty", "b": None, "c": 0.123456789}], ["a", "b", "c"])
    assert path.read_text() == "a\tb\tc\nx y\t\t0.123457\n"
