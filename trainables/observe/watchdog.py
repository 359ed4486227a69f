"""Hang detection in a worker: a thread that dumps the stacks of every thread when the loop
makes no progress for ``stall_timeout_s``.

A rank stuck in Python (or in a collective that never completes) stops calling ``beat()``; the
watchdog then writes ``stacks-rank<r>.txt`` (faulthandler: every thread, also while the main
thread waits inside gloo/NCCL with the GIL released). The process-group timeout is set just above
``stall_timeout_s`` (trainables.trial), so the waiting ranks then fail the collective and Ray
Train tears the run down: a hang is explained, not waited out.
"""

from __future__ import annotations

import faulthandler
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from stage1_common.output_root import RunFolder

__all__ = ["StallWatchdog", "pg_timeout_for"]


def pg_timeout_for(stall_timeout_s: float, pg_timeout_s: int) -> int:
    """The process-group timeout: a little above the stall timeout (the stacks are written
    first), never above pg_timeout_s."""
    if stall_timeout_s <= 0:
        return pg_timeout_s
    return int(min(pg_timeout_s, stall_timeout_s + max(5.0, 0.1 * stall_timeout_s)))


def resident_end_after(stall_timeout_s: float, pg_timeout_s: int, world_size: int) -> float:
    """How long a resident worker still stuck after its stall dump waits before it ends its
    process. With several workers: 10 s past the process group's timeout (``pg_timeout_for``),
    so that the collectives' timeout ends the run first, as in a fresh run; at least 15 s (the
    timeout is 5 s or more past the stall, unless pg_timeout_s caps it below the stall). With
    one worker no collective can end it, and its stacks are written and published before the
    wait starts: 1 s."""
    if world_size == 1:
        return 1.0
    margin = pg_timeout_for(stall_timeout_s, pg_timeout_s) - stall_timeout_s
    return max(15.0, margin + 10.0)


class StallWatchdog:
    """``end_after_s`` > 0 (a resident group's worker): once the stacks are written, a process
    still stuck that much later ends itself, so that its group is rebuilt and the sweep goes
    on (with one worker there is no collective whose timeout would end it)."""

    def __init__(
        self,
        stall_timeout_s: float,
        dump_dir: Path | None,
        rank: int,
        end_after_s: float = 0.0,
        on_dump: Callable[[Path], None] | None = None,
    ):
        self.stall_timeout_s = stall_timeout_s
        self.on_dump = on_dump  # told the dump's path once it is written (its upload)
        self.end_after_s = end_after_s
        self.dump_path = RunFolder(dump_dir).stacks(rank) if dump_dir else None
        self.last_beat = time.monotonic()
        self.step = 0
        self.stop_event = threading.Event()
        self.dumped = False
        self.thread = threading.Thread(target=self._run, name="stall-watchdog", daemon=True)

    def start(self) -> StallWatchdog:
        if self.stall_timeout_s > 0:
            self.thread.start()
        return self

    def beat(self, step: int) -> None:
        self.step, self.last_beat = step, time.monotonic()

    def stop(self) -> None:
        self.stop_event.set()

    def _run(self) -> None:
        poll_s = min(1.0, self.stall_timeout_s / 4)
        while not self.stop_event.wait(poll_s):
            idle = time.monotonic() - self.last_beat
            if self.dumped and self.end_after_s and idle > self.stall_timeout_s + self.end_after_s:
                os._exit(70)  # EX_SOFTWARE: the stacks say why
            if idle < self.stall_timeout_s or self.dumped:
                continue
            self.dumped = True
            if self.dump_path is None:
                continue
            self.dump_path.parent.mkdir(parents=True, exist_ok=True)
            with self.dump_path.open("w") as fh:
                fh.write(
                    f"no progress for {idle:.1f} s after step {self.step} "
                    f"(stall_timeout_s {self.stall_timeout_s}); stacks of every thread:\n\n"
                )
                fh.flush()
                faulthandler.dump_traceback(file=fh, all_threads=True)
            if self.on_dump is not None:
                try:
                    self.on_dump(self.dump_path)
                except Exception:  # the dump stays on this node; the driver says so
                    pass
