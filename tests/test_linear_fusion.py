"""compile_fuse_linears (trainables/engine/linear_fusion.py): the fusion pass on real
transformers layers (traced by dynamo, the graph Inductor's pre-grad pass gets), its numbers
against eager, the key's check and its per-run setting."""

import pytest
import torch
from torch import nn

from trainables.config import ConfigError, TrialConfig
from trainables.engine.linear_fusion import FuseSharedInputLinears


def _traced_with_the_pass(module: nn.Module, *inputs) -> tuple[torch.Tensor, list[int]]:
    """``module(*inputs)`` through dynamo with a backend that runs the pass on each graph it
    gets and then the graph as it is (eager): the pass's groups per graph, and the output."""
    import torch._dynamo

    torch._dynamo.reset()
    fused: list[int] = []

    def backend(gm: torch.fx.GraphModule, example_inputs):
        fusion = FuseSharedInputLinears()
        fusion(gm.graph)
        gm.graph.lint()
        gm.recompile()
        fused.append(fusion.fused)
        return gm.forward

    return torch.compile(module, backend=backend)(*inputs), fused


def _grads(module: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in module.parameters() if p.grad is not None]


@pytest.mark.parametrize("encoder", ["speech", "text"])
def test_each_attention_s_q_k_v_become_one_linear_with_the_same_output_and_gradients(encoder):
    from trainables.model.stage1 import build_model

    torch.manual_seed(0)
    model = build_model("tiny", 16, dropout=0.0)  # the same math both ways, no random masks
    if encoder == "speech":
        layer = model.speech.encoder.layers[0]
        inputs = (torch.randn(2, 7, 32),)
    else:
        layer = model.text.encoder.layer[0]
        inputs = (torch.randn(2, 5, 32),)
    expected = layer(*inputs)[0]
    expected.square().sum().backward()
    eager_grads = _grads(layer)
    layer.zero_grad(set_to_none=True)

    out, fused = _traced_with_the_pass(layer, *inputs)
    out = out[0]
    assert fused == [1]  # q, k, v: one group; the output projection and FFN read other inputs
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    out.square().sum().backward()
    grads = _grads(layer)
    assert len(grads) == len(eager_grads)  # every parameter still gets its gradient
    for got, want in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_linears_of_different_inputs_or_bias_kinds_are_left_apart():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)  # one input, both biased: fused
            self.c = nn.Linear(8, 8, bias=False)  # the same input, no bias: apart
            self.d = nn.Linear(8, 8)  # another input: apart

        def forward(self, x):
            return self.a(x).sum(-1) + self.b(x).sum(-1) + self.c(x).sum(-1) + self.d(2 * x).sum(-1)

    torch.manual_seed(0)
    block, x = Block(), torch.randn(3, 8)
    out, fused = _traced_with_the_pass(block, x)
    assert fused == [1]
    torch.testing.assert_close(out, block(x))


@pytest.mark.parametrize("between", ["in_place_add", "no_grad"])
def test_linears_with_a_mutation_or_a_mode_switch_between_them_are_left_apart(between):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            h = x * 2
            a = self.a(h)
            if between == "in_place_add":
                h.add_(1)  # b reads the changed h: one GEMM at a's place would not
                b = self.b(h)
            else:
                with torch.no_grad():
                    b = self.b(h)
            return a.sum(-1) + b.sum(-1)

    torch.manual_seed(0)
    block, x = Block(), torch.randn(3, 8)
    out, fused = _traced_with_the_pass(block, x)
    assert sum(fused) == 0
    torch.testing.assert_close(out, block(x))


def test_the_pass_is_installed_per_run_and_has_a_cache_key():
    import torch._inductor.config as inductor_config

    from trainables.engine.compile import setup_compile
    from trainables.engine.linear_fusion import set_linear_fusion

    assert FuseSharedInputLinears().uuid()  # Inductor's FX-graph cache keys compiled code by it
    effective = {"fallbacks": ""}
    cfg = dict(model_size="tiny", use_gpu=False, torch_compile=True)
    setup_compile(TrialConfig(**cfg, compile_fuse_linears=True), False, effective)
    assert isinstance(inductor_config.pre_grad_custom_pass, FuseSharedInputLinears)
    setup_compile(
        TrialConfig(**cfg), False, effective
    )  # the next run of a resident worker, without it
    assert inductor_config.pre_grad_custom_pass is None
    someone_elses = object()
    inductor_config.pre_grad_custom_pass = someone_elses
    try:
        set_linear_fusion(False)
        assert inductor_config.pre_grad_custom_pass is someone_elses
    finally:
        inductor_config.pre_grad_custom_pass = None


def test_the_key_is_checked():
    with pytest.raises(ConfigError, match="compile_fuse_linears: an Inductor pass"):
        TrialConfig(compile_fuse_linears=True)
    with pytest.raises(ConfigError, match="compile_fuse_linears: an Inductor pass"):
        TrialConfig(compile_fuse_linears=True, torch_compile=True, compile_backend="aot_eager")
    TrialConfig(compile_fuse_linears=True, torch_compile=True)
