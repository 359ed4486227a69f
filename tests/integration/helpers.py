"""Helpers of the integration tests: the CLIs run as a user runs them, in subprocesses."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_tune(
    space: str, root: Path, *sets: str, timeout: int = 600, flags: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """``python -m platform.tune --space SPACE --output-root ROOT --set ... FLAGS`` from the repo
    root."""
    args = [a for item in sets for a in ("--set", item)]
    cmd = [
        sys.executable,
        "-m",
        "platform.tune",
        "--space",
        space,
        "--output-root",
        str(root),
        *args,
        *flags,
    ]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
