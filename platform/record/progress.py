"""The console side of a sweep: one line per event of a run, ``[i/n] <run>: ...``.

The recorder (platform/record/recorder.py) calls this reporter at each event it records:
a run started, a timing window (the progress line), rows skipped, a restart or a resume, a
validation, a checkpoint, the end of a run and its log tails. It also prints what nobody
reported: heartbeats of long runs, and stall alerts when a window is much slower than the
run's median so far. A run's end-of-run line names the performance cliff it fell off
(platform/analysis/verdicts/cliffs.py), with torch's reason and what to change. It writes no file.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import pandas as pd

from platform.analysis import stats
from platform.analysis.verdicts import cliffs
from platform.spaces.expand import RunSpec

__all__ = ["Progress"]


class Progress:
    """Prints the lines of a sweep's runs through ``echo``, each prefixed with the run's place
    in the sweep (``[2/5] <run>:``)."""

    def __init__(self, runs: list[RunSpec], echo: Callable[[str], None]):
        self.runs = {r.name: r for r in runs}
        self.order = [r.name for r in runs]
        self.echo = echo
        self.last_heartbeat: dict[str, float] = {}
        self.iter_history: dict[str, list[float]] = {}  # run -> its windows' iter_ms_p50
        # run -> what torch's compiler did in each window of its attempt (rank 0's): the cliff
        # its end-of-run line names, judged as the manifest judges it.
        self.compiled: dict[str, list[dict[str, Any]]] = {}

    def say(self, run: str, text: str) -> None:
        self.echo(f"[{self.order.index(run) + 1}/{len(self.order)}] {run}: {text}")

    # --- a run's events ---
    def started(self, run: str) -> None:
        self.last_heartbeat[run] = time.monotonic()
        self.say(run, "started")

    def window(self, run: str, row: dict[str, Any]) -> None:
        """The progress line of one timing window."""
        kept = self.compiled.setdefault(run, [])
        if kept and kept[-1]["attempt"] != row.get("attempt"):
            kept.clear()  # a new attempt (a restart): the cliff is judged on its windows
        kept.append({k: row.get(k) for k in _COMPILED})
        step, max_steps = row.get("step") or 0, row.get("max_steps") or 0
        eta_s = row.get("eta_s")
        self.say(
            run,
            f"step {step}/{max_steps}"
            f"  iter p50 {row.get('iter_ms_p50', math.nan):.1f} ms"
            f"  data p50 {row.get('data_ms_p50', math.nan):.1f} ms"
            f"  {row.get('samples_per_s', math.nan):.1f} samples/s"
            f"  loss {row.get('loss', math.nan):.3f}  ETA {math.nan if eta_s is None else eta_s:.0f} s",
        )

    def skipped_rows(self, run: str, missing_files: int) -> None:
        self.say(
            run,
            f"skipped {missing_files} manifest rows whose audio file is missing "
            "(max_missing_files_fraction allows it)",
        )

    def restarted(
        self, run: str, attempt: int, resumed_from_step: int, reason: str, saved_to: str
    ) -> None:
        """A new worker group of a training run (``attempt`` counts from 0), in one line: why
        the one before ended, where its workers' log tails are, the step it resumed from."""
        why = f" after {reason}" if reason else ""
        where = f" (log tails: {saved_to})" if saved_to else ""
        self.say(
            run,
            f"restarted (attempt {attempt + 1}){why}; resumed from step {resumed_from_step}{where}",
        )

    def resumed(self, run: str, step: int) -> None:
        self.say(run, f"resumed from the checkpoint at step {step}")

    def validation(self, run: str, step: int, result: dict[str, Any]) -> None:
        self.say(
            run,
            f"validation at step {step}: loss {result.get('val_loss', math.nan):.3f}  "
            f"speech->text R@1 {result.get('val_s2t_r1', math.nan):.3f} "
            f"R@5 {result.get('val_s2t_r5', math.nan):.3f}"
            f"  text->speech R@1 {result.get('val_t2s_r1', math.nan):.3f} "
            f"R@5 {result.get('val_t2s_r5', math.nan):.3f}"
            f"  (chance R@1 {result.get('val_chance_r1', math.nan):.4f}, "
            f"{result.get('val_items')} items, {result.get('val_s', math.nan):.1f} s)",
        )

    def checkpoint(self, run: str, step: int, result: dict[str, Any]) -> None:
        size_mb = (result.get("checkpoint_size_bytes") or 0) / 1e6
        self.say(
            run,
            f"checkpoint at step {step}: {size_mb:.1f} MB saved in "
            f"{result.get('checkpoint_save_s', math.nan):.2f} s, training held "
            f"{result.get('checkpoint_block_s', math.nan):.2f} s"
            + (
                "; a newer one was complete first, so it was deleted"
                if result.get("checkpoint_registered") is False
                else ""
            ),
        )

    def finished(self, run: str, status: str, duration_s: float, reason: str) -> None:
        """The end-of-run line: the status, and the performance cliff the run fell off."""
        cliff = self.cliff(run)
        self.say(
            run,
            f"{status} in {duration_s:.1f} s"
            + (f": {reason}" if reason else "")
            + (f"; cliff: {cliff}" if cliff else ""),
        )

    def cliff(self, run: str) -> str:
        """The run's cliff verdict in one line (platform/analysis/verdicts/cliffs.py), '' for
        none."""
        kept = self.compiled.get(run)
        if not kept:
            return ""
        config = self.runs[run].config
        return cliffs.verdict_line(
            cliffs.figures(pd.DataFrame(kept), config.tail_timing_points), config
        )

    def failure(self, run: str, raised_at: str, saved: list[str]) -> None:
        """A failed run's second line (its first is ``finished``'s, with the error's last
        line): where it raised and where its error and its workers' last log lines are; the
        tracebacks stay in those files."""
        parts = [f"raised at {raised_at}"] if raised_at else []
        if saved:
            parts.append("details in " + " and ".join(saved))
        if parts:
            self.say(run, "; ".join(parts))

    # --- what no report says ---
    def stall_alert(self, run: str, row: dict[str, Any]) -> bool:
        """Alert when this window's iter_ms_p50 exceeds stall_alert_ratio x the run's median so
        far (from the third window on, so a median exists); True when it did."""
        cfg = self.runs[run].config
        history = self.iter_history.setdefault(run, [])
        value = row.get("iter_ms_p50")
        if value is None or not cfg.telemetry:
            return False
        median = stats.stall_alert(history, value, cfg.stall_alert_ratio)
        if median is not None:
            self.say(
                run,
                f"ALERT step {row.get('step')}: iter p50 {value:.1f} ms is "
                f"{value / median:.1f}x the run's median {median:.1f} ms",
            )
        history.append(value)
        return median is not None

    def heartbeats(self, status: dict[str, dict[str, Any]], latest: dict[str, dict]) -> None:
        """One line per running run every ``heartbeat_every_s``, so a long run never looks
        silently hung (``latest``: run -> its last window)."""
        now = time.monotonic()
        for run, state in status.items():
            cfg = self.runs[run].config
            if state.get("status") != "running" or not cfg.telemetry or cfg.heartbeat_every_s <= 0:
                continue
            if now - self.last_heartbeat.get(run, now) < cfg.heartbeat_every_s:
                continue
            self.last_heartbeat[run] = now
            self.say(run, _heartbeat(state, latest.get(run)))


# A window's fields the cliff verdict reads.
_COMPILED = ("attempt", "window", "steps_in_window", *cliffs.COUNTS, "cliff_reason")


def _heartbeat(state: dict[str, Any], row: dict[str, Any] | None) -> str:
    elapsed = time.time() - state.get("started_at", time.time())
    if row is None:
        return f"heartbeat: starting, {elapsed:.0f} s since start"
    since = time.time() - (row.get("window_end_ts") or time.time())
    return (
        f"heartbeat: step {row.get('step')}/{row.get('max_steps')}"
        f"  {row.get('samples_per_s', math.nan):.1f} samples/s  ETA {row.get('eta_s') or 0:.0f} s"
        f"  last window {since:.0f} s ago"
    )
