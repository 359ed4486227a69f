"""Export of a trained model: both encoders as ``save_pretrained`` folders (loadable with
``speech_pretrained_path`` and ``text_pretrained_path``), the text side with its tokenizer, and
the projection heads and temperature in ``heads.pt``.

    runs/<run>/export/speech/     config.json + model.safetensors (Wav2Vec2Model)
    runs/<run>/export/text/       config.json + model.safetensors (BertModel) + tokenizer files
    runs/<run>/export/heads.pt    speech_proj, text_proj, logit_scale (fp32)
    runs/<run>/export/export.json where it came from (final or best checkpoint, step)

The names are RunFolder's (stage1_common/output_root.py).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Any

import torch

from stage1_common.output_root import RunFolder
from trainables.config import TrialConfig

__all__ = ["export_model", "load_exported"]


@contextlib.contextmanager
def _full_model(engine, cfg: TrialConfig, rank: int):
    """A context giving rank 0 the model with its full weights (the other ranks get None). Every
    rank must enter it: ZeRO-3 gathers its parameter shards (a collective), FSDP2 gathers a full
    state dict to rank 0's CPU (a collective), which loads into a model of the run's shape."""
    if engine.kind == "fsdp2":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        from trainables.model.stage1 import build_model

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(engine.model, options=options)
        if rank != 0:
            yield None
            return
        model = build_model(
            cfg.model_size,
            cfg.proj_dim,
            speech_path=cfg.speech_pretrained_path,
            text_path=cfg.text_pretrained_path,
            dropout=cfg.dropout_rate,
        )
        model.load_state_dict(full)
        yield model
    elif engine.kind == "deepspeed" and cfg.zero_stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(engine.bare.parameters()), modifier_rank=None):
            yield engine.bare if rank == 0 else None
    else:
        yield engine.bare if rank == 0 else None


def _tokenizer(cfg: TrialConfig):
    """The run's tokenizer as a transformers fast tokenizer (the text checkpoint's, or the one
    built from the manifest)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from trainables.model.pretrained import has_tokenizer

    if cfg.text_pretrained_path and has_tokenizer(cfg.text_pretrained_path):
        return AutoTokenizer.from_pretrained(cfg.text_pretrained_path, local_files_only=True)
    from trainables.data.manifest_table import read_manifest_table
    from trainables.data.text import load_or_build_tokenizer, text_vocab_size

    table = read_manifest_table(Path(cfg.manifest_path))
    tok = load_or_build_tokenizer(
        Path(cfg.manifest_path),
        [str(t) for t in table.column("transcript").to_pylist()],
        text_vocab_size(cfg.model_size, cfg.text_pretrained_path),
        cfg.tokenizer_path,
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def export_model(engine, cfg: TrialConfig, out: Path, *, rank: int, source: str) -> None:
    """Write the model as it is now to ``out`` (rank 0 writes; every rank must call it). The
    folder appears whole or not at all: written under a temporary name, then renamed."""
    out = Path(out)
    with _full_model(engine, cfg, rank) as model:
        if model is None:
            return
        tmp = out.with_name(f".{out.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.speech.save_pretrained(tmp / RunFolder.EXPORT_SPEECH)
        model.text.save_pretrained(tmp / RunFolder.EXPORT_TEXT)
        if cfg.dataset == "manifest":
            _tokenizer(cfg).save_pretrained(tmp / RunFolder.EXPORT_TEXT)
        heads = {
            "speech_proj": {
                k: v.detach().float().cpu() for k, v in model.speech_proj.state_dict().items()
            },
            "text_proj": {
                k: v.detach().float().cpu() for k, v in model.text_proj.state_dict().items()
            },
            "logit_scale": model.logit_scale.detach().float().cpu(),
            "proj_dim": cfg.proj_dim,
        }
        torch.save(heads, tmp / RunFolder.EXPORT_HEADS)
        (tmp / RunFolder.EXPORT_RECORD).write_text(
            json.dumps({"source": source, "strategy": cfg.strategy, "zero_stage": cfg.zero_stage})
        )
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


def load_exported(folder: Path, dtype: torch.dtype = torch.float32) -> tuple[Any, dict]:
    """The whole model from an export: encoders through ``speech_pretrained_path`` /
    ``text_pretrained_path`` (the real loading path), heads from heads.pt."""
    from trainables.model.stage1 import build_model

    folder = Path(folder)
    heads = torch.load(folder / RunFolder.EXPORT_HEADS, map_location="cpu", weights_only=True)
    model = build_model(
        "tiny",  # unused: both encoders come from their folders
        int(heads["proj_dim"]),
        speech_path=str(folder / RunFolder.EXPORT_SPEECH),
        text_path=str(folder / RunFolder.EXPORT_TEXT),
        dtype=dtype,
    )
    model.speech_proj.load_state_dict(heads["speech_proj"])
    model.text_proj.load_state_dict(heads["text_proj"])
    with torch.no_grad():
        model.logit_scale.copy_(heads["logit_scale"])
    return model, json.loads((folder / RunFolder.EXPORT_RECORD).read_text())
