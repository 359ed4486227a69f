"""FLOP counting and the peak table behind MFU."""

import math

import pytest
import torch

from trainables.config import TrialConfig
from trainables.engine.mfu import PEAK_TFLOPS, flops_per_sample, peak_tflops
from trainables.engine.shapes import probe_batch
from trainables.model.stage1 import build_model


def test_flops_grow_with_audio_length_and_grads_are_cleared():
    torch.manual_seed(0)
    model = build_model("tiny", 16)
    cpu = torch.device("cpu")
    short = flops_per_sample(model, probe_batch(TrialConfig(audio_s=1.0), cpu))
    long = flops_per_sample(model, probe_batch(TrialConfig(audio_s=4.0), cpu))
    assert short > 0 and 3.0 < long / short < 4.5  # mostly linear in audio (conv front end)
    assert all(p.grad is None for p in model.parameters())


def test_probe_batch_uses_the_mean_crop():
    cpu = torch.device("cpu")
    cfg = TrialConfig(dataset="manifest", min_audio_s=1.0, max_audio_s=3.0, text_tokens=20)
    batch = probe_batch(cfg, cpu)
    assert batch["audio"].shape == (2, 32_000) and batch["input_ids"].shape == (2, 20)
    fixed = TrialConfig(dataset="manifest", crop_policy="fixed_slice", fixed_slice_s=1.5)
    assert probe_batch(fixed, cpu)["audio"].shape == (2, 24_000)


def test_peak_table():
    assert math.isnan(peak_tflops(torch.device("cpu"), "fp32"))
    names = [name for name, _ in PEAK_TFLOPS]
    assert names.index("H100 PCIe") < names.index("H100")  # the more specific name first
    assert dict(PEAK_TFLOPS)["H100"]["bf16"] == pytest.approx(989.0)
