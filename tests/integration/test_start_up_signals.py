"""Issue 54 item 5: a stop signal during the driver's start-up (the space's corpus being made)
stops it within seconds, as the signal's exit code, keeping what was prepared and printing the
command that goes on. SIGTERM to the whole group (a job's time limit) ended the driver with
Ray's C++ stack dump; SIGINT in a command that inherited it ignored (a script's background
job: bash ignores SIGINT there) was ignored until the sweep ended."""

import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from tests.cli import ROOT

pytestmark = pytest.mark.integration


def _stop_during_data_prep(root, sig, ignore_sigint: bool) -> tuple[int, float, str]:
    """The smoke space's sweep in a process group of its own; ``sig`` to the whole group once
    its corpus is being made. (exit code, seconds to exit, console)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "platform.tune", "--space", "smoke", "--output-root", str(root)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        if ignore_sigint
        else None,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("data: "):
            break
    time.sleep(0.5)  # inside the preparation
    sent = time.monotonic()
    os.killpg(proc.pid, sig)
    try:
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, time.monotonic() - sent, "".join(lines) + out


def test_sigterm_to_the_group_during_data_prep_stops_the_start_up(tmp_path):
    """SIGINT inherited ignored is the same handler (tests/test_start_up_signals.py)."""
    root, sig, code = tmp_path / "out", signal.SIGTERM, 143
    got, took_s, console = _stop_during_data_prep(root, sig, ignore_sigint=False)
    assert got == code, console[-3000:]
    assert took_s < 45, (took_s, console[-3000:])
    assert "SIGTERM received" not in console and "Traceback" not in console, console[-3000:]
    (line,) = [ln for ln in console.splitlines() if "before any run started" in ln]
    assert f"interrupted by {signal.Signals(sig).name} before any run started" in line
    printed = shlex.split(line.split("finish with: ", 1)[1])
    assert printed == [
        "python", "-m", "platform.tune", "--space", "smoke", "--output-root", str(root), "--resume",
    ]  # fmt: skip
    assert (root / "data").is_dir() and not (root / "run_manifest.tsv").exists()
