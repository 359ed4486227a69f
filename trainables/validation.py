"""Validation on a held-out split: contrastive loss and retrieval recall over the whole split.

Every rank embeds its shard of the split (items r, r + world, ...); the embeddings travel to
rank 0, which scores every utterance against every transcript. Each rank runs the same number
of forward passes (a short shard repeats an item and drops the copy), as ZeRO-3 needs: its
parameters are gathered by collectives inside each forward.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trainables.config import TrialConfig
from trainables.distributed import gather_to_rank0

__all__ = ["VAL_METRICS", "build_val_dataset", "evaluate", "retrieval_metrics"]

VAL_METRICS = (
    "val_loss",
    "val_s2t_r1",
    "val_s2t_r5",
    "val_t2s_r1",
    "val_t2s_r5",
    "val_mean_r1",
)


def build_val_dataset(cfg: TrialConfig):
    """The held-out split (None without validation): ``val_manifest_path``, or the last
    ``val_speakers`` speakers of the training manifest. Transcripts are encoded with the
    training manifest's tokenizer, so ids mean the same words."""
    if not cfg.val_every:
        return None
    from trainables.data.loader import manifest_options
    from trainables.data.manifest import ManifestDataset

    common = manifest_options(cfg)
    if cfg.val_manifest_path:
        return ManifestDataset(
            Path(cfg.val_manifest_path), tokenizer_manifest=Path(cfg.manifest_path), **common
        )
    return ManifestDataset(
        Path(cfg.manifest_path),
        audio_root=Path(cfg.audio_root) if cfg.audio_root else None,
        val_speakers=cfg.val_speakers,
        split="val",
        **common,
    )


def retrieval_metrics(
    speech: torch.Tensor, text: torch.Tensor, logit_scale: float
) -> dict[str, float]:
    """Recall@1/@5 both ways and the symmetric contrastive loss over the whole split; row i of
    ``speech`` belongs to row i of ``text``. A tie counts for the true pair (strictly greater
    scores rank above it). Chance recall@1 is 1/N."""
    sims = speech.float() @ text.float().T
    diag = sims.diagonal()
    s2t_rank = (sims > diag[:, None]).sum(1)  # how many texts beat the true one, per utterance
    t2s_rank = (sims.T > diag[:, None]).sum(1)
    labels = torch.arange(len(diag))
    logits = logit_scale * sims
    out = {
        "val_loss": float(
            (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
        ),
        "val_items": len(diag),
        "val_chance_r1": 1.0 / len(diag),
    }
    for k in (1, 5):
        out[f"val_s2t_r{k}"] = float((s2t_rank < k).float().mean())
        out[f"val_t2s_r{k}"] = float((t2s_rank < k).float().mean())
    out["val_mean_r1"] = (out["val_s2t_r1"] + out["val_t2s_r1"]) / 2
    return out


def evaluate(engine, dataset, collate, cfg: TrialConfig, *, rank: int, world_size: int, device):
    """Validation metrics on rank 0 (an empty dict elsewhere), with ``val_s`` its duration."""
    t0 = time.perf_counter()
    n = len(dataset)
    if n < world_size:
        raise ValueError(f"the validation split has {n} items, fewer than {world_size} workers")
    mine = list(range(rank, n, world_size))
    per_rank = math.ceil(n / world_size)
    padded = mine + [mine[0]] * (per_rank - len(mine))
    speech, text, scale = [], [], 1.0
    engine.train(False)
    try:
        with torch.no_grad():
            for start in range(0, per_rank, cfg.micro_batch):
                items = [dataset[i] for i in padded[start : start + cfg.micro_batch]]
                batch = {k: v.to(device, non_blocking=True) for k, v in collate(items).items()}
                s, t, sc = engine(batch)
                speech.append(s.float().cpu())
                text.append(t.float().cpu())
                scale = sc.float().reshape(-1)[0]
        scale = float(scale)  # note: a CPU-GPU sync, once per validation
    finally:
        engine.train(True)
    share = {
        "index": mine,
        "speech": torch.cat(speech)[: len(mine)],
        "text": torch.cat(text)[: len(mine)],
    }
    gathered = gather_to_rank0(share, rank, world_size)
    if gathered is None:
        return {}
    order = torch.tensor([i for g in gathered for i in g["index"]]).argsort()
    all_speech = torch.cat([g["speech"] for g in gathered])[order]
    all_text = torch.cat([g["text"] for g in gathered])[order]
    out: dict[str, Any] = retrieval_metrics(all_speech, all_text, scale)
    out["val_s"] = time.perf_counter() - t0
    return out
