"""The output root a command names, turned into the OutputRoot every function past the command
line takes: the one prologue of platform.tune, train, analyze, report, stability and leak.

``--output-root`` (``OUTPUT_ROOT``, ``PATH``) is a folder or a prefix on object storage
(``s3://bucket/prefix``, ``gs://...``). A folder is the root itself. A prefix is worked on in a
local folder, and the OutputRoot names both (``path`` the folder, ``remote`` the address), so
that nothing past here asks which it is:

- ``start_root`` (platform.tune and platform.train, through platform/execution/inputs.py): a new
  root, or with ``resume`` the one to finish. A folder is made and proved writable; a bucket is
  probed writable, refused when it holds a sweep (unless resumed: then its files are pulled),
  and staged in a local folder that platform/storage/mirror.py keeps mirrored while the runs go
  and drops when the bucket holds all of it. The dry run asks the same, creating nothing.
- ``open_root`` (platform.analyze and platform.report write beside the sweep; platform.stability,
  platform.leak and ``platform.report --out`` only read): the bucket's result files (``wanted``)
  copied to a temporary folder for the block; when it writes, the bucket is probed writable
  first and what the block wrote or changed there is uploaded at its clean end, each file whole
  (stage1_common/storage.py). Nothing is uploaded when the block fails, and a UsageError raised
  in it names the root, never the copy. ``root_of`` finds the root of a run folder's PATH.

Every problem is one line (UsageError or StorageError), which the command prints before it
exits 2.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import posixpath
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import pyarrow.fs as pafs

from platform.errors import UsageError
from platform.storage.mirror import stage_remote_root
from stage1_common.fileio import ensure_writable_dir, unwritable_parent
from stage1_common.output_root import OutputRoot, RunFolder
from stage1_common.storage import Location, StorageError, check_writable, explain, is_remote

__all__ = [
    "check_readable",
    "open_root",
    "output_root_arg",
    "output_root_problem",
    "planned_output_root",
    "read_copy",
    "root_of",
    "start_root",
    "wanted",
    "working_copy",
]


# --- the command line's argument ---
def output_root_arg(text: str) -> Path | str:
    """``--output-root`` of platform.tune and platform.train: a path, a ``file://`` URI (read
    with pyarrow.fs), or an object-storage prefix (``s3://bucket/prefix``, ``gs://...``: kept as
    the URI, staged by ``start_root``). A folder on a cluster must be storage every node
    mounts."""
    if not text.strip():  # Path("") is the current folder: never what a user meant
        raise argparse.ArgumentTypeError(
            "is empty; give a folder (e.g. outputs/NAME) or s3://bucket/prefix, or leave "
            "--output-root out for outputs/<space>_<timestamp>"
        )
    scheme = urlparse(text).scheme
    if not scheme or len(scheme) == 1:  # a plain path (or a Windows drive letter)
        return Path(text)
    if is_remote(text):
        parsed = urlparse(text)
        secret = {"access_key", "secret_key", "session_token"} & set(
            k.lower() for k, _, _ in (q.partition("=") for q in parsed.query.split("&") if q)
        )
        if "@" in parsed.netloc or secret:
            # Every output names its root: a key in it would be written into all of them.
            raise argparse.ArgumentTypeError(
                f"{parsed.scheme}://{parsed.hostname or ''}{parsed.path}: credentials in the "
                "URI would be written into every output; set them in the environment "
                "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE) instead"
            )
        return text
    if scheme == "file":
        fs, path = pafs.FileSystem.from_uri(text)
        if isinstance(fs, pafs.LocalFileSystem):
            return Path(path)
    raise argparse.ArgumentTypeError(
        f"{text}: {scheme}:// output roots are not supported; use a folder (on a cluster, one "
        "every node mounts) or s3:// / gs://"
    )


# --- a root a sweep or a training run writes to ---
def start_root(
    output_root: Path | str | None,
    *,
    name: str,
    what: str = "sweep",
    resume: bool = False,
    create: bool = True,
) -> OutputRoot | None:
    """The root a sweep or a training run (``what``) writes to, before Ray starts:
    ``output_root`` (--output-root; None: outputs/<name>_<timestamp>), new and refused where it
    cannot be written or already holds a sweep; with ``resume`` the one to finish, which the
    command must name. ``create`` off (the dry run): the same refusals, nothing made or written;
    a root on object storage is then None (probing a bucket writes to it: the real run does)."""
    if resume and output_root is None:
        raise UsageError(f"--resume needs the --output-root of the {what} to finish")
    if output_root is not None and is_remote(output_root):
        return _staged(str(output_root), resume=resume) if create else None
    if resume:
        return OutputRoot(Path(output_root).expanduser().resolve())
    root = planned_output_root(output_root, name)
    problem = output_root_problem(root)
    if problem:
        raise UsageError(problem)
    if create:
        try:
            ensure_writable_dir(root.path)
        except OSError as exc:
            raise UsageError(
                f"output root {root} cannot be written ({exc.strerror or exc}); "
                "choose a writable --output-root"
            ) from None
    return root


def planned_output_root(output_root: Path | None, space_name: str) -> OutputRoot:
    """The local output root a run writes to: ``--output-root``, or
    ``outputs/<space>_<timestamp>``."""
    if output_root is None:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        output_root = Path("outputs") / f"{space_name}_{stamp}"
    return OutputRoot(Path(output_root).expanduser().resolve())


def output_root_problem(root: OutputRoot) -> str | None:
    """Why a new run cannot write to ``root``, found without creating anything (the dry run
    asks this too): a file in its place, a sweep already there, or a nearest existing folder
    above it that is a file or cannot be written."""
    path = root.path
    if path.exists() and not path.is_dir():
        return f"output root {path} is a file; choose a folder for --output-root"
    if root.manifest.exists() or root.timing.exists():
        return f"output root {root} already holds a sweep; choose another --output-root"
    why = unwritable_parent(path)
    if why is None:
        return None
    return f"output root {root} cannot be written ({why}); choose a writable --output-root"


def _staged(uri: str, *, resume: bool) -> OutputRoot:
    """A root on object storage, staged locally (platform/storage/mirror.py); its problems as
    UsageError (one line)."""
    try:
        return stage_remote_root(uri, resume=resume)
    except StorageError as exc:
        raise UsageError(str(exc)) from None


# --- a root a command reads, or writes its analysis beside ---
@contextmanager
def open_root(output_root: str | os.PathLike, *, writes: bool = False) -> Iterator[OutputRoot]:
    """The root ``output_root`` names, for the block: a folder as it is; on object storage a
    local copy of its result files, removed at the end, and with ``writes`` what the block
    wrote or changed there uploaded at its clean end (the bucket probed writable before any
    work). StorageError (one line) when the bucket cannot be read or written."""
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


def root_of(path: str | os.PathLike) -> tuple[str, list[str] | None]:
    """A PATH that is a sweep's output root, or a run folder ``<root>/runs/<run>`` of one (a
    folder or on object storage), as (the root, [run]; None: all its runs); UsageError for
    anything else, StorageError when its bucket cannot be read."""
    location = Location.of(path)
    parent, run = posixpath.split(location.path)
    top, runs_dir = posixpath.split(parent)
    base, sep, query = location.uri.partition("?")
    top_uri = posixpath.dirname(posixpath.dirname(base)) + sep + query
    check_readable(location)  # a bucket that is not there is its own line
    try:
        if location.join(OutputRoot.MANIFEST).is_file():
            return location.uri, None
        above = Location(location.fs, top, top_uri)
        if runs_dir == OutputRoot.RUNS and above.join(OutputRoot.MANIFEST).is_file():
            return above.uri, [run]
    except OSError as exc:
        raise StorageError(f"{location}: {explain(location, exc)}") from None
    raise UsageError(
        f"{location} is neither a sweep's output root nor a run folder <root>/runs/<run>; "
        "give one of those"
    )


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


def check_readable(location: Location) -> None:
    """StorageError (one line naming ``location`` and the fix) when its bucket is not there, the
    credentials are refused or the endpoint does not answer; a prefix without files passes
    (the command then says what it lacks), and so does any local folder. Listing a missing
    bucket with ``allow_not_found`` (as ``Location.files`` does) answers "nothing" instead."""
    if not location.remote:
        return
    try:
        location.fs.get_file_info(pafs.FileSelector(location.path, recursive=False))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StorageError(f"{location}: {explain(location, exc)}") from None


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
