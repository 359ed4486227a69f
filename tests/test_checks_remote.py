"""``python -m platform.stability`` and ``python -m platform.leak`` on an output root in a bucket
(a real S3-compatible server: moto in a subprocess, tests/s3server.py): the same lines as on a
local folder, read from a local copy, nothing written back; the commands the report prints for
such a root run as printed; a path that is no sweep, or a bucket that is not there, is one line
and exit 2."""

import html
import re
import shlex
import shutil

import pytest

from stage1_common.storage import Location
from tests.cli import run_module
from tests.s3server import CLIENT_ENV, make_bucket, moto_server
from tests.test_leak import LINES, leak_root
from tests.test_report import H200

BUCKET = "checks"


@pytest.fixture(scope="module")
def s3():
    with pytest.MonkeyPatch.context() as mp, moto_server() as endpoint:
        for key, value in {**CLIENT_ENV, "AWS_ENDPOINT_URL": endpoint}.items():
            mp.setenv(key, value)
        make_bucket(endpoint, BUCKET)
        yield endpoint


def bucket_copy(folder, tmp_path) -> tuple[str, Location, dict]:
    """``folder`` uploaded to the bucket: its URI, Location, and its files with their bytes."""
    uri = f"s3://{BUCKET}/{tmp_path.name}/{folder.name}"
    root = Location.of(uri)
    root.upload(folder)
    return uri, root, contents(root)


def contents(root: Location) -> dict[str, bytes]:
    return {rel: root.join(rel).read_bytes() for rel in root.files()}


def page_command(page: str, module: str) -> list[str]:
    """The command the report prints after "The same lines:" for ``module``."""
    (found,) = re.findall(rf"<code>(python -m {module} [^<]*)</code>", page)
    return shlex.split(html.unescape(found))


def test_stability_reads_a_bucket_as_a_folder_and_writes_nothing_there(s3, tmp_path):
    uri, root, before = bucket_copy(H200, tmp_path)
    out = run_module("platform.stability", "--output-root", uri, "--min-repeats", "2")
    assert out.returncode == 1, out.stderr  # mb96's iter p50 CV 0.053 > 0.05
    assert out.stdout == (H200 / "stability.log").read_text()  # as on the folder itself
    assert contents(root) == before  # read only: nothing uploaded, nothing changed

    # The report of that root prints a command for it that runs as printed.
    page_file = tmp_path / "page.html"
    assert run_module("platform.report", uri, "--out", page_file).returncode == 0
    command = page_command(page_file.read_text(), "platform.stability")
    assert command[3:5] == ["--output-root", uri]
    again = run_module(*command[2:])
    assert again.returncode == 1 and again.stdout == out.stdout, again.stderr
    assert contents(root) == before

    # A prefix without a sweep names the bucket's address, not the local copy.
    empty = run_module("platform.stability", "--output-root", f"{uri}-none")
    assert empty.returncode == 2
    (line,) = empty.stderr.strip().splitlines()
    assert line.startswith(f"platform.stability: error: {uri}-none holds no sweep"), line
    assert "stage1-read-" not in line


def test_leak_reads_a_bucket_root_or_run_folder_and_writes_nothing_there(s3, tmp_path):
    folder = leak_root(tmp_path / "leak_20261125-120000")
    uri, root, before = bucket_copy(folder, tmp_path)
    out = run_module("platform.leak", uri)
    assert out.returncode == 1, out.stderr
    assert out.stdout.splitlines() == LINES  # the lines of the local folder (test_leak)
    clean = run_module("platform.leak", f"{uri}/runs/clean")
    assert clean.returncode == 0 and clean.stdout.splitlines() == [LINES[0], LINES[2]]
    assert contents(root) == before

    # The report of that root prints a command for it that runs as printed.
    page_file = tmp_path / "page.html"
    assert run_module("platform.report", uri, "--out", page_file).returncode == 0
    command = page_command(page_file.read_text(), "platform.leak")
    assert command[3] == uri
    again = run_module(*command[2:])
    assert again.returncode == 1 and again.stdout == out.stdout, again.stderr

    # A sweep in the bucket without timing rows: nothing could be judged, and it says so.
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(folder / "run_manifest.tsv", bare)
    bare_uri, _, _ = bucket_copy(bare, tmp_path)
    out = run_module("platform.leak", bare_uri)
    assert out.returncode == 1
    assert out.stdout.splitlines()[0].startswith(f"NOT JUDGED {bare_uri}: no run could be judged")


def test_bad_remote_paths_are_one_line_and_exit_2(s3, tmp_path):
    uri = f"s3://{BUCKET}/{tmp_path.name}/nothing"
    out = run_module("platform.leak", uri)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"platform.leak: error: {uri} is neither a sweep's output root nor a run folder "
        "<root>/runs/<run>; give one of those"
    ]
    for module, args in (
        ("platform.leak", ["s3://no-such-bucket/sweep"]),
        ("platform.stability", ["--output-root", "s3://no-such-bucket/sweep"]),
    ):
        out = run_module(module, *args)
        assert out.returncode == 2
        (line,) = out.stderr.strip().splitlines()
        assert line == (
            f"{module}: error: s3://no-such-bucket/sweep: bucket 'no-such-bucket' does not "
            "exist (create it, or fix the name)"
        )
