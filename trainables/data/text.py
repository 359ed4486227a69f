"""The text side of the data path: the text checkpoint's own tokenizer when it has one, else a
WordPiece tokenizer built offline from the manifest's transcripts (no download) and cached
beside the manifest."""

from __future__ import annotations

import hashlib
from pathlib import Path

from stage1_common.storage import read_text

__all__ = [
    "SPECIAL_TOKENS",
    "TINY_TEXT_VOCAB",
    "build_tokenizer",
    "load_or_build_tokenizer",
    "text_tokenizer",
    "text_vocab_size",
]

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # [PAD] is id 0, like BERT's
TINY_TEXT_VOCAB = 1000  # the tiny text encoder's (trainables/model/stage1.py); bert-base has 30522


def text_vocab_size(model_size: str, text_path: str = "") -> int:
    """Vocabulary of the text encoder: the checkpoint's when loading one, else the size's."""
    if text_path:
        from trainables.model.pretrained import read_config

        return int(read_config(text_path)["vocab_size"])
    return TINY_TEXT_VOCAB if model_size == "tiny" else 30522


def build_tokenizer(transcripts: list[str], vocab_size: int):
    """A BERT-style (lower-cased WordPiece, ``[CLS] text [SEP]``) tokenizer trained on
    ``transcripts``; its ids stay below ``vocab_size`` so they fit the text encoder."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    def fresh(model):
        tok = Tokenizer(model)
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        return tok

    trained = fresh(models.WordPiece(unk_token="[UNK]"))
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS + _continuing_pieces(trained.normalizer, transcripts),
        show_progress=False,
    )
    trained.train_from_iterator(transcripts, trainer)
    # Ids are numbered canonically (specials first, then tokens sorted), so equal vocabularies
    # always give equal ids.
    words = sorted(set(trained.get_vocab()) - set(SPECIAL_TOKENS))
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + words)}
    tok = fresh(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return tok


def _continuing_pieces(normalizer, transcripts: list[str]) -> list[str]:
    """Every character the trainer can see inside a word, as its continuing piece ("##e"), in
    one fixed order. The WordPiece trainer (BPE underneath) numbers the characters in sorted
    order but these pieces as it meets them in a hash map of the words, whose order changes
    with every map it makes; a merge between pairs of equal counts goes to the lower ids, so
    the vocabulary changed from build to build (15 vocabularies in 20 builds of the smoke
    corpus), and with it every manifest run's text: two sweeps of one corpus (a resident and a
    fresh one) trained on different tokens (huggingface/tokenizers#1794). Given first, as
    special tokens of the training only, they take ids in this order and the build is
    reproducible."""
    text = normalizer.normalize_str("\n".join(transcripts))
    return ["##" + c for c in sorted(set(text)) if not c.isspace()]


def load_or_build_tokenizer(
    manifest_path: Path, transcripts: list[str], vocab_size: int, tokenizer_path: str = ""
):
    """``tokenizer_path`` when given (the file the driver built for the sweep), else the cached
    tokenizer of this manifest content and vocabulary size, else a new one (cached atomically
    when the folder is writable, so concurrent ranks cannot leave a torn file)."""
    from tokenizers import Tokenizer

    from stage1_common.fileio import atomic_write_text

    if tokenizer_path:  # the sweep's: in its root's folder, or its bucket
        return Tokenizer.from_str(read_text(tokenizer_path))
    digest = hashlib.sha1(Path(manifest_path).read_bytes()).hexdigest()[:12]
    cache = Path(manifest_path).with_name(
        f"{Path(manifest_path).stem}.tokenizer-{vocab_size}-{digest}.json"
    )
    if cache.is_file():
        return Tokenizer.from_file(str(cache))
    tok = build_tokenizer(transcripts, vocab_size)
    try:
        atomic_write_text(cache, tok.to_str())
    except OSError:
        pass  # a read-only corpus folder: build again next time
    return tok


def text_tokenizer(
    manifest_path: Path,
    transcripts: list[str],
    vocab_size: int,
    text_path: str = "",
    tokenizer_path: str = "",
):
    """(tokenizer, padding id) for a run: the checkpoint's tokenizer when ``text_path`` has one
    (its ids are the ones the checkpoint's embeddings were trained on), else the manifest's."""
    from trainables.model.pretrained import has_tokenizer, load_tokenizer

    if text_path and has_tokenizer(text_path):
        return load_tokenizer(text_path)
    tok = load_or_build_tokenizer(manifest_path, transcripts, vocab_size, tokenizer_path)
    return tok, tok.token_to_id("[PAD]")
