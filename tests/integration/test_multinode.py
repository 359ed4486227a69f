"""A real multi-node cluster on one machine (tests/integration/cluster.py): a head raylet with no
CPU and two worker raylets of one CPU each, started as separate ``ray start`` processes, each
worker node in a mount namespace that hides this checkout and the head's log folder. The CLIs
join it with ``--address`` (or run on it as a Ray Job) as a user's would.

One sweep carries the fault checks too (a run past run_timeout_s, a run whose rank 1 raises on
a worker node, stop_on_error), so that the suite pays for one sweep, not two.
"""

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from tests.cli import ROOT, run_module
from tests.integration.cluster import LocalCluster, can_unshare
from tests.integration.helpers import smoke_manifest

pytestmark = pytest.mark.integration

WORKER_IPS = {"127.0.0.2", "127.0.0.3"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = can_unshare()
    if why:
        pytest.skip(f"worker raylets need a mount namespace of their own: {why}")
    folder = tmp_path_factory.mktemp("cluster")
    # Seen by the driver only: the worker nodes get an empty folder in its place.
    private = tmp_path_factory.mktemp("driver-only")
    # Two CPUs per worker node: three workers would fit the cluster, not three nodes.
    with LocalCluster(folder, workers=2, hide=(private,), worker_cpus=2) as c:
        c.private = private
        yield c


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The smoke corpus, prepared in this process on storage every node sees, with one of its
    32 audio files gone (and allowed: 1 of 32 rows)."""
    path = smoke_manifest(tmp_path_factory.mktemp("corpus"))
    (path.parent / pd.read_csv(path, sep="\t")["path"].iloc[3]).unlink()
    return path


def tune(cluster, space: str, root: Path, *sets: str, timeout: int = 500):
    args = [a for item in sets for a in ("--set", item)]
    return run_module(
        "platform.tune",
        "--space",
        space,
        "--address",
        cluster.address,
        "--output-root",
        root,
        *args,
        timeout=timeout,
        env=cluster.env,
    )


def test_a_sweep_across_two_nodes_with_faults(tmp_path, cluster, corpus):
    root = tmp_path / "out"
    # Run 1 goes past run_timeout_s, run 2 raises inside step 7 on rank 1, and with
    # stop_on_error run 3 never starts. Each run's 2 ranks are on 2 nodes (STRICT_SPREAD).
    out = tune(
        cluster,
        "smoke",
        root,
        f"manifest_path={corpus}",
        "max_missing_files_fraction=0.05",
        "placement_strategy=STRICT_SPREAD",
        "nodes=2",
        "timing_ranks=all",
        "host_telemetry_interval_s=1.0",
        "micro_batch=4",
        "inject_error_at_step=[0, 7, 3]",
        "inject_error_rank=1",
        "max_steps=1000",
        # Long enough for run 2 to start (20-30 s on this cluster), report step 5 and raise.
        "run_timeout_s=45",
        "stop_on_error=true",
    )
    text = out.stdout[-4000:] + out.stderr[-4000:]
    assert out.returncode == 1, text
    assert "cluster: 3 nodes" in out.stdout and "sees the output root" in out.stdout
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False)
    assert list(manifest["status"]) == ["timeout", "failed", "pending"], text
    assert list(manifest["exit_code"].astype(str)) == ["124", "1", ""]
    # The missing file: skipped and counted by each run that read the manifest, said once each.
    assert list(manifest["missing_files"].astype(str)) == ["1", "1", ""]
    assert out.stdout.count("skipped 1 manifest rows whose audio file is missing") == 2
    assert not (root / "data").exists()  # the given manifest was used, no corpus made
    assert "run_timeout_s 45 reached at step" in manifest["failure_reason"].iloc[0]
    assert 0 < int(manifest["last_step"].iloc[0]) < 1000

    # Placement: the ranks of a run ran on the two worker nodes (the head has no CPU), and the
    # timing rows and the manifest say which.
    first = manifest.iloc[0]
    timing = pd.read_parquet(root / "timing.parquet")
    ran = timing[timing["run"] == first["run"]]
    by_rank = ran.groupby("rank")["node"].unique()
    assert set(by_rank.index) == {0, 1}
    assert {n for nodes in by_rank for n in nodes} == WORKER_IPS
    assert len(set(ran["node_id"])) == 2  # Ray's node ids, not a hostname (one here)
    assert str(first["nodes_used"]) == "2" and set(first["rank_nodes"].split()) == {
        f"{r}={by_rank[r][0]}" for r in (0, 1)
    }
    assert float(first["startup_s"]) > 0
    # One host sampler per node.
    host = pd.read_parquet(root / "host_telemetry.parquet")
    assert set(host.loc[host["run"] == first["run"], "node"]) == WORKER_IPS
    # Every rank imported the code the driver shipped (the worker nodes cannot see ROOT).
    for rank_file in (root / "runs" / first["run"] / "workers").glob("rank*.json"):
        record = json.loads(rank_file.read_text())
        assert "runtime_resources/py_modules_files" in record["code_path"], record
        assert not record["code_path"].startswith(str(ROOT))
    # The tokenizer travelled through the output root, the same file for every run.
    config = json.loads((root / "runs" / first["run"] / "config.json").read_text())["config"]
    assert config["tokenizer_path"].startswith(str(root / "tokenizers"))

    # The run whose rank 1 raised on a worker node: its reason, and its log tails, read on that
    # node (the files are not on the driver's filesystem).
    failed = manifest.iloc[1]
    assert failed["failure_reason"] == (
        "rank 1: RuntimeError: injected error at step 7 on rank 1 (inject_error_at_step)"
    )
    assert str(failed["last_step"]) == "5"
    tail = (root / "runs" / failed["run"] / "fail_tail.txt").read_text()
    assert tail.count("--- rank 0 ") == 2 and tail.count("--- rank 1 ") == 2
    rank1 = json.loads((root / "runs" / failed["run"] / "workers" / "rank1.json").read_text())
    assert rank1["node_ip"] in WORKER_IPS and not Path(rank1["stderr"]).exists()
    rank1_tail = tail.split("--- rank 1 ", 1)[1]
    assert "RuntimeError: injected error at step 7 on rank 1" in rank1_tail
    assert f"{failed['run']}: the last 40 lines of each worker's logs" in out.stdout
    assert "stopped on error (stop_on_error): 1 run(s) not started" in out.stdout


def test_a_sweep_submitted_as_a_ray_job(tmp_path, cluster):
    root = tmp_path / "job-out"
    # The driver runs on the head, in the job's copy of the working directory; the corpus is
    # generated and prepared with Ray Data on the worker nodes (the head has no CPU).
    out = subprocess.run(
        [
            "ray",
            "job",
            "submit",
            f"--address={cluster.dashboard}",
            "--working-dir",
            str(ROOT),
            "--",
            "python",
            "-m",
            "platform.tune",
            "--space",
            "cpu_multinode",
            "--output-root",
            str(root),
            "--set",
            "max_steps=10",
        ],  # fmt: skip
        cwd=ROOT,
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "succeeded" in out.stdout + out.stderr
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False)
    assert list(manifest["status"]) == ["ok"] and str(manifest["nodes_used"].iloc[0]) == "2"
    assert (root / "best_config.json").is_file() and (root / "summary.md").is_file()
    assert (root / "data" / "prepared" / "manifest_16k_trim.tsv").is_file()
    assert sorted(pd.read_parquet(root / "timing.parquet")["step"].unique()) == [5, 10]


def test_data_prep_spreads_over_the_nodes_and_bad_cluster_input_is_refused(
    tmp_path, cluster, corpus
):
    from data_prep import synth

    # data_prep joins the cluster: its Ray Data tasks run on the worker nodes, which read the
    # corpus and write the outputs on the shared storage with the code the driver shipped.
    raw = tmp_path / "raw"
    synth.make_corpus(raw, speakers=2, chapters=1, utts=4, seed=1)
    prepared = tmp_path / "prepared"
    prep = run_module(
        "data_prep.librispeech",
        *("--input-root", raw, "--output-root", prepared, "--trim"),
        *("--manifest-path", prepared / "m.tsv", "--address", cluster.address),
        timeout=300,
        env=cluster.env,
    )
    assert prep.returncode == 0, prep.stdout[-3000:] + prep.stderr[-3000:]
    assert len(pd.read_csv(prepared / "m.tsv", sep="\t")) == 8
    # ... and refuses an output root the nodes cannot see.
    hidden = run_module(
        "data_prep.librispeech",
        *("--input-root", raw, "--output-root", cluster.private / "prep", "--trim"),
        *("--manifest-path", cluster.private / "prep" / "m.tsv", "--address", cluster.address),
        timeout=300,
        env=cluster.env,
    )
    assert hidden.returncode == 2 and "cannot see --output-root" in hidden.stderr, hidden.stderr

    def refused(*sets: str, root: Path) -> str:
        out = tune(cluster, "smoke", root, *sets, "micro_batch=4", timeout=200)
        assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
        lines = [ln for ln in out.stderr.splitlines() if ln.startswith("platform.tune: error")]
        assert len(lines) == 1, out.stderr
        assert not (root / "run_manifest.tsv").exists()  # nothing half-written
        return lines[0]

    # An output root on the driver's disk only.
    line = refused(f"manifest_path={corpus}", root=cluster.private / "out")
    assert "cannot see the output root" in line and "storage every node mounts" in line
    assert not (cluster.private / "out").exists()
    # A manifest only the driver can read.
    copy = cluster.private / "corpus"
    subprocess.run(["cp", "-r", str(corpus.parent), str(copy)], check=True)
    line = refused(f"manifest_path={copy / corpus.name}", root=tmp_path / "out2")
    assert "cannot read the data of" in line and str(copy) in line
    # More workers than nodes that can each hold one (STRICT_SPREAD).
    line = refused(
        f"manifest_path={corpus}",
        "train_workers=3",
        "placement_strategy=STRICT_SPREAD",
        root=tmp_path / "out3",
    )
    assert "places 3 train workers on 3 nodes" in line and "the cluster has 2 such node" in line
