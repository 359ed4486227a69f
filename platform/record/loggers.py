"""Experiment loggers: ``--logger tensorboard|wandb|mlflow`` (repeatable, off by default).

The recorder (platform/record/recorder.py) hands every timing window of every run to each logger: one
series per run, keyed by the run's step, with the window metrics (``perf/samples_per_s``,
``perf/iter_ms_p50``, ... ``train/loss``; ``val/*`` and ``checkpoint/save_s`` in training). All
three write to the output root unless told otherwise, so they work offline:

- ``tensorboard``: tensorboardX event files, ``<root>/tensorboard/<run>/``;
- ``wandb``: one W&B run per run (group = the run's group), offline in ``<root>/wandb/`` unless
  ``WANDB_MODE`` says otherwise (``wandb sync <root>/wandb/offline-run-*`` uploads them later);
- ``mlflow``: one MLflow run per run in the experiment named after the output root, tracked in
  ``sqlite:///<root>/mlflow.db`` unless ``MLFLOW_TRACKING_URI`` names a server
  (``mlflow ui --backend-store-uri sqlite:///<root>/mlflow.db`` shows them).

These run in the driver only (Tune callbacks), so they live under ``platform``.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from platform.errors import UsageError
from stage1_common.output_root import OutputRoot

__all__ = [
    "LOGGERS",
    "WINDOW_SCALARS",
    "RunLoggers",
    "add_logger_argument",
    "check_loggers",
    "make_loggers",
    "scalars_of",
]

LOGGERS = ("tensorboard", "wandb", "mlflow")

# Series name -> key of the window's result.
WINDOW_SCALARS = {
    "perf/samples_per_s": "samples_per_s",
    "perf/iter_ms_p50": "iter_ms_p50",
    "perf/iter_ms_p90": "iter_ms_p90",
    "perf/step_ms_p50": "step_ms_p50",
    "perf/data_ms_p50": "data_ms_p50",
    "perf/audio_s_per_s": "audio_s_per_s",
    "perf/padding_ratio": "padding_ratio",
    "perf/mfu": "mfu",
    "perf/peak_mem_gib": "peak_mem_gib",
    "perf/rank_skew": "rank_skew",
    "train/loss": "loss",
    "train/lr": "lr",
}
_PACKAGES = {"wandb": "wandb", "mlflow": "mlflow-skinny sqlalchemy alembic"}


def scalars_of(result: dict[str, Any], validation_keys: tuple[str, ...] = ()) -> dict[str, float]:
    """The finite numbers of one window report, under their series names."""
    step = result.get("step")
    keys = dict(WINDOW_SCALARS)
    if result.get("iter_ms_mean"):
        result = dict(result, data_share=result.get("data_ms_mean", 0) / result["iter_ms_mean"])
        keys["perf/data_share"] = "data_share"
    if step is not None and result.get("val_step") == step:
        keys.update({f"val/{k[4:]}": k for k in validation_keys})
    if result.get("checkpoint_step") is not None:  # complete at this window
        keys["checkpoint/save_s"] = "checkpoint_save_s"
        keys["checkpoint/block_s"] = "checkpoint_block_s"
    out = {}
    for name, key in keys.items():
        value = result.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = float(value)
    return out


def add_logger_argument(parser, default: str | None = None) -> None:
    """``--logger`` of platform.tune and platform.train."""
    parser.add_argument(
        "--logger",
        action="append",
        default=None,
        choices=LOGGERS,
        help="also log every run's window metrics to TensorBoard, W&B or MLflow (offline, under "
        "the output root, unless WANDB_MODE / MLFLOW_TRACKING_URI say otherwise); repeatable"
        + (f"; default {default}" if default else ""),
    )


def check_loggers(names: list[str] | None, default: tuple[str, ...] = ()) -> list[str]:
    """``--logger`` values (``default`` when none was given), checked before anything starts:
    known names, packages installed."""
    out = []
    for name in default if names is None else names:
        if name not in LOGGERS:
            raise UsageError(f"--logger {name}: unknown; choose from {', '.join(LOGGERS)}")
        if name in _PACKAGES:
            try:
                __import__(name)
            except ImportError:
                raise UsageError(
                    f"--logger {name}: the package is not installed; pip install "
                    f"{_PACKAGES[name]} (or pip install -e '.[loggers]')"
                ) from None
        if name not in out:
            out.append(name)
    return out


class _TensorBoard:
    def __init__(self, root: OutputRoot, experiment: str):
        self.root = root.tensorboard
        self.runs: dict[str, Any] = {}  # run -> its SummaryWriter

    def log(self, run: str, group: str, config: dict, step: int, scalars: dict[str, float]):
        writer = self.runs.get(run)
        if writer is None:
            from tensorboardX import SummaryWriter

            writer = self.runs[run] = SummaryWriter(str(self.root / run), flush_secs=30)
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, step)

    def flush(self, run: str) -> None:
        if run in self.runs:
            self.runs[run].flush()

    def finish(self, run: str, status: str) -> None:
        writer = self.runs.pop(run, None)
        if writer is not None:
            writer.close()


class _Wandb:
    def __init__(self, root: OutputRoot, experiment: str):
        import wandb

        self.wandb, self.root, self.project = wandb, root.path, experiment
        self.runs: dict[str, Any] = {}

    def log(self, run: str, group: str, config: dict, step: int, scalars: dict[str, float]):
        handle = self.runs.get(run)
        if handle is None:
            handle = self.runs[run] = self.wandb.init(
                project=os.environ.get("WANDB_PROJECT", self.project),
                name=run,
                group=group,
                config=config,
                dir=str(self.root),
                mode=os.environ.get("WANDB_MODE", "offline"),
                reinit="create_new",  # one W&B run per sweep run, in one driver process
                settings=self.wandb.Settings(silent=True, console="off"),
            )
        handle.log(scalars, step=step)

    def finish(self, run: str, status: str) -> None:
        handle = self.runs.pop(run, None)
        if handle is not None:
            handle.finish(exit_code=0 if status in ("ok", "stopped_early") else 1)


class _Mlflow:
    def __init__(self, root: OutputRoot, experiment: str):
        from mlflow.tracking import MlflowClient

        here = root.path.resolve()
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{here / OutputRoot.MLFLOW_DB}"
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        self.experiment = (
            found.experiment_id
            if found is not None
            else self.client.create_experiment(
                experiment, artifact_location=(here / OutputRoot.MLFLOW_ARTIFACTS).as_uri()
            )
        )
        self.runs: dict[str, str] = {}

    def log(self, run: str, group: str, config: dict, step: int, scalars: dict[str, float]):
        from mlflow.entities import Metric, Param

        run_id = self.runs.get(run)
        if run_id is None:
            handle = self.client.create_run(self.experiment, run_name=run, tags={"group": group})
            run_id = self.runs[run] = handle.info.run_id
            params = [Param(k, str(v)[:500]) for k, v in sorted(config.items())]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
                self.client.log_batch(run_id, params=params[i : i + 100])
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in scalars.items()]
        self.client.log_batch(run_id, metrics=metrics)

    def finish(self, run: str, status: str) -> None:
        run_id = self.runs.pop(run, None)
        if run_id is not None:
            state = {"ok": "FINISHED", "stopped_early": "FINISHED", "interrupted": "KILLED"}
            self.client.set_terminated(run_id, state.get(status, "FAILED"))


_CLASSES = {"tensorboard": _TensorBoard, "wandb": _Wandb, "mlflow": _Mlflow}


class RunLoggers:
    """The chosen loggers behind one call per window and one per finished run. A logger that
    fails is reported once and dropped: it never stops a sweep or loses a measured row."""

    def __init__(self, names: list[str], root: OutputRoot, echo=print):
        self.echo = echo
        self.loggers: dict[str, Any] = {}
        for name in names:
            try:
                # The output root's folder name is the W&B project and the MLflow experiment.
                self.loggers[name] = _CLASSES[name](root, root.path.name)
            except Exception as exc:  # noqa: BLE001 - the sweep goes on without it
                echo(f"logger {name} is off: {type(exc).__name__}: {exc}")

    def __bool__(self) -> bool:
        return bool(self.loggers)

    def log(self, run: str, group: str, config: dict, step: int, scalars: dict[str, float]):
        self._each("log", run, group, config, step, scalars)

    def finish(self, run: str, status: str) -> None:
        self._each("finish", run, status)

    def flush(self, run: str) -> None:
        """Whatever a logger buffers for ``run`` goes to disk (with the recorder's flush)."""
        for name, logger in list(self.loggers.items()):
            if hasattr(logger, "flush"):
                self._call(name, logger, "flush", run)

    def close(self) -> None:
        for name, logger in list(self.loggers.items()):
            for run in list(logger.runs):  # every logger keeps its open runs in .runs
                self._call(name, logger, "finish", run, "interrupted")

    def _each(self, method: str, *args) -> None:
        for name, logger in list(self.loggers.items()):
            self._call(name, logger, method, *args)

    def _call(self, name: str, logger, method: str, *args) -> None:
        try:
            getattr(logger, method)(*args)
        except Exception as exc:  # noqa: BLE001
            self.echo(f"logger {name} is off from here: {type(exc).__name__}: {exc}")
            self.loggers.pop(name, None)


def make_loggers(names: list[str], root: OutputRoot, echo=print) -> RunLoggers:
    """The ``--logger`` sinks ``names`` of the output root ``root``, behind one RunLoggers."""
    return RunLoggers(names, root, echo)
