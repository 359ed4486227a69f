"""Helpers of the integration tests: the CLIs run as a user runs them, in subprocesses."""

import subprocess
from pathlib import Path

from tests.cli import run_module
from tests.conftest import prepare_serial


def run_tune(
    space: str, root: Path, *sets: str, timeout: int = 600, flags: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """``python -m platform.tune --space SPACE --output-root ROOT --set ... FLAGS`` from the repo
    root."""
    args = [a for item in sets for a in ("--set", item)]
    return run_module(
        "platform.tune", "--space", space, "--output-root", root, *args, *flags, timeout=timeout
    )


def smoke_manifest(folder: Path) -> Path:
    """The smoke space's corpus (its ``data:`` section), made and prepared in this process, for
    sweeps that pass ``manifest_path`` instead of preparing it on their cluster (~8 s each)."""
    from data_prep import synth

    synth.make_corpus(folder / "raw", speakers=2, chapters=2, utts=8, seed=0)
    return prepare_serial(folder / "raw", folder / "prepared")
