"""The Tune callback that records a sweep: it runs in the driver, receives every timing window
that rank 0 reports, writes the rows to Parquet part files, keeps each run's status for the run
manifest and writes its ``env.json``.

It is the record of truth: Ray Train V2 keeps no metrics for reports without a checkpoint. What
it prints is platform/record/progress.py's; why a run failed, platform/record/failures.py's. It
never holds Tune's loop: its callbacks buffer and print, and the files are written by one
thread of its own (platform/record/writer.py), drained at the sweep's end.
"""

from __future__ import annotations

import copy
import functools
import math
import sys
import time
from collections.abc import Callable
from typing import Any

from ray.tune import Callback

from platform.record.failures import (
    diagnose,
    error_text,
    exit_code,
    keep_failure,
    raised_at,
    save_restart_tail,
)
from platform.record.loggers import make_loggers, scalars_of
from platform.record.progress import Progress
from platform.record.writer import BackgroundWriter
from platform.spaces.expand import RunSpec
from platform.storage import results
from platform.storage.mirror import pull_run
from stage1_common.output_root import OutputRoot
from trainables.ticket import RunTicket

__all__ = ["SweepRecorder"]


# The validation figures that become val/* series (platform/record/loggers.py).
_VALIDATION_SERIES = tuple(
    k
    for k in results.VALIDATION_SCHEMA.names
    if k.startswith("val_") and k not in ("val_items", "val_chance_r1")
)


class SweepRecorder(Callback):
    """Buffers rows per run (timing windows, GPU and host telemetry; validations and
    checkpoints in training) and writes them as Parquet part files: at the end of every run (ok
    or failed) and, during a long run, every ``flush_every_s`` seconds, so that an interrupted
    sweep keeps everything up to its last flush. It keeps each run's status for the manifest
    (``on_change`` writes it) and writes each run's ``env.json``; its ``progress`` prints the
    console lines, its ``logs`` feed the ``--logger`` sinks."""

    def __init__(
        self,
        root: OutputRoot,
        runs: list[RunSpec],
        *,
        flush_every_s: float = 30.0,
        on_change: Callable[[dict[str, dict[str, Any]]], None] | None = None,
        echo: Callable[[str], None] | None = None,
        facts: dict[str, Any] | None = None,
        loggers: list[str] = (),
    ):
        self.root = root
        self.runs = {r.name: r for r in runs}
        self.flush_every_s = flush_every_s
        self.on_change = on_change
        self.echo = echo or (lambda line: print(line, file=sys.stdout, flush=True))
        self.progress = Progress(list(runs), self.echo)
        self.facts = facts or {}  # the driver's git facts, also written into env.json
        self.pending: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.parts: dict[tuple[str, str], int] = {}  # the writer thread's alone
        self.writer = BackgroundWriter(self.echo)
        self.last_flush: dict[str, float] = {}
        self.status: dict[str, dict[str, Any]] = {}
        self.latest: dict[str, dict[str, Any]] = {}  # run -> its last timing window
        self.trial_runs: dict[str, str] = {}  # Tune trial id -> run (for the RunTimeout stopper)
        # Training: attempts of a run (worker-group restarts, --resume), by their start time;
        # a resumed run continues after the attempts already on disk (read once, here).
        self.attempt: dict[str, int] = {}
        self.attempt_ts: dict[str, float] = {}
        self.attempts_before = _attempts_on_disk(self.root)
        # --logger: TensorBoard / W&B / MLflow series per run.
        self.logs = make_loggers(list(loggers), self.root, self.echo)
        self.logged_config: dict[str, dict[str, Any]] = {}
        # The sweep's platform.control.race.Schedule (early stops, skipped runs); None: none.
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
        self.last_flush[run] = time.monotonic()
        self.progress.started(run)
        self._changed()  # the manifest on disk says which run was going, should the driver die

    def on_trial_result(self, iteration, trials, trial, result, **info):
        run = self._run(trial)
        spec = self.runs[run]
        status = self.status.setdefault(run, {})
        restarts = status.get("restarts", 0)
        attempt = self._attempt(run, result, status)
        attempt_changed = status.get("restarts", 0) != restarts
        keys = {"run": run, "group": spec.group, "repeat": spec.repeat, "attempt": attempt}
        row = {name: result.get(name) for name in results.TIMING_SCHEMA.names} | keys
        self._note_effective(run, result, status)
        self._add_window(run, row, result, keys, status)
        if result.get("env_facts"):
            record = {"run": run, **result["env_facts"], **self.facts}
            record["config"] = spec.config.to_dict()
            self.writer.submit(lambda: results.write_json(self.root.run_folder(run).env, record))
        self.progress.window(run, row)
        self._training_rows(run, result, keys, status)
        self._log_series(run, result)
        if self.progress.stall_alert(run, row):
            status["stall_alerts"] = status.get("stall_alerts", 0) + 1
        self.latest[run] = row
        # Training: everything measured up to a checkpoint or a restart is on disk at once, so
        # a killed driver loses only windows that a resume from that checkpoint measures again.
        durable = result.get("checkpoint_step") is not None or attempt_changed
        if durable or time.monotonic() - self.last_flush.get(run, 0.0) >= self.flush_every_s:
            self.flush(run)

    def on_step_begin(self, iteration, trials, **info):
        self.progress.heartbeats(self.status, self.latest)

    def on_trial_complete(self, iteration, trials, trial, **info):
        run = self._run(trial)
        cfg, last = self.runs[run].config, self.latest.get(run, {})
        stopped = self.schedule.stops.get(run) if self.schedule is not None else None
        if stopped is None and self.schedule is not None and self.schedule.ended_by_budget(run):
            self._finish(trial, "ok", "")  # --budget: ended where it was, a finished run
            return
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
        lines = self.runs[run].config.fail_tail_lines
        pull_run(self.root, run)  # a root on object storage: what its workers uploaded
        error = error_text(trial)
        failure = diagnose(self.root, run, error, lines)
        self._finish(trial, failure.status, failure.reason, failure.exit_code)
        shown = keep_failure(self.root, run, error, failure.workers, lines)
        self.progress.failure(run, raised_at(error), shown)

    def on_experiment_end(self, trials, **info):
        for run in list(self.last_flush):
            self.flush(run)

    def drain(self) -> None:
        """Wait until every write handed to the writer thread is on disk."""
        self.writer.drain()

    def close(self) -> None:
        """Close the loggers' runs (those still open were interrupted), once every write and
        series handed to the writer thread is done."""
        self.writer.drain()
        self.logs.close()

    # --- the end of the sweep (platform.execution.launch) ---
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

    def settle(self, verdict) -> list[str]:
        """Runs still running when the sweep ended on its own (the budget's safety stop) get
        the status and reason ``verdict(run)`` gives; returns their names."""
        settled = []
        for run, status in self.status.items():
            if status.get("status") == "running":
                state, reason = verdict(run)
                status.update(status=state, failure_reason=reason, exit_code=exit_code(state),
                              duration_sec=time.time() - status.get("started_at", time.time()))  # fmt: skip
                settled.append(run)
        return settled

    def mark_skipped(self) -> list[str]:
        """Runs the scheduler left out (their group left the race) become ``skipped``."""
        skipped = self.schedule.state["skipped"] if self.schedule is not None else {}
        out = []
        for run, reason in skipped.items():
            if self.status.get(run, {}).get("status", "pending") == "pending":
                self.status[run] = {"status": "skipped", "failure_reason": reason}
                out.append(run)
        return out

    # --- one window report ---
    def _note_effective(self, run: str, result: dict[str, Any], status: dict[str, Any]) -> None:
        """The values the run actually used, where it placed its ranks and what its start cost
        (manifest columns)."""
        effective = {k: result[k] for k in results.EFFECTIVE_KEYS if k in result}
        status.setdefault("effective", {}).update(effective)
        status.update(
            {k: result[k] for k in (*results.PLACEMENT_KEYS, *results.STARTUP_KEYS) if k in result}
        )
        if effective.get("missing_files") and not status.get("missing_noted"):
            status["missing_noted"] = True
            self.progress.skipped_rows(run, effective["missing_files"])

    def _add_window(self, run: str, row: dict, result: dict, keys: dict, status: dict) -> None:
        """Buffer the window's timing rows and the telemetry samples that came with it."""
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

    def _log_series(self, run: str, result: dict[str, Any]) -> None:
        if not self.logs:
            return
        spec = self.runs[run]
        config = self.logged_config.get(run)
        if config is None:  # what W&B and MLflow record with the run, built once
            config = self.logged_config[run] = {
                **spec.config.to_dict(),
                "group": spec.group,
                "repeat": spec.repeat,
            }
        step = int(result.get("step") or 0)
        scalars = scalars_of(result, _VALIDATION_SERIES)
        # On the writer thread, like every call of the loggers: a logger's first series imports
        # its package and opens its files (2.7 s for TensorBoard's on a 2x H100 host), MLflow's
        # writes to its store, W&B's to its process.
        self.writer.submit(functools.partial(self.logs.log, run, spec.group, config, step, scalars))

    # --- training runs (platform.train) ---
    def _attempt(self, run: str, result: dict[str, Any], status: dict[str, Any]) -> int:
        """The attempt a window belongs to: a new worker group (a restart from a checkpoint, or
        --resume) starts a new one and says so."""
        start_ts = result.get("attempt_start_ts") or 0.0
        restarted = False
        if run not in self.attempt:
            self.attempt[run] = self.attempts_before.get(run, -1) + 1
            self.attempt_ts[run] = start_ts
        elif start_ts != self.attempt_ts[run]:
            self.attempt[run] += 1
            self.attempt_ts[run] = start_ts
            status["restarts"] = status.get("restarts", 0) + 1
            resumed = result.get("resumed_from_step") or 0
            # Its line, once the ended attempt's log tails are read and saved (off Tune's loop).
            self.writer.submit(
                functools.partial(self._say_restart, run, self.attempt[run], resumed)
            )
            restarted = True
        else:
            return self.attempt[run]
        if result.get("resumed_from_step"):
            status["resumed_from_step"] = result["resumed_from_step"]
            if not restarted:  # a restart's own line names the step
                self.progress.resumed(run, result["resumed_from_step"])
        if result.get("resume_notes"):
            self.progress.say(run, result["resume_notes"])
        return self.attempt[run]

    def _say_restart(self, run: str, attempt: int, resumed: int) -> None:
        """The one console line of a restart: why the attempt before ended and where its
        workers' log tails are saved (runs/<run>/restart_tail-attempt<N>.txt)."""
        pull_run(self.root, run)  # a root on object storage: the records its workers uploaded
        lines = self.runs[run].config.fail_tail_lines
        reason, saved_to = save_restart_tail(self.root, run, attempt, lines)
        self.progress.restarted(run, attempt, resumed, reason, saved_to)

    def _training_rows(self, run: str, result: dict[str, Any], keys, status) -> None:
        """A validation or a checkpoint at this window's step: its row and its line."""
        step = result.get("step")
        if result.get("val_step") == step and step is not None:
            row = {n: result.get(n) for n in results.VALIDATION_SCHEMA.names} | keys
            self._add(run, "validation", [row])
            status["val_mean_r1_last"] = result.get("val_mean_r1")
            self.progress.validation(run, step, result)
        # Complete checkpoints a newer one overtook before Ray Train took them (deleted on the
        # workers), then the one it took: a row and a line each, oldest first.
        superseded = result.get("checkpoints_superseded") or []
        for ckpt in [*superseded, result] if result.get("checkpoint_step") is not None else []:
            ckpt_step = int(ckpt["checkpoint_step"])
            row = {n: ckpt.get(n) for n in results.CHECKPOINTS_SCHEMA.names} | keys
            row["step"], row["window_end_ts"] = ckpt_step, result.get("window_end_ts")
            self._add(run, "checkpoints", [row])
            status["checkpoints"] = status.get("checkpoints", 0) + 1
            self.progress.checkpoint(run, ckpt_step, ckpt)
        if result.get("checkpoint_step") is not None:
            status["last_checkpoint"] = result.get("checkpoint_path") or ""
            score = result.get("checkpoint_score")
            if score is not None and math.isfinite(score):
                status["best_checkpoint_metric"] = score
        cfg = self.runs[run].config
        if cfg.checkpoint_every or cfg.val_every:
            _overheads(status, result)

    # --- recording ---
    def _add(self, run: str, kind: str, rows: list[dict[str, Any]]) -> None:
        if rows:
            self.pending.setdefault((run, kind), []).extend(rows)

    def flush(self, run: str) -> None:
        """Hand ``run``'s buffered rows to the writer thread: one new part file per dataset
        that has any."""
        self.last_flush[run] = time.monotonic()
        self.writer.submit(functools.partial(self.logs.flush, run))
        for kind, (folder, schema) in results.DATASETS.items():
            rows = self.pending.pop((run, kind), [])
            if rows:
                self.writer.submit(
                    functools.partial(self._write_part, run, kind, folder, schema, rows)
                )

    def _write_part(self, run: str, kind: str, folder: str, schema, rows: list[dict]) -> None:
        """The writer thread: the run's next part file of one dataset."""
        part = self.parts.get((run, kind))
        if part is None:  # continue after the parts an earlier attempt left (training)
            part = results.next_part(self.root / folder, run)
        results.write_part(self.root / folder, f"{run}-{part:05d}", rows, schema)
        self.parts[(run, kind)] = part + 1

    def _changed(self) -> None:
        """The manifest is written again, by the writer thread, from the status as it is now."""
        if self.on_change is not None:
            status, write = copy.deepcopy(self.status), self.on_change
            self.writer.submit(lambda: write(status), key="manifest")

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
        self.writer.submit(functools.partial(self.logs.finish, run, status))
        self.progress.finished(run, status, self.status[run]["duration_sec"], reason)
        self._changed()

    def _run(self, trial) -> str:
        return RunTicket.name_in(trial.config)


def _overheads(status: dict[str, Any], result: dict[str, Any]) -> None:
    """The run's checkpoint and validation overheads (manifest columns) so far: the seconds
    they held training over the seconds in steps (every window's steps x its mean iteration,
    which leaves out the pauses the loop keeps out of its windows)."""
    sums = status.setdefault("_sums", {"train_s": 0.0, "block_s": 0.0, "val_s": 0.0})
    sums["train_s"] += (
        (result.get("steps_in_window") or 0) * (result.get("iter_ms_mean") or 0) / 1e3
    )
    if result.get("checkpoint_step") is not None:
        for ckpt in result.get("checkpoints_superseded") or []:
            sums["block_s"] += ckpt.get("checkpoint_block_s") or 0.0
        sums["block_s"] += result.get("checkpoint_block_s") or 0.0
        status["ckpt_end_wait_s"] = result.get("checkpoint_wait_s") or 0.0
    if result.get("val_step") == result.get("step") and result.get("step") is not None:
        sums["val_s"] += result.get("val_s") or 0.0
    if sums["train_s"] > 0:
        status["ckpt_overhead_share"] = sums["block_s"] / sums["train_s"]
        status["val_overhead_share"] = sums["val_s"] / sums["train_s"]


def _attempts_on_disk(root: OutputRoot) -> dict[str, int]:
    """Each run's last attempt in the root's timing windows (an earlier driver's, for --resume)."""
    timing = results.read_dataset(root.timing, results.TIMING_SCHEMA)
    if timing.empty:
        return {}
    return {str(run): int(a) for run, a in timing.groupby("run")["attempt"].max().items()}
