"""--address is checked before ray.init, which would retry for minutes where nothing answers."""

import socket
import time

from stage1_common.ray_address import address_problem
from tests.cli import run_module


def test_an_address_with_a_listener_passes_and_a_closed_port_does_not():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert address_problem(f"127.0.0.1:{port}") is None
        assert address_problem(f"ray://127.0.0.1:{port}") is None
    assert "nothing answers at 127.0.0.1:" in address_problem(f"127.0.0.1:{port}")
    assert address_problem(None) is None and address_problem("auto") is None
    for bad in ("headnode", "10.0.0.5:", ":6379", "10.0.0.5:99999", "h:port"):
        assert "is not HOST:PORT" in address_problem(bad), bad


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
    assert out.returncode == 2 and time.monotonic() - t0 < 30
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(
        "data_prep.librispeech: error: cannot reach Ray at --address 127.0.0.1:1"
    )
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
