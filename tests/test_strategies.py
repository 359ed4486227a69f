"""Strategy building blocks: precision policy, the DeepSpeed config, a DDP step with autocast."""

import pytest
import torch

from trainables.config import ConfigError, TrialConfig
from trainables.data.loader import SyntheticSpeechText
from trainables.data.manifest import collate_padded
from trainables.engine import build_engine, deepspeed_config, resolve_precision
from trainables.model.stage1 import contrastive_loss


def test_precision_policy_on_cpu():
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == "fp32"
    assert resolve_precision("bf16", cpu) == "bf16"


def test_deepspeed_config_maps_the_trial():
    cfg = TrialConfig(
        strategy="deepspeed", zero_stage=2, micro_batch=16, bucket_mb=50, grad_accum_steps=2
    )
    ds = deepspeed_config(cfg, "bf16")
    assert ds["train_micro_batch_size_per_gpu"] == 16 and ds["gradient_accumulation_steps"] == 2
    zero = ds["zero_optimization"]
    assert (
        zero["stage"] == 2
        and zero["reduce_bucket_size"] == zero["allgather_bucket_size"] == 12_500_000
    )
    assert ds["bf16"]["enabled"] and not ds["fp16"]["enabled"]
    fp16 = deepspeed_config(TrialConfig(strategy="deepspeed"), "fp16")
    assert fp16["fp16"] == {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    assert fp16["zero_optimization"] == {"stage": 0}


def test_the_convolution_keys_reach_the_engine_model_with_the_same_parameters_and_output(
    gloo_world_of_one,
):
    from trainables.model.extractor import ChannelsLastFeatureEncoder, MatmulFeatureEncoder
    from trainables.model.pos_conv import MatmulPositionalConv

    ds = SyntheticSpeechText(
        num_items=2, audio_samples=8000, text_tokens=8, vocab_size=1000, seed=0
    )
    batch = collate_padded([ds[i] for i in range(2)])
    outputs, names = {}, {}
    encoders = {"channels_last": ChannelsLastFeatureEncoder, "matmul": MatmulFeatureEncoder}
    for layout in ("channels_first", "channels_last", "matmul"):
        keys = (
            {} if layout == "channels_first" else {"pos_conv": "matmul", "extractor_layout": layout}
        )
        cfg = TrialConfig(model_size="tiny", proj_dim=16, use_gpu=False, **keys)
        engine = build_engine(cfg, torch.device("cpu"))  # the same seed: the same weights
        speech = engine.model.module.speech
        assert isinstance(speech.encoder.pos_conv_embed, MatmulPositionalConv) == bool(keys)
        kind = encoders.get(layout)
        assert kind is None or isinstance(speech.feature_extractor, kind)
        names[layout] = [name for name, _ in engine.model.module.named_parameters()]
        outputs[layout] = engine(batch)[0].detach()
    for layout in ("channels_last", "matmul"):
        assert names[layout] == names["channels_first"]  # checkpoints load either way
        torch.testing.assert_close(outputs[layout], outputs["channels_first"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_ddp_engine_steps_and_changes_the_weights(gloo_world_of_one, precision):
    cfg = TrialConfig(model_size="tiny", proj_dim=16, precision=precision, use_gpu=False, lr=1e-2)
    engine = build_engine(cfg, torch.device("cpu"))
    assert engine.effective == {
        "precision_effective": precision,
        "strategy_effective": "ddp",
        "model_load_dtype_effective": "fp32",  # auto under DDP: fp32 master weights
        "compile_effective": "off",
        "extractor_norm_effective": "torch",  # channels_first: transformers' GroupNorm
        "residual_dtype_effective": "fp32",  # autocast's float32 LayerNorms, the default
        "speech_attention_effective": "sdpa",  # auto on the CPU
        "text_attention_effective": "sdpa",
        "fallbacks": "",
    }
    ds = SyntheticSpeechText(
        num_items=4, audio_samples=16000, text_tokens=8, vocab_size=1000, seed=0
    )
    batch = collate_padded([ds[i] for i in range(4)])
    before = engine.model.module.speech_proj.weight.detach().clone()
    speech, text, scale = engine(batch)
    if precision == "bf16":
        assert speech.dtype == torch.bfloat16  # autocast is on
    loss = contrastive_loss(speech.float(), text.float(), scale.float())
    engine.backward(loss)
    engine.step()
    assert torch.isfinite(loss)
    assert not torch.equal(before, engine.model.module.speech_proj.weight)
    assert all(p.grad is None for p in engine.model.parameters())  # zeroed after the step


def test_engine_casts_floating_inputs_for_deepspeed_low_precision():
    from trainables.engine import Engine

    seen = {}

    def model(**batch):
        seen.update(batch)
        return batch

    engine = Engine(model=model, optimizer=None, effective={}, _dtype=torch.bfloat16)
    engine({"audio": torch.zeros(2, 4), "audio_mask": torch.ones(2, 4, dtype=torch.long)})
    assert seen["audio"].dtype == torch.bfloat16 and seen["audio_mask"].dtype == torch.long


def test_ddp_knobs_reach_ddp_and_tf32_switches_apply(gloo_world_of_one):
    cfg = TrialConfig(
        model_size="tiny",
        proj_dim=16,
        use_gpu=False,
        ddp_static_graph=True,
        ddp_gradient_as_bucket_view=True,
        matmul_precision="high",
        tf32=True,
    )
    engine = build_engine(cfg, torch.device("cpu"))
    ddp = engine.model
    assert ddp.static_graph and ddp.gradient_as_bucket_view and not ddp.find_unused_parameters
    assert torch.get_float32_matmul_precision() == "high" and torch.backends.cuda.matmul.allow_tf32
    ds = SyntheticSpeechText(
        num_items=2, audio_samples=8000, text_tokens=6, vocab_size=1000, seed=0
    )
    for _ in range(2):  # static_graph records the graph on the first step, checks on the second
        loss = contrastive_loss(*[t.float() for t in engine(collate_padded([ds[0], ds[1]]))])
        engine.backward(loss)
        engine.step()
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = True


def test_comm_hooks_need_ddp_on_gpus():
    from trainables.config import ConfigError

    with pytest.raises(ConfigError, match="ddp_comm_hook: bf16 needs strategy ddp on GPUs"):
        TrialConfig(ddp_comm_hook="bf16", use_gpu=False)
    with pytest.raises(ConfigError, match="needs strategy ddp on GPUs"):
        TrialConfig(ddp_comm_hook="fp16", strategy="deepspeed")
    assert TrialConfig(ddp_comm_hook="bf16", use_gpu=True).ddp_comm_hook == "bf16"


def test_fused_adam_without_ninja_is_refused_before_any_trial(monkeypatch, tmp_path):
    from platform.errors import UsageError
    from platform.spaces.expand import expand_runs
    from platform.spaces.load import load_space
    from platform.spaces.preflight import check_inputs

    space = load_space("smoke").with_overrides(["optimizer=deepspeed_fused_adam"])
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty PATH: no ninja on it
    with pytest.raises(UsageError, match="ninja is missing"):
        check_inputs(space, expand_runs(space))


def _one_step(engine, seed=0):
    ds = SyntheticSpeechText(
        num_items=4, audio_samples=16000, text_tokens=8, vocab_size=1000, seed=seed
    )
    batch = collate_padded([ds[i] for i in range(4)])
    speech, text, scale = engine(batch)
    loss = contrastive_loss(speech.float(), text.float(), scale.float())
    engine.backward(loss)
    engine.step()
    return loss


def _compiled_tiny(**overrides) -> TrialConfig:
    """A tiny CPU config with torch_compile on, after a dynamo reset (each test compiles anew)."""
    import torch._dynamo

    torch._dynamo.reset()
    return TrialConfig(
        model_size="tiny", proj_dim=16, use_gpu=False, torch_compile=True, **overrides
    )


def test_compiled_ddp_engine_steps_compiled(gloo_world_of_one):
    import torch._dynamo

    cfg = _compiled_tiny(compile_backend="aot_eager")
    engine = build_engine(cfg, torch.device("cpu"))
    assert isinstance(engine.model, torch._dynamo.eval_frame.OptimizedModule)
    assert isinstance(engine.model._orig_mod, torch.nn.parallel.DistributedDataParallel)
    assert torch.isfinite(_one_step(engine)) and torch.isfinite(_one_step(engine, seed=1))
    assert engine.effective["compile_effective"] == "aot_eager/default"
    assert engine.effective["fallbacks"] == ""
    import torch._dynamo.config as dynamo_config

    # The whole DDP module: dynamo's DDPOptimizer splits its graph at the gradient buckets.
    assert dynamo_config.optimize_ddp is True
    # Regions: no split (it kept every region of an H100 run out of AOTAutograd's cache), and
    # the next run of a resident worker gets it back for the whole model.
    build_engine(_compiled_tiny(compile_scope="layers"), torch.device("cpu"))
    assert dynamo_config.optimize_ddp is False
    build_engine(_compiled_tiny(), torch.device("cpu"))
    assert dynamo_config.optimize_ddp is True


@pytest.mark.parametrize("strategy", ["ddp", "deepspeed"])
def test_a_compile_error_falls_back_to_eager_and_is_recorded(gloo_world_of_one, strategy):
    # A real compile failure: inductor without a working C++ compiler (the CPU code path).
    import torch._dynamo
    import torch._inductor.config

    cfg = _compiled_tiny(lr=1e-2, strategy=strategy)
    engine = build_engine(cfg, torch.device("cpu"))
    if strategy == "ddp":
        assert isinstance(engine.model, torch._dynamo.eval_frame.OptimizedModule)
        inner = engine.model._orig_mod.module
    else:
        inner = engine.model.module
        assert inner._compiled_call_impl is not None  # DeepSpeed's engine.compile
    before = inner.speech_proj.weight.detach().clone()
    with torch._inductor.config.patch({"cpp.cxx": ("/nonexistent-cxx",)}):
        loss = _one_step(engine)
    assert torch.isfinite(loss)
    if strategy == "ddp":
        assert isinstance(engine.model, torch.nn.parallel.DistributedDataParallel)  # eager now
    else:
        assert inner._compiled_call_impl is None
    assert not torch.equal(before, inner.speech_proj.weight)  # the step happened
    assert engine.effective["compile_effective"] == "eager (fallback)"
    note = engine.effective["fallbacks"]
    assert note.startswith("compile: InductorError: ") and note.endswith("eager from step 1")
    assert torch.isfinite(_one_step(engine, seed=1))  # and it goes on eagerly


def test_bf16_load_dtype_trains_bf16_weights_under_ddp(gloo_world_of_one):
    cfg = TrialConfig(
        model_size="tiny", proj_dim=16, use_gpu=False, precision="bf16", model_load_dtype="bf16"
    )
    engine = build_engine(cfg, torch.device("cpu"))
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    assert engine.effective["model_load_dtype_effective"] == "bf16"
    assert torch.isfinite(_one_step(engine))


def test_load_dtype_policy():
    from trainables.engine import resolve_load_dtype

    assert resolve_load_dtype("auto", "ddp", "bf16") == "fp32"  # autocast: fp32 master weights
    assert resolve_load_dtype("auto", "deepspeed", "bf16") == "bf16"
    assert resolve_load_dtype("auto", "deepspeed", "fp32") == "fp32"
    assert resolve_load_dtype("fp32", "deepspeed", "fp16") == "fp32"
    # precision auto resolved to fp16 (a V100) while the weights were asked in bf16
    with pytest.raises(ValueError, match="model_load_dtype: bf16 weights, but precision resolved"):
        resolve_load_dtype("bf16", "deepspeed", "fp16")


def test_ddp_accumulation_steps_the_optimizer_once_per_grad_accum_steps(gloo_world_of_one):
    cfg = TrialConfig(
        model_size="tiny", proj_dim=16, use_gpu=False, lr=1e-2, grad_accum_steps=2, warmup_steps=4
    )
    engine = build_engine(cfg, torch.device("cpu"))
    ds = SyntheticSpeechText(4, 8000, 8, 1000, seed=0)
    batch = collate_padded([ds[i] for i in range(4)])
    before = [p.detach().clone() for p in engine.bare.parameters()]

    def micro(last: bool) -> None:
        with engine.accumulating(last):
            engine.backward(contrastive_loss(*engine(batch)))
        engine.step(last)

    micro(last=False)  # gradients accumulate (no all-reduce, no optimizer step)
    assert all(torch.equal(a, p) for a, p in zip(before, engine.bare.parameters(), strict=True))
    assert engine.lr() == pytest.approx(1e-2 / 4)  # warm-up step 1 of 4, not yet stepped
    micro(last=True)
    assert not all(torch.equal(a, p) for a, p in zip(before, engine.bare.parameters(), strict=True))
    assert engine.lr() == pytest.approx(1e-2 * 2 / 4)  # the schedule stepped once
    assert all(p.grad is None for p in engine.bare.parameters())  # zeroed for the next step


@pytest.mark.parametrize("scope", ["model", "layers"])
def test_the_compile_warm_up_compiles_every_shape_before_the_first_step(gloo_world_of_one, scope):
    """compile_warmup: each static shape compiles in a pass that leaves the model as it was;
    steps of those shapes then run without compiling again."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    cfg = _compiled_tiny(
        compile_backend="aot_eager",
        compile_scope=scope,
        # regional: the positional convolution a region too (the compile_pos_conv key)
        compile_pos_conv=scope == "layers",
        pos_conv="matmul",
        dataset="manifest",
        crop_buckets_s="1,1.5",
        text_tokens=8,
        micro_batch=4,
    )
    counters.clear()
    engine = build_engine(cfg, torch.device("cpu"))
    before = {k: v.clone() for k, v in engine.bare.state_dict().items()}
    rng = torch.get_rng_state()
    compile_s, parts, passes = engine.warm_up(cfg)
    assert compile_s > 0 and engine.effective["fallbacks"] == ""
    # Where the seconds went: dynamo traced (a compile, not a cache load only), parts sum up.
    seconds = dict((k, float(v)) for k, v in (p.split("=") for p in parts.split()))
    # One pass per shape, and the closing collection of what the paused collector put off.
    assert len(passes) == 1
    assert passes[0] + seconds["collect"] == pytest.approx(compile_s, rel=0.2, abs=0.1), parts
    assert list(seconds) == [
        "trace",
        "guards",
        "backend",
        "dynamo_other",
        "first_passes",
        "cudagraph_passes",
        "collect",
    ]
    assert seconds["cudagraph_passes"] == 0  # one pass per shape off a GPU
    assert seconds["trace"] > 0 and seconds["backend"] > 0
    assert sum(seconds.values()) == pytest.approx(compile_s, abs=0.3)
    assert all(torch.equal(before[k], v) for k, v in engine.bare.state_dict().items())
    assert all(p.grad is None for p in engine.bare.parameters())
    assert torch.equal(rng, torch.get_rng_state())  # dropout masks of the real steps unchanged
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 2  # one per shape at least
    for samples in (16_000, 24_000, 16_000):
        ds = SyntheticSpeechText(
            num_items=4, audio_samples=samples, text_tokens=8, vocab_size=1000, seed=0
        )
        batch = collate_padded([ds[i] for i in range(4)])
        speech, text, scale = engine(batch)
        engine.backward(contrastive_loss(speech.float(), text.float(), scale.float()))
        engine.step()
    assert counters["stats"]["unique_graphs"] == graphs  # nothing compiled inside the steps
    assert engine.effective["compile_effective"].startswith("aot_eager/default")
    if scope == "layers":
        from trainables.engine import compile_regions

        assert len(compile_regions(engine.bare)) == 5  # feature encoder, 2 + 2 layers
        regions = compile_regions(engine.bare, pos_conv=True)
        assert regions[1] is engine.bare.speech.encoder.pos_conv_embed
        assert len(regions) == 6 and all(r._compiled_call_impl is not None for r in regions)


def _three_steps(cfg: TrialConfig) -> tuple[list[float], object]:
    engine = build_engine(cfg, torch.device("cpu"))
    ds = SyntheticSpeechText(4, 8000, 8, 1000, seed=0)
    batch = collate_padded([ds[i] for i in range(4)])
    losses = []
    for _ in range(3):
        with engine.accumulating(True):
            loss = contrastive_loss(*engine(batch))
            engine.backward(loss)
        engine.step(True)
        losses.append(float(loss.detach()))
    return losses, engine


@pytest.mark.parametrize("reshard", [True, False])
def test_fsdp2_trains_like_ddp_with_sharded_parameters(gloo_world_of_one, reshard):
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    base = dict(model_size="tiny", proj_dim=16, use_gpu=False, lr=1e-2, grad_clip=1.0)
    ddp, _ = _three_steps(TrialConfig(**base))
    cfg = TrialConfig(**base, strategy="fsdp2", fsdp_reshard_after_forward=reshard)
    fsdp, engine = _three_steps(cfg)
    assert engine.kind == "fsdp2" and engine.effective["strategy_effective"] == "fsdp2"
    # Every layer of both encoders is a unit of its own, and the optimizer holds the shards.
    layers = [*engine.bare.speech.encoder.layers, *engine.bare.text.encoder.layer]
    assert all(isinstance(m, FSDPModule) for m in [engine.bare, *layers])
    assert all(isinstance(p, DTensor) for g in engine.optimizer.param_groups for p in g["params"])
    assert fsdp == pytest.approx(ddp, rel=1e-5)  # one rank: the same numbers as DDP
    assert fsdp[2] < fsdp[0]  # and it learns the batch


def test_fsdp2_keys_are_checked():
    with pytest.raises(ConfigError, match="zero_stage: 2 needs strategy deepspeed"):
        TrialConfig(strategy="fsdp2", zero_stage=2)
    with pytest.raises(ConfigError, match="set compile_scope=layers"):
        TrialConfig(strategy="fsdp2", torch_compile=True, compile_scope="model")
