"""The resident protocol: what the sweep's group pool (trainables/resident/pool.py) and its
trials (trainables/resident/relay.py) and groups' ranks (trainables/resident/serve.py) say to each
other, and the states the pool keeps of its groups and runs.

- A trial ``submit``s its run (its ``RunTicket``, trainables/ticket.py: the object itself) and
  ``poll``s the pool: each answer is the run's new events, ``Window`` (a window's metrics, for
  ``tune.report``), ``Ended`` (ok or stopped) or ``Failed`` (the group's error text). A trial
  that stops polling for ``LEASE_S`` has its run cancelled. A fresh run's trial asks the pool to
  ``close_idle`` groups.
- A group's every rank asks for its ``next_job``: an ``Assignment`` (the run's ticket, as its
  trial decoded it: no rank parses the run again), ``Shutdown`` when the group closes, or None
  (nothing yet). Rank 0 sends each ``window`` (the answer: whether the run must stop), then
  ``finished`` with the run's ``Outcome`` and ``released`` with what the run left in memory.

These cross Ray as pickles; what reaches ``groups.json`` (a group's ``ended``, a run's
``outcome``) is the enum's plain string value.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from trainables.ticket import RunTicket

__all__ = [
    "LEASE_S",
    "RELAY_POLL_S",
    "Assignment",
    "Ended",
    "Event",
    "Failed",
    "GroupState",
    "JobState",
    "Outcome",
    "Shutdown",
    "Window",
]

LEASE_S = 10.0  # a run whose trial has not polled for this long is cancelled
RELAY_POLL_S = 0.5  # how long one poll of a trial waits for events: well inside the lease


class GroupState(StrEnum):
    """A resident group's state in the pool (``groups.json``'s ``ended`` when it has no other
    reason)."""

    STARTING = "starting"  # its host started its TorchTrainer; no rank has asked for a run yet
    READY = "ready"  # its ranks ask for runs
    CLOSING = "closing"  # its ranks get ``Shutdown`` at their next ask
    DEAD = "dead"  # its fit() ended

    @property
    def alive(self) -> bool:
        """Whether the group may still train a run."""
        return self in (GroupState.STARTING, GroupState.READY)


class JobState(StrEnum):
    """A submitted run's state in the pool."""

    QUEUED = "queued"  # waiting for a group of its shape
    RUNNING = "running"  # given to a group
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"  # cancelled, or stopped at a window

    @property
    def ended(self) -> bool:
        return self not in (JobState.QUEUED, JobState.RUNNING)


class Outcome(StrEnum):
    """How a run in a group ended (``groups.json``'s ``outcome`` of each run)."""

    OK = "ok"
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass(frozen=True)
class Window:
    """A window rank 0 reported: the metrics the trial passes to ``tune.report``."""

    metrics: dict[str, Any]


@dataclass(frozen=True)
class Ended:
    """The run ended in its group (``Outcome.OK`` or ``Outcome.STOPPED``)."""

    outcome: Outcome


@dataclass(frozen=True)
class Failed:
    """The run failed in its group: the error text its ``fit()`` ended with."""

    error: str


Event = Window | Ended | Failed  # what a trial's poll returns, in order


@dataclass(frozen=True)
class Assignment:
    """The run a group's rank trains next."""

    job_id: str  # the pool's id of the submitted run
    ticket: RunTicket  # the run as its trial submitted it (its start time set)
    label: str  # which group and which of its runs: "g2 run 3" (the manifest's resident_group)


@dataclass(frozen=True)
class Shutdown:
    """The group closes: its ranks leave the train function."""
