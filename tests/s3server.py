"""A real S3-compatible server for the tests: moto's server mode in a subprocess on a free
loopback port (as Ray's own storage tests use moto), and the environment a client needs to use
it (fake keys, no EC2 metadata lookups, ``AWS_ENDPOINT_URL``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from tests.test_model import free_port

CLIENT_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",  # boto3's name for it (the IAM set-up of the tests)
    "AWS_EC2_METADATA_DISABLED": "true",
}


@contextmanager
def moto_server(**server_env: str) -> Iterator[str]:
    """Start ``python -m moto.server`` and yield its endpoint URL; stopped at the end.
    ``server_env``: moto's own settings (``INITIAL_NO_AUTH_ACTION_COUNT`` to enforce IAM)."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, **server_env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto server did not start on {endpoint}") from None
                time.sleep(0.2)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def make_bucket(endpoint: str, bucket: str) -> None:
    """Create ``bucket`` (pyarrow's own client, as the platform uses)."""
    import pyarrow.fs as pafs

    fs = pafs.S3FileSystem(
        access_key=CLIENT_ENV["AWS_ACCESS_KEY_ID"],
        secret_key=CLIENT_ENV["AWS_SECRET_ACCESS_KEY"],
        region=CLIENT_ENV["AWS_REGION"],
        endpoint_override=endpoint,
        allow_bucket_creation=True,
    )
    fs.create_dir(bucket)


@contextmanager
def bucket_env(monkeypatch, staging, bucket: str) -> Iterator[str]:
    """A moto server with ``bucket`` made, and the variables a CLI reaches it with (set with
    ``monkeypatch``; the driver stages its roots under ``staging``); yields the endpoint."""
    with moto_server() as endpoint:
        env = {**CLIENT_ENV, "AWS_ENDPOINT_URL": endpoint, "STAGE1_STAGING_DIR": str(staging)}
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        make_bucket(endpoint, bucket)
        yield endpoint
