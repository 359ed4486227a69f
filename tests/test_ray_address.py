"""--address is checked before ray.init, which would retry for minutes where nothing answers,
and before anything is written. A cluster that refuses the driver's token:
tests/integration/test_multinode.py."""

import socket
import time
from concurrent.futures import ThreadPoolExecutor

from stage1_common.ray_address import address_problem
from tests.cli import run_module


def test_an_address_is_host_port_with_a_listener():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert address_problem(f"ray://127.0.0.1:{port}") is None  # Ray Client: a listener
    assert "nothing answers at 127.0.0.1:" in address_problem(f"127.0.0.1:{port}")
    assert address_problem(None) is None and address_problem("auto") is None
    for bad in ("headnode", "10.0.0.5:", ":6379", "10.0.0.5:99999", "h:port"):
        assert "is not HOST:PORT" in address_problem(bad), bad


def _refusal(out, root) -> str:
    """The one console line of a refused --address: exit 2, no Ray retry line, no folder."""
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "gcs_client.cc" not in out.stdout + out.stderr
    assert not root.exists()  # nothing written before the cluster answered
    (line,) = out.stderr.strip().splitlines()
    return line


def test_tune_tells_nothing_listening_from_no_ray_there_in_one_line_each(tmp_path):
    # As a user would: the CLI with --address of a closed loopback port, and of a port where
    # something listens that is no Ray GCS (ray.init retried there for minutes, a gcs_client.cc
    # line each time, and left an empty output root).
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = closed.getsockname()[1]
    with socket.socket() as other, ThreadPoolExecutor(2) as pool:
        other.bind(("127.0.0.1", 0))
        other.listen()
        alive = other.getsockname()[1]

        def tune(port: int, name: str):
            args = ("--space", "smoke", "--address", f"127.0.0.1:{port}")
            return run_module("platform.tune", *args, "--output-root", tmp_path / name, timeout=90)

        t0 = time.monotonic()
        nothing, no_ray = pool.map(tune, (dead, alive), ("a", "b"))
        took_s = time.monotonic() - t0
    line = _refusal(nothing, tmp_path / "a")
    assert line.startswith(f"platform.tune: error: cannot reach Ray at --address 127.0.0.1:{dead}")
    assert "nothing answers" in line and "`ray start --head` runs there" in line
    line = _refusal(no_ray, tmp_path / "b")
    assert f"--address 127.0.0.1:{alive}: something listens there but no Ray GCS" in line
    assert "no answer within 3 s" in line and "`ray start --head` printed" in line
    assert took_s < 60


def test_data_prep_refuses_an_unreachable_address_in_seconds(tmp_path):
    from data_prep import synth

    synth.make_corpus(tmp_path / "raw", speakers=1, chapters=1, utts=1, seed=0)
    t0 = time.monotonic()
    out = run_module(
        "data_prep.librispeech",
        "--input-root",
        tmp_path / "raw",
        "--output-root",
        tmp_path / "out",
        "--address",
        "127.0.0.1:1",
    )
    assert time.monotonic() - t0 < 30
    line = _refusal(out, tmp_path / "out")
    assert line.startswith(
        "data_prep.librispeech: error: cannot reach Ray at --address 127.0.0.1:1"
    )
