"""stage1_common/storage.py against a local folder and a real S3-compatible server (moto in a
subprocess, tests/s3server.py): the same round trip on both, a write killed mid-upload leaves
no object, and each bad storage input is one line that names the fix."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from stage1_common.storage import Location, StorageError, check_writable, is_remote
from tests.s3server import CLIENT_ENV, make_bucket, moto_server

BUCKET = "results"


@pytest.fixture(scope="module")
def s3():
    with pytest.MonkeyPatch.context() as mp, moto_server() as endpoint:
        for key, value in {**CLIENT_ENV, "AWS_ENDPOINT_URL": endpoint}.items():
            mp.setenv(key, value)
        make_bucket(endpoint, BUCKET)
        yield endpoint


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "out")
    request.getfixturevalue("s3")
    return f"s3://{BUCKET}/{tmp_path.name}/out"


def test_a_root_round_trips_files_and_folders(root, tmp_path):
    loc = Location.of(root)
    assert loc.remote == is_remote(root)
    check_writable(loc)
    loc.join("runs", "r1", "config.json").write_text(json.dumps({"lr": 0.1}))
    loc.join("summary.md").write_text("# old")
    loc.join("summary.md").write_text("# new")  # replaced whole
    assert loc.join("summary.md").read_text() == "# new"
    assert json.loads(loc.join("runs/r1/config.json").read_text()) == {"lr": 0.1}
    assert loc.join("runs/r1/config.json").is_file() and not loc.join("nothing").exists()
    local = tmp_path / "ckpt"
    (local / "dcp").mkdir(parents=True)
    (local / "dcp" / "__0_0.distcp").write_bytes(b"x" * 1000)
    (local / "meta.json").write_text("{}")
    loc.join("runs/r1/checkpoint_step0000002").upload(local)
    assert loc.join("runs/r1/checkpoint_step0000002").files() == {
        "dcp/__0_0.distcp": 1000,
        "meta.json": 2,
    }
    back = loc.join("runs/r1/checkpoint_step0000002").download(tmp_path / "back")
    assert (back / "dcp" / "__0_0.distcp").read_bytes() == b"x" * 1000
    files = loc.files()
    assert {"summary.md", "runs/r1/config.json", "runs/r1/checkpoint_step0000002/meta.json"} <= set(
        files
    ), files
    assert not any(".write-probe-" in f for f in files)  # the probe cleaned up after itself
    loc.join("runs").delete()
    assert set(loc.files()) == {"summary.md"}


WRITER = """
import sys
from stage1_common.storage import Location
print("writing", flush=True)
Location.of(sys.argv[1]).write_bytes(b"y" * (256 << 20))
print("written", flush=True)
"""


def test_a_write_killed_mid_upload_leaves_the_previous_object(s3, tmp_path):
    target = Location.of(f"s3://{BUCKET}/{tmp_path.name}/big.bin")
    target.write_bytes(b"previous")
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, target.uri],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.getcwd(),
    )
    assert proc.stdout.readline().strip() == "writing"
    time.sleep(1.0)  # the upload of 256 MB is under way
    assert proc.poll() is None, "the upload finished before the kill: make the payload larger"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert target.read_bytes() == b"previous"


def test_bad_storage_input_is_one_line_that_names_the_fix(s3):
    with pytest.raises(StorageError) as e:
        check_writable(Location.of("s3://no-such-bucket/prefix"))
    assert "bucket 'no-such-bucket' does not exist" in str(e.value)
    assert str(e.value).startswith("s3://no-such-bucket/prefix: ") and "\n" not in str(e.value)

    unreachable = f"s3://{BUCKET}/x?endpoint_override=http://127.0.0.1:9&scheme=http"
    with pytest.raises(StorageError, match="cannot reach") as e:
        check_writable(Location.of(unreachable))
    assert "\n" not in str(e.value)


def test_no_credentials_on_a_store_that_takes_anonymous_writes_leaves_no_probe(s3, monkeypatch):
    """moto takes an unsigned write and reads back something else: the line says what is
    missing, and the probe object is deleted, whatever the check found (issue 43 item 10)."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    for key in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
        monkeypatch.setenv(key, "/nonexistent/aws")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(StorageError) as e:
        check_writable(Location.of(f"s3://{BUCKET}/anonymous"))
    assert (
        str(e.value)
        == f"s3://{BUCKET}/anonymous: no credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
    )
    # The same from the CLI, before Ray starts: one line, exit 2.
    from tests.cli import run_module

    root = f"s3://{BUCKET}/anonymous-sweep"
    out = run_module(
        "platform.tune", "--space", "smoke", "--output-root", root, env=dict(os.environ)
    )
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert (
        out.stderr.strip()
        == f"platform.tune: error: {root}: no credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
    )
    monkeypatch.undo()
    for prefix in ("anonymous", "anonymous-sweep"):  # the probes are gone
        assert Location.of(f"s3://{BUCKET}/{prefix}").files() == {}


def test_a_store_out_of_reach_while_resolving_the_bucket_names_aws_endpoint_url(monkeypatch):
    """No endpoint set: pyarrow asks AWS for the bucket's region first; without a network the
    line names AWS_ENDPOINT_URL instead of the SDK's resolver text (its text as recorded on
    this machine, raised where pyarrow raises it)."""
    from types import SimpleNamespace

    import stage1_common.storage

    recorded = (
        "When resolving region for bucket 'nobucket': AWS Error NETWORK_CONNECTION during "
        "HeadBucket operation: curlCode: 6, Could not resolve hostname"
    )

    def offline(uri):
        raise OSError(recorded)

    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    fake = SimpleNamespace(FileSystem=SimpleNamespace(from_uri=offline), LocalFileSystem=None)
    monkeypatch.setattr(stage1_common.storage, "pafs", fake)
    with pytest.raises(StorageError) as e:
        Location.of("s3://nobucket/x")
    assert str(e.value) == (
        "s3://nobucket/x: cannot reach AWS S3 for bucket 'nobucket' (for another S3-compatible "
        "store set AWS_ENDPOINT_URL to its address; for AWS check the network)"
    )


def iam_user(iam, name: str, actions: list[str]) -> tuple[str, str]:
    iam.create_user(UserName=name)
    policy = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}],
    }
    iam.put_user_policy(UserName=name, PolicyName="p", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]


def test_refused_credentials_and_no_write_permission_each_get_their_line(monkeypatch):
    """A server that enforces IAM (moto's INITIAL_NO_AUTH_ACTION_COUNT: the first 7 requests,
    the set-up below, go unchecked)."""
    import boto3

    with moto_server(INITIAL_NO_AUTH_ACTION_COUNT="7") as endpoint:
        for key, value in {**CLIENT_ENV, "AWS_ENDPOINT_URL": endpoint}.items():
            monkeypatch.setenv(key, value)
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="locked")  # 1
        iam = boto3.client("iam", endpoint_url=endpoint)
        writer = iam_user(iam, "writer", ["s3:*"])  # 2-4
        reader = iam_user(iam, "reader", ["s3:GetObject", "s3:ListBucket"])  # 5-7

        monkeypatch.setenv("AWS_ACCESS_KEY_ID", writer[0])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", writer[1])
        check_writable(Location.of("s3://locked/ok"))  # the writer may

        monkeypatch.setenv("AWS_ACCESS_KEY_ID", reader[0])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", reader[1])
        with pytest.raises(StorageError, match="no permission to write to bucket 'locked'"):
            check_writable(Location.of("s3://locked/ro"))
        # The same check refuses a sweep's or a training run's root before anything starts.
        from tests.cli import run_module

        for cli in ("platform.tune", "platform.train"):
            args = ("--space", "smoke", "--set", "micro_batch=8", "--output-root", "s3://locked/ro")
            out = run_module(cli, *args)
            assert out.returncode == 2, out.stderr[-2000:]
            assert out.stderr.strip() == (
                f"{cli}: error: s3://locked/ro: no permission to write to bucket 'locked' (grant "
                "s3:PutObject, s3:GetObject and s3:DeleteObject on the prefix, or use "
                "credentials that have them)"
            )
        assert Location.of("s3://locked/ro").files() == {}  # nothing written

        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANOTAREALKEY00000")
        with pytest.raises(StorageError, match="the credentials were refused"):
            check_writable(Location.of("s3://locked/bad"))

        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
            monkeypatch.delenv(key, raising=False)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
        monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
        with pytest.raises(StorageError, match="no credentials found"):
            check_writable(Location.of("s3://locked/none"))


def test_the_report_of_a_sweep_in_a_bucket_is_uploaded_beside_it(s3, tmp_path):
    from platform.storage.mirror import wanted
    from tests.cli import run_module
    from tests.test_report import H200, check_filled

    uri = f"s3://{BUCKET}/{tmp_path.name}/analysis_2xh200"
    root = Location.of(uri)
    root.upload(H200)
    out = run_module("platform.report", uri)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"report: {uri}/report.html (")
    page = root.join("report.html").read_text()
    found = check_filled(page)
    assert "sweep_z0_mb160_nw8_pf4" in found.text["ranking"]
    assert f"<code>{uri}</code>" in page  # the bucket's name, not the local copy's
    assert set(root.files()) == {
        str(p.relative_to(H200)) for p in H200.rglob("*") if p.is_file()
    } | {"report.html"}
    # Read-only use: the page goes to --out, nothing is uploaded.
    local = tmp_path / "page.html"
    before = root.files()
    out = run_module("platform.report", uri, "--out", local)
    assert out.returncode == 0 and local.is_file() and root.files() == before, out.stderr
    # What the copy leaves in the bucket: checkpoints, caches, TensorBoard logs.
    assert wanted("runs/r1/config.json") and wanted("timing.parquet/r1-00000.parquet")
    assert not wanted("runs/r1/checkpoint_step0000200/dcp-1a2b/__0_0.distcp")
    assert not wanted("cache/inductor/fxgraph/x") and not wanted("tensorboard/r1/events")
    assert not wanted("runs/r1/export/model.safetensors")


def test_a_report_from_a_bucket_that_is_not_there_is_one_line_and_exit_2(s3):
    from tests.cli import run_module

    out = run_module("platform.report", "s3://no-such-bucket/sweep")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "platform.report: error: s3://no-such-bucket/sweep: bucket 'no-such-bucket' does not "
        "exist (create it, or fix the name)"
    ]


def test_a_sweep_in_a_bucket_is_analyzed_there_and_its_winner_trains_from_it(s3, tmp_path):
    from tests.cli import run_module
    from tests.test_stats import make_root

    uri = f"s3://{BUCKET}/{tmp_path.name}/smoke_20261121-120000"
    root = Location.of(uri)
    root.upload(make_root(tmp_path))
    swept = set(root.files())
    out = run_module("platform.analyze", uri)
    assert out.returncode == 0, out.stderr
    assert "Best: **fast**" in out.stdout
    assert out.stdout.rstrip().endswith(f"report: {uri}/report.html")
    assert f"train with it: python -m platform.train --config {uri}/best_config.json" in out.stdout
    written = set(root.files()) - swept
    assert written == {
        "per_run_metrics.csv",
        "group_summary.csv",
        "ranked_groups.csv",
        "best_config.json",
        "summary.json",
        "summary.md",
        "report.html",
    }, written
    best = json.loads(root.join("best_config.json").read_text())
    # The training command names the bucket's file, not the local copy the analysis ran on.
    assert best["command"] == f"python -m platform.train --config {uri}/best_config.json"
    assert json.loads(root.join("summary.json").read_text())["output_root"] == uri
    # ... and platform.train reads it from there.
    dry = run_module("platform.train", "--config", f"{uri}/best_config.json", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("train_z0_mb16_") and "micro_batch=16" in dry.stdout.split()
    missing = run_module("platform.train", "--config", f"{uri}/no_such.json", "--dry-run")
    assert missing.returncode == 2
    (line,) = missing.stderr.strip().splitlines()
    assert line.startswith(f"platform.train: error: --config {uri}/no_such.json: not a best_")


def test_an_analysis_of_a_bucket_without_a_sweep_is_one_line_naming_the_bucket(s3, tmp_path):
    from tests.cli import run_module

    uri = f"s3://{BUCKET}/{tmp_path.name}/empty"
    out = run_module("platform.analyze", uri)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"platform.analyze: error: {uri}") and "holds no sweep" in line
    assert Location.of(uri).files() == {}  # nothing written
