"""The ``Tuner`` of a sweep or a training run, and what it is built from: the recorder (Parquet,
manifest, telemetry, failures), the search algorithm that hands out the runs, the early-stopping
scheduler and the stopper (all sharing ``schedule.json``, platform/control/), and the
``RunConfig``. Each trial runs one run (trainables.trial.run_trial, one ``TorchTrainer``).

This module imports Ray and the workload: ``launch`` imports it only once the environment Ray
reads at import is set.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from ray import tune

from platform.analysis.analyze import group_ranks
from platform.analysis.priors import Priors
from platform.control.asha import WarmASHA
from platform.control.budget import Budget
from platform.control.costs import Costs, read_memory
from platform.control.race import Race, Schedule
from platform.control.searchers import OptunaPlanner, PlannedSearcher
from platform.control.stoppers import SweepStopper
from platform.errors import UsageError
from platform.record.manifest import write_manifest, write_run_record
from platform.record.provenance import git_facts
from platform.record.recorder import SweepRecorder
from platform.spaces.expand import RunSpec
from platform.spaces.space import SearchSpace
from platform.storage import results
from platform.storage.mirror import run_storage
from stage1_common.machine_cache import configured_cache
from stage1_common.output_root import OutputRoot
from trainables.resident.shape import GroupKey, GroupShape, group_cpus
from trainables.ticket import RunStorage, RunTicket
from trainables.trial import run_trial

__all__ = ["OpenedPool", "ResidentPool", "Sweep", "build_sweep", "open_pool", "start_pool"]

# Held while a sweep's last rows and manifest are written (Sweep.finish_files), by the main
# thread or the stop that found Ray gone. Not a field: Tune pickles what refers to the sweep.
_FINISHING = threading.Lock()


@dataclass(frozen=True)
class ResidentPool:
    """The sweep's GroupPool actor (trainables/resident/pool.py) and the CPUs per worker its groups
    reserve, per group key: the most any planned run of the key needs
    (trainables/resident/shape.py: group_cpus), so that loader workers and prefetch never force
    a new group."""

    name: str
    actor: Any
    cpus: dict[GroupKey, int]

    def group_cpus(self, run: RunSpec) -> int:
        """The CPUs per worker of ``run``'s group (its own when no planned run shares its key)."""
        return self.cpus.get(GroupKey.of(run.config), run.config.cpus_per_train_worker)


@dataclass
class Sweep:
    """A sweep ready to run: its ``Tuner``, the recorder, the runs still to run (``todo``), the
    runs the manifest lists (``planned``: optuna adds a group's runs when it picks the group)
    and the git facts every manifest row carries."""

    root: OutputRoot
    recorder: SweepRecorder
    todo: list[RunSpec]
    planned: list[RunSpec]
    facts: dict[str, Any]
    tuner: tune.Tuner | None = None
    pool: ResidentPool | None = None  # the resident groups (None: every run is fresh)
    budget: Budget | None = None  # --budget (platform/control/budget.py)
    space_ref: str = ""  # the space, as the catalogue names it
    kind: str = "sweep"  # or train (platform.train)
    _finished: tuple[list[dict[str, Any]], list[str]] | None = None  # finish_files's answer

    def write_manifest(
        self, status: dict[str, dict[str, Any]] | None = None
    ) -> list[dict[str, Any]]:
        """The run manifest from ``status`` (the recorder's snapshot; default: its status now)."""
        status = self.recorder.status if status is None else status
        return write_manifest(self.root, list(self.planned), status, self.facts)

    def run(self, stop) -> tuple[list[dict[str, Any]], list[str]]:
        """Fit inside ``stop`` (StopSignals); returns the final manifest rows and the runs a
        signal cut short."""
        try:
            if self.todo:
                with stop:
                    self.tuner.fit()
        finally:
            manifest, interrupted = self.finish_files(stop)
            # Interrupted: no waiting for runs to reach a window (Ray's shutdown ends them).
            self.close_groups(wait_s=0.0 if stop.received or interrupted else 60.0)
        self.recorder.close()
        # The catalogue of every sweep (platform/storage/catalogue.py): what the runs measured
        # and cost, for comparisons, warm starts and the machine's next --budget.
        self.catalogue(manifest, {r.name: r.config for r in self.planned})
        return manifest, interrupted

    def catalogue(self, manifest: list[dict[str, Any]], configs: dict[str, Any]) -> None:
        """The sweep's rows into the machine's catalogue and the root's ``catalogue.parquet``
        (never at the sweep's expense: a store that cannot be written is one line)."""
        from platform.storage import catalogue

        configured = configured_cache(configs.values())
        try:
            rows = catalogue.rows_of(self.root, manifest, configs, kind=self.kind,
                                     space=self.space_ref, ranks=_ranks(self.root))  # fmt: skip
            catalogue.append(
                rows, catalogue.store(configured), name=rows[0]["sweep"] if rows else None
            )
            catalogue.append(rows, self.root.path, name=catalogue.CATALOGUE)
        except (OSError, ValueError) as exc:
            print(f"catalogue: not written ({type(exc).__name__}: {exc})", flush=True)

    def finish_files(self, stop) -> tuple[list[dict[str, Any]], list[str]]:
        """Whatever ended the sweep (done, Ctrl-C, SIGTERM, an error), the buffered rows are
        written and the manifest says where every run stands; the final manifest rows and the
        runs a signal cut short. Once: a second call (the stop that found Ray gone, on its own
        thread, while fit() still waits on Ray) returns the first one's answer."""
        with _FINISHING:
            if self._finished is None:
                self.recorder.on_experiment_end(trials=[])
                self.recorder.drain()  # every row and record handed to its writer is on disk
                if self.budget is not None and not stop.received and self.budget.spent():
                    self.recorder.settle(self.budget.settle)  # the budget's safety stop
                interrupted = self.recorder.mark_interrupted(stop.received or "SIGINT")
                if self.budget is not None:  # its record, and the runs it left unrun
                    self.budget.finish()
                    self.recorder.schedule.state["skipped"].update(self.budget.unrun())
                    self.recorder.schedule.save()
                self.recorder.mark_skipped()
                self._finished = (self.write_manifest(), interrupted)
            return self._finished

    def close_groups(self, wait_s: float) -> None:
        """Close the resident groups, waiting up to ``wait_s`` for their workers to leave;
        ``groups.json`` says what each trained and how it ended (the memory before and after
        each run)."""
        if self.pool is None:
            return
        import ray

        try:
            ray.get(self.pool.actor.shutdown.remote(wait_s), timeout=wait_s + 30)
            history = ray.get(self.pool.actor.history.remote(), timeout=30)
        except ray.exceptions.RayError as exc:  # the pool is gone: nothing more to say
            print(f"resident groups: no record ({type(exc).__name__})", flush=True)
            return
        results.write_json(self.root.groups, {"groups": history})


def _ranks(root: OutputRoot) -> dict[str, int]:
    """The sweep's groups ranked as its summary will rank them (none when that fails: the
    catalogue then names the fastest steady group its best)."""
    try:
        return group_ranks(root)
    except (OSError, ValueError, KeyError, UsageError) as exc:
        print(f"catalogue: no ranking kept ({type(exc).__name__}: {exc})", flush=True)
        return {}


def build_sweep(
    space: SearchSpace,
    runs: list[RunSpec],
    root: OutputRoot,
    done: dict[str, dict[str, Any]],
    *,
    resume: bool,
    loggers: list[str],
    pool: ResidentPool | None = None,
    budget: tuple[float, float] | None = None,
    skips: dict[str, str] | None = None,
    kind: str = "sweep",
    priors: Priors | None = None,
    history: str = "confirm",
) -> Sweep:
    """The recorder, the search, scheduler and stopper, and the ``Tuner`` over the runs not in
    ``done`` (the runs an earlier attempt finished ok); writes the first manifest. ``pool``:
    the resident groups, when the launch started them already (``start_pool``). ``budget``:
    --budget's seconds and when the command started (time.time). ``priors``: a warm race's
    figures from the catalogue (platform/analysis/priors.py: race_priors), and ``history``
    what the race does with them (confirm or order)."""
    facts = git_facts()
    recorder = SweepRecorder(root, runs, facts=facts, loggers=loggers)
    recorder.status.update({k: dict(v) for k, v in done.items()})
    sweep = Sweep(
        root=root,
        recorder=recorder,
        todo=[r for r in runs if r.name not in done and r.name not in (skips or {})],
        # A search that plans late (optuna) plans a group's runs when it picks the group;
        # every other search plans all of them now (the manifest lists the planned runs).
        planned=[r for r in runs if not space.search.plans_late or r.name in done],
        facts=facts,
        space_ref=space.ref,
        kind=kind,
    )
    recorder.on_change = sweep.write_manifest
    sweep.pool = pool or start_pool(root, space, sweep.todo)
    if budget is not None:
        sweep.budget = _budget(space, sweep, *budget)
    tune_config, stopper = _search_and_stop(space, runs, done, sweep, resume, skips or {},
                                            priors, history)  # fmt: skip
    sweep.write_manifest()
    _quiet_tune()
    sweep.tuner = tune.Tuner(
        # The trial only waits on its TorchTrainer, whose workers reserve the CPUs and GPUs.
        # Tune refuses an empty request, so the trial holds a token 1 MiB of logical memory.
        tune.with_resources(run_trial, {"cpu": 0, "memory": 2**20}),
        tune_config=tune_config,
        run_config=tune.RunConfig(
            name="tune",
            storage_path=str(root),
            callbacks=[recorder],
            stop=stopper,
            failure_config=tune.FailureConfig(fail_fast=space.stop_on_error),
            verbose=0,
        ),
    )
    return sweep


class _TunesOwnLines(logging.Filter):
    """Drops Tune's "Resume experiment with: Tuner.restore(path=..., trainable=...)" after a
    stop signal (the platform prints the full command with --resume, and Tuner.restore of a
    platform sweep would not write its files), its "Stop signal received ... ending Ray Tune
    run" (the platform's "interrupted by" line says it) and its "Trials did not complete: [...]"
    (the platform's end-of-sweep lines list every run's status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not (
            "Tuner.restore(" in text
            or text.startswith(("Trials did not complete", "Stop signal received"))
        )


def _quiet_tune() -> None:
    """Tune's own console output off: its table of the experiment at the start ("Number of
    trials 9223372036854775807" for a searcher without an end), its resume advice, and the
    traceback of every failed trial ("Trial task failed for trial ...",
    ``TUNE_PRINT_ALL_TRIAL_ERRORS``): the recorder says a failed run in its own lines and keeps
    the error in the run's folder (``runs/<run>/error.txt``). The old output engine at verbose
    0 prints nothing; the new one prints that table whatever the verbosity. A user's
    RAY_AIR_NEW_OUTPUT and TUNE_PRINT_ALL_TRIAL_ERRORS win."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")
    tune_logger = logging.getLogger("ray.tune.tune")
    if not any(isinstance(f, _TunesOwnLines) for f in tune_logger.filters):
        tune_logger.addFilter(_TunesOwnLines())


def _search_and_stop(
    space: SearchSpace,
    runs: list[RunSpec],
    done: dict[str, dict[str, Any]],
    sweep: Sweep,
    resume: bool,
    skips: dict[str, str],
    priors: Priors | None = None,
    history: str = "confirm",
) -> tuple[tune.TuneConfig, SweepStopper]:
    """The Tune search algorithm that hands out the runs (``search``), the early-stopping
    scheduler (``scheduler``) and the stopper, all sharing the sweep's ``schedule.json``
    (platform/control/race.py). A resumed warm race races on the priors and the history mode
    its first attempt kept there, not on the catalogue as it is now (platform/tune.py refuses
    a --history or --no-history that disagrees with it)."""
    root, recorder = sweep.root, sweep.recorder
    schedule = Schedule(root, space, runs)
    if resume:
        schedule.load()
        if priors is None:
            priors = Priors.of_schedule(schedule.state)
            history = (schedule.state.get("history") or {}).get("mode", history)
    schedule.state["skipped"].update(skips)  # known to fail here (platform/analysis/priors.py)
    schedule.save()
    recorder.schedule = schedule
    trial_runs = recorder.trial_runs
    budget = sweep.budget
    if budget is not None:
        schedule.budget = budget.record

    storage, pool = run_storage(root), sweep.pool

    def param(run: RunSpec) -> dict[str, Any]:
        return _ticket(run, storage, pool).encode()

    race = None
    if space.scheduler.name == "race":
        race = Race(runs, space, schedule, echo=recorder.echo, priors=priors, history=history)
        if resume:
            race.restore(results.read_dataset(root.timing, results.TIMING_SCHEMA), done)
    if space.search.plans_late:  # OptunaPlanner, the one search that plans late

        def on_plan(run: RunSpec) -> None:
            if run not in sweep.planned:
                sweep.planned.append(run)
                write_run_record(root, run, space.ref)

        searcher = OptunaPlanner(space, sweep.todo, param, trial_runs, schedule, on_plan)
    else:
        searcher = PlannedSearcher(sweep.todo, param, trial_runs, race, budget, schedule.save)
    scheduler = (
        WarmASHA(space, runs, schedule, trial_runs, budget=budget is not None)
        if space.scheduler.name == "asha"
        else None
    )
    if budget is not None:  # a run's spec as the budget plans it: the race's and ASHA's too
        recorded = budget.on_spec

        def on_spec(spec: RunSpec) -> None:
            recorded(spec)
            if race is not None:
                race.runs[spec.name] = spec
            if scheduler is not None:
                scheduler.max_steps[spec.name] = spec.config.max_steps

        budget.on_spec = on_spec
    tune_config = tune.TuneConfig(
        search_alg=searcher,
        scheduler=scheduler,
        num_samples=-1,  # until the search algorithm says it is finished
        max_concurrent_trials=space.max_concurrent_trials,
        trial_name_creator=_trial_name,
        trial_dirname_creator=_trial_name,
        # A resident run's trial only relays windows: its actor serves the next trial.
        reuse_actors=sweep.pool is not None,
    )
    return tune_config, SweepStopper(runs, trial_runs, race, budget, schedule)


def _budget(space: SearchSpace, sweep: Sweep, seconds: float, started_at: float) -> Budget:
    """The sweep's budget: its runs to plan, the costs remembered on the machine, and the
    sweep's records kept to each run's spec as the budget plans it."""
    configured = configured_cache(r.config for r in sweep.todo)

    def on_spec(spec: RunSpec) -> None:
        sweep.recorder.runs[spec.name] = spec
        sweep.recorder.progress.runs[spec.name] = spec  # the console's cliff line
        sweep.planned = [spec if r.name == spec.name else r for r in sweep.planned]

    return Budget(
        seconds,
        started_at,
        sweep.todo,
        warmup=space.scheduler.warmup_windows,
        concurrency=space.max_concurrent_trials,
        costs=Costs(memory=read_memory(configured)),
        echo=sweep.recorder.echo,
        on_spec=on_spec,
    )


@dataclass(frozen=True)
class OpenedPool:
    """The sweep's GroupPool actor and its first group's host, made first of what the driver
    prepares once Ray is up (``open_pool``); no group yet."""

    name: str
    actor: Any
    host: Any


def open_pool(root: OutputRoot, space: SearchSpace, todo: list[RunSpec]) -> OpenedPool | None:
    """The sweep's GroupPool actor (trainables/resident/pool.py), on the driver's node (at most
    max_concurrent_trials resident groups, their Ray Train state under tune/groups/), and the
    host of its first group, made before anything else the driver prepares once Ray is up: both
    reserve no CPU, and their process starts and imports (2-3 s each on 2 busy cores) overlap
    the driver's checks and tokenizers instead of coming before Ray Train's controller can
    start. None when no run of ``todo`` is resident."""
    if not any(r.config.executor == "resident" for r in todo):
        return None
    import uuid

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from trainables.resident.pool import GroupPool, new_host

    node = ray.get_runtime_context().get_node_id()
    name = f"stage1-groups-{uuid.uuid4().hex[:8]}"
    host = new_host(node)
    actor = (
        ray.remote(GroupPool)
        .options(
            name=name,
            num_cpus=0,
            max_concurrency=1000,  # every trial's poll and every rank's ask wait in a thread
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        )
        .remote(name, space.max_concurrent_trials, run_storage(root).groups, node, host=host)
    )
    return OpenedPool(name=name, actor=actor, host=host)


def start_pool(
    root: OutputRoot, space: SearchSpace, todo: list[RunSpec], opened: OpenedPool | None = None
) -> ResidentPool | None:
    """The sweep's resident groups: the pool ``opened`` (``open_pool``) or one made now, and
    the group of the first resident run to run started at once (its workers start while the
    driver checks the nodes and builds the tokenizers, and Tune starts the run's trial). None
    when no run of ``todo`` is resident (an opened pool and its host are then stopped)."""
    import ray

    resident = [r for r in todo if r.config.executor == "resident"]
    if not resident:
        if opened is not None:
            ray.kill(opened.actor)
            ray.kill(opened.host)
        return None
    opened = opened or open_pool(root, space, todo)
    cpus = group_cpus(r.config for r in resident)
    first = resident[0]
    opened.actor.start.remote(GroupShape.of(first.config, cpus[GroupKey.of(first.config)]))
    return ResidentPool(name=opened.name, actor=opened.actor, cpus=cpus)


def _trial_name(trial) -> str:
    return RunTicket.name_in(trial.config)


def _ticket(run: RunSpec, storage: RunStorage, pool: ResidentPool | None) -> RunTicket:
    """The run as its trial receives it: built here alone, where the driver hands runs to Tune
    (plain values once encoded: Tune's param space crosses the Ray boundary)."""
    return RunTicket(
        name=run.name,
        group=run.group,
        repeat=run.repeat,
        storage=storage,
        config=run.config,
        # Every run of a sweep with resident groups knows the pool: a fresh one has it close
        # its idle groups first (trainables/trial.py).
        pool=pool.name if pool is not None else None,
        group_cpus=pool.group_cpus(run) if pool is not None else None,
    )
