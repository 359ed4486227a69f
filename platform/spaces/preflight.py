"""Checks of a sweep's inputs made before anything starts: the tools an optimizer needs,
pretrained checkpoint folders, the manifests the runs read (present, with the right columns),
and that each run's corpus gives a full global batch (after held-out speakers and crop
buckets), which the workers would otherwise find after the whole start-up."""

from __future__ import annotations

from pathlib import Path

from platform.errors import UsageError
from platform.spaces.expand import RunSpec
from platform.spaces.space import SearchSpace
from trainables.crops import crop_options, full_batches, largest_micro_batch

__all__ = ["PATH_KEYS", "check_inputs"]


def check_inputs(space: SearchSpace, runs: list[RunSpec]) -> None:
    """Files the runs read must exist and have the right columns before any trial starts:
    every key that names a file or folder (PATH_KEYS), the tools an optimizer needs, and a full
    global batch from each run's corpus."""
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
    for run in runs:
        if run.config.dataset == "manifest" and not run.config.manifest_path and not space.data:
            raise UsageError(
                f"{space.source}: dataset manifest needs manifest_path (or a data: section); "
                "set manifest_path=PATH/manifest_16k_trim.tsv"
            )
    seen: set[tuple[str, str]] = set()
    for run in runs:
        for key, check in PATH_KEYS.items():
            value = getattr(run.config, key)
            if check is not None and value and (key, value) not in seen:
                seen.add((key, value))
                check(key, value, run.config)
    _check_full_batches(runs)


def _manifest(key: str, value: str, cfg) -> None:
    """A data_prep manifest: the file, with the columns the loader reads."""
    if key == "manifest_path" and cfg.dataset != "manifest":
        return
    path = Path(value)
    if not path.is_file():
        raise UsageError(
            f"{key} {path} does not exist; make it with python -m data_prep.librispeech"
        )
    from trainables.manifest_table import MANIFEST_REQUIRED

    with path.open(encoding="utf-8") as fh:
        header = fh.readline().rstrip("\n").split("\t")
    missing = [c for c in MANIFEST_REQUIRED if c not in header]
    if missing:
        raise UsageError(
            f"{key} {path} lacks column(s) {', '.join(missing)}; "
            "make it with python -m data_prep.librispeech"
        )


def _tokenizer(key: str, value: str, cfg) -> None:
    """A tokenizers JSON file (a bucket's copy is the driver's own, written before the runs)."""
    if "://" not in value and not Path(value).is_file():
        raise UsageError(
            f"{key} {value} does not exist; leave it empty (the driver builds the manifest's "
            "tokenizer) or name a tokenizers JSON file"
        )


# Every key of TrialConfig that names a file or a folder, and its check before anything starts
# (None: nothing to check on the driver; why beside it). tests/test_cli_dry_run.py fails when a
# new *_path or *_dir key is missing here.
PATH_KEYS = {
    "manifest_path": _manifest,
    "val_manifest_path": _manifest,
    "tokenizer_path": _tokenizer,
    "speech_pretrained_path": None,  # _check_checkpoints: the folder, its config and weights
    "text_pretrained_path": None,  # the same, and text_tokens against its positions
    "compile_cache_dir": None,  # made on each node as needed; a relative path is refused
}


def _check_full_batches(runs: list[RunSpec]) -> None:
    """Every run's training split must give at least one full global batch an epoch, as its
    sampler forms them (trainables/data.py: per crop length with crop_buckets_s): the same rule
    from the manifest's lengths, without reading audio (rows whose audio file is missing are the
    workers' to skip)."""
    lengths: dict[tuple, object] = {}
    for run in runs:
        cfg = run.config
        if cfg.dataset != "manifest" or not cfg.manifest_path:
            continue
        held_out = 0 if cfg.val_manifest_path else cfg.val_speakers
        key = (cfg.manifest_path, held_out, *crop_options(cfg).values())
        if key not in lengths:
            lengths[key] = _train_crop_lengths(cfg, held_out)
        by_shape = bool(cfg.crop_buckets)
        count = full_batches(
            lengths[key],
            micro_batch=cfg.micro_batch,
            world_size=cfg.train_workers,
            by_shape=by_shape,
        )
        if count:
            continue
        best = largest_micro_batch(lengths[key], world_size=cfg.train_workers, by_shape=by_shape)
        after = [f"holding out val_speakers={held_out}"] if held_out else []
        after += ["grouping crops by crop_buckets_s"] if by_shape else []
        where = f" after {' and '.join(after)}" if after else ""
        fix = (
            f"the largest that fits is {best}: --set micro_batch={best}"
            if best
            else "use a larger corpus or fewer train_workers"
        )
        raise UsageError(
            f"micro_batch {cfg.micro_batch}: {cfg.manifest_path} gives no full global batch "
            f"({cfg.micro_batch} x {cfg.train_workers} workers) in {run.name}{where}; {fix}"
        )


def _train_crop_lengths(cfg, held_out: int):
    """Every training item's crop length (samples), as the run's dataset will crop it."""
    from trainables.crops import crop_lengths
    from trainables.manifest_table import read_manifest_table, speaker_split

    table = read_manifest_table(Path(cfg.manifest_path))
    num_samples = table.column("num_samples").to_numpy()
    if held_out:
        try:
            num_samples = num_samples[~speaker_split(table, held_out)]
        except ValueError as exc:  # too many held out, or no speaker column: one line
            raise UsageError(f"{exc} ({cfg.manifest_path})") from None
    return crop_lengths(num_samples, **crop_options(cfg))


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
