"""One way to launch and record a run, for sweeps (``platform.tune``) and final training
(``platform.train``): output root, cluster, corpus and tokenizer, the ``Tuner`` whose trials
each run one ``TorchTrainer``, the recorder (Parquet, manifest, telemetry, heartbeats, failure
handling), signals, and ``--resume``. Neither CLI copies any of it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from platform.analysis import stats
from platform.errors import EXIT_USAGE, UsageError
from platform.execution.provenance import GIT_KEYS, git_facts
from platform.execution.resume import drop_rows
from platform.spaces.space import DataPlan, RunSpec, SearchSpace
from platform.storage import results
from stage1_common.fileio import ensure_writable_dir
from trainables.config import field_names

__all__ = [
    "MANIFEST_COLUMNS",
    "output_root_arg",
    "launch",
    "needs_corpus",
    "prepare_corpus",
    "prepare_inputs",
    "prepare_output_root",
    "resolve_resources",
    "train_env_vars",
    "write_manifest",
    "StopSignals",
]

MANIFEST_COLUMNS = [
    "run",
    "group",
    "repeat",
    "status",
    "failure_reason",
    "exit_code",
    "duration_sec",
    "last_step",
    "tail_samples_per_sec_mean",
    "tail_mean_iter_p50_ms",
    "startup_s",
    "gpu_telemetry_rows",
    "gpu_telemetry_empty_flag",
    "host_telemetry_rows",
    "stall_alerts",
    *results.PLACEMENT_KEYS,
    *results.STARTUP_KEYS,
    *results.TRAINING_KEYS,
    *results.EFFECTIVE_KEYS,
    *GIT_KEYS,
    *field_names(),
]


def output_root_arg(text: str) -> Path:
    """``--output-root``: a path, or a ``file://`` URI (read with pyarrow.fs). On a cluster it
    must be storage every node mounts at that path; object stores are refused with the fix."""
    import argparse
    from urllib.parse import urlparse

    scheme = urlparse(text).scheme
    if not scheme or len(scheme) == 1:  # a plain path (or a Windows drive letter)
        return Path(text)
    if scheme == "file":
        import pyarrow.fs

        fs, path = pyarrow.fs.FileSystem.from_uri(text)
        if isinstance(fs, pyarrow.fs.LocalFileSystem):
            return Path(path)
    raise argparse.ArgumentTypeError(
        f"{text}: {scheme}:// output roots are not supported yet; mount the bucket on every node "
        "(s3fs, gcsfuse) or use a shared filesystem path"
    )


def prepare_output_root(output_root: Path | None, space_name: str) -> Path:
    """Create the output root and prove it writable, before Ray starts."""
    if output_root is None:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        output_root = Path("outputs") / f"{space_name}_{stamp}"
    output_root = output_root.expanduser().resolve()
    if (output_root / results.MANIFEST).exists() or (output_root / results.TIMING_DIR).exists():
        raise UsageError(
            f"output root {output_root} already holds a sweep; choose another --output-root"
        )
    try:
        ensure_writable_dir(output_root)
    except OSError as exc:
        raise UsageError(
            f"output root {output_root} cannot be written ({exc.strerror or exc}); "
            "choose a writable --output-root"
        ) from None
    return output_root


def prepare_inputs(
    space: SearchSpace,
    runs: list[RunSpec],
    *,
    address: str | None,
    resume: bool,
    output_root: Path | None,
    what: str = "sweep",
) -> tuple[Path, dict[str, dict[str, Any]]]:
    """Before Ray starts: the runs' inputs, the cluster address, and the output root (a new
    one, or with ``resume`` the one to finish and its runs that finished ok). Raises UsageError
    with the fix."""
    from platform.execution.resume import previous_status
    from platform.spaces.space import check_inputs
    from stage1_common.ray_address import address_problem

    check_inputs(space, runs)
    problem = address_problem(address)
    if problem:
        raise UsageError(
            f"cannot reach Ray at --address {address}: {problem}; check the address "
            "or drop --address to start a local cluster"
        )
    if not resume:
        return prepare_output_root(output_root, space.name), {}
    if output_root is None:
        raise UsageError(f"--resume needs the --output-root of the {what} to finish")
    output_root = output_root.expanduser().resolve()
    return output_root, previous_status(output_root, runs)


def resolve_resources(
    runs: list[RunSpec],
    cluster: dict[str, float],
    nodes: list[dict[str, float]] | None = None,
) -> list[RunSpec]:
    """Decide ``use_gpu: auto`` and check that every trial fits the cluster (``cluster``: its
    totals; ``nodes``: each alive node's resources), so that no trial waits forever for
    resources that do not exist, or for nodes a placement strategy needs."""
    cpus, gpus = cluster.get("CPU", 0.0), cluster.get("GPU", 0.0)
    out = []
    for run in runs:
        cfg = run.config
        use_gpu = cfg.use_gpu if cfg.use_gpu != "auto" else gpus >= cfg.train_workers
        if cfg.precision == "fp16" and not use_gpu:
            raise UsageError(
                f"run {run.name}: precision fp16 needs GPUs, the run has none; use fp32, bf16 or auto"
            )
        need_cpu = cfg.train_workers * cfg.cpus_per_train_worker
        need_gpu = cfg.train_workers if use_gpu else 0
        if need_cpu > cpus or need_gpu > gpus:
            raise UsageError(
                f"run {run.name} needs {need_cpu} CPUs and {need_gpu} GPUs "
                f"({cfg.train_workers} train workers x {cfg.cpus_per_train_worker} CPUs), the "
                f"cluster has {cpus:g} CPUs and {gpus:g} GPUs; lower train_workers, num_workers "
                "or cpus_per_worker"
            )
        if nodes is not None:
            _check_placement(run, cfg, bool(use_gpu), nodes)
        out.append(dataclasses.replace(run, config=dataclasses.replace(cfg, use_gpu=use_gpu)))
    return out


def _check_placement(run: RunSpec, cfg, use_gpu: bool, nodes: list[dict[str, float]]) -> None:
    """A placement that spans nodes (``nodes`` > 0, STRICT_SPREAD, STRICT_PACK) needs enough
    nodes that can each hold their share of the workers."""
    per_node = cfg.workers_per_node
    want = cfg.train_workers // per_node
    if cfg.placement_strategy == "STRICT_PACK":
        per_node, want = cfg.train_workers, 1
    elif not cfg.nodes and cfg.placement_strategy != "STRICT_SPREAD":
        return
    cpu, gpu = per_node * cfg.cpus_per_train_worker, (per_node if use_gpu else 0)
    able = sum(1 for n in nodes if n.get("CPU", 0.0) >= cpu and n.get("GPU", 0.0) >= gpu)
    if able < want:
        how = (
            f"placement_strategy {cfg.placement_strategy}"
            if not cfg.nodes
            else f"nodes {cfg.nodes}, placement_strategy {cfg.placement_strategy}"
        )
        raise UsageError(
            f"run {run.name} places {cfg.train_workers} train workers on {want} nodes of "
            f"{per_node} each ({how}), which needs {want} nodes with {cpu} CPUs and {gpu} GPUs "
            f"free; the cluster has {able} such node(s) of {len(nodes)}; add nodes, or lower "
            "train_workers, or use placement_strategy PACK"
        )


# --- running ---
def launch(
    space: SearchSpace,
    runs: list[RunSpec],
    output_root: Path,
    *,
    report: Callable[[list[dict[str, Any]], Path, float], int],
    address: str | None,
    dashboard_host: str = "127.0.0.1",
    dashboard_port: int = 8265,
    metrics_port: int | None = None,
    done: dict[str, dict[str, Any]] | None = None,
    resume: bool = False,
    training: bool = False,
    before_trials: Callable[[list[RunSpec]], list[RunSpec]] | None = None,
    loggers: list[str] = (),
) -> int:
    """Run ``runs`` (one Tune trial each) and record them; ``report`` prints the outcome and
    returns the exit code. With ``resume``, ``done`` holds the runs of the earlier attempt that
    finished ok (not run again). ``training`` (platform.train): a resumed run keeps the windows
    its earlier attempts measured (it continues from a checkpoint; rows carry their
    ``attempt``). ``loggers``: the --logger series (platform/loggers.py). ``before_trials`` may
    adjust the runs once the corpus exists (epochs -> max_steps)."""
    done = done or {}
    stop = StopSignals()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # The platform's callback is the record; Tune's own result.json/progress.csv per trial
    # would copy every window and telemetry sample again.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # A trial stopped by run_timeout_s (or Ctrl-C) is killed after this grace, not Tune's
    # default 600 s: its Train workers hold the resources the next run waits for.
    os.environ.setdefault("TUNE_FORCE_TRIAL_CLEANUP_S", "10")
    # ASHA's metric is computed in the driver (platform/race.py), not reported by the trial.
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    import ray
    from ray import tune

    # With Tune's loggers off, the ResultGrid that fit() returns warns that it found no
    # result.json; nothing reads that grid (the recorder's files are the results).
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)

    from platform.execution.cluster import start_cluster
    from platform.execution.nodes import check_nodes
    from platform.record.recorder import SweepRecorder
    from stage1_common.cluster import alive_nodes
    from trainables.trial import run_trial

    sweep_start = time.time()
    print(f"output root: {output_root}", flush=True)
    try:
        cluster = start_cluster(
            address=address,
            dashboard_host=dashboard_host,
            dashboard_port=dashboard_port,
            metrics_port=metrics_port,
            env_vars=train_env_vars(),
        )
    except ConnectionError as exc:
        print(
            f"platform.tune: error: cannot reach Ray at --address {address} ({exc}); "
            "check the address or drop --address to start a local cluster",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        multi_node = cluster.joined or len(alive_nodes()) > 1
        try:
            if multi_node:
                # Every node: the driver's versions, the shipped code, the output root.
                facts = check_nodes(output_root)
                print(
                    f"cluster: {len(facts)} nodes ("
                    + ", ".join(sorted(f["node_ip"] for f in facts))
                    + "); each runs the driver's versions, the code shipped with the job, and "
                    "sees the output root",
                    flush=True,
                )
            runs = resolve_resources(
                runs,
                ray.cluster_resources(),
                [n["Resources"] for n in ray.nodes() if n.get("Alive")],
            )
        except UsageError as exc:
            print(f"platform.tune: error: {exc}", file=sys.stderr)
            if not resume:
                _remove_if_empty(output_root)
            return EXIT_USAGE
        if needs_corpus(space, runs):
            manifest = prepare_corpus(space.data, output_root)
            runs = [
                dataclasses.replace(
                    r, config=dataclasses.replace(r.config, manifest_path=str(manifest))
                )
                for r in runs
            ]
        if before_trials is not None:
            try:
                runs = before_trials(runs)
            except (UsageError, ValueError) as exc:
                print(f"platform: error: {exc}", file=sys.stderr)
                return EXIT_USAGE
        if multi_node:
            try:
                check_nodes(manifests=_run_manifests(runs))
            except UsageError as exc:
                print(f"platform.tune: error: {exc}", file=sys.stderr)
                if not resume:
                    _remove_if_empty(output_root)
                return EXIT_USAGE
        runs = prepare_tokenizers(runs, output_root)
        for run in runs:
            if space.search.name == "optuna" and run.name not in done:
                continue  # written when optuna picks its group
            _write_run_record(output_root, run, space.ref)
        if cluster.dashboard_url:
            print(f"Ray dashboard: {cluster.dashboard_url}", flush=True)
        elif not cluster.joined:
            print(
                "Ray dashboard: not running (its packages are missing: pip install 'ray[default]')"
            )
        if cluster.metrics_url:
            print(f"Prometheus metrics: {cluster.metrics_url}", flush=True)
        if not cluster.joined:
            from platform.record.grafana import install

            board = install()
            if board is not None:
                print(
                    f"Grafana dashboard 'Stage-1 sweep': {board} (README: Dashboards)", flush=True
                )
        facts = git_facts()
        todo = [r for r in runs if r.name not in done]
        if resume:
            removed = drop_rows(output_root, [r.name for r in todo], keep_parts=training)
            print(
                f"resuming: {len(done)} runs finished ok are kept, {len(todo)} run again "
                + (
                    "from their latest complete checkpoint (earlier windows kept)"
                    if training
                    else f"({removed} part files of their earlier attempts removed)"
                ),
                flush=True,
            )
        recorder = SweepRecorder(output_root, runs, facts=facts, loggers=loggers)
        recorder.status.update({k: dict(v) for k, v in done.items()})
        # search: optuna plans a group's runs when it picks the group; every other search
        # plans all of them now (the manifest lists the planned runs).
        planned = [r for r in runs if space.search.name != "optuna" or r.name in done]
        recorder.on_change = lambda: write_manifest(output_root, planned, recorder.status, facts)
        tune_config, stopper = _search_and_stop(
            space, runs, todo, done, output_root, recorder, planned, resume
        )
        write_manifest(output_root, planned, recorder.status, facts)
        tuner = tune.Tuner(
            # The trial only waits on its TorchTrainer, whose workers reserve the CPUs and GPUs.
            # Tune refuses an empty request, so the trial holds a token 1 MiB of logical memory.
            tune.with_resources(run_trial, {"cpu": 0, "memory": 2**20}),
            tune_config=tune_config,
            run_config=tune.RunConfig(
                name="tune",
                storage_path=str(output_root),
                callbacks=[recorder],
                stop=stopper,
                failure_config=tune.FailureConfig(fail_fast=space.stop_on_error),
                verbose=0,
            ),
        )
        try:
            if todo:
                with stop:
                    tuner.fit()
        finally:
            # Whatever ended the sweep (done, Ctrl-C, SIGTERM, an error), the buffered rows are
            # written and the manifest says where every run stands.
            recorder.on_experiment_end(trials=[])
            interrupted = recorder.mark_interrupted(stop.received or "SIGINT")
            recorder.mark_skipped()
            manifest = write_manifest(output_root, planned, recorder.status, facts)
        recorder.close()
        code = report(manifest, output_root, time.time() - sweep_start)
        unfinished = [r["run"] for r in manifest if r["status"] in ("pending", "interrupted")]
        stopped_on_error = space.stop_on_error and any(r["status"] != "ok" for r in manifest)
        if stopped_on_error and not stop.received:
            print(f"stopped on error (stop_on_error): {len(unfinished)} run(s) not started")
            return 1
        if unfinished:
            # Tune ends fit() early only on a stop signal; SIGTERM is noted, so this was SIGINT.
            stop.received = stop.received or "SIGINT"
            print(
                f"interrupted by {stop.received}: {len(interrupted)} run(s) cut short, "
                f"{len(unfinished)} unfinished; finish with the same command plus --resume",
                flush=True,
            )
            return stop.exit_code
        return code
    finally:
        ray.shutdown()


def _search_and_stop(
    space: SearchSpace,
    runs: list[RunSpec],
    todo: list[RunSpec],
    done: dict[str, dict[str, Any]],
    output_root: Path,
    recorder,
    planned: list[RunSpec],
    resume: bool,
):
    """The Tune search algorithm that hands out the runs (``search``), the early-stopping
    scheduler (``scheduler``) and the stopper, all sharing the sweep's ``schedule.json``
    (platform/race.py)."""
    from ray import tune

    from platform.control.race import (
        OptunaPlanner,
        PlannedSearcher,
        Race,
        Schedule,
        SweepStopper,
        WarmASHA,
    )

    schedule = Schedule(output_root, space, runs)
    if resume:
        schedule.load()
    schedule.save()
    recorder.schedule = schedule
    trial_runs = recorder.trial_runs

    def param(run: RunSpec) -> dict[str, Any]:
        return _trial_param(run, output_root)

    race = None
    if space.scheduler.name == "race":
        race = Race(runs, space, schedule, echo=recorder.echo)
        if resume:
            timing = results.read_dataset(output_root / results.TIMING_DIR, results.TIMING_SCHEMA)
            race.restore(timing, done)
    if space.search.name == "optuna":

        def on_plan(run: RunSpec) -> None:
            if run not in planned:
                planned.append(run)
                _write_run_record(output_root, run, space.ref)

        searcher = OptunaPlanner(space, todo, param, trial_runs, schedule, on_plan)
    else:
        searcher = PlannedSearcher(todo, param, trial_runs, race)
    scheduler = (
        WarmASHA(space, runs, schedule, trial_runs) if space.scheduler.name == "asha" else None
    )
    tune_config = tune.TuneConfig(
        search_alg=searcher,
        scheduler=scheduler,
        num_samples=-1,  # until the search algorithm says it is finished
        max_concurrent_trials=space.max_concurrent_trials,
        trial_name_creator=_trial_name,
        trial_dirname_creator=_trial_name,
    )
    return tune_config, SweepStopper(runs, trial_runs, race)


def _remove_if_empty(output_root: Path) -> None:
    """A sweep refused before it wrote anything leaves no empty output root behind."""
    try:
        output_root.rmdir()
    except OSError:
        pass


def _run_manifests(runs: list[RunSpec]) -> list[tuple[str, str]]:
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


class StopSignals:
    """Inside the block, SIGTERM stops the sweep the way Ctrl-C does: Tune's own SIGINT handler
    ends the experiment gracefully (trials stopped, state saved), and the driver then writes
    every buffered row, the manifest and the summary."""

    EXIT = {"SIGINT": 130, "SIGTERM": 143}

    def __init__(self) -> None:
        self.received: str | None = None
        self.previous: dict[int, Any] = {}

    @property
    def exit_code(self) -> int:
        return self.EXIT.get(self.received or "", 1)

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.getsignal(sig)
        signal.signal(signal.SIGTERM, self._on_term)
        # SIGINT stays Tune's: fit() installs its own handler for the graceful stop.
        return self

    def _on_term(self, signum, frame) -> None:
        self.received = self.received or "SIGTERM"
        signal.raise_signal(signal.SIGINT)  # Tune's graceful stop

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def prepare_tokenizers(runs: list[RunSpec], output_root: Path) -> list[RunSpec]:
    """Build each manifest's tokenizer once, here, and put it under the output root
    (``tokenizers/``); every rank of every run loads that file (``tokenizer_path``), on any node
    of a cluster, instead of training its own or relying on a cache of its node. Runs whose
    text checkpoint has a tokenizer, or that name a ``tokenizer_path`` themselves, keep theirs."""
    from trainables.manifest import read_manifest_table
    from trainables.model import text_vocab_size
    from trainables.pretrained import has_tokenizer
    from trainables.text import load_or_build_tokenizer

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
            path = output_root / "tokenizers" / f"{manifest.stem}-{key[1]}-{digest}.json"
            if not path.is_file():
                results.atomic_write_text(path, text)
            built[key] = str(path)
        out.append(
            dataclasses.replace(run, config=dataclasses.replace(cfg, tokenizer_path=built[key]))
        )
    return out


def needs_corpus(space: SearchSpace, runs: list[RunSpec]) -> bool:
    """A space's ``data`` corpus is made only when no run names a manifest of its own."""
    return space.data is not None and not any(r.config.manifest_path for r in runs)


def prepare_corpus(plan: DataPlan, output_root: Path) -> Path:
    """Generate the space's synthetic corpus under ``<output_root>/data/`` and prepare it with
    data_prep on the sweep's cluster; returns the manifest path."""
    from data_prep import synth
    from data_prep.layout import discover
    from data_prep.librispeech import prepare

    raw, prepared = output_root / "data" / "synth", output_root / "data" / "prepared"
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
    )
    if counts["written"] + counts["skipped"] == 0:
        raise RuntimeError(f"data preparation produced no utterance; see {manifest}")
    return manifest


# Communication settings a user exported for the driver must reach every worker, also on a
# cluster joined with --address (whose processes did not inherit this shell's environment).
FORWARDED_ENV_PREFIXES = ("NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM_", "GLOO_")


def train_env_vars(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of every process of the sweep's Ray job.

    A Ray Train V2 worker's result queue holds one report, and the controller drains it only on
    its health-check poll (2 s by default): a window shorter than that would block in
    ``ray.train.report``. A shorter poll keeps short windows honest; users can still set it.
    """
    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if k.startswith(FORWARDED_ENV_PREFIXES)}
    env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = environ.get(
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25"
    )
    return env


def _trial_name(trial) -> str:
    return trial.config["run"]["name"]


def _trial_param(run: RunSpec, output_root: Path) -> dict[str, Any]:
    return {
        "name": run.name,
        "group": run.group,
        "repeat": run.repeat,
        "storage_path": str(output_root / "runs"),
        "config": run.config.to_dict(),
    }


def _write_run_record(output_root: Path, run: RunSpec, space: str) -> None:
    """``runs/<run>/config.json``: what the analysis and promotion read of a planned run."""
    results.write_json(output_root / "runs" / run.name / "config.json", _run_record(run, space))


def _run_record(run: RunSpec, space: str) -> dict[str, Any]:
    return {
        "space": space,
        "run": run.name,
        "group": run.group,
        "repeat": run.repeat,
        "swept": run.swept,
        "baseline": run.baseline,
        "config": run.config.to_dict(),
    }


def write_manifest(
    output_root: Path,
    runs: list[RunSpec],
    status: dict[str, dict[str, Any]],
    facts: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One row per run: its status and key figures (from timing.parquet) and every config value."""
    timing = results.read_dataset(output_root / results.TIMING_DIR, results.TIMING_SCHEMA)
    figures = stats.run_figures(timing, {r.name: r.config.tail_timing_points for r in runs})
    rows = []
    for run in runs:
        st = status.get(run.name, {"status": "pending"})
        rows.append(
            {
                "run": run.name,
                "group": run.group,
                "repeat": run.repeat,
                "status": st["status"],
                "failure_reason": st.get("failure_reason", ""),
                "exit_code": st.get("exit_code"),
                "duration_sec": st.get("duration_sec"),
                **_telemetry_counts(run, st),
                **st.get("effective", {}),
                **(facts or {}),
                **figures.get(run.name, {}),
                **run.config.to_dict(),
            }
        )
    results.write_tsv(output_root / results.MANIFEST, rows, MANIFEST_COLUMNS)
    return rows


def _telemetry_counts(run: RunSpec, st: dict[str, Any]) -> dict[str, Any]:
    gpu_rows = st.get("gpu_telemetry_rows", 0)
    finished = st["status"] not in ("pending", "running")
    return {
        "gpu_telemetry_rows": gpu_rows,
        # A GPU run that sampled nothing: NVML missing or broken on its nodes.
        "gpu_telemetry_empty_flag": bool(
            finished and run.config.use_gpu is True and run.config.telemetry and gpu_rows == 0
        ),
        "host_telemetry_rows": st.get("host_telemetry_rows", 0),
        "stall_alerts": st.get("stall_alerts", 0),
        **{
            k: st[k]
            for k in (*results.PLACEMENT_KEYS, *results.STARTUP_KEYS, *results.TRAINING_KEYS)
            if k in st
        },
    }
