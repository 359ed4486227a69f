"""Local pretrained checkpoints: checks before any trial, offline loading, dtype, tokenizer."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.checkpoints import save_tiny_checkpoints
from trainables.data.text import text_vocab_size
from trainables.model.pretrained import checkpoint_problem, has_tokenizer, load_tokenizer
from trainables.model.stage1 import build_model, build_model_with_attention

TRANSCRIPTS = ["the cat sat on the mat", "a dog ran home", "speech and text in one space"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return save_tiny_checkpoints(tmp_path_factory.mktemp("ckpt"), TRANSCRIPTS)


def test_loaded_encoders_hold_the_checkpoint_weights_with_masking_off(checkpoints):
    speech_path, text_path = checkpoints
    model = build_model("base", 8, speech_path=str(speech_path), text_path=str(text_path))
    saved = load_file(speech_path / "model.safetensors")
    assert all(
        torch.equal(model.speech.state_dict()[k], v)
        for k, v in saved.items()
        if k in model.speech.state_dict()
    )
    saved_text = load_file(text_path / "model.safetensors")
    assert all(torch.equal(model.text.state_dict()[k], v) for k, v in saved_text.items())
    # The checkpoint says layerdrop 0.1 and SpecAugment on; the throughput workload needs off.
    assert json.loads((speech_path / "config.json").read_text())["layerdrop"] == 0.1
    assert model.speech.config.layerdrop == 0.0 and model.speech.config.mask_time_prob == 0.0
    # `base` was asked for, but both encoders come from the (tiny) checkpoints.
    assert model.speech.config.hidden_size == 32 and model.text.config.hidden_size == 32
    assert text_vocab_size("base", str(text_path)) == 1000


def test_load_dtype_and_attention_apply_to_loaded_encoders(checkpoints):
    speech_path, text_path = checkpoints
    model, used = build_model_with_attention(
        "tiny",
        8,
        speech="eager",
        text="flash_attention_2",
        device=torch.device("cpu"),
        precision="bf16",
        speech_path=str(speech_path),
        text_path=str(text_path),
        dtype=torch.bfloat16,
    )
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert used["speech_attention_effective"] == "eager"
    assert used["text_attention_effective"] == "sdpa"
    assert "text: flash_attention_2 needs a GPU" in used["fallbacks"]


def test_weights_missing_from_a_checkpoint_are_reported(checkpoints, tmp_path):
    speech_path, _ = checkpoints
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text((speech_path / "config.json").read_text())
    weights = load_file(speech_path / "model.safetensors")
    dropped = "feature_projection.projection.weight"
    save_file({k: v for k, v in weights.items() if k != dropped}, partial / "model.safetensors")
    notes: list[str] = []
    build_model("tiny", 8, speech_path=str(partial), notes=notes)
    assert len(notes) == 1 and f"speech: 1 weight(s) not in {partial}" in notes[0]
    assert dropped in notes[0]


def test_the_checkpoint_tokenizer_is_used(checkpoints):
    _, text_path = checkpoints
    assert has_tokenizer(text_path) and not has_tokenizer(checkpoints[0])
    tok, pad = load_tokenizer(text_path)
    ids = tok.encode("the cat").ids
    assert pad == 0 and ids[0] == tok.token_to_id("[CLS]") and ids[-1] == tok.token_to_id("[SEP]")
    assert tok.token_to_id("[UNK]") not in ids


def test_checkpoint_problems_name_the_key_and_the_fix(checkpoints, tmp_path):
    speech_path, text_path = checkpoints
    assert checkpoint_problem(speech_path, "speech") is None
    assert checkpoint_problem(text_path, "text") is None
    wrong = checkpoint_problem(speech_path, "text")
    assert wrong.startswith("text_pretrained_path: ") and "'wav2vec2' model" in wrong
    missing = checkpoint_problem(tmp_path / "nope", "speech")
    assert missing.startswith("speech_pretrained_path: ") and "is not a folder" in missing
    (tmp_path / "empty").mkdir()
    assert "has no config.json" in checkpoint_problem(tmp_path / "empty", "speech")
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text('{"model_type": "bert"}')
    assert "has no weights" in checkpoint_problem(tmp_path / "noweights", "text")
    (tmp_path / "badjson").mkdir()
    (tmp_path / "badjson" / "config.json").write_text("{")
    assert "cannot be read" in checkpoint_problem(tmp_path / "badjson", "text")


def test_the_driver_checks_checkpoints_before_any_trial(checkpoints):
    from platform.errors import UsageError
    from platform.spaces.expand import expand_runs
    from platform.spaces.load import load_space
    from platform.spaces.preflight import check_inputs

    speech_path, text_path = checkpoints

    def check(*sets):
        space = load_space("smoke").with_overrides(list(sets))
        check_inputs(space, expand_runs(space))

    check(f"speech_pretrained_path={speech_path}", f"text_pretrained_path={text_path}")
    with pytest.raises(UsageError, match="exceeds the 128 positions of"):
        check(f"text_pretrained_path={text_path}", "text_tokens=200")
    with pytest.raises(UsageError, match="the speech encoder is 'wav2vec2'"):
        check(f"speech_pretrained_path={text_path}")
