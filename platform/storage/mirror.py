"""An output root on object storage, staged on the driver's disk and mirrored to the bucket.

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
checkpoints and exported models of ``runs/<run>/``, which the workers upload. The
workers upload their run folders themselves (trainables/run_folder/run_files.py), and Ray Train writes the
checkpoints into the bucket (its ``storage_path``).

What a sweep does differently with a staged root is here, each a no-op or the plain answer for
a root in a folder, so that the launch never asks which it has: the staging note of the
``output root:`` line (``staged_note``), a file every node must read at once (``publish``), a
failed run's worker records (``pull_run``), a node that cannot reach the root
(``unreachable_line``), the exported model's line (``exported_model_line``), and the staging
copy dropped when the bucket holds all of it (``RootMirror.whole``, ``drop_staging``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
from fnmatch import fnmatch
from pathlib import Path

from stage1_common.fileio import TMP_SUFFIX
from stage1_common.output_root import OutputRoot, RunFolder
from stage1_common.storage import Location, StorageError, check_writable, explain

__all__ = [
    "RootMirror",
    "drop_staging",
    "exported_model_line",
    "publish",
    "pull_run",
    "stage_remote_root",
    "staged_note",
    "unreachable_line",
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
