"""Checks of a sweep's inputs made before anything starts: the tools an optimizer needs,
pretrained checkpoint folders, and the manifests the runs read (present, with the right
columns)."""

from __future__ import annotations

from pathlib import Path

from platform.errors import UsageError
from platform.spaces.expand import RunSpec
from platform.spaces.space import SearchSpace

__all__ = ["check_inputs"]


def check_inputs(space: SearchSpace, runs: list[RunSpec]) -> None:
    """Files the runs read must exist and have the right columns before any trial starts."""
    import shutil

    if (
        any(r.config.optimizer == "deepspeed_fused_adam" for r in runs)
        and shutil.which("ninja") is None
    ):
        raise UsageError(
            "optimizer deepspeed_fused_adam compiles a CUDA extension and ninja is missing; "
            "pip install ninja, or use optimizer=adamw_torch"
        )
    _check_checkpoints(runs)
    seen: set[str] = set()
    for run in runs:
        cfg = run.config
        if cfg.dataset != "manifest":
            continue
        if not cfg.manifest_path:
            if space.data is None:
                raise UsageError(
                    f"{space.source}: dataset manifest needs manifest_path (or a data: section); "
                    "set manifest_path=PATH/manifest_16k_trim.tsv"
                )
            continue
        if cfg.manifest_path in seen:
            continue
        seen.add(cfg.manifest_path)
        path = Path(cfg.manifest_path)
        if not path.is_file():
            raise UsageError(
                f"manifest_path {path} does not exist; make it with python -m data_prep.librispeech"
            )
        from trainables.manifest_table import MANIFEST_REQUIRED

        with path.open(encoding="utf-8") as fh:
            header = fh.readline().rstrip("\n").split("\t")
        missing = [c for c in MANIFEST_REQUIRED if c not in header]
        if missing:
            raise UsageError(
                f"manifest_path {path} lacks column(s) {', '.join(missing)}; "
                "make it with python -m data_prep.librispeech"
            )


def _check_checkpoints(runs: list[RunSpec]) -> None:
    """Pretrained folders must hold the right kind of checkpoint, and the text encoder must have
    positions for text_tokens."""
    from trainables.pretrained import checkpoint_problem, read_config

    seen: set[tuple[str, str]] = set()
    for run in runs:
        cfg = run.config
        for side, path in (
            ("speech", cfg.speech_pretrained_path),
            ("text", cfg.text_pretrained_path),
        ):
            if not path or (side, path) in seen:
                continue
            seen.add((side, path))
            problem = checkpoint_problem(path, side)
            if problem:
                raise UsageError(problem)
        if cfg.text_pretrained_path:
            positions = int(read_config(cfg.text_pretrained_path).get("max_position_embeddings", 0))
            if cfg.text_tokens > positions:
                raise UsageError(
                    f"text_tokens: {cfg.text_tokens} exceeds the {positions} positions of "
                    f"{cfg.text_pretrained_path}; lower text_tokens"
                )
