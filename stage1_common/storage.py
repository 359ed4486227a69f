"""Where an output root's files live: a local folder or object storage (``s3://``, ``gs://``),
through ``pyarrow.fs``, the filesystem layer Ray Train and Ray Tune use for their own storage.

A :class:`Location` is a filesystem and a path in it, resolved once from what the user gave
(``FileSystem.from_uri``, which reads the endpoint and credentials from the standard AWS and
GCS environment variables and config files: ``AWS_ENDPOINT_URL`` for an S3-compatible server
such as MinIO). Whatever goes through it is written whole or not at all:

- local: a temporary name in the same folder, then a rename (``stage1_common/fileio.py``);
- object storage: the whole payload in one upload, closed once. Object stores have no rename,
  and an upload stream closed after an error still commits what was written (pyarrow 26,
  measured against moto), so a payload is never streamed in pieces: a reader sees the previous
  object or the new one, never half of it.

:func:`check_writable` probes a root before anything starts and turns the store's errors into
one line each: an unknown bucket, credentials that are missing or refused, no write
permission, an endpoint that does not answer (:class:`StorageError`); :func:`check_readable`
does the same for a root a command only reads, and :func:`root_address` refuses an address a
root cannot have before anything is resolved.

This module says what an address is (``is_remote``); the output root's owner
(stage1_common/output_root.py) and the driver's one chooser for a staged root
(platform/storage/mirror.py) are the only others that ask it (tests/test_layering.py): everything
else holds a :class:`Location` or an object that answers.
"""

from __future__ import annotations

import os
import posixpath
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pyarrow.fs as pafs

from stage1_common.fileio import atomic_path, atomic_write_bytes

__all__ = [
    "Location",
    "StorageError",
    "check_readable",
    "check_writable",
    "explain",
    "is_remote",
    "read_text",
    "root_address",
    "unreadable",
]

REMOTE_SCHEMES = ("s3", "gs", "gcs")


class StorageError(Exception):
    """A storage location that cannot be used, in one line that names it and the fix."""


def is_remote(root: str | os.PathLike) -> bool:
    """Whether ``root`` names object storage (``s3://``, ``gs://``) rather than a folder."""
    scheme = str(root).partition("://")[0].lower() if "://" in str(root) else ""
    return scheme in REMOTE_SCHEMES


def root_address(text: str) -> Path | str:
    """An output root's address as a command names it: a path (also given as a ``file://`` URI,
    read with pyarrow.fs), or a prefix on object storage (``s3://bucket/prefix``, ``gs://...``)
    kept as its URI. :class:`StorageError` (one line naming the fix) for another scheme, and
    for credentials written into the URI."""
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
            raise StorageError(
                f"{parsed.scheme}://{parsed.hostname or ''}{parsed.path}: credentials in the "
                "URI would be written into every output; set them in the environment "
                "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE) instead"
            )
        return text
    if scheme == "file":
        fs, path = pafs.FileSystem.from_uri(text)
        if isinstance(fs, pafs.LocalFileSystem):
            return Path(path)
    raise StorageError(
        f"{text}: {scheme}:// output roots are not supported; use a folder (on a cluster, one "
        "every node mounts) or s3:// / gs://"
    )


def read_text(address: str | os.PathLike) -> str:
    """The text of the file at ``address``: a local path, or an address on object storage
    (a local file's errors are Python's own)."""
    return Location.of(address).read_text() if is_remote(address) else Path(address).read_text()


@dataclass(frozen=True)
class Location:
    """A filesystem and a path in it (``bucket/prefix/...`` for object storage, an absolute
    path for a local folder), and the URI it was named by."""

    fs: pafs.FileSystem
    path: str
    uri: str

    @classmethod
    def of(cls, root: str | os.PathLike) -> Location:
        """Resolve ``root`` (a folder or ``s3://bucket/prefix``) once."""
        text = str(root)
        if not is_remote(text):
            path = str(Path(text).expanduser().resolve())
            return cls(pafs.LocalFileSystem(), path, path)
        try:
            fs, path = pafs.FileSystem.from_uri(text)
        except Exception as exc:  # a malformed URI, an unsupported scheme, no way to the store
            why = _first_line(exc)
            if "NETWORK_CONNECTION" in why or "curlCode" in why:  # resolving the bucket's region
                why = _unreachable(text.partition("://")[2].split("/", 1)[0].split("?", 1)[0])
            raise StorageError(f"{text}: {why}") from None
        return cls(fs, path.rstrip("/"), text.rstrip("/"))

    @property
    def remote(self) -> bool:
        return not isinstance(self.fs, pafs.LocalFileSystem)

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    def join(self, *parts: str) -> Location:
        path = posixpath.join(self.path, *parts)
        uri = self.uri if not parts else _join_uri(self.uri, *parts)
        return Location(self.fs, path, uri)

    def __str__(self) -> str:
        return self.uri

    # --- reading ---
    def exists(self) -> bool:
        return self.fs.get_file_info(self.path).type != pafs.FileType.NotFound

    def is_file(self) -> bool:
        return self.fs.get_file_info(self.path).type == pafs.FileType.File

    def read_bytes(self) -> bytes:
        with self.fs.open_input_stream(self.path) as f:
            return f.read()

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def files(self) -> dict[str, int]:
        """Every file under this folder: its path relative to it, and its size in bytes."""
        selector = pafs.FileSelector(self.path, recursive=True, allow_not_found=True)
        prefix = self.path.rstrip("/") + "/"
        return {
            info.path[len(prefix) :]: info.size
            for info in self.fs.get_file_info(selector)
            if info.type == pafs.FileType.File
        }

    # --- writing (whole or not at all) ---
    def write_bytes(self, data: bytes) -> None:
        """Write ``data`` as this file, atomically (see the module's doc)."""
        if not self.remote:
            with atomic_path(Path(self.path)) as tmp:
                tmp.write_bytes(data)
            return
        with self.fs.open_output_stream(self.path) as out:
            out.write(data)

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode())

    def upload(self, folder: str | os.PathLike) -> None:
        """Copy a local folder's files under this location (file by file, each whole)."""
        local = str(Path(folder).resolve())
        pafs.copy_files(local, self.path, pafs.LocalFileSystem(), self.fs, use_threads=False)

    def download(self, folder: str | os.PathLike) -> Path:
        """Copy this location's files into a local folder; returns it."""
        target = Path(folder)
        target.mkdir(parents=True, exist_ok=True)
        pafs.copy_files(self.path, str(target.resolve()), self.fs, pafs.LocalFileSystem())
        return target

    def pull(self, folder: Path, keep: Callable[[str], bool] = lambda rel: True) -> list[str]:
        """Copy the files of this location that ``keep`` names (by their path relative to it)
        into ``folder``, each written whole (a scanner of that folder never sees half a file);
        returns their relative paths."""
        got = []
        for rel in sorted(self.files()):
            if keep(rel):
                atomic_write_bytes(folder / rel, self.join(rel).read_bytes(), durable=False)
                got.append(rel)
        return got

    def delete(self) -> None:
        """Remove this folder and everything under it (nothing if it is not there)."""
        if self.exists():
            self.fs.delete_dir(self.path)

    def delete_file(self) -> None:
        """Remove this file (nothing if it is not there)."""
        try:
            self.fs.delete_file(self.path)
        except FileNotFoundError:
            pass


def check_writable(root: Location) -> None:
    """Write, read back and delete one small object under ``root``; raise :class:`StorageError`
    with one line naming the root, what is wrong and the fix."""
    probe = root.join(f".write-probe-{uuid.uuid4().hex[:12]}")
    written = False
    try:
        if not root.remote:
            Path(root.path).mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"probe")
        written = True
        if probe.read_bytes() != b"probe":
            # A store that takes anonymous writes and hands back something else to read
            if root.remote and not _may_have_credentials():
                raise StorageError(f"{root}: {_NO_CREDENTIALS}")
            raise StorageError(f"{root}: an object written here read back differently")
        root.fs.delete_file(probe.path)  # the mirror deletes too: a refusal here is the answer
        written = False
    except StorageError:
        raise
    except Exception as exc:
        raise StorageError(f"{root}: {explain(root, exc)}") from None
    finally:
        if written:  # a check that failed after the write: the probe is not left behind
            try:
                root.fs.delete_file(probe.path)
            except Exception:
                pass


def check_readable(root: Location) -> None:
    """StorageError (one line naming ``root`` and the fix) when its bucket is not there, the
    credentials are refused or the endpoint does not answer; a prefix without files passes
    (the command then says what it lacks), and so does any local folder. Listing a missing
    bucket with ``allow_not_found`` (as ``Location.files`` does) answers "nothing" instead."""
    if not root.remote:
        return
    try:
        root.fs.get_file_info(pafs.FileSelector(root.path, recursive=False))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StorageError(f"{root}: {explain(root, exc)}") from None


_NO_CREDENTIALS = (
    "no credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
)


def _endpoint() -> str | None:
    """The S3-compatible store's address the AWS SDK uses, if one is set."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def _unreachable(bucket: str) -> str:
    endpoint = _endpoint()
    if endpoint:
        return f"cannot reach {endpoint} (check AWS_ENDPOINT_URL and the network)"
    return (
        f"cannot reach AWS S3 for bucket {bucket!r} (for another S3-compatible store set "
        "AWS_ENDPOINT_URL to its address; for AWS check the network)"
    )


def explain(root: Location, exc: BaseException) -> str:
    """The store's error as what the user can do about it."""
    text = _first_line(exc)
    bucket = root.path.split("/", 1)[0]
    if "NO_SUCH_BUCKET" in text or ("not found" in text and "Bucket" in text):
        return f"bucket {bucket!r} does not exist (create it, or fix the name)"
    if "INVALID_ACCESS_KEY_ID" in text or "SIGNATURE_DOES_NOT_MATCH" in text:
        return (
            "the credentials were refused (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
            "or the profile in AWS_PROFILE)"
        )
    if ("ACCESS_DENIED" in text or "INTERNAL_FAILURE" in text) and not _may_have_credentials():
        return _NO_CREDENTIALS
    if "ACCESS_DENIED" in text:
        return (
            f"no permission to write to bucket {bucket!r} (grant s3:PutObject, s3:GetObject "
            "and s3:DeleteObject on the prefix, or use credentials that have them)"
        )
    if "NETWORK_CONNECTION" in text or "Couldn't connect" in text or "curlCode" in text:
        return _unreachable(bucket)
    if isinstance(exc, PermissionError):
        return "no permission to write here (choose a folder you can write to)"
    return text


def unreadable(where: Location, exc: BaseException) -> str:
    """Why ``where`` could not be read, in a few words: a folder's error as the system says it
    ("No such file or directory"), a store's as :func:`explain` says it."""
    if not where.remote and isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno)
    return explain(where, exc)


_CREDENTIAL_SOURCES = (  # the AWS SDK's other sources: keys, profiles, web identity, containers
    "AWS_ACCESS_KEY_ID",
    "AWS_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


def _may_have_credentials() -> bool:
    """Whether the AWS SDK may have found credentials: False only when no source of them is
    there (an instance's metadata service counts unless AWS_EC2_METADATA_DISABLED is set)."""
    if any(os.environ.get(name) for name in _CREDENTIAL_SOURCES):
        return True
    if os.environ.get("AWS_EC2_METADATA_DISABLED", "").lower() != "true":
        return True
    files = (
        ("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"),
        ("AWS_CONFIG_FILE", "~/.aws/config"),
    )
    return any(Path(os.environ.get(var, default)).expanduser().is_file() for var, default in files)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())[:300]


def _join_uri(uri: str, *parts: str) -> str:
    """``s3://b/p?query`` joined with parts, the query (an endpoint override) kept at the end."""
    base, sep, query = uri.partition("?")
    return posixpath.join(base, *parts) + (sep + query if sep else "")
