"""The group pool: a sweep's resident worker groups (Ray Train workers kept alive across runs)
and the runs they train.

``GroupPool`` (one Ray actor per sweep, on the driver's node) keeps one group per resource
shape (``GroupShape``, trainables/resident/shape.py: workers, GPUs, CPUs, placement, nodes,
process-group timeout; the CPUs are the most any planned run of the sweep with the same key
needs, the run's ``group_cpus``, so runs that differ in loader workers or prefetch share a
group), at most ``max_groups`` at a time. Each group is a Ray Train trainer with torch's backend
(trainables/resident/group_trainer.py) whose train function serves runs
(trainables/resident/serve.py), started by a ``GroupHost`` actor that calls its
``fit()``. A Tune trial submits its run and relays the windows (trainables/resident/relay.py);
what they say to each other, and the states of groups and runs, are
trainables/resident/messages.py.

- A run goes to an idle group of its shape; else to a new group while fewer than ``max_groups``
  are alive; else an idle group of another shape is closed to make room (the run's group starts
  once it has ended, on its host); else it waits. A fresh
  run of the same sweep closes the idle groups first (``close_idle``): it needs their resources.
- A trial that stops polling (stopped by the race, ASHA, a timeout or Ctrl-C: Tune ends its
  actor) or cancels stops its run within two of the run's windows. A run that does not stop
  within its grace (a hang) has its group killed.
- A group whose ``fit()`` ends in an error (an exception in a run, a dead worker, a stall the
  watchdog ended) fails the run it was training with that error's text; the next run of its
  shape gets a new group of fresh processes.

Everything runs inside Ray workers: nothing here may import ``platform``.
"""

from __future__ import annotations

import itertools
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import ray

from trainables.observe.gc_control import collector_paused
from trainables.resident.messages import (
    LEASE_S,
    Assignment,
    Ended,
    Event,
    Failed,
    GroupState,
    JobState,
    Outcome,
    Shutdown,
    Window,
)
from trainables.resident.shape import GroupShape
from trainables.ticket import GroupTicket, RunTicket

__all__ = ["GroupHost", "GroupPool", "new_host"]

MIN_GRACE_S = 30.0  # least time a cancelled run gets to reach its next window


@dataclass
class _Job:
    id: str
    ticket: RunTicket
    shape: GroupShape
    submitted: float
    state: JobState = JobState.QUEUED
    group: str = ""
    label: str = ""
    events: list[Event] = field(default_factory=list)
    last_poll: float = 0.0
    cancelled: bool = False
    deadline: float = 0.0  # when a cancelled run that has not stopped gets its group killed
    window_ts: list[float] = field(default_factory=list)


@dataclass
class _Group:
    id: str
    shape: GroupShape
    host: Any
    started: float
    state: GroupState = GroupState.STARTING
    job: str | None = None
    delivered: dict[int, str] = field(default_factory=dict)  # rank -> the job it was given
    runs: list[dict[str, Any]] = field(default_factory=list)
    ended: str = ""


@ray.remote(num_cpus=0)
class GroupHost:
    """Runs one resident group's trainer's ``fit()``; killing this actor ends the group (the
    Ray Train controller and its workers are owned by it)."""

    def __init__(self) -> None:
        # What building the group's trainer needs, imported as the actor starts: the host the
        # driver starts with the pool, before its corpus (platform/execution/tuner.py:
        # open_pool), has it done before the first group. No torch (trainables/torch_backend.py):
        # 3 s of a GPU host's single thread off the first run.
        with collector_paused():
            import ray.train.v2.api.data_parallel_trainer  # noqa: F401

            import trainables.resident.group_trainer  # noqa: F401

    def run(self, shape: GroupShape, group: GroupTicket, storage_path: str) -> str:
        from trainables.resident.group_trainer import build_group_trainer

        build_group_trainer(shape, group, storage_path).fit()
        return "closed"


class GroupPool:
    """The sweep's resident groups and the runs they train (a threaded Ray actor)."""

    def __init__(self, name: str, max_groups: int, storage_path: str, node_id: str, host=None):
        """``storage_path``: Ray Train's storage of the groups (``RunStorage.groups``);
        ``host``: a ``GroupHost`` the driver started beside this actor (its process start and
        imports then overlap this actor's), else one is started here. No group until ``start``
        or a run's ``submit``."""
        self.name, self.max_groups = name, max(1, int(max_groups))
        self.storage_path, self.node_id = storage_path, node_id
        self.jobs: dict[str, _Job] = {}
        self.pending: list[str] = []
        self.groups: dict[str, _Group] = {}
        self.cond = threading.Condition()
        self.ids = itertools.count(1)
        self.closed = False
        # Hosts with nothing to run. The first group's starts with the pool, before the driver
        # prepares the corpus: its process start and imports (~3.5 s on 2 cores) are off the
        # first run's start-up. A group that closed cleanly leaves its host here for the next
        # group (another shape: a sweep over train_workers); a failed group's host is killed.
        # No other host starts ahead, so that no import competes with a run being timed.
        self.idle_hosts: list[Any] = [host if host is not None else new_host(node_id)]
        threading.Thread(target=self._monitor, name="group-monitor", daemon=True).start()

    def start(self, first: GroupShape) -> None:
        """The group of the sweep's first resident run, started now, before Tune starts the
        run's trial, so its workers' start and imports overlap the driver's last steps and the
        trial's start (the pool itself was made before the corpus, whose tasks need the CPUs
        a group reserves)."""
        with self.cond:
            if self.closed or any(g.state != GroupState.DEAD for g in self.groups.values()):
                return  # a run's submit came first and started it
            self._start_group(first)

    # --- the trials' side ---
    def submit(self, ticket: RunTicket) -> str:
        with self.cond:
            job = _Job(
                id=f"{ticket.name}#{next(self.ids)}",
                ticket=ticket,
                shape=GroupShape.of(ticket.config, ticket.group_cpus),
                submitted=time.time(),
                last_poll=time.monotonic(),
            )
            self.jobs[job.id] = job
            self.pending.append(job.id)
            self._dispatch()
            return job.id

    def poll(self, job_id: str, timeout: float) -> list[Event]:
        """The run's new events, waiting up to ``timeout`` for one."""
        with self.cond:
            job = self.jobs[job_id]
            job.last_poll = time.monotonic()
            self.cond.wait_for(lambda: job.events, timeout=timeout)
            job.last_poll = time.monotonic()
            events, job.events = job.events, []
            return events

    def cancel(self, job_id: str) -> None:
        with self.cond:
            self._cancel(self.jobs[job_id])

    def close_idle(self, timeout: float) -> int:
        """Close every idle group and wait (up to ``timeout``) until their workers left: a fresh
        run is about to start and needs the resources they hold. Returns how many closed."""
        with self.cond:
            idle = [
                g for g in self.groups.values() if g.state == GroupState.READY and g.job is None
            ]
            for group in idle:
                group.state = GroupState.CLOSING
                group.ended = "closed to make room for a fresh run"
            self.cond.notify_all()
            self.cond.wait_for(
                lambda: all(g.state == GroupState.DEAD for g in idle), timeout=timeout
            )
            return len(idle)

    # --- the groups' side ---
    def next_job(self, group_id: str, rank: int, timeout: float) -> Assignment | Shutdown | None:
        """The run ``rank`` of the group trains next; ``Shutdown`` when the group closes; None
        when there is none yet."""
        with self.cond:
            group = self.groups[group_id]
            if group.state == GroupState.STARTING:
                group.state = GroupState.READY

            def given() -> bool:
                return group.state == GroupState.CLOSING or (
                    group.job is not None and group.delivered.get(rank) != group.job
                )

            if not self.cond.wait_for(given, timeout=timeout):
                return None
            if group.state == GroupState.CLOSING:
                return Shutdown()
            job = self.jobs[group.job]
            group.delivered[rank] = job.id
            return Assignment(job_id=job.id, ticket=job.ticket, label=job.label)

    def window(self, job_id: str, metrics: dict[str, Any]) -> bool:
        """Rank 0's window of the run; returns whether the run must stop."""
        with self.cond:
            job = self.jobs[job_id]
            job.window_ts.append(time.monotonic())
            if not job.cancelled:
                job.events.append(Window(metrics))
                self.cond.notify_all()
            return job.cancelled

    def finished(self, job_id: str, outcome: Outcome, before: dict) -> None:
        """Rank 0: the run ended (``Outcome.OK`` or ``Outcome.STOPPED``); its ranks release it
        next, and ask for the next run once done (``released``)."""
        with self.cond:
            job = self.jobs[job_id]
            group = self.groups[job.group]
            job.state = JobState.DONE if outcome == Outcome.OK else JobState.STOPPED
            job.events.append(Ended(outcome))
            group.runs.append(
                {"run": job.ticket.name, "outcome": outcome.value, "memory_before": before}
            )
            group.job = None
            self._dispatch()
            self.cond.notify_all()

    def released(self, job_id: str, after: dict) -> None:
        """Rank 0: what the run left in memory once released."""
        with self.cond:
            group = self.groups[self.jobs[job_id].group]
            mine = [r for r in group.runs if r["run"] == self.jobs[job_id].ticket.name]
            if mine:
                mine[-1]["memory_after"] = after

    # --- the driver's side ---
    def history(self) -> list[dict[str, Any]]:
        """Every group: its shape, its host actor, when it started, the runs it trained (with
        the memory before and after each), how it ended."""
        with self.cond:
            return [
                {
                    "group": g.id,
                    "shape": g.shape.to_dict(),
                    "host": g.host._actor_id.hex(),  # the GroupHost actor (reused: the same)
                    "started_ts": g.started,
                    "runs": list(g.runs),
                    "ended": g.ended or g.state.value,
                }
                for g in self.groups.values()
            ]

    def shutdown(self, timeout: float = 30.0) -> None:
        """Close every group; returns once their workers left (each released its last run and
        said what it left in memory), or after ``timeout``."""
        with self.cond:
            self.closed = True
            for host in self.idle_hosts:
                ray.kill(host)
            self.idle_hosts = []
            for group in self.groups.values():
                if group.state.alive:
                    group.state, group.ended = GroupState.CLOSING, "closed at the end of the sweep"
            self.cond.notify_all()
            if timeout > 0:
                self.cond.wait_for(
                    lambda: all(g.state == GroupState.DEAD for g in self.groups.values()),
                    timeout=timeout,
                )

    # --- inside ---
    def _dispatch(self) -> None:
        """Hand queued runs to groups (the rules are in the module's docstring)."""
        if self.closed:
            return
        for job_id in list(self.pending):
            job = self.jobs[job_id]
            alive = [g for g in self.groups.values() if g.state.alive]
            group = next((g for g in alive if g.shape == job.shape and g.job is None), None)
            if group is None and len(alive) >= self.max_groups:
                idle = next((g for g in alive if g.job is None), None)
                if idle is None:
                    continue
                idle.state = GroupState.CLOSING
                idle.ended = "closed to make room for another shape"
                # The run waits for that group's end (its workers leave, its host is free,
                # _watch dispatches again): the new group reuses the host and gets the
                # resources the closing one still holds.
                continue
            if group is None:
                group = self._start_group(job.shape)
            self.pending.remove(job_id)
            group.job, job.group, job.state = job.id, group.id, JobState.RUNNING
            job.label = f"{group.id} run {len(group.runs) + 1}"
        self.cond.notify_all()

    def _start_group(self, shape: GroupShape) -> _Group:
        """A new group of ``shape`` (its trainer's workers, trainables/resident/serve.py)."""
        gid = f"g{len(self.groups) + 1}"
        host = self.idle_hosts.pop() if self.idle_hosts else new_host(self.node_id)
        group = _Group(id=gid, shape=shape, host=host, started=time.time())
        self.groups[gid] = group
        ticket = GroupTicket(pool=self.name, group=gid, cpus=shape.cpus_per_worker)
        ref = host.run.remote(shape, ticket, self.storage_path)
        threading.Thread(target=self._watch, args=(group, ref), daemon=True).start()
        return group

    def _watch(self, group: _Group, ref) -> None:
        """Wait for the group's fit() to end; an error fails the run it was training."""
        try:
            ray.get(ref)
            error = ""
        except Exception as exc:  # noqa: BLE001 - every way a group ends is recorded
            error = _error_text(exc)
        with self.cond:
            was = group.state
            group.state = GroupState.DEAD
            if error and not group.ended:
                group.ended = f"failed: {error.strip().splitlines()[-1][:200]}"
            if group.job is not None:
                job = self.jobs[group.job]
                if job.state == JobState.RUNNING:
                    job.state = JobState.FAILED
                    job.events.append(Failed(error or f"the group ended ({was.value})"))
                    group.runs.append({"run": job.ticket.name, "outcome": Outcome.FAILED.value})
                group.job = None
            if error or self.closed or group.ended.startswith("killed"):
                ray.kill(group.host)
            else:  # closed cleanly: its process, imports done, serves the next group
                self.idle_hosts.append(group.host)
            self._dispatch()
            self.cond.notify_all()

    def _cancel(self, job: _Job) -> None:
        if job.cancelled or job.state.ended:
            return
        job.cancelled = True
        if job.state == JobState.QUEUED:
            self.pending.remove(job.id)
            job.state = JobState.STOPPED
            return
        longest = max(
            (b - a for a, b in itertools.pairwise(job.window_ts)), default=0.0
        )  # the stop lands up to two windows later (serve.py): three of its longest windows
        stall = float(job.ticket.config.stall_timeout_s or 0.0)
        grace = max(MIN_GRACE_S, 3 * longest) if job.window_ts else max(MIN_GRACE_S, stall)
        job.deadline = time.monotonic() + grace

    def _monitor(self) -> None:
        """Cancel runs whose trial stopped polling; kill groups whose cancelled run hangs."""
        while True:
            time.sleep(0.5)
            with self.cond:
                now = time.monotonic()
                for job in self.jobs.values():
                    if not job.state.ended and now - job.last_poll > LEASE_S:
                        self._cancel(job)
                    if job.cancelled and job.state == JobState.RUNNING and now > job.deadline:
                        group = self.groups[job.group]
                        if group.state != GroupState.DEAD:
                            group.ended = f"killed: {job.ticket.name} did not stop when cancelled"
                            ray.kill(group.host)
                        job.deadline = float("inf")


def new_host(node_id: str):
    """A ``GroupHost`` on ``node_id`` (the pool's node, where the groups' Ray Train controllers
    run), its imports started."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return GroupHost.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=True)
    ).remote()


def _error_text(exc: BaseException) -> str:
    """The text of the error a group's fit() ended with: Ray Train's own error (with each failed
    rank's snippet) when the host passed it on, as a fresh trial's error file would hold it."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
