"""Checks of a sweep's inputs made before anything starts: the tools an optimizer needs,
pretrained checkpoint folders, that some run reads the data the space gives, the manifests the
runs read (present, with the right columns), and that each run's corpus gives a full global
batch (after held-out speakers and crop buckets), which the workers would otherwise find after
the whole start-up. A ``data:`` section's corpus is made by the real run before Ray starts and
checked then (``check_full_batches``); before it exists, only its size bounds the batch."""

from __future__ import annotations

from pathlib import Path

from platform.errors import UsageError
from platform.spaces.expand import RunSpec, needs_corpus
from platform.spaces.plans import DataPlan
from platform.spaces.space import SearchSpace
from trainables.data.crops import crop_settings, full_batches, largest_micro_batch
from trainables.data.durations import duration_bins, steps_per_epoch

__all__ = ["PATH_KEYS", "check_full_batches", "check_inputs", "train_crop_lengths"]


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
    _check_data_is_read(space, runs)
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
            if key == "manifest_path" and run.config.dataset != "manifest":
                continue  # not read by this run (a grid over dataset reads it in another)
            if check is not None and value and (key, value) not in seen:
                seen.add((key, value))
                check(key, value, run.config)
    check_full_batches(runs)
    if needs_corpus(space, runs):
        _check_planned_batches(space.data, runs)


def _check_data_is_read(space: SearchSpace, runs: list[RunSpec]) -> None:
    """A ``data:`` section or a ``manifest_path`` that no run reads is refused, naming
    ``dataset: manifest``: with ``dataset: synthetic`` (the default) every run trains on generated
    tensors, and the corpus made or named for it is silently left aside.

    Refused rather than followed: ``dataset`` decides what a run measures (the model's compute
    alone, or with the loader, the files and real crop lengths), so the platform does not change
    it behind the user's back, nor an explicit ``dataset: synthetic`` because some path is also
    set (a space copied with its ``manifest_path``); one edit fixes it and the space then says
    what it runs. Only when no run reads the data: a sweep whose groups compare synthetic with
    manifest data (``dataset: [synthetic, manifest]``) reads it in its manifest groups."""
    paths = sorted({r.config.manifest_path for r in runs if r.config.manifest_path})
    if not (space.data or paths) or any(r.config.dataset == "manifest" for r in runs):
        return
    explicit = "dataset" in space.fixed or "dataset" in space.swept_keys
    why = f"dataset is synthetic{'' if explicit else ', the default'}: generated tensors"
    if paths:
        raise UsageError(
            f"manifest_path {paths[0]}: no run reads it ({why}); set dataset=manifest "
            "(or drop manifest_path)"
        )
    raise UsageError(
        f"{space.source}: no run reads the corpus of its data: section ({why}); set "
        "dataset: manifest under fixed: (or --set dataset=manifest), or drop the data: section"
    )


def _manifest(key: str, value: str, cfg) -> None:
    """A data_prep manifest: the file, with the columns the loader reads."""
    path = Path(value)
    if not path.is_file():
        raise UsageError(
            f"{key} {path} does not exist; make it with python -m data_prep.librispeech"
        )
    from trainables.data.manifest_table import MANIFEST_REQUIRED

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


def check_full_batches(runs: list[RunSpec]) -> None:
    """Every run's training split must give at least one full global batch an epoch, as its
    sampler forms them (trainables/data/loader.py: per crop length with crop_buckets_s; with
    batching duration, a micro-batch for every rank): the same
    rule from the manifest's lengths, without reading audio (rows whose audio file is missing are
    the workers' to skip). The launch calls it again once a ``data:`` section's corpus exists."""
    lengths: dict[tuple, object] = {}
    for run in runs:
        cfg = run.config
        if cfg.dataset != "manifest" or not cfg.manifest_path:
            continue
        held_out = 0 if cfg.val_manifest_path else cfg.val_speakers
        key = (cfg.manifest_path, held_out, crop_settings(cfg))
        if key not in lengths:
            lengths[key] = train_crop_lengths(cfg, held_out)
        if cfg.batching == "duration":
            _check_duration_steps(run, lengths[key], held_out)
            continue
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


def _check_duration_steps(run: RunSpec, lengths, held_out: int) -> None:
    """batching duration: an epoch needs a micro-batch for every rank, so at least one
    utterance per train worker (trainables/data/durations.py: ``steps_per_epoch``)."""
    cfg = run.config
    if steps_per_epoch(lengths, duration_bins(cfg), cfg.train_workers):
        return
    where = f" after holding out val_speakers={held_out}" if held_out else ""
    raise UsageError(
        f"batching duration: {cfg.manifest_path} gives {len(lengths)} training utterances"
        f"{where}, too few for one step of {cfg.train_workers} workers in {run.name} (each "
        "rank needs one); use a larger corpus or fewer train_workers"
    )


def _check_planned_batches(plan: DataPlan, runs: list[RunSpec]) -> None:
    """Before a ``data:`` section's corpus exists (the dry run; the real run before making it):
    its utterance count bounds every batch, so a micro-batch the whole training split cannot
    fill is refused now, by :func:`full_batches`' rule over that many items. Crop buckets (and
    a file data_prep fails on) can only leave fewer: the real run checks the corpus it made."""
    import numpy as np

    for run in runs:
        cfg = run.config
        held_out = 0 if cfg.val_manifest_path else cfg.val_speakers
        if cfg.dataset != "manifest" or held_out >= plan.speakers:
            continue  # too many held out: the real run's speaker split names it
        items = np.zeros((plan.speakers - held_out) * plan.utterances_per_speaker)
        if cfg.batching == "duration":  # a rank-batch per worker (durations.steps_per_epoch)
            if len(items) < cfg.train_workers:
                raise UsageError(
                    f"batching duration: the data: section's corpus has {len(items)} training "
                    f"utterances, fewer than the {cfg.train_workers} train workers of "
                    f"{run.name}; make data: synth larger or use fewer train_workers"
                )
            continue
        sizes = dict(world_size=cfg.train_workers, by_shape=False)
        if full_batches(items, micro_batch=cfg.micro_batch, **sizes):
            continue
        best = largest_micro_batch(items, **sizes)
        where = f" after holding out val_speakers={held_out}" if held_out else ""
        fix = (
            f"the largest that can fit is {best}: --set micro_batch={best}"
            if best
            else "make data: synth larger or use fewer train_workers"
        )
        raise UsageError(
            f"micro_batch {cfg.micro_batch}: the data: section's corpus has {len(items)} "
            f"training utterances{where}, no full global batch ({cfg.micro_batch} x "
            f"{cfg.train_workers} workers) in {run.name}; {fix}"
        )


def train_crop_lengths(cfg, held_out: int):
    """Every training item's crop length (samples), as the run's dataset will crop it."""
    from trainables.data.crops import crop_lengths
    from trainables.data.manifest_table import read_manifest_table, speaker_split

    table = read_manifest_table(Path(cfg.manifest_path))
    num_samples = table.column("num_samples").to_numpy()
    if held_out:
        try:
            num_samples = num_samples[~speaker_split(table, held_out)]
        except ValueError as exc:  # too many held out, or no speaker column: one line
            raise UsageError(f"{exc} ({cfg.manifest_path})") from None
    return crop_lengths(num_samples, crop_settings(cfg))


def _check_checkpoints(runs: list[RunSpec]) -> None:
    """Pretrained folders must hold the right kind of checkpoint, and the text encoder must have
    positions for text_tokens."""
    from trainables.model.pretrained import checkpoint_problem, read_config

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
