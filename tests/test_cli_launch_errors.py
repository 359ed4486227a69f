"""Each CLI's error lines carry its own name, those of the launcher it shares with the other
(platform/execution/launch.py) too: ``platform.train: error: ...``, never ``platform.tune``."""

import subprocess
import sys

import pytest

from tests.cli import ROOT, run_module

# Runs main() of the CLI named in argv[1] like `python -m` does, with something listening at
# the --address that the check before Ray takes for a GCS, and a Ray that cannot be joined there
# (as when the head went away after the check): the launcher's own "cannot reach Ray" line.
PROBE = """\
import importlib, socket, sys

import platform.execution.cluster as cluster
import stage1_common.ray_address as ray_address

ray_address._ask_gcs = lambda target: {"code": "OK"}


def unreachable(**_):
    raise ConnectionError("no GCS answered")


cluster.start_cluster = unreachable
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen()
address = f"127.0.0.1:{listener.getsockname()[1]}"
cli = importlib.import_module(sys.argv[1])
sys.exit(cli.main([*sys.argv[2:], "--address", address]))
"""


def test_train_refuses_an_address_where_nothing_listens_in_its_own_name(tmp_path):
    root = tmp_path / "out"
    out = run_module(
        "platform.train",
        "--space",
        "train_smoke",
        "--address",
        "127.0.0.1:1",
        "--output-root",
        root,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("platform.train: error: cannot reach Ray at --address 127.0.0.1:1")
    assert not root.exists()


@pytest.mark.parametrize(
    ("cli", "space"), [("platform.train", "train_smoke"), ("platform.tune", "smoke")]
)
def test_the_launcher_names_the_cli_that_called_it(cli, space, tmp_path, prepared_corpus):
    # A manifest of its own: no corpus of the data: section to make before the launcher connects.
    manifest, _ = prepared_corpus
    data = [f"manifest_path={manifest}", "micro_batch=2", "val_speakers=1"]
    args = [cli, "--space", space, "--output-root", tmp_path / "out"]
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *args, *(a for s in data for a in ("--set", s))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 2, out.stderr
    errors = [line for line in out.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, out.stderr
    assert errors[0].startswith(f"{cli}: error: cannot reach Ray at --address 127.0.0.1:")
    assert "(no GCS answered)" in errors[0]
    assert not (tmp_path / "out").exists()  # made once the check passed, gone with the refusal
