"""An output root on object storage (issue 26), against a real S3-compatible server (moto in a
subprocess): the staging folder mirrored to the bucket (new and changed files uploaded whole,
removed ones deleted, inputs and caches left out), a worker's run folder uploaded from its
node, and each bad storage input to platform.tune and platform.train refused before anything
starts: one line, exit 2, nothing written (refused or missing credentials and no write
permission: tests/test_storage.py, the same check). The sweeps and training runs themselves run
against a bucket in tests/integration/ (test_interrupt_resume.py, test_train.py,
test_multinode.py)."""

import json
import math
import os
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from platform.storage.mirror import RootMirror, mirrored, pull_run, run_storage, stage_remote_root
from stage1_common.output_root import CheckpointFolder, OutputRoot
from stage1_common.storage import Location, StorageError
from tests.cli import run_module
from tests.s3server import CLIENT_ENV, make_bucket, moto_server
from trainables.run_folder.place import InBucket, InFolder
from trainables.run_folder.run_files import RunFiles
from trainables.ticket import RunsInBucket, RunsInFolder

BUCKET = "sweeps"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    staging = tmp_path_factory.mktemp("staging")
    with pytest.MonkeyPatch.context() as mp, moto_server() as endpoint:
        env = {**CLIENT_ENV, "AWS_ENDPOINT_URL": endpoint, "STAGE1_STAGING_DIR": str(staging)}
        for key, value in env.items():
            mp.setenv(key, value)
        make_bucket(endpoint, BUCKET)
        yield endpoint


def touch(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_staging_folder_is_mirrored_to_the_bucket(s3, tmp_path):
    uri = f"s3://{BUCKET}/{tmp_path.name}/sweep"
    root = stage_remote_root(uri, resume=False)
    assert root.remote == uri and root.shown == uri and root.path.is_dir()
    assert Location.of(uri).files() == {}  # the write probe is gone
    touch(root.manifest, "run\tstatus\nr1\trunning\n")
    touch(root.timing / "r1-00000.parquet", "rows")
    touch(root.runs / "r1" / "config.json", "{}")
    # Left out: the synthetic corpus, caches, Tune's state, checkpoints, unfinished temporaries.
    for rel in (
        "data/prepared/manifest.tsv",
        "cache/inductor/x",
        "tune/experiment_state.json",
        "runs/r1/checkpoint_step0000010/meta.json",
        "runs/r1/export/speech/model.safetensors",
        ".run_manifest.tsv.abc.tmp",
    ):
        touch(root.path / rel, "x")
        assert not mirrored(rel), rel
    with RootMirror(root, interval_s=0.2) as mirror:
        deadline = time.monotonic() + 20
        while "timing.parquet/r1-00000.parquet" not in Location.of(uri).files():
            assert time.monotonic() < deadline, "the mirror never uploaded"
            time.sleep(0.1)
        touch(root.manifest, "run\tstatus\nr1\tok\n")  # changed: uploaded again, whole
        (root.timing / "r1-00000.parquet").unlink()  # gone (--resume drops it): deleted
        touch(root.timing / "r1-00001.parquet", "rows of the next attempt")
    assert mirror.error == ""
    bucket = Location.of(uri)
    assert set(bucket.files()) == {
        "run_manifest.tsv",
        "timing.parquet/r1-00001.parquet",
        "runs/r1/config.json",
    }
    assert bucket.join("run_manifest.tsv").read_text().endswith("r1\tok\n")

    # --resume, here or on another machine: a fresh staging folder from the bucket; a file it
    # deletes there is deleted in the bucket too (it came from there).
    again = stage_remote_root(uri, resume=True)
    assert again.manifest.read_text().endswith("r1\tok\n")
    assert (
        not (again.path / "data").exists()
        and not (again.runs / "r1" / "checkpoint_step0000010").exists()
    )
    (again.timing / "r1-00001.parquet").unlink()
    RootMirror(again).sync()
    assert "timing.parquet/r1-00001.parquet" not in bucket.files()
    # Not --resume: a root that holds a sweep is refused, naming it.
    with pytest.raises(StorageError, match=f"output root {uri} already holds a sweep"):
        stage_remote_root(uri, resume=False)


def test_a_workers_run_folder_reaches_the_bucket_and_the_driver(s3, tmp_path):
    # A root of its own: the node's scratch folder under /tmp outlives pytest's tmp_path, and
    # a record left there by an earlier session is an earlier attempt's (workers/previous/).
    uri = f"s3://{BUCKET}/{tmp_path.name}-{uuid.uuid4().hex[:8]}/sweep"
    root = stage_remote_root(uri, resume=False)
    files = RunFiles("r1", run_storage(root))  # as the driver's ticket says it
    assert isinstance(files.storage, RunsInBucket) and files.storage.runs == f"{uri}/runs"
    assert files.folder != root.run_dir("r1")  # on the worker's node, not the driver's staging
    files.register(rank=1, local_rank=0)  # uploaded at once: a failed rank's log paths
    assert set(Location.of(f"{uri}/runs/r1").files()) == {"workers/rank1.json"}
    log = tmp_path / "worker.err"
    log.write_text("".join(f"line {i}\n" for i in range(2500)))
    files.record["stderr"] = str(log)  # the rank's Ray log file (its node may be gone later)
    touch(files.folder / "stacks-rank1.txt", "stacks")
    touch(files.folder / "checkpoint_step0000010" / "__1_0.distcp", "shard")  # Ray Train's
    touch(files.folder / "export" / "speech" / "config.json", "{}")
    files.publish_at_end(local_rank=0)
    bucket = Location.of(f"{uri}/runs/r1")
    assert set(bucket.files()) == {
        "workers/rank1.json",
        "workers/rank1.stderr.log",
        "stacks-rank1.txt",
        "export/speech/config.json",
    }
    tail = bucket.join("workers/rank1.stderr.log").read_text().splitlines()
    assert len(tail) == 2000 and tail[-1] == "line 2499"  # the end of a long log
    pull_run(root, "r1")  # the driver, when the run fails: why, from the worker's files
    assert (root.run_dir("r1") / "stacks-rank1.txt").read_text() == "stacks"
    assert json.loads(root.run_folder("r1").worker(1).read_text())["pid"] == os.getpid()
    assert not root.run_folder("r1").worker_log(1, "stderr").exists()  # the record says where
    assert not (root.run_dir("r1") / "export").exists()


def test_bad_object_storage_roots_are_refused_before_anything_starts(s3, tmp_path):
    base = f"s3://{BUCKET}/{tmp_path.name}"
    cases = [
        (
            ("platform.tune", "--space", "smoke", "--output-root", "s3://no-such-bucket/sweep"),
            "platform.tune: error: s3://no-such-bucket/sweep: bucket 'no-such-bucket' does not "
            "exist (create it, or fix the name)",
        ),
        (
            ("platform.tune", "--space", "smoke", "--output-root", f"{base}/new", "--resume"),
            f"platform.tune: error: --resume: {base}/new holds no sweep (run_manifest.tsv is "
            "missing); drop --resume to start one there",
        ),
        (
            (
                "platform.train",
                "--space",
                "smoke",
                "--set",
                "micro_batch=8",
                "--output-root",
                "s3://no-such-bucket/train",
            ),
            "platform.train: error: s3://no-such-bucket/train: bucket 'no-such-bucket' does not "
            "exist (create it, or fix the name)",
        ),
    ]
    for args, line in cases:
        out = run_module(*args)
        assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
        (got,) = out.stderr.strip().splitlines()
        assert got.startswith(line), got
    assert Location.of(base).files() == {}  # nothing written anywhere in the bucket
    # A root that holds a sweep already, without --resume.
    Location.of(f"{base}/done").join(OutputRoot.MANIFEST).write_text("run\tstatus\n")
    out = run_module("platform.tune", "--space", "smoke", "--output-root", f"{base}/done")
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"platform.tune: error: output root {base}/done already holds a sweep; choose another "
        "--output-root"
    )


def test_a_checkpoint_is_registered_per_node_only_once_no_writer_holds_it(tmp_path):
    """A root on object storage: Ray Train deletes a node's folder once uploaded, so a save is
    registered only when every rank's part is written and no rank's writer still holds it (a
    writer that did would write its done file again into the deleted folder at the next
    save). One rank here; the agreement across ranks is the same list, gathered."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    import torch

    from trainables.checkpoint.files import finish_part
    from trainables.checkpoint.state import CheckpointWriter, _Save
    from trainables.config import TrialConfig

    engine = SimpleNamespace(kind="ddp", effective={})
    cfg = TrialConfig(model_size="tiny", checkpoint_every=5, checkpoint_async=False)
    writer = CheckpointWriter(
        cfg, engine, rank=0, world_size=1, device=torch.device("cpu"), per_node=True
    )
    folder = tmp_path / "checkpoint_step0000005"
    (folder / "dcp-1").mkdir(parents=True)
    (folder / "dcp-1" / "__0_0.distcp").write_bytes(b"x" * 10)
    save = _Save(folder=folder, rank=0, t0=0.0, upload=Future())
    writer._unregistered.append(folder)
    writer._save = save
    save.upload.add_done_callback(save.whole)
    assert writer.registrable_everywhere() is None  # still being written
    finish_part(folder, 0, save_s=0.0)  # a done file from an earlier write of this folder...
    assert writer.registrable_everywhere() is None  # ...but the writer still holds the save
    save.upload.set_result(None)  # written: the done file is there
    assert (folder / "done-rank0.json").is_file()
    assert writer.registrable_everywhere() == folder  # and the writer let it go
    assert writer._save is None and writer._unregistered == []
    assert writer.registered_parts[0]["files"] == {"dcp-1/__0_0.distcp": 10}
    import shutil

    shutil.rmtree(folder)  # what Ray Train does once the node's folder is uploaded
    writer.wait()  # the next save's wait: nothing held, nothing written into the gone folder
    assert not folder.exists()
    assert writer.registrable_everywhere() is None  # nothing more to register


@pytest.mark.parametrize("per_node", [False, True])
def test_a_checkpoint_overtaken_before_registering_is_recorded_and_deleted(tmp_path, per_node):
    """An asynchronous save that completes in the same window as the run's last save: the newer
    one is registered with Ray Train, the older one is recorded (checkpoint_registered false,
    its own step and times) and deleted, so keep_checkpoints holds on disk and on a node's
    scratch (issue 43 item 6). An incomplete older one is neither recorded nor deleted here."""
    import torch

    from trainables.checkpoint.files import finish_part
    from trainables.checkpoint.state import CheckpointWriter
    from trainables.config import TrialConfig

    engine = SimpleNamespace(kind="ddp", effective={})
    cfg = TrialConfig(model_size="tiny", checkpoint_every=5, checkpoint_async=False)
    writer = CheckpointWriter(
        cfg, engine, rank=0, world_size=1, device=torch.device("cpu"), per_node=per_node
    )

    def saved(step: int, *, complete: bool = True) -> Path:
        folder = tmp_path / f"checkpoint_step{step:07d}"
        (folder / "dcp-1").mkdir(parents=True)
        (folder / "dcp-1" / "__0_0.distcp").write_bytes(b"x" * step)
        CheckpointFolder(folder).meta.write_text(json.dumps({"step": step, "world_size": 1}))
        if complete:
            finish_part(folder, 0, save_s=0.1 * step, block_s=0.01 * step)
        writer._unregistered.append(folder)
        return folder

    cut, older, newer = saved(10, complete=False), saved(15), saved(20)
    registrable = writer.registrable_everywhere if per_node else writer.registrable
    assert registrable() == newer
    records = writer.superseded_records(-math.inf, local_rank=0)
    assert [(r["checkpoint_step"], r["checkpoint_registered"]) for r in records] == [(15, False)]
    assert records[0]["checkpoint_save_s"] == pytest.approx(1.5)
    meta_bytes = len(json.dumps({"step": 15, "world_size": 1}))
    assert records[0]["checkpoint_size_bytes"] == 15 + meta_bytes  # rank 0's files
    assert not older.exists() and newer.exists() and cut.exists()
    assert writer.superseded_records(-math.inf, local_rank=0) == []  # each once


def test_the_staging_copy_goes_but_for_the_corpus_the_training_command_reads(tmp_path):
    """Issue 54 item 7: a sweep with a data: section on a bucket root printed a training
    command whose manifest_path was in the deleted staging folder."""
    from platform.storage.mirror import drop_staging

    staged = OutputRoot(tmp_path / "staged", remote="s3://runs/sweep")
    manifest = staged.prepared_data / "manifest_16k_trim.tsv"
    manifest.parent.mkdir(parents=True)
    manifest.write_text("id\tpath\n")
    (staged.path / "runs" / "r1").mkdir(parents=True)
    (staged.path / "summary.json").write_text("{}")
    assert drop_staging(staged) == staged.path / "data"
    assert manifest.is_file() and sorted(p.name for p in staged.path.iterdir()) == ["data"]
    bare = OutputRoot(tmp_path / "bare", remote="s3://runs/other")
    (bare.path / "runs").mkdir(parents=True)
    assert drop_staging(bare) is None and not bare.path.exists()


def test_a_runs_checkpoints_live_in_its_folder_or_its_bucket_chosen_once(s3, tmp_path):
    """The driver chooses the kind of storage once (platform/storage/mirror.py: run_storage);
    the run's files get its place (trainables/run_folder/place.py), and the loop, the resume
    and the Ray worker call methods, never asking which root they have."""
    folder = RunFiles("r1", run_storage(OutputRoot(tmp_path)))
    assert isinstance(folder.storage, RunsInFolder)
    here = folder.place
    assert isinstance(here, InFolder) and not here.per_node
    assert folder.folder == tmp_path / "runs" / "r1"
    assert here.upload(local_rank=1, final=False) == ("NO_UPLOAD", False)  # every rank reports
    assert here.clears(0) is None and here.shown("checkpoint_000010") == ""
    folder.register(rank=0, local_rank=0)
    folder.publish_at_end(local_rank=0, finished=True)  # nothing to upload, nothing dropped
    assert folder.folder.is_dir()
    uri = f"s3://{BUCKET}/{tmp_path.name}/sweep"
    bucket = RunsInBucket(runs=f"{uri}/runs", groups=f"{uri}/tune/groups", scratch="x")
    there = RunFiles("r1", bucket).place
    assert isinstance(there, InBucket) and there.per_node
    assert there.upload(local_rank=1, final=False) is None  # the node's first rank uploads
    assert there.upload(local_rank=0, final=False) == ("ASYNC", True)
    assert there.upload(local_rank=0, final=True) == ("SYNC", True)  # the run's end needs it
    assert (there.clears(0), there.clears(1)) == (True, False)
    assert there.shown("checkpoint_000010") == f"{uri}/runs/r1/checkpoint_000010"
