"""The driver's side of an output root on object storage: staged on its disk and mirrored to the
bucket during a sweep, copied for a command, and the one place past stage1_common that chooses
between a bucket and a folder (tests/test_layering.py).

``--output-root s3://bucket/prefix``: the driver writes the root's files in a local staging
folder as it writes any root (atomically, stage1_common/fileio.py), and :class:`RootMirror`
keeps the bucket's copy current while the sweep runs: every ``interval_s`` it uploads each
file that is new or changed (each whole: stage1_common/storage.py) and deletes from the bucket
the files it had uploaded that are gone from the folder (``--resume`` drops the rows of runs it
redoes); once more at the end, after a Ctrl-C or an error too. A driver killed with SIGKILL
leaves the bucket at most one interval behind its disk; ``--resume`` starts from the bucket
(any machine can finish the sweep) and reruns what the bucket does not show finished.

Not mirrored: ``data/`` (a space's synthetic corpus: an input, made again by ``--resume``; kept
on the driver's disk when the staging copy goes, for the training command: ``drop_staging``),
``cache/`` and ``tune/`` (Ray Tune's own state; the recorder's files are the record), and the
checkpoints and exported models of ``runs/<run>/``, which the workers upload. The workers
upload their run folders themselves (trainables/run_folder/place.py: ``InBucket``), and Ray
Train writes the checkpoints into the bucket (its ``storage_path``).

What differs between a staged root and a root in a folder is chosen here, each a no-op or the
plain answer for a folder, so that nothing else asks which it has: the root a command starts
(``staged_or_folder``: platform/storage/open_root.py's ``start_root``) or opens
(``opened_root``: a folder as it is, a bucket's result files copied for the block), where the
runs write as their tickets say it (``run_storage``: the kind of storage the workers receive,
trainables/ticket.py), the staging note of the ``output root:`` line (``staged_note``), a file
every node must read at once (``publish``), a failed run's worker records (``pull_run``), a
node that cannot reach the root (``unreachable_line``), the exported model's line
(``exported_model_line``), and the staging copy dropped when the bucket holds all of it
(``RootMirror.whole``, ``drop_staging``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from fnmatch import fnmatch
from pathlib import Path

from platform.errors import UsageError
from stage1_common.fileio import TMP_SUFFIX
from stage1_common.output_root import OutputRoot, RunFolder
from stage1_common.storage import (
    Location,
    StorageError,
    check_readable,
    check_writable,
    explain,
    is_remote,
)
from trainables.ticket import RunsInBucket, RunsInFolder, RunStorage

__all__ = [
    "RootMirror",
    "drop_staging",
    "exported_model_line",
    "opened_root",
    "publish",
    "pull_run",
    "read_copy",
    "run_storage",
    "stage_remote_root",
    "staged_note",
    "staged_or_folder",
    "unreachable_line",
    "wanted",
    "working_copy",
]

BASELINE = ".mirror-baseline.json"  # the files staged from the bucket (not mirrored: a dot)
SYNC_INTERVAL_S = float(os.environ.get("STAGE1_SYNC_INTERVAL_S", "2"))
_NOT_MIRRORED = {OutputRoot.DATA, OutputRoot.CACHE, OutputRoot.TUNE}


def staging_folder(uri: str) -> Path:
    """The driver's local folder for the root at ``uri`` (``STAGE1_STAGING_DIR``, else the
    system's temporary folder): one per address."""
    base = Path(os.environ.get("STAGE1_STAGING_DIR") or tempfile.gettempdir())
    digest = hashlib.sha1(uri.encode()).hexdigest()[:10]
    name = uri.split("?")[0].rstrip("/").rsplit("/", 1)[-1] or "root"
    return base / "stage1-roots" / f"{name}-{digest}"


# --- the choice: a bucket or a folder ---
def staged_or_folder(
    output_root: Path | str | None,
    folder: Callable[[], OutputRoot | None],
    *,
    resume: bool,
    create: bool,
) -> OutputRoot | None:
    """The root a sweep or a training run writes to: an address on object storage staged in a
    local folder (``stage_remote_root``; its problems as one UsageError line), or for anything
    else (a folder, or none: the default folder) what ``folder()`` makes. ``create`` off (the
    dry run): a bucket is None, left to the real run (probing a bucket writes to it)."""
    if output_root is None or not is_remote(output_root):
        return folder()
    if not create:
        return None
    try:
        return stage_remote_root(str(output_root), resume=resume)
    except StorageError as exc:
        raise UsageError(str(exc)) from None


@contextmanager
def opened_root(output_root: str | os.PathLike, *, writes: bool = False) -> Iterator[OutputRoot]:
    """The root ``output_root`` names, for the block: a folder as it is; on object storage a
    local copy of its result files (``wanted``), removed at the end, and with ``writes`` what
    the block wrote or changed there uploaded at its clean end (the bucket probed writable
    before any work). A UsageError raised in the block names the root, never the copy."""
    if not is_remote(output_root):
        yield OutputRoot(Path(output_root))
        return
    location = Location.of(output_root)
    if writes:
        check_writable(location)  # before any work: a bucket the files cannot go to is one line
    with working_copy(location) if writes else read_copy(location) as local:
        try:
            yield OutputRoot(local, remote=location.uri)
        except UsageError as exc:  # it names the local copy: name the root instead
            raise UsageError(str(exc).replace(str(local), location.uri)) from None


def run_storage(root: OutputRoot) -> RunStorage:
    """Where the runs of ``root`` write, as their tickets tell the workers
    (trainables/ticket.py): the root's folder, which every node mounts, or its bucket, each
    node writing a run's folder in a scratch folder named after the staging folder."""
    runs = root.where(OutputRoot.RUNS)
    groups = root.where(OutputRoot.TUNE, OutputRoot.GROUP_RUNS)
    if root.remote is None:
        return RunsInFolder(runs=runs, groups=groups)
    return RunsInBucket(runs=runs, groups=groups, scratch=root.path.name)


# --- a sweep's staged root ---
def stage_remote_root(uri: str, *, resume: bool) -> OutputRoot:
    """The staged root for ``uri``: checked writable first (one line and nothing written when
    not: :class:`StorageError`), refused when it holds a sweep already (unless ``resume``);
    with ``resume`` the bucket's files are copied into a fresh staging folder."""
    location = Location.of(uri)
    check_writable(location)
    try:
        holds_sweep = location.join(OutputRoot.MANIFEST).exists()
    except OSError as exc:
        raise StorageError(f"{uri}: {explain(location, exc)}") from None
    if holds_sweep and not resume:
        raise StorageError(f"output root {uri} already holds a sweep; choose another --output-root")
    local = staging_folder(location.uri)
    shutil.rmtree(local, ignore_errors=True)
    local.mkdir(parents=True)
    got = location.pull(local, mirrored) if resume else []
    stats = {rel: _stat(local / rel) for rel in got}
    (local / BASELINE).write_text(json.dumps(stats))
    return OutputRoot(local, remote=location.uri)


def drop_staging(root: OutputRoot) -> Path | None:
    """A root whole in the bucket: the driver's staging copy goes (``--resume`` and
    platform.analyze start from the bucket), all but the space's prepared corpus (``data/``,
    not mirrored: an input), which every run's ``manifest_path`` and so the printed training
    command read on this machine. Returns that corpus folder when kept, else None."""
    data = root.path / OutputRoot.DATA
    if not data.is_dir():
        shutil.rmtree(root.path, ignore_errors=True)
        return None
    for entry in root.path.iterdir():
        if entry.name == OutputRoot.DATA:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    return data


def _stat(path: Path) -> tuple[int, int]:
    st = path.stat()
    return (st.st_mtime_ns, st.st_size)


def mirrored(relative: str) -> bool:
    """Whether the file at ``relative`` (inside the root) belongs in the bucket's copy."""
    parts = relative.split("/")
    if parts[0] in _NOT_MIRRORED or parts[-1].endswith(TMP_SUFFIX):
        return False
    if parts[0] == OutputRoot.RUNS and RunFolder.EXPORT in parts[2:3]:
        return False  # an exported model: the workers' upload, never staged (hundreds of MB)
    return not any(RunFolder.uploaded_by_ray_train(p) or p.startswith(".") for p in parts)


def staged_note(root: OutputRoot) -> str:
    """What the ``output root:`` line adds for a staged root: where its staging folder is."""
    return f" (staged in {root.path}, mirrored there)" if root.remote else ""


def publish(root: OutputRoot, path: Path) -> str:
    """Where every node reads ``path`` (a file the driver wrote in the root) from: the path
    itself, or for a staged root its copy in the bucket, uploaded now (the runs read it before
    the mirror's next pass)."""
    if root.remote is None:
        return str(path)
    address = root.remote_join(*path.relative_to(root.path).parts)
    Location.of(address).write_bytes(path.read_bytes())
    return address


def unreachable_line(root: OutputRoot, why: str) -> str:
    """The node check's words for a node that cannot reach ``root`` (after ``node <node> ``):
    the bucket without its credentials or endpoint, or a folder not on shared storage."""
    if root.remote:
        return (
            f"cannot reach the output root {root.shown}: {why}; give every node credentials "
            "for the bucket (AWS_* variables, a profile or an instance role) and its endpoint "
            "(AWS_ENDPOINT_URL)"
        )
    return (
        f"cannot see the output root {root}: {why}; use a path on storage every node mounts "
        "(NFS, a shared volume) as --output-root"
    )


def exported_model_line(root: OutputRoot, run: str) -> str:
    """Where a run's exported model is, and how to load it ('' when it exported none): in the
    root's folder, or for a staged root in the bucket (the workers uploaded it, it is never
    staged: copy it to the nodes to load it from local paths)."""
    if root.remote is None:
        export = root.run_folder(run).export
        if not (export / RunFolder.EXPORT_RECORD).is_file():
            return ""
        source = json.loads((export / RunFolder.EXPORT_RECORD).read_text())["source"]
        speech, text = export / RunFolder.EXPORT_SPEECH, export / RunFolder.EXPORT_TEXT
        return (
            f"model, {source}: {export}; load it with --set speech_pretrained_path="
            f"{speech} --set text_pretrained_path={text}"
        )
    export = Location.of(root.remote_join(OutputRoot.RUNS, run, RunFolder.EXPORT))
    try:
        source = json.loads(export.join(RunFolder.EXPORT_RECORD).read_text())["source"]
    except (OSError, ValueError):
        return ""
    return (
        f"model, {source}: {export}; copy it to every node (aws s3 sync) and load it with "
        f"--set speech_pretrained_path=<copy>/{RunFolder.EXPORT_SPEECH} "
        f"--set text_pretrained_path=<copy>/{RunFolder.EXPORT_TEXT}"
    )


def pull_run(root: OutputRoot, run: str) -> None:
    """What the workers uploaded of a run's folder that says why it failed (their records, the
    stack dumps), into the staging folder, where the driver reads it. Nothing for a local
    root."""
    if root.remote is None:
        return
    remote = Location.of(root.remote_join(OutputRoot.RUNS, run))

    def keep(rel: str) -> bool:
        records = rel.startswith(f"{RunFolder.WORKERS}/") and rel.endswith(".json")
        return records or fnmatch(rel, RunFolder.STACKS.format(rank="*"))

    try:
        remote.pull(root.run_dir(run), keep)
    except OSError:
        pass  # the reason is then read from the error text alone


class RootMirror:
    """``with RootMirror(root): ...``: the bucket's copy of a staged root kept current (see the
    module's doc); a no-op for a local root."""

    def __init__(self, root: OutputRoot, interval_s: float = SYNC_INTERVAL_S) -> None:
        self.root, self.interval_s = root, interval_s
        self.remote = Location.of(root.remote) if root.remote else None
        self._sent: dict[str, tuple[int, int]] = {}  # relative path -> (mtime_ns, size)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error = ""
        baseline = root.path / BASELINE
        if self.remote is not None and baseline.is_file():  # what came from the bucket
            self._sent = {k: tuple(v) for k, v in json.loads(baseline.read_text()).items()}

    def __enter__(self) -> RootMirror:
        if self.remote is not None:
            self._thread = threading.Thread(target=self._loop, name="root-mirror", daemon=True)
            self._thread.start()
        return self

    @property
    def whole(self) -> bool:
        """Whether the bucket holds all of the root (a staged root, its last pass done without
        an error): its staging copy may go (``drop_staging``). False for a local root."""
        return self.remote is not None and not self.error

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        try:
            self.sync()
        except Exception as exc:  # never in place of the sweep's own outcome: said instead
            self.error = (
                f"{self.remote}: {explain(self.remote, exc)}; everything is in "
                f"{self.root.path}: upload it with aws s3 sync {self.root.path} {self.remote}"
            )

    def sync(self) -> int:
        """Upload what is new or changed, delete what went; returns the files uploaded."""
        if self.remote is None:
            return 0
        with self._lock:
            now = self._scan()
            changed = [rel for rel, stat in now.items() if self._sent.get(rel) != stat]
            for rel in changed:
                try:
                    data = (self.root.path / rel).read_bytes()
                except FileNotFoundError:
                    continue  # replaced while scanning: the next pass takes the new one
                self.remote.join(rel).write_bytes(data)
                self._sent[rel] = now[rel]
            for rel in [r for r in self._sent if r not in now]:
                target = self.remote.join(rel)
                if target.exists():
                    target.fs.delete_file(target.path)
                del self._sent[rel]
            return len(changed)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sync()
            except Exception as exc:  # the store is down for a while: the next pass retries
                self.error = f"{self.remote}: {explain(self.remote, exc)}"

    def _scan(self) -> dict[str, tuple[int, int]]:
        out = {}
        base = self.root.path
        for path in base.rglob("*"):
            rel = path.relative_to(base).as_posix()
            if mirrored(rel):
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                if path.is_file():
                    out[rel] = (st.st_mtime_ns, st.st_size)
        return out


# --- a command's copy of a root on object storage ---
_SKIPPED_TOP = {
    OutputRoot.CACHE,
    OutputRoot.TOKENIZERS,
    OutputRoot.TENSORBOARD,
    OutputRoot.TUNE,
    OutputRoot.MLFLOW_ARTIFACTS,
}


def wanted(relative: str) -> bool:
    """Whether the analysis reads the file at ``relative`` (a path inside the root): not the
    checkpoints, compile cache, tokenizers, TensorBoard, Tune or MLflow folders."""
    parts = relative.split("/")
    if parts[0] in _SKIPPED_TOP:
        return False
    return not any(RunFolder.uploaded_by_ray_train(p) or p == RunFolder.EXPORT for p in parts[1:])


@contextmanager
def read_copy(location: Location) -> Iterator[Path]:
    """A local folder holding ``location``'s result files; removed at the end, never uploaded."""
    check_readable(location)
    with tempfile.TemporaryDirectory(prefix="stage1-read-") as tmp:
        local = Path(tmp) / (location.name or "root")
        local.mkdir()
        _pull(location, local)
        yield local


@contextmanager
def working_copy(location: Location) -> Iterator[Path]:
    """A local folder holding ``location``'s result files; on a clean exit, what the block wrote
    or changed there is uploaded."""
    with tempfile.TemporaryDirectory(prefix="stage1-root-") as tmp:
        local = Path(tmp) / (location.name or "root")
        local.mkdir()
        copied = {rel: (local / rel).stat().st_mtime_ns for rel in _pull(location, local)}
        yield local
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            rel = path.relative_to(local).as_posix()
            if copied.get(rel) != path.stat().st_mtime_ns:
                location.join(rel).write_bytes(path.read_bytes())


def _pull(location: Location, local: Path) -> list[str]:
    """The result files copied into ``local``; their paths relative to it."""
    try:
        return location.pull(local, wanted)
    except OSError as exc:
        raise StorageError(f"{location}: {explain(location, exc)}") from None
