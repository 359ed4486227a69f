"""Tiny local checkpoints in the layout ``save_pretrained`` writes, for the pretrained paths."""

from pathlib import Path

import torch

from trainables.model.stage1 import build_model


def save_tiny_checkpoints(
    folder: Path, transcripts: list[str] | None = None, *, seed: int = 123
) -> tuple[Path, Path]:
    """A tiny wav2vec2 (``folder/speech``) and BERT (``folder/text``) checkpoint. The speech
    config turns LayerDrop and SpecAugment on, as real checkpoints do. With ``transcripts``
    the text folder also gets a tokenizer (tokenizer.json) trained on them."""
    from transformers import BertTokenizerFast

    from trainables.data.text import build_tokenizer

    torch.manual_seed(seed)
    model = build_model("tiny", proj_dim=8)
    model.speech.config.layerdrop = 0.1
    model.speech.config.mask_time_prob = 0.05
    speech, text = Path(folder) / "speech", Path(folder) / "text"
    model.speech.save_pretrained(speech)
    model.text.save_pretrained(text)
    if transcripts:
        tok = build_tokenizer(transcripts, vocab_size=model.text.config.vocab_size)
        BertTokenizerFast(tokenizer_object=tok, pad_token="[PAD]").save_pretrained(text)
    return speech, text
