"""What a run reads and where it writes, made ready before its first trial: the output root
(``--output-root``: new, or the one ``--resume`` finishes; platform/storage/open_root.py), the
space's synthetic corpus, each manifest's tokenizer (built once, under the output root, for
every rank on every node), and the manifests every node must read. ``--dry-run`` asks the same
questions (``check_inputs_only``) and creates nothing."""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from pathlib import Path
from typing import Any

from platform.errors import UsageError
from platform.execution.resume import previous_status
from platform.spaces.expand import RunSpec, needs_corpus
from platform.spaces.plans import DataPlan
from platform.spaces.space import SearchSpace
from platform.storage import results
from platform.storage.mirror import publish
from platform.storage.open_root import start_root
from stage1_common.output_root import OutputRoot

__all__ = [
    "check_inputs_only",
    "needs_corpus",
    "prepare_corpus",
    "prepare_inputs",
    "prepare_tokenizers",
    "remove_if_empty",
    "run_manifests",
]


def prepare_inputs(
    space: SearchSpace,
    runs: list[RunSpec],
    *,
    address: str | None,
    resume: bool,
    output_root: Path | str | None,
    what: str = "sweep",
) -> tuple[OutputRoot, dict[str, dict[str, Any]]]:
    """Before Ray starts: the runs' inputs, the cluster address, and the root ``output_root``
    (--output-root) names (platform/storage/open_root.py: a new one, or with ``resume`` the one
    to finish, with its runs that finished ok). Raises UsageError with the fix."""
    _check_runs_and_address(space, runs, address)
    root = start_root(output_root, name=space.name, what=what, resume=resume)
    return root, previous_status(root, runs) if resume else {}


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
    nothing is created or written (a root on object storage is left to the real run: probing a
    bucket writes to it)."""
    _check_runs_and_address(space, runs, address)
    root = start_root(output_root, name=space.name, what=what, resume=resume, create=False)
    if resume and root is not None:
        previous_status(root, runs)


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


def remove_if_empty(root: OutputRoot) -> None:
    """A sweep refused before it wrote anything leaves no empty output root behind."""
    try:
        root.path.rmdir()
    except OSError:
        pass


def prepare_corpus(plan: DataPlan, root: OutputRoot) -> Path:
    """Generate the space's synthetic corpus under ``<root>/data/`` and prepare it with
    data_prep in this process (before Ray starts: launch.py says why); returns the manifest
    path."""
    from data_prep import synth
    from data_prep.layout import discover
    from data_prep.librispeech import prepare

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


def with_corpus(space: SearchSpace, runs: list[RunSpec], root: OutputRoot) -> list[RunSpec]:
    """The runs reading the space's ``data:`` corpus, made here when they need it (before Ray
    starts: platform/execution/launch.py), each with its manifest_path, and a full global batch
    for every run from it (preflight.check_full_batches: UsageError)."""
    if not needs_corpus(space, runs):
        return runs
    from platform.spaces.preflight import check_full_batches

    manifest = str(prepare_corpus(space.data, root))
    runs = [
        dataclasses.replace(r, config=dataclasses.replace(r.config, manifest_path=manifest))
        for r in runs
    ]
    check_full_batches(runs)
    return runs


def prepare_tokenizers(runs: list[RunSpec], root: OutputRoot) -> list[RunSpec]:
    """Build each manifest's tokenizer once, here, and put it under the output root
    (``tokenizers/``); every rank of every run loads that file (``tokenizer_path``), on any node
    of a cluster, instead of training its own or relying on a cache of its node. Runs whose
    text checkpoint has a tokenizer, or that name a ``tokenizer_path`` themselves, keep theirs."""
    from trainables.data.manifest_table import read_manifest_table
    from trainables.data.text import load_or_build_tokenizer, text_vocab_size
    from trainables.model.pretrained import has_tokenizer

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
            built[key] = publish(root, path)  # where every node reads it (trainables/data/text.py)
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
