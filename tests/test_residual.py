"""The residual_dtype key (trainables/model/residual.py): under DDP's bf16 autocast every
LayerNorm of both encoders returns bf16, so the stream between them is bf16; the parameters,
their names and the rest of the engine unchanged; other strategies and precisions record what
their weights compute in."""

import pytest
import torch
from torch import nn

from trainables.config import TrialConfig
from trainables.data.loader import SyntheticSpeechText
from trainables.data.manifest import collate_padded
from trainables.engine import build_engine
from trainables.model.residual import residual_dtype_effective, use_residual_dtype
from trainables.model.stage1 import build_model


def norm_output_dtypes(model: nn.Module) -> set[torch.dtype]:
    """The dtypes every LayerNorm of the encoders returned in the next forward."""
    seen: set[torch.dtype] = set()
    for m in model.modules():
        if isinstance(m, nn.LayerNorm):
            m.register_forward_hook(lambda mod, args, out: seen.add(out.dtype))
    return seen


def batch() -> dict[str, torch.Tensor]:
    ds = SyntheticSpeechText(
        num_items=4, audio_samples=8000, text_tokens=8, vocab_size=1000, seed=0
    )
    return collate_padded([ds[i] for i in range(4)])


def test_bf16_makes_every_layer_norm_return_bf16_under_ddp_and_keeps_the_parameters(
    gloo_world_of_one,
):
    outputs, names = {}, {}
    for dtype in ("fp32", "bf16"):
        cfg = TrialConfig(
            model_size="tiny", proj_dim=16, precision="bf16", use_gpu=False, residual_dtype=dtype
        )
        engine = build_engine(cfg, torch.device("cpu"))
        assert engine.effective["residual_dtype_effective"] == dtype
        assert engine.effective["fallbacks"] == ""
        seen = norm_output_dtypes(engine.bare)
        speech, text, _ = engine(batch())
        assert seen == {torch.float32 if dtype == "fp32" else torch.bfloat16}
        outputs[dtype] = torch.cat([speech, text]).float().detach()
        names[dtype] = list(engine.bare.state_dict())
    assert names["fp32"] == names["bf16"]
    # Another rounding of the stream: close, not equal.
    cosine = nn.functional.cosine_similarity(outputs["fp32"], outputs["bf16"], dim=-1)
    assert not torch.equal(outputs["fp32"], outputs["bf16"]) and cosine.min() > 0.98


def test_a_precision_without_bf16_autocast_falls_back_with_the_reason(gloo_world_of_one):
    cfg = TrialConfig(
        model_size="tiny", proj_dim=16, precision="fp32", use_gpu=False, residual_dtype="bf16"
    )
    engine = build_engine(cfg, torch.device("cpu"))
    assert engine.effective["residual_dtype_effective"] == "fp32"
    assert engine.effective["fallbacks"] == (
        "residual_dtype: bf16 needs precision bf16 (resolved fp32), ran fp32"
    )
    seen = norm_output_dtypes(engine.bare)
    engine(batch())
    assert seen == {torch.float32}


@pytest.mark.parametrize(
    "precision, strategy, load_dtype, requested, expected",
    [
        ("bf16", "ddp", "fp32", "fp32", "fp32"),  # autocast: float32 norms
        ("bf16", "ddp", "fp32", "bf16", "bf16"),
        ("bf16", "ddp", "bf16", "fp32", "bf16"),  # bf16 weights: bf16 norms
        ("bf16", "fsdp2", "fp32", "fp32", "bf16"),  # its mixed precision policy's bf16 weights
        ("bf16", "deepspeed", "bf16", "fp32", "bf16"),
        ("fp16", "ddp", "fp32", "bf16", "fp32"),
        ("fp32", "fsdp2", "fp32", "bf16", "fp32"),
    ],
)
def test_what_each_strategy_and_precision_computes_in(
    precision, strategy, load_dtype, requested, expected
):
    assert residual_dtype_effective(requested, precision, strategy, load_dtype) == expected


def test_a_compiled_layer_keeps_the_cast_in_one_graph():
    model = build_model("tiny", 16)
    # speech: the feature projection's, the encoder's and 2 in each of 2 layers; text: the
    # embeddings' and 2 in each of 2 layers
    assert use_residual_dtype(model, "bf16") == 6 + 5
    layer = model.text.encoder.layer[0]
    x = torch.randn(2, 8, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        explained = torch._dynamo.explain(layer)(x)
        out = layer(x)
    assert explained.graph_break_count == 0 and out[0].dtype == torch.bfloat16
