"""The output root of a sweep or a training run, as one object: where each of its files lives.

Every module that reads or writes an output root asks this object for the path instead of
joining its own file names onto a folder, so each name has one home (the layout is the one in
the README's "What a sweep writes"): the root's own files here, those of a run's folder
(``runs/<run>/``) in :class:`RunFolder`, those of one of its checkpoints in
:class:`CheckpointFolder` (tests/test_layering.py fails when another module spells a run
folder's name itself). The driver hands the object to each step; the workers receive where a
run's files go in the run's ticket (trainables/ticket.py, built by platform/storage/mirror.py's
``run_storage`` from an OutputRoot) and name the files of a run's folder with
``RunFolder(path)``.

An output root on object storage (``--output-root s3://bucket/prefix``) is worked on locally:
``path`` is a local folder the driver reads and writes as it would any root, ``remote`` the
bucket's address: the staging folder of a sweep, mirrored there, or a command's copy of the
root's result files (both platform/storage/mirror.py). The workers write their run folders on
their own node and upload them (trainables/run_folder/place.py).

Past the command-line entry points every function takes an OutputRoot, and none asks whether it
is on a bucket: the object answers (``shown``, ``where``, ``folder``), and what differs beyond
that (staging, copies, uploads, the kind of storage the workers get) is chosen in
platform/storage/mirror.py. This module, stage1_common/storage.py (what an address is) and
that one are the only modules that ask (tests/test_layering.py). The one prologue that turns
``--output-root`` into this object is platform/storage/open_root.py.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CheckpointFolder", "OutputRoot", "RunFolder"]


@dataclass(frozen=True)
class OutputRoot:
    """An output root folder and the names of everything at its top (a run's folder:
    :meth:`run_folder`)."""

    path: Path
    # s3://bucket/prefix when ``path`` is a local copy of a root on object storage (a sweep's
    # staging folder, or a command's copy of its result files)
    remote: str | None = None

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
    GROUP_RUNS = "groups"  # tune/groups/: Ray Train's state of the resident groups
    # --logger mlflow's store when no MLFLOW_TRACKING_URI names one (platform/record/loggers.py).
    MLFLOW_DB = "mlflow.db"
    MLFLOW_ARTIFACTS = "mlflow_artifacts"
    # What a committed analysis folder (benchmarks/results/*) holds in place of Parquet rows:
    # the notebooks' figures and the logs of platform.stability and platform.leak.
    PLOTS = "plots"
    STABILITY_LOG = "stability.log"
    LEAK_LOG = "leak.log"
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

    def where(self, *parts: str) -> str:
        """How a file inside the root is named to the user (a path printed, a command's
        argument): its address in the bucket, or its path."""
        return self.remote_join(*parts) or str(self.path.joinpath(*parts))

    @property
    def folder(self) -> Path | None:
        """The folder that is the root, for a command that reads a folder in place
        (``--from-ranked``); None for a root on object storage (``path`` is only a copy)."""
        return None if self.remote else self.path

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
        return self.path / self.TUNE / self.GROUP_RUNS

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
    def run_folder(self, run: str) -> RunFolder:
        """``runs/<run>/``: the run's config, environment, logs, stack dumps and checkpoints."""
        return RunFolder(self.runs / run)

    def run_dir(self, run: str) -> Path:
        """The path of :meth:`run_folder`."""
        return self.run_folder(run).path


@dataclass(frozen=True)
class RunFolder:
    """A run's folder (``runs/<run>/``) and the names of everything in it: what the driver writes
    (config, environment, log tails, the curves of platform.train) and what the workers write
    (their records, stack dumps, armed faults, checkpoints, the export). The workers build it
    from the folder's path (a node's own copy for a root on object storage:
    trainables/run_folder/place.py)."""

    path: Path

    CONFIG = "config.json"  # the planned run (platform/record/manifest.py)
    ENV = "env.json"  # its resolved config, environment and the driver's git facts
    FAIL_TAIL = "fail_tail.txt"
    ERROR = "error.txt"  # a failed run's error as Ray and Tune gave it (the console has one line)
    # The log tails of the attempt that ended before attempt <attempt> (from 1) began.
    RESTART_TAIL = "restart_tail-attempt{attempt}.txt"
    STACKS = (
        "stacks-rank{rank}.txt"  # a stalled rank's thread stacks (trainables/observe/watchdog.py)
    )
    # A rank of the run's first attempt armed its inject_* faults (one file per rank: ranks of
    # one attempt start at different times); later attempts (a restart, a resumed training)
    # train without them (trainables/faults.py).
    FAULTS_ARMED = "faults_armed-rank{rank}.json"
    CURVES = "curves.png"  # platform.train's plot
    PROFILE = "profile-rank{rank}.json"  # profile_steps: a torch profiler trace (Chrome's format)
    # workers/: one record per rank (pid, node, log files: trainables/run_folder/worker_logs.py)
    # and, for a root on object storage, its log tails; workers/previous/: the records of the
    # attempt before this one (a restarted worker group moves them there).
    WORKERS = "workers"
    WORKERS_PREVIOUS = "previous"
    WORKER = "rank{rank}.json"
    WORKER_LOG = "rank{rank}.{stream}.log"  # stream: stdout or stderr
    # export/: the model platform.train exported (trainables/model/export.py): where it came from,
    # the projection heads, and a save_pretrained folder per encoder.
    EXPORT = "export"
    EXPORT_RECORD = "export.json"
    EXPORT_HEADS = "heads.pt"
    EXPORT_SPEECH = "speech"
    EXPORT_TEXT = "text"
    CHECKPOINT = "checkpoint_step{step:07d}"  # a checkpoint's folder (CheckpointFolder)
    # What starts so is Ray Train's to upload, never the mirror's or a run's upload: the
    # checkpoint folders and Ray Train's own checkpoint_manager_snapshot.json.
    CHECKPOINT_PREFIX = "checkpoint_"
    NAMES = (
        CONFIG, ENV, FAIL_TAIL, RESTART_TAIL, STACKS, FAULTS_ARMED, CURVES, PROFILE, WORKERS,
        WORKERS_PREVIOUS, WORKER, WORKER_LOG, EXPORT, EXPORT_RECORD, EXPORT_HEADS, EXPORT_SPEECH,
        EXPORT_TEXT, CHECKPOINT, CHECKPOINT_PREFIX,
    )  # fmt: skip

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def config(self) -> Path:
        return self.path / self.CONFIG

    @property
    def env(self) -> Path:
        return self.path / self.ENV

    @property
    def fail_tail(self) -> Path:
        return self.path / self.FAIL_TAIL

    @property
    def error(self) -> Path:
        return self.path / self.ERROR

    @property
    def curves(self) -> Path:
        return self.path / self.CURVES

    @property
    def export(self) -> Path:
        return self.path / self.EXPORT

    # Formatted with a rank or an attempt, or "*" for the glob of all of them.
    def restart_tail(self, attempt: int | str = "*") -> Path:
        return self.path / self.RESTART_TAIL.format(attempt=attempt)

    def stacks(self, rank: int | str = "*") -> Path:
        return self.path / self.STACKS.format(rank=rank)

    def faults_armed(self, rank: int | str = "*") -> Path:
        return self.path / self.FAULTS_ARMED.format(rank=rank)

    def profile(self, rank: int | str = "*") -> Path:
        return self.path / self.PROFILE.format(rank=rank)

    def workers(self, *, previous: bool = False) -> Path:
        """``workers/`` (``workers/previous/`` with ``previous``)."""
        folder = self.path / self.WORKERS
        return folder / self.WORKERS_PREVIOUS if previous else folder

    def worker(self, rank: int | str = "*", *, previous: bool = False) -> Path:
        """A rank's record in :meth:`workers`."""
        return self.workers(previous=previous) / self.WORKER.format(rank=rank)

    def worker_log(self, rank: int, stream: str) -> Path:
        """The tail of a rank's ``stdout`` or ``stderr`` uploaded at the run's end."""
        return self.workers() / self.WORKER_LOG.format(rank=rank, stream=stream)

    # --- its checkpoints ---
    @classmethod
    def checkpoint_name(cls, step: int) -> str:
        return cls.CHECKPOINT.format(step=step)

    @classmethod
    def checkpoint_step(cls, name: str) -> int | None:
        """The step of a checkpoint folder's name (None for any other name)."""
        m = re.fullmatch(re.escape(cls.CHECKPOINT.partition("{")[0]) + r"(\d+)", name)
        return int(m.group(1)) if m else None

    @classmethod
    def uploaded_by_ray_train(cls, name: str) -> bool:
        """Whether a file or folder of the run's folder named ``name`` is Ray Train's to upload
        (see CHECKPOINT_PREFIX)."""
        return name.startswith(cls.CHECKPOINT_PREFIX)

    def checkpoint(self, step: int) -> Path:
        """A checkpoint's folder (its parts: :class:`CheckpointFolder`)."""
        return self.path / self.checkpoint_name(step)

    def checkpoints(self) -> list[Path]:
        """The checkpoint folders here, oldest first (complete or not)."""
        found = [(self.checkpoint_step(p.name), p) for p in self.path.glob("*") if p.is_dir()]
        return [p for _, p in sorted((step, p) for step, p in found if step is not None)]


@dataclass(frozen=True)
class CheckpointFolder:
    """One checkpoint's folder (``runs/<run>/checkpoint_step<N>/``) and the names of its parts
    (trainables/checkpoint/files.py says what each holds)."""

    path: Path

    META = "meta.json"  # rank 0's: step, data position, the run's shape, its validation score
    STATE = "state.pt"  # rank 0's: lr schedule and loss scaler (DDP, FSDP2)
    RNG = "rng-rank{rank}.pt"
    DONE = "done-rank{rank}.json"  # written last: the files the rank wrote and their sizes
    # DCP's folder (DDP, FSDP2): dcp-<token>, a new one for every save, named in the meta;
    # plain dcp in checkpoints from before the token.
    DCP = "dcp"
    DEEPSPEED = "ds"  # DeepSpeed's folder (its checkpoint tag)
    NAMES = (META, STATE, RNG, DONE, DCP, DEEPSPEED)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def meta(self) -> Path:
        return self.path / self.META

    @property
    def state(self) -> Path:
        return self.path / self.STATE

    @property
    def deepspeed(self) -> Path:
        return self.path / self.DEEPSPEED

    def rng(self, rank: int) -> Path:
        return self.path / self.RNG.format(rank=rank)

    def done(self, rank: int) -> Path:
        return self.path / self.DONE.format(rank=rank)

    @classmethod
    def dcp_name(cls, token: str) -> str:
        """The name of a save's DCP folder."""
        return f"{cls.DCP}-{token}"
