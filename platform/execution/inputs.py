"""What a run reads and where it writes, made ready before its first trial: the output root
(``--output-root``: new, or the one ``--resume`` finishes), the space's synthetic corpus, each
manifest's tokenizer (built once, under the output root, for every rank on every node), and the
manifests every node must read. ``--dry-run`` asks the same questions (``check_inputs_only``)
and creates nothing."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import sys
from pathlib import Path
from typing import Any

from platform.errors import UsageError
from platform.spaces.expand import RunSpec, needs_corpus
from platform.spaces.plans import DataPlan
from platform.spaces.space import SearchSpace
from platform.storage import results
from stage1_common.fileio import ensure_writable_dir, unwritable_parent
from stage1_common.output_root import OutputRoot
from stage1_common.storage import Location

__all__ = [
    "check_inputs_only",
    "needs_corpus",
    "output_root_arg",
    "output_root_problem",
    "planned_output_root",
    "prepare_corpus",
    "prepare_inputs",
    "prepare_output_root",
    "prepare_tokenizers",
    "remove_if_empty",
    "run_manifests",
]


def output_root_arg(text: str) -> Path | str:
    """``--output-root``: a path, a ``file://`` URI (read with pyarrow.fs), or an object-storage
    prefix (``s3://bucket/prefix``, ``gs://...``: kept as the URI, staged by
    platform/storage/mirror.py). A folder on a cluster must be storage every node mounts."""
    import argparse
    from urllib.parse import urlparse

    from stage1_common.storage import is_remote

    if not text.strip():  # Path("") is the current folder: never what a user meant
        raise argparse.ArgumentTypeError(
            "is empty; give a folder (e.g. outputs/NAME) or s3://bucket/prefix, or leave "
            "--output-root out for outputs/<space>_<timestamp>"
        )
    scheme = urlparse(text).scheme
    if not scheme or len(scheme) == 1:  # a plain path (or a Windows drive letter)
        return Path(text)
    if is_remote(text):
        parsed = urlparse(text)
        secret = {"access_key", "secret_key", "session_token"} & set(
            k.lower() for k, _, _ in (q.partition("=") for q in parsed.query.split("&") if q)
        )
        if "@" in parsed.netloc or secret:
            # Every output names its root: a key in it would be written into all of them.
            raise argparse.ArgumentTypeError(
                f"{parsed.scheme}://{parsed.hostname or ''}{parsed.path}: credentials in the "
                "URI would be written into every output; set them in the environment "
                "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE) instead"
            )
        return text
    if scheme == "file":
        import pyarrow.fs

        fs, path = pyarrow.fs.FileSystem.from_uri(text)
        if isinstance(fs, pyarrow.fs.LocalFileSystem):
            return Path(path)
    raise argparse.ArgumentTypeError(
        f"{text}: {scheme}:// output roots are not supported; use a folder (on a cluster, one "
        "every node mounts) or s3:// / gs://"
    )


def planned_output_root(output_root: Path | None, space_name: str) -> OutputRoot:
    """The local output root a run writes to: ``--output-root``, or
    ``outputs/<space>_<timestamp>``."""
    if output_root is None:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        output_root = Path("outputs") / f"{space_name}_{stamp}"
    return OutputRoot(output_root.expanduser().resolve())


def output_root_problem(root: OutputRoot) -> str | None:
    """Why a new run cannot write to ``root``, found without creating anything (the dry run
    asks this too): a file in its place, a sweep already there, or a nearest existing folder
    above it that is a file or cannot be written."""
    path = root.path
    if path.exists() and not path.is_dir():
        return f"output root {path} is a file; choose a folder for --output-root"
    if root.manifest.exists() or root.timing.exists():
        return f"output root {root} already holds a sweep; choose another --output-root"
    why = unwritable_parent(path)
    if why is None:
        return None
    return f"output root {root} cannot be written ({why}); choose a writable --output-root"


def prepare_output_root(output_root: Path | str | None, space_name: str) -> OutputRoot:
    """Create the output root and prove it writable, before Ray starts (a root on object
    storage: the bucket probed, a staging folder made)."""
    if isinstance(output_root, str):
        return _remote_root(output_root, resume=False)
    root = planned_output_root(output_root, space_name)
    problem = output_root_problem(root)
    if problem:
        raise UsageError(problem)
    try:
        ensure_writable_dir(root.path)
    except OSError as exc:
        raise UsageError(
            f"output root {root} cannot be written ({exc.strerror or exc}); "
            "choose a writable --output-root"
        ) from None
    return root


def prepare_inputs(
    space: SearchSpace,
    runs: list[RunSpec],
    *,
    address: str | None,
    resume: bool,
    output_root: Path | str | None,
    what: str = "sweep",
) -> tuple[OutputRoot, dict[str, dict[str, Any]]]:
    """Before Ray starts: the runs' inputs, the cluster address, and the output root (a new
    one, or with ``resume`` the one to finish and its runs that finished ok). Raises UsageError
    with the fix."""
    _check_runs_and_address(space, runs, address)
    if not resume:
        return prepare_output_root(output_root, space.name), {}
    return _resumed_root(output_root, runs, what, stage=True)


def check_inputs_only(
    space: SearchSpace,
    runs: list[RunSpec],
    *,
    address: str | None,
    resume: bool,
    output_root: Path | str | None,
    what: str = "sweep",
) -> None:
    """``--dry-run``: what :func:`prepare_inputs` refuses, refused with the same line, while
    nothing is created or written. A root on object storage is left to the real run (probing
    a bucket writes to it)."""
    _check_runs_and_address(space, runs, address)
    if not resume:
        if not isinstance(output_root, str):
            problem = output_root_problem(planned_output_root(output_root, space.name))
            if problem:
                raise UsageError(problem)
        return
    _resumed_root(output_root, runs, what, stage=False)


def _check_runs_and_address(space: SearchSpace, runs: list[RunSpec], address: str | None) -> None:
    from platform.spaces.preflight import check_inputs
    from stage1_common.ray_address import address_problem

    check_inputs(space, runs)
    _check_local_fit(runs, address)
    problem = address_problem(address)  # before the output root is made: nothing written yet
    if problem:
        raise UsageError(problem)


def _check_local_fit(runs: list[RunSpec], address: str | None) -> None:
    """Every run must fit the cluster it would use, before Ray starts and in the dry run: a
    local cluster gets this machine's CPUs and GPUs (counted as Ray will count them:
    stage1_common.cluster.local_cpus, local_gpus), held to the rule the launch applies to the
    cluster it started (resources.resolve_resources). A cluster joined with ``--address`` is
    not joined by the dry run (it starts no Ray): the launch checks it as soon as it joins,
    before any trial."""
    from platform.execution.resources import resolve_resources
    from stage1_common.cluster import joining, local_cpus, local_gpus

    if joining(address):
        return
    machine = {"CPU": float(local_cpus()), "GPU": float(local_gpus())}
    resolve_resources(runs, machine, [machine], where="this machine")


def _resumed_root(
    output_root: Path | str | None, runs: list[RunSpec], what: str, *, stage: bool
) -> tuple[OutputRoot | None, dict[str, dict[str, Any]]]:
    """``--resume``: the root to finish and its runs that finished ok (read only). A root on
    object storage is staged locally first, unless ``stage`` is off (then (None, {}))."""
    from platform.execution.resume import previous_status

    if output_root is None:
        raise UsageError(f"--resume needs the --output-root of the {what} to finish")
    if isinstance(output_root, str):
        if not stage:
            return None, {}
        root = _remote_root(output_root, resume=True)
        return root, previous_status(root, runs)
    root = OutputRoot(output_root.expanduser().resolve())
    return root, previous_status(root, runs)


def _remote_root(uri: str, *, resume: bool) -> OutputRoot:
    """A root on object storage, staged locally; its problems as UsageError (one line)."""
    from platform.storage.mirror import stage_remote_root
    from stage1_common.storage import StorageError

    try:
        return stage_remote_root(uri, resume=resume)
    except StorageError as exc:
        raise UsageError(str(exc)) from None


def remove_if_empty(output_root: OutputRoot | Path) -> None:
    """A sweep refused before it wrote anything leaves no empty output root behind."""
    try:
        OutputRoot.of(output_root).path.rmdir()
    except OSError:
        pass


def prepare_corpus(plan: DataPlan, output_root: OutputRoot | Path) -> Path:
    """Generate the space's synthetic corpus under ``<output_root>/data/`` and prepare it with
    data_prep in this process (before Ray starts: launch.py says why); returns the manifest
    path."""
    from data_prep import synth
    from data_prep.layout import discover
    from data_prep.librispeech import prepare

    root = OutputRoot.of(output_root)
    raw, prepared = root.synth_data, root.prepared_data
    manifest = prepared / f"manifest_{plan.target_sr // 1000}k{'_trim' if plan.trim else ''}.tsv"
    if manifest.is_file():  # --resume: written last and atomically, so the corpus is complete
        print(f"data: reusing {manifest}", flush=True)
        return manifest
    print(f"data: {plan.describe()}", flush=True)
    synth.make_corpus(raw, **plan.synth)
    counts = prepare(
        discover(raw),
        raw,
        prepared,
        manifest,
        target_sr=plan.target_sr,
        trim=plan.trim,
        log_every=100,
        stream=sys.stdout,
        in_process=True,
    )
    if counts["written"] + counts["skipped"] == 0:
        raise RuntimeError(f"data preparation produced no utterance; see {manifest}")
    return manifest


def with_corpus(space: SearchSpace, runs: list[RunSpec], output_root: OutputRoot) -> list[RunSpec]:
    """The runs reading the space's ``data:`` corpus, made here when they need it (before Ray
    starts: platform/execution/launch.py), each with its manifest_path, and a full global batch
    for every run from it (preflight.check_full_batches: UsageError)."""
    if not needs_corpus(space, runs):
        return runs
    from platform.spaces.preflight import check_full_batches

    manifest = str(prepare_corpus(space.data, output_root))
    runs = [
        dataclasses.replace(r, config=dataclasses.replace(r.config, manifest_path=manifest))
        for r in runs
    ]
    check_full_batches(runs)
    return runs


def prepare_tokenizers(runs: list[RunSpec], output_root: OutputRoot | Path) -> list[RunSpec]:
    """Build each manifest's tokenizer once, here, and put it under the output root
    (``tokenizers/``); every rank of every run loads that file (``tokenizer_path``), on any node
    of a cluster, instead of training its own or relying on a cache of its node. Runs whose
    text checkpoint has a tokenizer, or that name a ``tokenizer_path`` themselves, keep theirs."""
    from trainables.data.manifest_table import read_manifest_table
    from trainables.data.text import load_or_build_tokenizer, text_vocab_size
    from trainables.model.pretrained import has_tokenizer

    root = OutputRoot.of(output_root)
    built: dict[tuple[str, int], str] = {}
    out = []
    for run in runs:
        cfg = run.config
        if (
            cfg.dataset != "manifest"
            or has_tokenizer(cfg.text_pretrained_path)
            or cfg.tokenizer_path
        ):
            out.append(run)
            continue
        key = (cfg.manifest_path, text_vocab_size(cfg.model_size, cfg.text_pretrained_path))
        if key not in built:
            manifest = Path(cfg.manifest_path)
            table = read_manifest_table(manifest)
            tok = load_or_build_tokenizer(
                manifest, [str(t) for t in table.column("transcript").to_pylist()], key[1]
            )
            text = tok.to_str()
            digest = hashlib.sha1(text.encode()).hexdigest()[:12]
            path = root.tokenizers / f"{manifest.stem}-{key[1]}-{digest}.json"
            if not path.is_file():
                results.atomic_write_text(path, text)
            built[key] = str(path)
            if root.remote:  # every node reads it from the bucket (trainables/data/text.py)
                built[key] = root.remote_join(OutputRoot.TOKENIZERS, path.name)
                Location.of(built[key]).write_text(text)
        out.append(
            dataclasses.replace(run, config=dataclasses.replace(cfg, tokenizer_path=built[key]))
        )
    return out


def run_manifests(runs: list[RunSpec]) -> list[tuple[str, str]]:
    """(manifest, audio_root) of every manifest the runs read, training and validation."""
    out: dict[tuple[str, str], None] = {}
    for run in runs:
        cfg = run.config
        if cfg.dataset != "manifest":
            continue
        if cfg.manifest_path:
            out[(cfg.manifest_path, cfg.audio_root)] = None
        if cfg.val_manifest_path:
            out[(cfg.val_manifest_path, "")] = None
    return list(out)
