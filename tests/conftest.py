"""Shared fixtures: a small corpus prepared by data_prep's own per-file code, without Ray. The
machine cache folder (compiled code, FLOPs counts) of every test and every command a test
starts is one folder of this session, not the user's: tests neither read nor leave one there."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from stage1_common.machine_cache import CACHE_ENV

os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="stage1-test-cache-")


def pytest_unconfigure(config):
    shutil.rmtree(os.environ[CACHE_ENV], ignore_errors=True)


def prepare_serial(raw: Path, out: Path, *, trim: bool = True) -> Path:
    """synth corpus at ``raw`` -> data_prep outputs and manifest at ``out`` (the same per-file
    work as the Ray Data pipeline, run in this process)."""
    from data_prep.audio import TrimSettings
    from data_prep.layout import discover
    from data_prep.librispeech import write_outputs
    from data_prep.pipeline import make_tasks, run_serial

    found = discover(raw)
    tasks = make_tasks(
        found.utterances,
        raw,
        out,
        target_sr=16_000,
        trim=trim,
        settings=TrimSettings(),
        force=False,
    )
    manifest = out / "manifest_16k_trim.tsv"
    write_outputs(manifest, out, found, list(run_serial(tasks)))
    return manifest


@pytest.fixture(scope="session")
def prepared_corpus(tmp_path_factory):
    """(manifest path, synth utterances): 12 utterances, 2-20 s, prepared to 16 kHz."""
    from data_prep import synth

    root = tmp_path_factory.mktemp("prepared")
    made = synth.make_corpus(root / "raw", speakers=2, chapters=2, utts=3, seed=5)
    return prepare_serial(root / "raw", root / "out"), made
