"""The output root a command names, turned into the OutputRoot every function past the command
line takes: the one prologue of platform.tune, train, analyze, report, stability and leak.

``--output-root`` (``OUTPUT_ROOT``, ``PATH``) is a folder or a prefix on object storage
(``s3://bucket/prefix``, ``gs://...``: stage1_common/storage.py says which addresses a root may
have). A folder is the root itself. A prefix is worked on in a local folder, and the OutputRoot
names both (``path`` the folder, ``remote`` the address), so that nothing past here asks which
it is; which of the two an address is, and what a bucket needs, platform/storage/mirror.py
decides, the one place that asks:

- ``start_root`` (platform.tune and platform.train, through platform/execution/inputs.py): a new
  root, or with ``resume`` the one to finish. A folder is made and proved writable here; a
  bucket is probed writable, refused when it holds a sweep (unless resumed: then its files are
  pulled), and staged in a local folder that the mirror keeps mirrored while the runs go and
  drops when the bucket holds all of it. The dry run asks the same, creating nothing.
- ``open_root`` (platform.analyze and platform.report write beside the sweep; platform.stability,
  platform.leak and ``platform.report --out`` only read): the bucket's result files copied to a
  temporary folder for the block; when it writes, the bucket is probed writable first and what
  the block wrote or changed there is uploaded at its clean end, each file whole
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
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path

from platform.errors import UsageError
from platform.storage.mirror import opened_root, staged_or_folder
from stage1_common.fileio import ensure_writable_dir, unwritable_parent
from stage1_common.output_root import OutputRoot
from stage1_common.storage import Location, StorageError, check_readable, explain, root_address

__all__ = [
    "open_root",
    "output_root_arg",
    "output_root_problem",
    "planned_output_root",
    "root_of",
    "start_root",
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
    try:
        return root_address(text)
    except StorageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
    in_folder = partial(_folder_root, output_root, name=name, resume=resume, create=create)
    return staged_or_folder(output_root, in_folder, resume=resume, create=create)


def _folder_root(
    output_root: Path | None, *, name: str, resume: bool, create: bool
) -> OutputRoot | None:
    """``start_root``'s root in a folder: the one to finish, or a new one checked (and made
    writable unless ``create`` is off)."""
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


# --- a root a command reads, or writes its analysis beside ---
def open_root(
    output_root: str | os.PathLike, *, writes: bool = False
) -> AbstractContextManager[OutputRoot]:
    """``with open_root(...) as root``: the root ``output_root`` names, for the block: a folder
    as it is; on object storage a local copy of its result files, removed at the end, and with
    ``writes`` what the block wrote or changed there uploaded at its clean end (the bucket
    probed writable before any work: platform/storage/mirror.py, ``opened_root``). StorageError
    (one line) when the bucket cannot be read or written."""
    return opened_root(output_root, writes=writes)


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
