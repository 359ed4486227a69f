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


class StopSignals:
    """Inside the block, SIGTERM stops the sweep the way Ctrl-C does: Tune's own SIGINT handler
    ends the experiment gracefully (trials stopped, state saved), and the driver then writes
    every buffered row, the manifest and the summary."""

    EXIT = {"SIGINT": 130, "SIGTERM": 143}

    def __init__(
        self,
        on_stuck: Callable[[], None] | None = None,
        grace_s: float = 3.0,
        patience_s: float = 60.0,
        ray_alive: Callable[[], bool] = lambda: True,
    ) -> None:
        self.received: str | None = None
        self.previous: dict[int, Any] = {}
        # After SIGTERM, on a thread of its own: when the sweep has not ended by grace_s and
        # Ray is gone (its processes got the signal too), or by patience_s whatever Ray does.
        self.on_stuck, self.grace_s, self.patience_s = on_stuck, grace_s, patience_s
        self.ray_alive = ray_alive
        self.ending = threading.Lock()  # held by whoever writes the sweep's last files
        self.ended = False  # the driver's own end came first: on_stuck does nothing
        self._timer: threading.Timer | None = None

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
        if self.on_stuck is not None and self._timer is None:
            self._timer = threading.Timer(self.grace_s, self._stuck)
            self._timer.daemon = True
            self._timer.start()
        signal.raise_signal(signal.SIGINT)  # Tune's graceful stop

    def _stuck(self) -> None:
        deadline = time.monotonic() + self.patience_s
        while not self.ended and self.ray_alive() and time.monotonic() < deadline:
            time.sleep(0.5)  # Ray is there: Tune's graceful stop goes on
        with self.ending:
            if not self.ended:
                self.on_stuck()  # writes what finished and exits
        # The driver wrote its last files itself; if its exit still waits on Ray (the shutdown
        # of a cluster whose processes died), it ends here.
        time.sleep(self.grace_s)
        os._exit(self.exit_code)

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


# --- what the command says after a stop signal ---
def resume_command(prog: str, argv: Sequence[str], root: OutputRoot) -> str:
    """The command that finishes an interrupted sweep, to copy as it is: the same arguments,
    the output root the sweep used (named where the command let the platform choose it) and
    ``--resume``."""
    import shlex

    args = list(argv)
    if not any(a == "--output-root" or a.startswith("--output-root=") for a in args):
        args += ["--output-root", root.shown]
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
