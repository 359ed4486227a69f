"""One way to launch and record a run, for sweeps (``platform.tune``) and final training
(``platform.train``), in five steps: the space's corpus and what needs it (its full global
batches, ``before_trials``) before Ray starts, connect (start or join Ray, check the nodes and
that the runs fit), prepare the inputs (tokenizers, run records), build the ``Tuner``
(execution/tuner.py) and run it to the end (signals, manifest, report, exit code). Neither CLI
copies any of it. The inputs and the checks before Ray are in execution/inputs.py.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from platform.errors import EXIT_USAGE, UsageError
from platform.execution.inputs import (
    prepare_tokenizers,
    remove_if_empty,
    run_manifests,
    with_corpus,
)
from platform.execution.resources import resolve_executors, resolve_resources
from platform.execution.resume import clear_earlier_attempts
from platform.execution.signals import (
    StopSignals,
    interrupted_counts,
    resume_command,
    start_up_signals,
)
from platform.record.manifest import write_run_record
from platform.spaces.expand import RunSpec
from platform.spaces.space import SearchSpace
from platform.storage.mirror import RootMirror, drop_staging, staged_note
from stage1_common.output_root import OutputRoot

if TYPE_CHECKING:
    from platform.analysis.priors import Priors

__all__ = ["LaunchRequest", "launch"]

# What a CLI's report gets: the manifest rows, the output root and the wall time; it prints
# the outcome and returns the exit code.
Report = Callable[[list[dict[str, Any]], OutputRoot, float], int]


@dataclass(frozen=True, kw_only=True)
class LaunchRequest:
    """What to launch, and how."""

    prog: str
    """The calling CLI's name (platform.tune, platform.train): every error line the launch
    prints starts with it."""
    space: SearchSpace
    runs: list[RunSpec]
    root: OutputRoot
    """The output root (platform/storage/open_root.py: new, or the one to finish)."""
    report: Report
    """Prints the outcome and returns the exit code (tune.report, train.report)."""
    address: str | None = None
    """The Ray cluster to join; None starts a local one."""
    dashboard_host: str = "127.0.0.1"
    dashboard_port: int | None = None  # None: Ray's 8265, or a free port where it is taken
    metrics_port: int | None = None
    done: dict[str, dict[str, Any]] = field(default_factory=dict)
    """With ``resume``: the runs of the earlier attempt that finished ok (not run again)."""
    resume: bool = False
    training: bool = False
    """platform.train: a resumed run keeps the windows its earlier attempts measured (it
    continues from a checkpoint; rows carry their ``attempt``)."""
    before_trials: Callable[[list[RunSpec]], list[RunSpec]] | None = None
    """Adjusts the runs once the corpus exists, before Ray starts (epochs -> max_steps)."""
    loggers: Sequence[str] = ()
    """The --logger series (platform/record/loggers.py)."""
    skips: dict[str, str] = field(default_factory=dict)
    """Runs not to run, and why (platform/analysis/priors.py: warm_start's known failures)."""
    priors: Priors | None = None
    """A warm race's figures from the catalogue (platform/analysis/priors.py: race_priors)."""
    history: str = "confirm"
    """What a warm race does with ``priors`` (``--history``: confirm or order; history.py)."""
    budget_s: float | None = None
    """--budget: the seconds the command may take, counted from its process's start
    (platform/control/budget.py)."""


class _Refused(Exception):
    """A step refused the launch and printed why; ``code`` is the exit code."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def launch(request: LaunchRequest) -> int:
    """Run the request's runs (one Tune trial each) and record them; returns the exit code."""
    from stage1_common.cluster import local_auth_mode
    from stage1_common.machine_cache import bytecode_env, keep_bytecode
    from trainables.observe.gc_control import collector_paused

    local_auth_mode(request.address)  # before Ray is imported
    # Before Ray is imported too: where this environment would compile every module from source
    # in every process, the driver and the processes of a local cluster it starts (they inherit
    # its environment) keep their bytecode in the machine cache (stage1_common/machine_cache.py).
    # Not passed to a joined cluster: its nodes have packages and home folders of their own.
    keep_bytecode(bytecode_env())
    with collector_paused():  # the driver's big imports (trainables/observe/gc_control.py)
        _set_ray_environment()
        import ray

    from stage1_common.cluster import alive_nodes

    started = time.time()
    root = request.root
    print(f"output root: {root.shown}{staged_note(root)}", flush=True)
    # A refused launch of a new root leaves nothing: the corpus it made goes too.
    new_corpus = not request.resume and not root.data.exists()
    try:
        with start_up_signals() as signals:  # SIGINT and SIGTERM until Tune's loop takes them
            runs = _corpus_and_batches(request)
            try:
                cluster = _connect(request)
                signals.again()  # ray.init put in its own SIGTERM handler: it aborts the driver
                multi_node = cluster.joined or len(alive_nodes()) > 1
                runs = _fit_to_cluster(request, runs, multi_node)
                runs, pool = _prepare_runs(request, runs, multi_node)
            except BaseException:
                ray.shutdown()
                raise
        try:
            _announce(cluster, request.training)
            code, whole = _run_to_the_end(request, runs, started, pool)
        finally:
            ray.shutdown()
    except _Refused as refused:
        code, whole = refused.code, False
        if new_corpus:
            import shutil

            shutil.rmtree(root.data, ignore_errors=True)
            remove_if_empty(root)
    if whole and code == 0:
        # A root on object storage, all of it in the bucket: the driver's staging copy goes
        # (--resume and platform.analyze start from the bucket), but for the corpus it made.
        kept = drop_staging(root)
        if kept is not None:
            print(
                f"the space's corpus stays in {kept}: the runs' manifest_path and the training "
                "command read it on this machine",
                flush=True,
            )
    return code


def _set_ray_environment() -> None:
    """What Ray and Tune read when imported or started; then the Tuner's modules are imported
    (before the first line is printed, so whatever they print on import comes first)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # The platform's callback is the record; Tune's own result.json/progress.csv per trial
    # would copy every window and telemetry sample again.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # A trial stopped by run_timeout_s (or Ctrl-C) is killed after this grace, not Tune's
    # default 600 s: its Train workers hold the resources the next run waits for.
    os.environ.setdefault("TUNE_FORCE_TRIAL_CLEANUP_S", "10")
    # ASHA's metric is computed in the driver (platform/control/race.py), not reported by the
    # trial.
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    import platform.execution.tuner  # noqa: F401 - Ray, Tune, the recorder and the workload

    # With Tune's loggers off, the ResultGrid that fit() returns warns that it found no
    # result.json; nothing reads that grid (the recorder's files are the results).
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)


def _refuse(request: LaunchRequest, exc: Exception) -> NoReturn:
    """Print the refusal, named by the calling CLI; a new output root the launch wrote nothing
    into goes (and the corpus it made: ``launch``)."""
    print(f"{request.prog}: error: {exc}", file=sys.stderr)
    if not request.resume:
        remove_if_empty(request.root)
    raise _Refused(EXIT_USAGE)


# --- step 1: the corpus, and what needs it, before Ray starts ---
def _corpus_and_batches(request: LaunchRequest) -> list[RunSpec]:
    """The space's ``data:`` corpus, generated and prepared in the driver, then the checks that
    need it (a full global batch for every run: preflight.check_full_batches) and
    ``before_trials``, all before Ray starts: a refusal is one line, not a failed trial. In this
    process, not on Ray Data: a generated corpus is small (preparing smoke's 32 files takes
    0.5 s on 2 cores, train_smoke's 640 0.9 s, less than Ray Data's start-up alone), and its
    generation, which it already was, costs more."""
    try:
        runs = with_corpus(request.space, request.runs, request.root)
        if request.before_trials is not None:
            runs = request.before_trials(runs)
    except (UsageError, ValueError) as exc:
        _refuse(request, exc)
    return runs


# --- step 2: connect ---
def _connect(request: LaunchRequest):
    """Start a local Ray cluster, or join ``address``."""
    from platform.execution.cluster import start_cluster, train_env_vars
    from stage1_common.cluster import joining

    try:
        return start_cluster(
            address=request.address,
            dashboard_host=request.dashboard_host,
            dashboard_port=request.dashboard_port,
            metrics_port=request.metrics_port,
            env_vars=train_env_vars(local=not joining(request.address)),
        )
    except ConnectionError as exc:
        # The GCS answered the check before the output root was made (address_problem) and
        # is gone now: the new root holds nothing yet and goes.
        _refuse(
            request,
            UsageError(
                f"cannot reach Ray at --address {request.address} ({exc}); check the address "
                "or drop --address to start a local cluster"
            ),
        )


def _fit_to_cluster(request: LaunchRequest, runs: list[RunSpec], multi_node: bool) -> list[RunSpec]:
    """Every node runs the driver's versions and sees the output root; every run fits the
    cluster (``use_gpu: auto`` decided)."""
    import ray

    from platform.execution.nodes import check_nodes

    try:
        if multi_node:
            # Every node: the driver's versions, the shipped code, the output root.
            facts = check_nodes(request.root)
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
        return resolve_executors(runs, training=request.training)
    except UsageError as exc:
        _refuse(request, exc)


# --- step 3: prepare the inputs ---
def _prepare_runs(request: LaunchRequest, runs: list[RunSpec], multi_node: bool):
    """The resident group pool and its first host, the resident groups (their first group
    starts now, while the driver goes on), every node reading the runs' manifests,
    the tokenizers, and ``runs/<run>/config.json`` of each planned run. Returns the runs and
    the resident pool (None when every run is fresh)."""
    from platform.execution.nodes import check_nodes
    from platform.execution.tuner import open_pool, start_pool

    space, root = request.space, request.root
    todo = [r for r in runs if r.name not in request.done]
    # The group pool and its first host before everything else here: they reserve no CPU, and
    # their process starts and imports overlap the checks and the tokenizers.
    pool = start_pool(root, space, todo, open_pool(root, space, todo))
    if multi_node:
        try:
            check_nodes(manifests=run_manifests(runs))
        except UsageError as exc:
            _refuse(request, exc)
    runs = prepare_tokenizers(runs, root)
    for run in runs:
        if space.search.plans_late and run.name not in request.done:
            continue  # written when the search picks its group
        write_run_record(root, run, space.ref)
    return runs, pool


def _announce(cluster, training: bool) -> None:
    """Where to watch: the Ray dashboard, the Prometheus endpoint, the Grafana dashboard (named
    for what runs: a sweep, or platform.train's training)."""
    if cluster.dashboard_url:
        print(f"Ray dashboard: {cluster.dashboard_url}", flush=True)
    elif not cluster.joined:
        from ray._private.utils import get_dashboard_dependency_error

        why = (
            "its packages are missing: pip install 'ray[default]'"
            if get_dashboard_dependency_error()
            else "it did not start; Ray's session folder holds logs/dashboard.log"
        )
        print(f"Ray dashboard: not running ({why})", flush=True)
    if cluster.metrics_url:
        print(f"Prometheus metrics: {cluster.metrics_url}", flush=True)
    if not cluster.joined:
        from platform.record.grafana import board_title, install

        board = install(training=training)
        if board is not None:
            print(
                f"Grafana dashboard '{board_title(training)}': {board} (README: Dashboards)",
                flush=True,
            )


# --- steps 4 and 5: build the Tuner, run it to the end ---
def _run_to_the_end(
    request: LaunchRequest, runs: list[RunSpec], started: float, pool
) -> tuple[int, bool]:
    """Clear what the runs to redo left behind, build the Tuner, fit it, report; the exit
    code, and whether a root on object storage (mirrored to its bucket all the while) is
    whole in the bucket."""
    with RootMirror(request.root) as mirror:
        code = _fit_and_report(request, runs, started, mirror, pool)
    if mirror.error:
        print(f"warning: the bucket missed an upload ({mirror.error})", flush=True)
    return code, mirror.whole


def _process_start() -> float:
    """When this command's process started (time.time): a budget counts from there, as the
    user's clock does."""
    import psutil

    return psutil.Process().create_time()


def _fit_and_report(
    request: LaunchRequest, runs: list[RunSpec], started: float, mirror, pool
) -> int:
    from platform.execution.tuner import build_sweep

    if request.resume:
        todo = [r.name for r in runs if r.name not in request.done]
        clear_earlier_attempts(request.root, len(request.done), todo, request.training)
        mirror.sync()  # the earlier attempts' files gone from the bucket before any run starts
    sweep = build_sweep(
        request.space,
        runs,
        request.root,
        request.done,
        resume=request.resume,
        loggers=list(request.loggers),
        pool=pool,
        budget=None if request.budget_s is None else (request.budget_s, _process_start()),
        skips=request.skips,
        kind="train" if request.training else "sweep",
        priors=request.priors,
        history=request.history,
    )
    stop = StopSignals()

    def finish_without_ray() -> None:
        """SIGTERM, and the sweep still waits on Ray (its processes got the signal too): the
        rows, the manifest and the ranking, summary and report of what finished, then exit."""
        manifest, _ = sweep.finish_files(stop)
        code = request.report(manifest, request.root, time.time() - started)
        code = _exit_code(request, manifest, stop, code)
        mirror.sync()  # a root on object storage: its last files in the bucket
        sys.stdout.flush()
        os._exit(code)  # Ray's processes are gone or going: nothing left to shut down

    stop.on_stuck, stop.ray_alive = finish_without_ray, _ray_alive
    manifest, _ = sweep.run(stop)
    with stop.ending:  # the last files are written once, by this thread or finish_without_ray
        stop.ended = True
        code = request.report(manifest, request.root, time.time() - started)
    return _exit_code(request, manifest, stop, code)


def _ray_alive() -> bool:
    """Whether the cluster's GCS still takes connections (after a SIGTERM to the whole process
    group, a local cluster's GCS is gone and every call to Ray waits a minute for it)."""
    import socket

    import ray

    try:
        host, port = ray.get_runtime_context().gcs_address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except Exception:  # refused, unreachable, Ray not connected
        return False


def _exit_code(
    request: LaunchRequest,
    manifest: list[dict[str, Any]],
    stop: StopSignals,
    code: int,
) -> int:
    """The report's ``code``, unless the sweep stopped on an error (1) or was interrupted
    (130/143, with the line saying how to finish it)."""
    unfinished = [r["run"] for r in manifest if r["status"] in ("pending", "interrupted")]
    stopped_on_error = request.space.stop_on_error and any(r["status"] != "ok" for r in manifest)
    if stopped_on_error and not stop.received:
        print(f"stopped on error (stop_on_error): {len(unfinished)} run(s) not started")
        return 1
    if unfinished:
        # Tune ends fit() early only on a stop signal; SIGTERM is noted, so this was SIGINT.
        stop.received = stop.received or "SIGINT"
        command = resume_command(request.prog, sys.argv[1:], request.root)
        print(
            f"interrupted by {stop.received}: {interrupted_counts(manifest, command)}", flush=True
        )
        return stop.exit_code
    return code
