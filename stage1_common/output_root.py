"""The output root of a sweep or a training run, as one object: where each of its files lives.

Every module that reads or writes an output root asks this object for the path instead of
joining its own file names onto a folder, so each name has one home (the layout is the one in
the README's "What a sweep writes"). The driver hands the object to each step; the workers,
which receive the root as a plain string in their config, rebuild it with ``OutputRoot.of``.

An output root on object storage (``--output-root s3://bucket/prefix``) is staged: ``path`` is a
local folder the driver writes as it would write any root, ``remote`` the bucket's address that
folder is mirrored to (platform/storage/mirror.py); the workers write their run folders on
their own node and upload them (trainables/run_files.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["OutputRoot"]


@dataclass(frozen=True)
class OutputRoot:
    """An output root folder and the names of everything in it."""

    path: Path
    remote: str | None = None  # s3://bucket/prefix when ``path`` stages a root on object storage

    # Files and folders at the top of the root.
    MANIFEST = "run_manifest.tsv"
    TIMING = "timing.parquet"
    GPU_TELEMETRY = "gpu_telemetry.parquet"
    HOST_TELEMETRY = "host_telemetry.parquet"
    VALIDATION = "validation.parquet"
    CHECKPOINTS = "checkpoints.parquet"
    PER_RUN_METRICS = "per_run_metrics.csv"
    GROUP_SUMMARY = "group_summary.csv"
    RANKED_GROUPS = "ranked_groups.csv"
    BEST_CONFIG = "best_config.json"
    SUMMARY_MD = "summary.md"
    SUMMARY_JSON = "summary.json"
    SCHEDULE = "schedule.json"
    GROUPS = "groups.json"  # the resident worker groups of a sweep and the runs each trained
    REPORT = "report.html"
    TENSORBOARD = "tensorboard"
    RUNS = "runs"
    DATA = "data"
    CACHE = "cache"
    TOKENIZERS = "tokenizers"
    TUNE = "tune"
    # --logger mlflow's store when no MLFLOW_TRACKING_URI names one (platform/record/loggers.py).
    MLFLOW_DB = "mlflow.db"
    MLFLOW_ARTIFACTS = "mlflow_artifacts"
    # What a committed analysis folder (benchmarks/results/*) holds in place of Parquet rows:
    # the notebooks' figures and the logs of platform.stability and platform.leak.
    PLOTS = "plots"
    STABILITY_LOG = "stability.log"
    LEAK_LOG = "leak.log"
    # Files in a run's folder (runs/<run>/).
    RUN_CONFIG = "config.json"
    RUN_ENV = "env.json"
    FAIL_TAIL = "fail_tail.txt"
    # A rank of the run's first attempt armed its inject_* faults (one file per rank: ranks of
    # one attempt start at different times); later attempts (a restart, a resumed training)
    # train without them (trainables/faults.py). Formatted with the rank, or "*".
    FAULTS_ARMED = "faults_armed-rank{rank}.json"
    WORKERS = "workers"
    # workers/previous/: the records of the attempt before this one (a restarted worker group
    # moves them there), whose log tails the driver saves in restart_tail-attempt<N>.txt.
    WORKERS_PREVIOUS = "previous"
    RESTART_TAIL = "restart_tail-attempt{attempt}.txt"
    EXPORT = "export"
    # Folders in data/: the synthetic corpus and its prepared form.
    SYNTH = "synth"
    PREPARED = "prepared"

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @classmethod
    def of(cls, value: OutputRoot | str | os.PathLike) -> OutputRoot:
        """``value`` as an OutputRoot (an OutputRoot is returned as it is)."""
        return value if isinstance(value, OutputRoot) else cls(Path(value))

    @property
    def shown(self) -> str:
        """How the root is named to the user: the bucket's address, or the folder."""
        return self.remote or str(self.path)

    def remote_join(self, *parts: str) -> str | None:
        """The bucket's address of a path inside the root (None for a local root)."""
        if self.remote is None:
            return None
        base, sep, query = self.remote.partition("?")
        return "/".join([base.rstrip("/"), *parts]) + (sep + query if sep else "")

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __truediv__(self, name: str | os.PathLike) -> Path:
        return self.path / name

    # --- the root's files ---
    @property
    def manifest(self) -> Path:
        return self.path / self.MANIFEST

    @property
    def timing(self) -> Path:
        return self.path / self.TIMING

    @property
    def best_config(self) -> Path:
        return self.path / self.BEST_CONFIG

    @property
    def schedule(self) -> Path:
        return self.path / self.SCHEDULE

    @property
    def groups(self) -> Path:
        return self.path / self.GROUPS

    @property
    def group_runs(self) -> Path:
        """Ray Train's own state of the resident groups (beside Tune's, under ``tune/``)."""
        return self.path / self.TUNE / "groups"

    @property
    def runs(self) -> Path:
        return self.path / self.RUNS

    @property
    def data(self) -> Path:
        return self.path / self.DATA

    @property
    def cache(self) -> Path:
        return self.path / self.CACHE

    @property
    def tokenizers(self) -> Path:
        return self.path / self.TOKENIZERS

    @property
    def tensorboard(self) -> Path:
        return self.path / self.TENSORBOARD

    @property
    def validation(self) -> Path:
        return self.path / self.VALIDATION

    @property
    def checkpoints(self) -> Path:
        return self.path / self.CHECKPOINTS

    @property
    def summary_md(self) -> Path:
        return self.path / self.SUMMARY_MD

    @property
    def synth_data(self) -> Path:
        """``data/synth/``: a space's synthetic corpus as generated."""
        return self.data / self.SYNTH

    @property
    def prepared_data(self) -> Path:
        """``data/prepared/``: that corpus prepared by data_prep (audio and manifest)."""
        return self.data / self.PREPARED

    def holds_sweep(self) -> bool:
        """Whether a sweep or a training run was started here (its manifest exists)."""
        return self.manifest.is_file()

    # --- a run's folder ---
    def run_dir(self, run: str) -> Path:
        """``runs/<run>/``: the run's config, environment, logs, stack dumps and checkpoints."""
        return self.runs / run

    def run_config(self, run: str) -> Path:
        return self.run_dir(run) / self.RUN_CONFIG

    def run_env(self, run: str) -> Path:
        return self.run_dir(run) / self.RUN_ENV

    def fail_tail(self, run: str) -> Path:
        return self.run_dir(run) / self.FAIL_TAIL

    def workers_dir(self, run: str) -> Path:
        """``runs/<run>/workers/``: one ``rank<r>.json`` per rank (pid, node, log files)."""
        return self.run_dir(run) / self.WORKERS

    def restart_tail(self, run: str, attempt: int) -> Path:
        """The log tails of the attempt that ended before attempt ``attempt`` (from 1) began."""
        return self.run_dir(run) / self.RESTART_TAIL.format(attempt=attempt)

    def export_dir(self, run: str) -> Path:
        """``runs/<run>/export/``: the model platform.train exported (export.json, speech/, text/)."""
        return self.run_dir(run) / self.EXPORT

    def stacks(self, run: str, rank: int | str = "*") -> Path:
        """A stalled rank's thread stacks (``rank="*"`` gives the glob of all of them)."""
        return self.run_dir(run) / f"stacks-rank{rank}.txt"
