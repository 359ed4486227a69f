"""Stopping a sweep by signal: SIGTERM stops it the way Ctrl-C does, and the exit code says which
signal ended it (130 for SIGINT, 143 for SIGTERM). A SIGTERM sent to the driver's whole process
group (timeout, Slurm's scancel, a job's time limit) reaches Ray's own processes too, and Tune's
graceful stop then waits a minute on the dead GCS: after ``grace_s`` the driver writes what
finished without Ray (``on_stuck``) and exits."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from platform.execution.inputs import remove_if_empty

if TYPE_CHECKING:
    from stage1_common.output_root import OutputRoot

__all__ = [
    "StartUpInterrupted",
    "StopSignals",
    "interrupted_at_start",
    "interrupted_counts",
    "resume_command",
    "start_up_signals",
]


class StartUpInterrupted(KeyboardInterrupt):
    """A stop signal before the first trial (the cluster's start, the corpus, the checks):
    nothing was measured yet; what the data preparation wrote whole stays (it skips those
    files when run again)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    @property
    def exit_code(self) -> int:
        return StopSignals.EXIT.get(self.name, 130)


class _StartUpHandlers:
    """The start-up's handlers (``start_up_signals``); ``again`` puts them back after a
    library replaced one (ray.init installs its own SIGTERM handler)."""

    def __init__(self) -> None:
        self.on = threading.current_thread() is threading.main_thread()

    def again(self) -> None:
        if self.on:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, _interrupt)


def _interrupt(signum, frame) -> None:
    raise StartUpInterrupted(signal.Signals(signum).name)


@contextmanager
def start_up_signals():
    """Inside the block (the driver's start-up: the corpus, the cluster, the checks, before
    Tune's loop takes the signals over): SIGINT and SIGTERM raise StartUpInterrupted in the
    main thread, so the start-up stops within seconds. SIGINT too where the command inherited
    it ignored (a script's background job: bash ignores SIGINT there, and Tune's loop would take
    it later anyway); SIGTERM also after ray.init, whose own handler aborts the driver with a
    C++ stack dump (call ``again`` after it). The handlers before are put back at the end."""
    handlers = _StartUpHandlers()
    if not handlers.on:
        yield handlers
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    handlers.again()
    try:
        yield handlers
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


# --- what the command says after a stop signal ---
def resume_command(prog: str, argv: Sequence[str], root: OutputRoot) -> str:
    """The command that finishes an interrupted sweep, to copy as it is: the same arguments,
    the output root the sweep used (named where the command let the platform choose it) and
    ``--resume``."""
    import shlex

    args = list(argv)
    if not any(a == "--output-root" or a.startswith("--output-root=") for a in args):
        args += ["--output-root", root.remote or str(root)]
    if "--resume" not in args:
        args.append("--resume")
    return shlex.join(["python", "-m", prog, *args])


def interrupted_at_start(prog: str, root: OutputRoot, stop: KeyboardInterrupt, what: str) -> int:
    """The line and exit code of a stop signal before the first trial (``prog``: the CLI;
    ``what``: "any run", "the run"): which signal, what is kept, and the command that goes on
    (130 or 143)."""
    name = getattr(stop, "name", "SIGINT")
    kept = root.path.is_dir() and any(root.path.iterdir())
    line = f"{prog}: interrupted by {name} before {what} started"
    if kept:
        line += (
            f"; what was prepared is kept; finish with: {resume_command(prog, sys.argv[1:], root)}"
        )
    else:
        remove_if_empty(root)
    print(line, file=sys.stderr, flush=True)
    return getattr(stop, "exit_code", 130)


def interrupted_counts(manifest: list[dict[str, Any]], command: str) -> str:
    """'1 of 2 run(s) finished, 1 cut short, 0 not started; finish with: python -m ...': the
    three counts add up to the sweep's runs."""
    statuses = [r["status"] for r in manifest]
    cut, waiting = statuses.count("interrupted"), statuses.count("pending")
    return (
        f"{len(statuses) - cut - waiting} of {len(statuses)} run(s) finished, {cut} cut short, "
        f"{waiting} not started; finish with: {command}"
    )
