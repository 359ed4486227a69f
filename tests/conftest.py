"""Shared fixtures: a small corpus prepared by data_prep's own per-file code, without Ray. The
machine cache folder (compiled code, FLOPs counts) of every test and every command a test
starts is one folder of this session, not the user's: tests neither read nor leave one there."""

import os
import shutil
import socket
import tempfile

import pytest

from stage1_common.machine_cache import CACHE_ENV

os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="stage1-test-cache-")


def pytest_unconfigure(config):
    shutil.rmtree(os.environ[CACHE_ENV], ignore_errors=True)


@pytest.fixture(scope="session")
def prepared_corpus(tmp_path_factory):
    """(manifest path, synth utterances): 12 utterances, 2-20 s, prepared to 16 kHz."""
    from data_prep import synth
    from data_prep.librispeech import prepare_serial

    root = tmp_path_factory.mktemp("prepared")
    made = synth.make_corpus(root / "raw", speakers=2, chapters=2, utts=3, seed=5)
    return prepare_serial(root / "raw", root / "out"), made


@pytest.fixture
def gloo_world_of_one():
    """A gloo process group of one rank on a free port (RANK/WORLD_SIZE/LOCAL_RANK set as a
    launcher sets them: DeepSpeed reads them), destroyed after the test."""
    import torch.distributed as dist

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"
    )
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
