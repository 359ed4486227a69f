"""Fault injection for tests (the ``inject_*`` keys): a slow step, a step that raises, a rank
that kills itself with SIGKILL, host memory that is never freed (and, in
trainables/checkpoint/state.py, a slow checkpoint writer). Built once from the config for one
rank; with every key off (or none aimed at this rank) it is a no-op object, so the step itself
holds no injection branch.

Faults act in a run's first attempt only: a rank that arms any writes
``faults_armed-rank<r>.json`` in the run's folder (its own: the ranks of one attempt start at
different times, and one rank's file must not disarm another), and the same rank of a later
attempt of the run (Ray Train's restart of the worker group, a training's ``--resume``) that
finds it arms none, so a drill with ``inject_kill_at_step`` shows
the recovery instead of dying at the same step until ``max_failures`` runs out.
``inject_every_attempt`` keeps them in every attempt."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from stage1_common.fileio import write_json
from stage1_common.output_root import RunFolder
from trainables.config import TrialConfig

__all__ = ["KILL_NOTE", "NoFaults", "build_faults", "release"]

# What a rank killed by inject_kill_at_step says on its stderr just before.
KILL_NOTE = "injected kill (inject_kill_at_step)"

_LEAKED: list[bytes] = []  # inject_leak_mb_per_step keeps its allocations here


class NoFaults:
    """Nothing injected: what every real run gets."""

    def after_step(self, step: int) -> None:
        """Called once per optimizer step, after its last micro-batch."""


class _Faults(NoFaults):
    """The faults aimed at this rank, each a function of the step, in the order they act."""

    def __init__(self, faults: list[Callable[[int], None]]):
        self._faults = faults

    def after_step(self, step: int) -> None:
        for fault in self._faults:
            fault(step)


def _sleep(cfg: TrialConfig) -> Callable[[int], None]:
    first, steps, every = cfg.inject_sleep_at_step, cfg.inject_sleep_steps, cfg.inject_sleep_every

    def sleep(step: int) -> None:
        if first <= step < first + steps and (step - first) % every == 0:
            time.sleep(cfg.inject_sleep_s)  # a slow step on this rank

    return sleep


def _leak(cfg: TrialConfig) -> Callable[[int], None]:
    size = int(cfg.inject_leak_mb_per_step * 2**20)

    def leak(step: int) -> None:
        _LEAKED.append(b"\x01" * size)  # memory that is never freed

    return leak


def _error(cfg: TrialConfig, rank: int) -> Callable[[int], None]:
    def error(step: int) -> None:
        if step == cfg.inject_error_at_step:
            raise RuntimeError(
                f"injected error at step {step} on rank {rank} (inject_error_at_step)"
            )

    return error


def _kill(cfg: TrialConfig) -> Callable[[int], None]:
    def kill(step: int) -> None:
        if step == cfg.inject_kill_at_step:
            # The one line the driver's restart and failure notes can name the cause by.
            print(
                f"{KILL_NOTE}: SIGKILL to this rank's process after step {step}",
                file=sys.stderr,
                flush=True,
            )
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no exception: a real kill -9

    return kill


def build_faults(cfg: TrialConfig, rank: int, run_dir: Path | None = None) -> NoFaults:
    """The faults the config injects on ``rank``: a sleep from inject_sleep_at_step, a leak
    every step, an error at inject_error_at_step, a SIGKILL after inject_kill_at_step;
    ``NoFaults()`` when there are none, or when ``run_dir`` (the run's folder) says an earlier
    attempt armed them (unless inject_every_attempt)."""
    armed = RunFolder(run_dir).faults_armed(rank) if run_dir is not None else None
    if armed is not None and armed.exists() and not cfg.inject_every_attempt:
        return NoFaults()
    faults = _aimed_at(cfg, rank)
    if not faults:
        return NoFaults()
    if armed is not None:
        write_json(armed, {"rank": rank, "armed_ts": time.time()})
    return _Faults(faults)


def _aimed_at(cfg: TrialConfig, rank: int) -> list[Callable[[int], None]]:
    faults: list[Callable[[int], None]] = []
    if cfg.inject_sleep_at_step > 0 and cfg.inject_sleep_rank in (-1, rank):
        faults.append(_sleep(cfg))
    if cfg.inject_leak_mb_per_step:
        faults.append(_leak(cfg))
    if cfg.inject_error_at_step > 0 and cfg.inject_error_rank in (-1, rank):
        faults.append(_error(cfg, rank))
    if cfg.inject_kill_at_step > 0 and cfg.inject_error_rank in (-1, rank):
        faults.append(_kill(cfg))
    return faults


def release() -> None:
    """Free what inject_leak_mb_per_step kept (a resident worker's next run starts clean)."""
    _LEAKED.clear()
