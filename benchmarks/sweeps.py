"""Shared by the benchmarks that compare variants inside one sweep of ``platform.tune``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

__all__ = ["prepared_synth_corpus", "run_variants"]


def prepared_synth_corpus(out: Path, *synth_args: str) -> Path:
    """``python -m data_prep.synth SYNTH_ARGS`` into ``out/raw``, prepared by data_prep on a
    local Ray into ``out/prepared`` (once: an existing manifest is reused); the manifest."""
    manifest = out / "prepared" / "manifest_16k_trim.tsv"
    if manifest.is_file():
        return manifest
    root = Path(__file__).resolve().parents[1]
    synth = [sys.executable, "-m", "data_prep.synth", "--output-root", str(out / "raw")]
    subprocess.run([*synth, *synth_args], cwd=root, check=True)
    subprocess.run(
        [sys.executable, "-m", "data_prep.librispeech", "--input-root", str(out / "raw"),
         "--output-root", str(out / "prepared"), "--trim", "--manifest-path", str(manifest),
         "--log-every", "1000"],
        cwd=root, check=True,
    )  # fmt: skip
    return manifest


def run_variants(
    prog: str, space: str, output_root: Path, sets: list[str]
) -> tuple[list[str], int, bool]:
    """Run ``python -m platform.tune --space SPACE --output-root ROOT --set ...`` (progress on
    the console); returns the command, its exit code, and whether it wrote a manifest to
    compare (if not, after one line on stderr; platform.tune said why)."""
    cmd = [sys.executable, "-m", "platform.tune", "--space", space]
    cmd += ["--output-root", str(output_root)]
    for item in sets:
        cmd += ["--set", item]
    print("running:", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, check=False)
    if not (output_root / "run_manifest.tsv").is_file():
        print(f"{prog}: the sweep wrote no manifest (exit {done.returncode})", file=sys.stderr)
        return cmd, done.returncode, False
    return cmd, done.returncode, True
