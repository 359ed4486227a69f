"""What the Triton kernels' tests share (tests/test_norm_gelu.py, tests/test_folded_layer.py):
a small wav2vec2 feature encoder, and a script run in a subprocess under Triton's interpreter
(``TRITON_INTERPRET`` is read when the kernels are defined, so it cannot be set in the test's
own process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from transformers import Wav2Vec2Config, Wav2Vec2Model

from trainables.model.extractor import MatmulFeatureEncoder

ROOT = Path(__file__).resolve().parents[1]

# A feature encoder of three 64-channel layers, the first with its GroupNorm (one per channel).
SMALL = dict(
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=64,
    conv_dim=(64,) * 3,
    conv_kernel=(10, 3, 2),
    conv_stride=(5, 2, 2),
)


def small_encoder(**config) -> MatmulFeatureEncoder:
    """SMALL's feature encoder as the GEMM encoder, ``config`` changing transformers' keys."""
    return MatmulFeatureEncoder(Wav2Vec2Model(Wav2Vec2Config(**SMALL, **config)).feature_extractor)


def run_interpreted(script: str) -> str:
    """Run ``script`` (with ``SMALL`` defined) under Triton's interpreter; its stdout, after
    asserting it exited 0."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", f"SMALL = {SMALL!r}\n{script}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
