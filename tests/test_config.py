"""TrialConfig: types, ranges and impossible combinations fail with one line naming the key."""

import pytest

from trainables.config import ConfigError, TrialConfig, coerce_value, global_batch


def test_defaults_are_valid_and_round_trip_through_a_plain_dict():
    cfg = TrialConfig()
    assert TrialConfig.from_dict(cfg.to_dict()) == cfg


def test_int_accepted_for_float_and_converted():
    cfg = TrialConfig(audio_s=2, lr=1)
    assert isinstance(cfg.audio_s, float) and cfg.audio_s == 2.0
    assert cfg.audio_samples == 32_000


@pytest.mark.parametrize(
    "values, key, fragment",
    [
        ({"micro_batch": 0}, "micro_batch", ">= 1, got 0"),
        ({"micro_batch": "8"}, "micro_batch", "expected int"),
        ({"micro_batch": 8.0}, "micro_batch", "expected int"),
        ({"micro_batch": True}, "micro_batch", "expected int"),
        ({"zero_stage": 4}, "zero_stage", "must be 0, 1, 2 or 3"),
        ({"zero_stage": 2}, "zero_stage", "needs strategy deepspeed"),
        ({"log_every": 50, "max_steps": 30}, "log_every", "larger than max_steps"),
        ({"strategy": "fsdp3"}, "strategy", "one of 'ddp', 'fsdp2', 'deepspeed'"),
        ({"use_gpu": "yes"}, "use_gpu", "expected bool or one of 'auto'"),
        ({"num_workers": -1}, "num_workers", ">= 0"),
        ({"prefetch_factor": 0}, "prefetch_factor", ">= 1"),
        ({"audio_s": 0.0}, "audio_s", "0.1-60"),
        ({"model_size": "huge"}, "model_size", "'tiny', 'base'"),
        ({"text_tokens": 129}, "text_tokens", "128 positions of the tiny text encoder"),
        ({"speech_attention": "flash3"}, "speech_attention", "one of 'auto', 'eager', 'sdpa'"),
        ({"text_attention": "xformers"}, "text_attention", "'flash_attention_2'"),
        ({"precision": "fp16", "use_gpu": False}, "precision", "fp16 needs a GPU"),
        ({"compile_mode": "fast"}, "compile_mode", "one of 'default', 'reduce-overhead'"),
        ({"compile_dynamic": "maybe"}, "compile_dynamic", "expected bool or one of 'auto'"),
        ({"timing_ranks": "rank1"}, "timing_ranks", "one of 'rank0', 'all'"),
        ({"model_load_dtype": "int8"}, "model_load_dtype", "one of 'auto', 'fp32'"),
        ({"length_bucketing_pool": 0}, "length_bucketing_pool", ">= 1"),
        ({"length_bucketing": True}, "length_bucketing", "needs dataset manifest"),
        (
            {"model_load_dtype": "fp16", "use_gpu": True},
            "model_load_dtype",
            "gradient scaler refuses fp16 gradients",
        ),
        (
            {"model_load_dtype": "bf16", "precision": "fp16", "strategy": "deepspeed"},
            "model_load_dtype",
            "set precision=bf16, or model_load_dtype auto or fp32",
        ),
        ({"model_load_dtype": "fp16", "use_gpu": False}, "model_load_dtype", "fp16 needs a GPU"),
        ({"pos_conv": "fft"}, "pos_conv", "one of 'conv', 'matmul'"),
        (
            {"pos_conv": "matmul", "strategy": "deepspeed", "zero_stage": 3},
            "pos_conv",
            "under zero_stage 3 set pos_conv=conv",
        ),
        (
            {"extractor_layout": "channels_last", "strategy": "deepspeed", "zero_stage": 3},
            "extractor_layout",
            "under zero_stage 3 set extractor_layout=channels_first",
        ),
        ({"extractor_norm": "triton"}, "extractor_norm", "set extractor_layout=matmul"),
        ({"extractor_norm": "folded"}, "extractor_norm", "set extractor_layout=matmul"),
        ({"compile_pos_conv": True}, "compile_pos_conv", "compile_scope=layers"),
        (
            {"compile_pos_conv": True, "torch_compile": True},
            "compile_pos_conv",
            "set torch_compile=true with compile_scope=layers",
        ),
    ],
)
def test_bad_values_fail_with_one_line_naming_the_key(values, key, fragment):
    with pytest.raises(ConfigError) as info:
        TrialConfig.from_dict(values)
    message = str(info.value)
    assert message.startswith(f"{key}:")
    assert fragment in message
    assert "\n" not in message


def test_workload_options_that_can_run():
    cfg = TrialConfig(
        dataset="manifest",
        length_bucketing=True,
        model_load_dtype="bf16",
        strategy="deepspeed",
        torch_compile=True,
        compile_dynamic=False,
        timing_ranks="all",
    )
    assert cfg.compile_dynamic is False and cfg.model_load_dtype == "bf16"
    # A text checkpoint brings its own position count (checked by the driver against the file).
    assert TrialConfig(text_pretrained_path="/ckpt/bert", text_tokens=512).text_tokens == 512


def test_strategy_rules():
    assert TrialConfig(strategy="deepspeed", zero_stage=3).zero_stage == 3
    # Accumulation under both strategies (DDP: no_sync on all but the last micro-batch).
    assert TrialConfig(grad_accum_steps=2).grad_accum_steps == 2
    assert TrialConfig(strategy="deepspeed", grad_accum_steps=2).grad_accum_steps == 2
    with pytest.raises(ConfigError, match="grad_accum_steps: must be >= 1"):
        TrialConfig(grad_accum_steps=0)
    with pytest.raises(ConfigError, match="precision: fp16 needs a GPU"):
        TrialConfig(precision="fp16", use_gpu=False)
    assert TrialConfig(precision="fp16", use_gpu="auto").precision == "fp16"  # decided later
    with pytest.raises(ConfigError, match="precision: expected one of"):
        TrialConfig(precision="fp8")


def test_unknown_key_suggests_the_closest_one():
    with pytest.raises(
        ConfigError, match=r"unknown key 'micro_bach' in here; did you mean 'micro_batch'\?"
    ):
        TrialConfig.from_dict({"micro_bach": 4}, where="here")


def test_unknown_key_without_a_close_match_lists_the_keys():
    with pytest.raises(
        ConfigError, match="known keys: strategy, fsdp_reshard_after_forward, zero_stage"
    ):
        TrialConfig.from_dict({"zzz": 1})


def test_cpus_per_train_worker_defaults_to_loader_workers_plus_one():
    assert TrialConfig(num_workers=6).cpus_per_train_worker == 7
    assert TrialConfig(num_workers=6, cpus_per_worker=2).cpus_per_train_worker == 2


def test_coerce_value_of_a_single_key():
    assert coerce_value("use_gpu", "auto") == "auto"
    assert coerce_value("use_gpu", False) is False
    with pytest.raises(ConfigError):
        coerce_value("bucket_mb", "25")


@pytest.mark.parametrize(
    "values, fragment",
    [
        ({"min_audio_s": 3.0, "max_audio_s": 1.0}, "swap or fix the crop bounds"),
        ({"fixed_slice_s": 0.0}, "fixed_slice_s: must be within"),
        ({"manifest_path": "corpus.parquet"}, r"not a data_prep manifest \(.tsv\)"),
        ({"crop_policy": "random"}, "crop_policy: expected one of 'limit_longest', 'fixed_slice'"),
        ({"dataset": "librispeech"}, "dataset: expected one of 'synthetic', 'manifest'"),
    ],
)
def test_data_path_keys_are_validated(values, fragment):
    with pytest.raises(ConfigError, match=fragment):
        TrialConfig.from_dict(values)


@pytest.mark.parametrize(
    "key, value, tool",
    [
        ("manifest_path", "s3://corpus/ls/manifest_16k_trim.tsv", "aws s3 sync"),
        ("val_manifest_path", "s3://corpus/ls/val.tsv", "aws s3 sync"),
        ("audio_root", "gs://corpus/ls", "gcloud storage rsync"),
        ("speech_pretrained_path", "s3://weights/wav2vec2-base", "aws s3 sync"),
        ("text_pretrained_path", "hf://bert-base-uncased", "rclone copy"),
    ],
)
def test_the_corpus_and_weights_on_object_storage_get_the_fix(key, value, tool):
    """Issue 26: what the workers read through local paths is refused on object storage with
    the fix (copy or mount), before any run starts; a local path or file:// stays valid."""
    base = {"dataset": "manifest", "manifest_path": "/data/ls/manifest_16k_trim.tsv"}
    with pytest.raises(ConfigError) as info:
        TrialConfig.from_dict({**base, key: value})
    line = str(info.value)
    assert "\n" not in line and line.startswith(f"{key}: {value} is on object storage")
    assert f"({tool})" in line and "mount the bucket" in line
    local = "/data/ls/manifest_16k_trim.tsv" if "manifest" in key else "/data/ls"
    assert getattr(TrialConfig.from_dict({**base, key: local}), key) == local
    # One small file, read once per worker: a tokenizer in a bucket is read from there.
    tok = "s3://sweeps/a/tokenizers/manifest-30522-0123abcd.json"
    assert TrialConfig.from_dict({**base, "tokenizer_path": tok}).tokenizer_path == tok


def test_the_global_batch_is_micro_batch_x_ranks_x_accumulation():
    """One function says it: an optimizer step's batch (throughput, steps per epoch) with the
    run's grad_accum_steps, one micro-step of every rank (what the samplers cut) without."""
    assert global_batch(micro_batch=8, world_size=4, grad_accum_steps=3) == 96
    assert global_batch(micro_batch=8, world_size=4) == 32
    cfg = TrialConfig(micro_batch=6, grad_accum_steps=2, train_workers=3)
    assert (
        global_batch(
            micro_batch=cfg.micro_batch,
            world_size=cfg.train_workers,
            grad_accum_steps=cfg.grad_accum_steps,
        )
        == 36
    )
