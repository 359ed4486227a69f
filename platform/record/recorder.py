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
from ray.tune.stopper import Stopper

from platform.analysis import stats
from platform.record.failures import (
    FAIL_TAIL,
    exit_code,
    failure_reason,
    format_tails,
    stderr_tails,
    worker_tails,
)
from platform.spaces.space import RunSpec
from platform.storage import results

__all__ = ["RunTimeout", "SweepRecorder", "failure_reason"]


class RunTimeout(Stopper):
    """Stops a run whose trial has been going longer than its run_timeout_s (checked at each
    window report; a run that stops reporting is the stall watchdog's case)."""

    def __init__(self, runs: list[RunSpec], trial_runs: dict[str, str]):
        self.limits = {r.name: r.config.run_timeout_s for r in runs if r.config.run_timeout_s}
        # Tune trial id -> run name: the sweep's searcher fills it when it hands a run out,
        # SweepRecorder when the trial starts.
        self.trial_runs = trial_runs

    def __call__(self, trial_id, result) -> bool:
        limit = self.limits.get(self.trial_runs.get(trial_id, ""))
        return bool(limit) and result.get("time_total_s", 0) >= limit

    def stop_all(self) -> bool:
        return False


# The validation figures that become val/* series (platform/loggers.py).
_VALIDATION_SERIES = tuple(
    k
    for k in results.VALIDATION_SCHEMA.names
    if k.startswith("val_") and k not in ("val_items", "val_chance_r1")
)


class SweepRecorder(Callback):
    """Buffers rows per run (timing windows, GPU and host telemetry) and writes them as Parquet
    part files: at the end of every run (ok or failed) and, during a long run, every
    ``flush_every_s`` seconds, so that an interrupted sweep keeps everything up to its last
    flush. It also prints progress, heartbeats and stall alerts, and writes each run's
    ``env.json``."""

    def __init__(
        self,
        output_root: Path,
        runs: list[RunSpec],
        *,
        flush_every_s: float = 30.0,
        on_change: Callable[[], None] | None = None,
        echo: Callable[[str], None] | None = None,
        facts: dict[str, Any] | None = None,
        loggers: list[str] = (),
    ):
        self.output_root = Path(output_root)
        self.runs = {r.name: r for r in runs}
        self.order = [r.name for r in runs]
        self.flush_every_s = flush_every_s
        self.on_change = on_change
        self.echo = echo or (lambda line: print(line, file=sys.stdout, flush=True))
        self.facts = facts or {}  # the driver's git facts, also written into env.json
        self.pending: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.parts: dict[tuple[str, str], int] = {}
        self.last_flush: dict[str, float] = {}
        self.status: dict[str, dict[str, Any]] = {}
        self.iter_history: dict[str, list[float]] = {}
        self.latest: dict[str, dict[str, Any]] = {}
        self.last_heartbeat: dict[str, float] = {}
        self.trial_runs: dict[str, str] = {}  # Tune trial id -> run (for the RunTimeout stopper)
        # Training: attempts of a run (worker-group restarts, --resume), by their start time.
        self.attempt: dict[str, int] = {}
        self.attempt_ts: dict[str, float] = {}
        # --logger: TensorBoard / W&B / MLflow series per run (platform/loggers.py).
        from platform.record.loggers import make_loggers

        self.logs = make_loggers(list(loggers), self.output_root, self.echo)
        self.logged_config: dict[str, dict[str, Any]] = {}
        # The sweep's platform.race.Schedule (early stops, skipped runs); None: stops none.
        self.schedule = None

    # --- Tune hooks (called in the driver's Tune loop) ---
    def on_trial_start(self, iteration, trials, trial, **info):
        run = self._run(trial)
        self.trial_runs[trial.trial_id] = run
        self.status[run] = {
            "status": "running",
            "started_at": time.time(),
            "effective": {},
            "gpu_telemetry_rows": 0,
            "host_telemetry_rows": 0,
            "stall_alerts": 0,
        }
        self.last_flush[run] = self.last_heartbeat[run] = time.monotonic()
        self.echo(f"[{self._index(run)}] {run}: started")
        if self.on_change:  # the manifest on disk says which run was going, should the driver die
            self.on_change()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        run = self._run(trial)
        spec = self.runs[run]
        status = self.status.setdefault(run, {})
        restarts = status.get("restarts", 0)
        attempt = self._attempt(run, result, status)
        attempt_changed = status.get("restarts", 0) != restarts
        keys = {"run": run, "group": spec.group, "repeat": spec.repeat, "attempt": attempt}
        row = {name: result.get(name) for name in results.TIMING_SCHEMA.names} | keys
        effective = {k: result[k] for k in results.EFFECTIVE_KEYS if k in result}
        status.setdefault("effective", {}).update(effective)
        status.update(
            {k: result[k] for k in (*results.PLACEMENT_KEYS, *results.STARTUP_KEYS) if k in result}
        )
        if effective.get("missing_files") and not status.get("missing_noted"):
            status["missing_noted"] = True
            self.echo(
                f"[{self._index(run)}] {run}: skipped {effective['missing_files']} manifest rows "
                "whose audio file is missing (max_missing_files_fraction allows it)"
            )
        rows = [row]
        # timing_ranks: all: the other ranks' windows come with rank 0's, one row per rank.
        for other in result.get("rank_windows") or ():
            rows.append({name: other.get(name) for name in results.TIMING_SCHEMA.names})
            rows[-1].update(keys, rank_skew=row["rank_skew"])
        self._add(run, "timing", rows)
        for kind in ("gpu", "host"):
            samples = [dict(r, **keys) for r in result.get(f"{kind}_samples") or ()]
            self._add(run, kind, samples)
            status[f"{kind}_telemetry_rows"] = status.get(f"{kind}_telemetry_rows", 0) + len(
                samples
            )
        if result.get("env_facts"):
            self._write_env(run, result["env_facts"])
        self.echo(self._progress_line(run, row))
        self._training_rows(run, result, keys, status)
        self._log_series(run, result)
        self._check_stall(run, row)
        self.latest[run] = row
        # Training: everything measured up to a checkpoint or a restart is on disk at once, so
        # a killed driver loses only windows that a resume from that checkpoint measures again.
        durable = result.get("checkpoint_step") == result.get("step") or attempt_changed
        if durable or time.monotonic() - self.last_flush.get(run, 0.0) >= self.flush_every_s:
            self.flush(run)

    def on_step_begin(self, iteration, trials, **info):
        """Heartbeats: one line per running run every ``heartbeat_every_s``, so a long run
        never looks silently hung."""
        now = time.monotonic()
        for run, status in self.status.items():
            cfg = self.runs[run].config
            if status.get("status") != "running" or not cfg.telemetry or cfg.heartbeat_every_s <= 0:
                continue
            if now - self.last_heartbeat.get(run, now) < cfg.heartbeat_every_s:
                continue
            self.last_heartbeat[run] = now
            self.echo(self._heartbeat_line(run, status))

    def on_trial_complete(self, iteration, trials, trial, **info):
        run = self._run(trial)
        cfg, last = self.runs[run].config, self.latest.get(run, {})
        stopped = self.schedule.stops.get(run) if self.schedule is not None else None
        if stopped is not None:
            # Stopped by the scheduler (race, asha): its windows are kept, a partial run.
            reason = (
                f"stopped early at step {stopped['step']} by {stopped['by']}: {stopped['reason']}"
            )
            self._finish(trial, "stopped_early", reason)
            return
        if cfg.run_timeout_s and (last.get("step") or 0) < cfg.max_steps:
            # Stopped by RunTimeout (Tune counts that as complete): not a finished run.
            reason = f"run_timeout_s {cfg.run_timeout_s:g} reached at step {last.get('step') or 0}"
            self._finish(trial, "timeout", reason)
            return
        self._finish(trial, "ok", "")

    def on_trial_error(self, iteration, trials, trial, **info):
        run = self._run(trial)
        text = _error_text(trial)
        run_dir = self.output_root / "runs" / run
        lines = self.runs[run].config.fail_tail_lines
        # The workers' log tails: for the reason (Ray cuts long error snippets), and to show.
        workers = worker_tails(run_dir, max(lines, 40))
        reason = failure_reason(text, stderr_tails(workers))
        stacks = sorted(run_dir.glob("stacks-rank*.txt"))
        if stacks:
            # The stall watchdog wrote these before the collectives timed out: a hang.
            names = ", ".join(p.name for p in stacks)
            reason = f"stalled: no progress for stall_timeout_s; stacks in runs/{run}/ ({names}); {reason}"
            self._finish(trial, "stalled", reason)
        else:
            self._finish(trial, "failed", reason, exit_code("failed", text))
        if lines > 0:
            self._save_fail_tail(run, run_dir, workers, lines)

    def _save_fail_tail(self, run: str, run_dir: Path, workers: list[dict], lines: int) -> None:
        """Print and save the last ``lines`` lines of each worker's stderr and stdout."""
        for w in workers:
            w["tails"] = {
                k: v[-lines:] if isinstance(v, list) else v for k, v in w["tails"].items()
            }
        text = format_tails(run_dir, workers)
        results.atomic_write_text(run_dir / FAIL_TAIL, text)
        self.echo(
            f"[{self._index(run)}] {run}: the last {lines} lines of each worker's logs "
            f"(saved to runs/{run}/{FAIL_TAIL}):\n{text.rstrip()}"
        )

    def on_experiment_end(self, trials, **info):
        for run in list(self.last_flush):
            self.flush(run)

    def close(self) -> None:
        """Close the loggers' runs (those still open were interrupted)."""
        self.logs.close()

    # --- training runs (platform.train) ---
    def _attempt(self, run: str, result: dict[str, Any], status: dict[str, Any]) -> int:
        """The attempt a window belongs to: a new worker group (a restart from a checkpoint, or
        --resume) starts a new one and says so."""
        if run not in self.attempt:
            # A resumed run continues after the attempts already on disk.
            timing = results.read_dataset(
                self.output_root / results.TIMING_DIR, results.TIMING_SCHEMA
            )
            previous = timing.loc[timing["run"] == run, "attempt"]
            self.attempt[run] = int(previous.max()) + 1 if len(previous) else 0
            self.attempt_ts[run] = result.get("attempt_start_ts") or 0.0
        elif (result.get("attempt_start_ts") or 0.0) != self.attempt_ts[run]:
            self.attempt[run] += 1
            self.attempt_ts[run] = result.get("attempt_start_ts") or 0.0
            status["restarts"] = status.get("restarts", 0) + 1
            self.echo(
                f"[{self._index(run)}] {run}: restarted (attempt {self.attempt[run] + 1}): the worker "
                f"group came back and resumed from step {result.get('resumed_from_step') or 0}"
            )
        else:
            return self.attempt[run]
        if result.get("resumed_from_step"):
            status["resumed_from_step"] = result["resumed_from_step"]
            self.echo(
                f"[{self._index(run)}] {run}: resumed from the checkpoint at step "
                f"{result['resumed_from_step']}"
            )
        if result.get("resume_notes"):
            self.echo(f"[{self._index(run)}] {run}: {result['resume_notes']}")
        return self.attempt[run]

    def _training_rows(self, run: str, result: dict[str, Any], keys, status) -> None:
        step = result.get("step")
        if result.get("val_step") == step and step is not None:
            row = {n: result.get(n) for n in results.VALIDATION_SCHEMA.names} | keys
            self._add(run, "validation", [row])
            status["val_mean_r1_last"] = result.get("val_mean_r1")
            self.echo(
                f"[{self._index(run)}] {run}: validation at step {step}: loss "
                f"{result.get('val_loss', math.nan):.3f}  speech->text R@1 "
                f"{result.get('val_s2t_r1', math.nan):.3f} R@5 {result.get('val_s2t_r5', math.nan):.3f}"
                f"  text->speech R@1 {result.get('val_t2s_r1', math.nan):.3f} R@5 "
                f"{result.get('val_t2s_r5', math.nan):.3f}  (chance R@1 "
                f"{result.get('val_chance_r1', math.nan):.4f}, {result.get('val_items')} items, "
                f"{result.get('val_s', math.nan):.1f} s)"
            )
        if result.get("checkpoint_step") == step and step is not None:
            row = {n: result.get(n) for n in results.CHECKPOINTS_SCHEMA.names} | keys
            self._add(run, "checkpoints", [row])
            status["checkpoints"] = status.get("checkpoints", 0) + 1
            status["last_checkpoint"] = result.get("checkpoint_path") or ""
            score = result.get("checkpoint_score")
            if score is not None and math.isfinite(score):
                status["best_checkpoint_metric"] = score
            size_mb = (result.get("checkpoint_size_bytes") or 0) / 1e6
            self.echo(
                f"[{self._index(run)}] {run}: checkpoint at step {step}: "
                f"{size_mb:.1f} MB saved in {result.get('checkpoint_save_s', math.nan):.2f} s"
            )

    def _log_series(self, run: str, result: dict[str, Any]) -> None:
        if not self.logs:
            return
        from platform.record.loggers import scalars_of

        spec = self.runs[run]
        config = self.logged_config.get(run)
        if config is None:  # what W&B and MLflow record with the run, built once
            config = self.logged_config[run] = {
                **spec.config.to_dict(),
                "group": spec.group,
                "repeat": spec.repeat,
            }
        step = int(result.get("step") or 0)
        self.logs.log(run, spec.group, config, step, scalars_of(result, _VALIDATION_SERIES))

    def mark_interrupted(self, signal_name: str | None = None) -> list[str]:
        """Runs still running when the sweep stopped become ``interrupted`` (their rows are
        flushed already); returns their names."""
        cut = []
        for run, status in self.status.items():
            if status.get("status") == "running":
                status.update(
                    status="interrupted",
                    failure_reason="interrupted (the sweep was stopped)",
                    exit_code=exit_code("interrupted", signal_name=signal_name),
                    duration_sec=time.time() - status.get("started_at", time.time()),
                )
                cut.append(run)
        return cut

    def mark_skipped(self) -> list[str]:
        """Runs the scheduler left out (their group left the race) become ``skipped``."""
        skipped = self.schedule.state["skipped"] if self.schedule is not None else {}
        out = []
        for run, reason in skipped.items():
            if self.status.get(run, {}).get("status", "pending") == "pending":
                self.status[run] = {"status": "skipped", "failure_reason": reason}
                out.append(run)
        return out

    # --- recording ---
    def _add(self, run: str, kind: str, rows: list[dict[str, Any]]) -> None:
        if rows:
            self.pending.setdefault((run, kind), []).extend(rows)

    def flush(self, run: str) -> None:
        self.last_flush[run] = time.monotonic()
        self.logs.flush(run)
        for kind, (folder, schema) in results.DATASETS.items():
            rows = self.pending.pop((run, kind), [])
            if not rows:
                continue
            part = self.parts.get((run, kind))
            if part is None:  # continue after the parts an earlier attempt left (training)
                part = results.next_part(self.output_root / folder, run)
            results.write_part(self.output_root / folder, f"{run}-{part:05d}", rows, schema)
            self.parts[(run, kind)] = part + 1

    def _write_env(self, run: str, facts: dict[str, Any]) -> None:
        record = {"run": run, **facts, **self.facts, "config": self.runs[run].config.to_dict()}
        results.write_json(self.output_root / "runs" / run / "env.json", record)

    def _check_stall(self, run: str, row: dict[str, Any]) -> None:
        """Alert when this window's iter_ms_p50 exceeds stall_alert_ratio x the run's median so
        far (from the third window on, so a median exists)."""
        cfg = self.runs[run].config
        history = self.iter_history.setdefault(run, [])
        value = row.get("iter_ms_p50")
        if value is None or not cfg.telemetry:
            return
        median = stats.stall_alert(history, value, cfg.stall_alert_ratio)
        if median is not None:
            self.status[run]["stall_alerts"] = self.status[run].get("stall_alerts", 0) + 1
            self.echo(
                f"[{self._index(run)}] {run}: ALERT step {row.get('step')}: iter p50 "
                f"{value:.1f} ms is {value / median:.1f}x the run's median {median:.1f} ms"
            )
        history.append(value)

    def _finish(self, trial, status: str, reason: str, code: int | None = None) -> None:
        run = self._run(trial)
        self.flush(run)
        previous = self.status.get(run, {})
        started = previous.get("started_at", time.time())
        self.status[run] = {
            **previous,
            "status": status,
            "failure_reason": reason,
            "exit_code": exit_code(status) if code is None else code,
            "started_at": started,
            "duration_sec": time.time() - started,
            "effective": previous.get("effective", {}),
        }
        self.logs.finish(run, status)
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
        eta_s = row.get("eta_s")
        return (
            f"[{self._index(run)}] {run}: step {step}/{max_steps}"
            f"  iter p50 {row.get('iter_ms_p50', math.nan):.1f} ms"
            f"  data p50 {row.get('data_ms_p50', math.nan):.1f} ms"
            f"  {row.get('samples_per_s', math.nan):.1f} samples/s"
            f"  loss {row.get('loss', math.nan):.3f}  ETA {math.nan if eta_s is None else eta_s:.0f} s"
        )

    def _heartbeat_line(self, run: str, status: dict[str, Any]) -> str:
        elapsed = time.time() - status.get("started_at", time.time())
        row = self.latest.get(run)
        if row is None:
            return f"[{self._index(run)}] {run}: heartbeat: starting, {elapsed:.0f} s since start"
        since = time.time() - (row.get("window_end_ts") or time.time())
        return (
            f"[{self._index(run)}] {run}: heartbeat: step {row.get('step')}/{row.get('max_steps')}"
            f"  {row.get('samples_per_s', math.nan):.1f} samples/s  ETA {row.get('eta_s') or 0:.0f} s"
            f"  last window {since:.0f} s ago"
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
