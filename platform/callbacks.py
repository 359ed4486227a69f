"""The Tune callback that records a sweep: it runs in the driver, receives every timing window
that rank 0 reports, writes them to Parquet and keeps the run manifest current.

It is the record of truth: Ray Train V2 keeps no metrics for reports without a checkpoint.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray.tune import Callback

from platform import results
from platform.spaces import RunSpec

__all__ = ["SweepRecorder", "failure_reason"]


class SweepRecorder(Callback):
    """Buffers window rows per run and writes them as Parquet part files: at the end of every
    run (ok or failed) and, during a long run, every ``flush_every_s`` seconds, so that an
    interrupted sweep keeps everything up to its last flush."""

    def __init__(
        self,
        output_root: Path,
        runs: list[RunSpec],
        *,
        flush_every_s: float = 30.0,
        on_change: Callable[[], None] | None = None,
        echo: Callable[[str], None] | None = None,
    ):
        self.output_root = Path(output_root)
        self.runs = {r.name: r for r in runs}
        self.order = [r.name for r in runs]
        self.flush_every_s = flush_every_s
        self.on_change = on_change
        self.echo = echo or (lambda line: print(line, file=sys.stdout, flush=True))
        self.pending: dict[str, list[dict[str, Any]]] = {}
        self.parts: dict[str, int] = {}
        self.last_flush: dict[str, float] = {}
        self.status: dict[str, dict[str, Any]] = {}

    # --- Tune hooks (called in the driver's Tune loop) ---
    def on_trial_start(self, iteration, trials, trial, **info):
        run = self._run(trial)
        self.status[run] = {"status": "running", "started_at": time.time(), "effective": {}}
        self.last_flush[run] = time.monotonic()
        self.echo(f"[{self._index(run)}] {run}: started")

    def on_trial_result(self, iteration, trials, trial, result, **info):
        run = self._run(trial)
        spec = self.runs[run]
        row = {name: result.get(name) for name in results.TIMING_SCHEMA.names}
        effective = {k: result[k] for k in results.EFFECTIVE_KEYS if k in result}
        self.status.setdefault(run, {}).setdefault("effective", {}).update(effective)
        row.update(run=run, group=spec.group, repeat=spec.repeat)
        rows = [row]
        # timing_ranks: all: the other ranks' windows come with rank 0's, one row per rank.
        for other in result.get("rank_windows") or ():
            rows.append({name: other.get(name) for name in results.TIMING_SCHEMA.names})
            rows[-1].update(
                run=run, group=spec.group, repeat=spec.repeat, rank_skew=row["rank_skew"]
            )
        self.pending.setdefault(run, []).extend(rows)
        self.echo(self._progress_line(run, row))
        if time.monotonic() - self.last_flush.get(run, 0.0) >= self.flush_every_s:
            self.flush(run)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._finish(trial, "ok", "")

    def on_trial_error(self, iteration, trials, trial, **info):
        self._finish(trial, "failed", failure_reason(_error_text(trial)))

    def on_experiment_end(self, trials, **info):
        for run in list(self.pending):
            self.flush(run)

    # --- recording ---
    def flush(self, run: str) -> None:
        rows = self.pending.pop(run, [])
        self.last_flush[run] = time.monotonic()
        if not rows:
            return
        part = self.parts.get(run, 0)
        results.write_part(
            self.output_root / results.TIMING_DIR, f"{run}-{part:05d}", rows, results.TIMING_SCHEMA
        )
        self.parts[run] = part + 1

    def _finish(self, trial, status: str, reason: str) -> None:
        run = self._run(trial)
        self.flush(run)
        started = self.status.get(run, {}).get("started_at", time.time())
        self.status[run] = {
            "status": status,
            "failure_reason": reason,
            "started_at": started,
            "duration_sec": time.time() - started,
            "effective": self.status.get(run, {}).get("effective", {}),
        }
        line = f"[{self._index(run)}] {run}: {status} in {self.status[run]['duration_sec']:.1f} s"
        self.echo(line + (f": {reason}" if reason else ""))
        if self.on_change:
            self.on_change()

    def _run(self, trial) -> str:
        return trial.config["run"]["name"]

    def _index(self, run: str) -> str:
        return f"{self.order.index(run) + 1}/{len(self.order)}"

    def _progress_line(self, run: str, row: dict[str, Any]) -> str:
        step, max_steps = row.get("step") or 0, row.get("max_steps") or 0
        iter_mean = row.get("iter_ms_mean") or math.nan
        eta_s = (max_steps - step) * iter_mean / 1000.0 if max_steps else math.nan
        return (
            f"[{self._index(run)}] {run}: step {step}/{max_steps}"
            f"  iter p50 {row.get('iter_ms_p50', math.nan):.1f} ms"
            f"  data p50 {row.get('data_ms_p50', math.nan):.1f} ms"
            f"  {row.get('samples_per_s', math.nan):.1f} samples/s"
            f"  loss {row.get('loss', math.nan):.3f}  ETA {eta_s:.0f} s"
        )


def _error_text(trial) -> str | None:
    """Tune writes the error to the trial's local folder before calling on_trial_error; the copy
    that ``trial.get_error()`` reads from storage is synced only later."""
    path = getattr(trial, "error_file", None)
    if path and os.path.isfile(path):
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    try:
        return trial.get_error()
    except Exception:  # no error text anywhere: the reason says so
        return None


def failure_reason(error_text: str | None) -> str:
    """The last meaningful line of a trial's traceback, as one short line."""
    if not error_text:
        return "failed (no error text recorded)"
    lines = [ln.strip() for ln in str(error_text).splitlines() if ln.strip()]
    for line in reversed(lines):
        if not line.startswith(("File ", "^", "~", "During handling", "The above exception")):
            return line[:300]
    return lines[-1][:300] if lines else "failed"
