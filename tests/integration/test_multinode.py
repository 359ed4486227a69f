"""A real multi-node cluster on one machine (tests/integration/cluster.py): a head raylet with no
CPU and two worker raylets of two CPUs each, started as separate ``ray start`` processes, each
worker node in a mount namespace that hides this checkout and the head's log folder. The CLIs
join it with ``--address`` (or run on it as a Ray Job) as a user's would.

Each sweep carries checks that need a sweep anyway, so that the suite pays for few: the
``--address`` sweep drills the failure paths (``cpu_faults``: a rank 1 that hangs, one that
raises on a worker node, a missing audio file) with the workload options
(local checkpoints loaded in the workers, every rank's windows); the Ray Job
runs every strategy (``cpu_strategies``: DDP, FSDP2 and ZeRO 0-3 across the two nodes), which
must train the same model. The two sweeps run at once (a rank of each fits every worker node).
"""

import json
import math
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
from safetensors.torch import load_file, save_file

from stage1_common.storage import Location
from stage1_common.tail import tail_start
from tests.checkpoints import save_tiny_checkpoints
from tests.cli import ROOT, run_module
from tests.integration.cluster import LocalCluster, can_unshare
from tests.integration.helpers import smoke_manifest
from tests.s3server import bucket_env
from trainables.checkpoint.files import is_complete

pytestmark = pytest.mark.integration

WORKER_IPS = {"127.0.0.2", "127.0.0.3"}
DROPPED = "feature_projection.projection.weight"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = can_unshare()
    if why:
        pytest.skip(f"worker raylets need a mount namespace of their own: {why}")
    folder = tmp_path_factory.mktemp("cluster")
    # Seen by the driver only: the worker nodes get an empty folder in its place. A root in
    # the bucket is staged there, so the worker nodes can reach it only through the bucket.
    private = tmp_path_factory.mktemp("driver-only")
    # Every node gets the bucket's endpoint and credentials from its environment, as nodes of
    # a cloud cluster get theirs (the raylets inherit these variables).
    with pytest.MonkeyPatch.context() as mp, bucket_env(mp, private, "multinode"):
        # Two CPUs per worker node: three workers would fit the cluster, not three nodes.
        with LocalCluster(folder, workers=2, hide=(private,), worker_cpus=2) as c:
            c.private = private
            yield c


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Tiny local speech and text checkpoints; one weight left out of the speech one (the run
    manifest must say the worker loaded this folder and initialised that weight itself)."""
    tmp = tmp_path_factory.mktemp("ckpt")
    speech, text = save_tiny_checkpoints(tmp, ["one two three four five six seven"])
    weights = load_file(speech / "model.safetensors")
    save_file({k: v for k, v in weights.items() if k != DROPPED}, speech / "model.safetensors")
    return speech, text


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The smoke corpus, prepared in this process on storage every node sees, with one of its
    32 audio files gone (and allowed: 1 of 32 rows)."""
    path = smoke_manifest(tmp_path_factory.mktemp("corpus"))
    (path.parent / pd.read_csv(path, sep="\t")["path"].iloc[3]).unlink()
    return path


def submit_strategies_job(cluster, root: Path) -> subprocess.CompletedProcess:
    """``ray job submit`` of the ``cpu_strategies`` sweep into ``root``, until the job ends.

    The driver runs on the head, in the job's copy of the working directory; the corpus is
    generated and prepared with Ray Data on the worker nodes (the head has no CPU). Each run
    puts its 2 ranks on the 2 worker nodes: DDP, FSDP2 and DeepSpeed ZeRO 0-3 across nodes."""
    return subprocess.run(
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
            "cpu_strategies",
            "--output-root",
            str(root),
            "--set",
            "max_steps=5",
            "--set",
            "placement_strategy=STRICT_SPREAD",
            "--set",
            "nodes=2",
        ],  # fmt: skip
        cwd=ROOT,
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def strategies_job(cluster, tmp_path_factory):
    """The Ray Job that test_every_strategy_across_two_nodes_as_a_ray_job checks, submitted in
    the background by the first test that uses this fixture: (its output root, the future of
    its ``ray job submit``). The faults sweep uses it, so that the two sweeps run at once: each
    of their runs puts one rank on each worker node, whose 2 CPUs hold one rank of each. One
    after the other they took ~113 s on 2 cores, at once ~82 s: much of either is waiting
    (the hung rank's 8 s to its stall, worker start-ups, DeepSpeed's import on each node)."""
    root = tmp_path_factory.mktemp("job") / "job-out"
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield root, pool.submit(submit_strategies_job, cluster, root)


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


@pytest.mark.usefixtures("strategies_job")  # the Ray Job of every strategy runs meanwhile
def test_a_sweep_across_two_nodes_with_faults_and_workload_options(
    tmp_path, cluster, corpus, checkpoints
):
    # The output root is a bucket (issue 26): no folder the nodes share holds any output. The
    # worker nodes upload their ranks' records and stack dumps; every check reads the bucket.
    bucket = "s3://multinode/faults"
    speech, text = checkpoints
    # Run 1's rank 1 hangs in step 12, run 2's rank 1 raises inside step 7. Each run's 2 ranks
    # are on the 2 worker nodes.
    out = tune(
        cluster,
        "cpu_faults",
        bucket,
        f"manifest_path={corpus}",
        "max_missing_files_fraction=0.05",
        "placement_strategy=STRICT_SPREAD",
        "nodes=2",
        "host_telemetry_interval_s=0.5",
        # Checkpoints from ranks on two nodes, each node's folder holding its own rank's part:
        # the ranks agree a save is whole, each node uploads its part (executor: fresh).
        "checkpoint_every=5",
        "checkpoint_async=false",
        f"speech_pretrained_path={speech}",
        f"text_pretrained_path={text}",
    )
    text_out = out.stdout[-4000:] + out.stderr[-4000:]
    assert out.returncode == 1, text_out
    assert "cluster: 3 nodes" in out.stdout and "sees the output root" in out.stdout
    root = Location.of(bucket).download(tmp_path / "bucket-copy")
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False)
    assert list(manifest["status"]) == ["stalled", "failed"], text_out
    assert list(manifest["exit_code"].astype(str)) == ["124", "1"]
    # The missing file: skipped and counted by each run that read the manifest, said once each.
    assert list(manifest["missing_files"].astype(str)) == ["1", "1"]
    assert out.stdout.count("skipped 1 manifest rows whose audio file is missing") == 2
    assert not (root / "data").exists()  # the given manifest was used, no corpus made
    ran = manifest.iloc[:2]

    # The hung rank: detected and explained, not waited out. Both ranks' stack dumps, written
    # on their nodes, are in the output root.
    hung = manifest.iloc[0]
    assert "stacks-rank1.txt" in hung["failure_reason"]
    assert float(hung["duration_sec"]) < 150  # not the 10-minute sleep, not gloo's 30 minutes
    run_dir = root / "runs" / hung["run"]
    stuck = (run_dir / "stacks-rank1.txt").read_text()
    assert stuck.startswith("no progress for ") and "after step 11" in stuck
    assert "trainables/loop.py" in stuck and "_train" in stuck  # where it sleeps
    waiting = (run_dir / "stacks-rank0.txt").read_text()
    # Rank 0 went on to step 13 and waits inside one of DDP's collectives for rank 1.
    assert "after step 12" in waiting and "torch/nn/parallel/distributed.py" in waiting

    # Its checkpoints in the bucket, complete though no node held all of them: 5 and 10, taken
    # before the hang (Ray Train keeps 2).
    saved = sorted((run_dir).glob("checkpoint_step*"))
    assert [p.name for p in saved] == ["checkpoint_step0000005", "checkpoint_step0000010"]
    assert all(is_complete(p)[0] for p in saved), [is_complete(p) for p in saved]
    assert set(manifest["executor"]) == {"fresh"}  # checkpoints: a Ray Train run of its own

    # Placement: the ranks of a run ran on the two worker nodes (the head has no CPU), and the
    # timing rows and the manifest say which.
    timing = pd.read_parquet(root / "timing.parquet")
    # What was measured before the hang is kept, every rank's window.
    assert sorted(timing.loc[timing["run"] == hung["run"], "step"]) == [5, 5, 10, 10]
    for run in ran["run"]:
        rows = timing[timing["run"] == run]
        by_rank = rows.groupby("rank")["node"].unique()
        assert set(by_rank.index) == {0, 1}
        assert {n for nodes in by_rank for n in nodes} == WORKER_IPS
        assert len(set(rows["node_id"])) == 2  # Ray's node ids, not a hostname (one here)
        row = manifest.set_index("run").loc[run]
        assert str(row["nodes_used"]) == "2"
        assert set(row["rank_nodes"].split()) == {f"{r}={by_rank[r][0]}" for r in (0, 1)}
        assert float(row["startup_s"]) > 0
    # One host sampler per node.
    host = pd.read_parquet(root / "host_telemetry.parquet")
    assert set(host["node"]) == WORKER_IPS
    # Every rank imported the code the driver shipped (the worker nodes cannot see ROOT).
    for rank_file in (root / "runs").glob("*/workers/rank*.json"):
        record = json.loads(rank_file.read_text())
        assert "runtime_resources/py_modules_files" in record["code_path"], record
        assert not record["code_path"].startswith(str(ROOT))

    # Workload options: local checkpoints loaded inside the workers, every rank's windows with
    # the skew (the run figures still from rank 0's).
    assert set(ran["model_load_dtype_effective"]) == {"fp32"}
    for note in ran["fallbacks"]:
        assert "speech: 1 weight(s) not in" in note and DROPPED in note
    # The text checkpoint brought a tokenizer, so the driver built none for the corpus.
    assert not (root / "tokenizers").exists()
    assert not list(corpus.parent.glob("*.tokenizer-*.json"))
    for run, rows in timing.groupby("run"):
        per_rank = rows.groupby("rank")["window"].apply(sorted)
        assert per_rank[0] == per_rank[1] and per_rank[0][0] == 0, run
        assert (rows["samples_per_s"] > 0).all() and (rows["rank_skew"] >= 1).all()
        assert (rows.groupby("window")["rank_skew"].nunique() == 1).all()
        rank0 = rows[rows["rank"] == 0].sort_values("window")
        tail = manifest.set_index("run").loc[run, "tail_samples_per_sec_mean"]
        # The last 3 windows after the first (a short run: fewer); run_manifest.tsv holds 6
        # significant digits (.6g): up to 5e-6 relative off.
        steady = rank0["samples_per_s"].iloc[tail_start(len(rank0), 3) :]
        assert float(tail) == pytest.approx(steady.mean(), rel=1e-5)

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
    # One line of where, then the files (issue 54 item 3): no traceback on the console.
    assert f"{failed['run']}: raised at trainables/faults.py:" in out.stdout
    assert f"runs/{failed['run']}/fail_tail.txt" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr


def test_every_strategy_across_two_nodes_as_a_ray_job(strategies_job):
    root, job = strategies_job
    out = job.result()
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "succeeded" in out.stdout + out.stderr
    # The results landed in the output root.
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t")
    assert (root / "best_config.json").is_file() and (root / "summary.md").is_file()
    assert (root / "data" / "prepared" / "manifest_16k_trim.tsv").is_file()
    assert list(manifest["status"]) == ["ok"] * 7
    assert (manifest["nodes_used"] == 2).all()
    # Every strategy got what it asked for, and the ZeRO stages train the same model.
    assert list(zip(manifest["strategy_effective"], manifest["zero_stage"], strict=True)) == [
        ("ddp", 0),
        ("deepspeed", 0),
        ("deepspeed", 1),
        ("deepspeed", 2),
        ("deepspeed", 3),
        ("fsdp2", 0),
        ("fsdp2", 0),
    ]
    assert set(manifest["precision"]) == {"auto"} and set(manifest["precision_effective"]) == {
        "fp32"
    }
    assert (manifest["last_step"] == 5).all() and (manifest["tail_samples_per_sec_mean"] > 0).all()
    timing = pd.read_parquet(root / "timing.parquet")
    loss = timing.pivot(index="window", columns="run", values="loss")
    assert loss.map(math.isfinite).all().all()
    ds = [c for c in loss.columns if "_ds_" in c]
    for run in ds[1:]:
        assert (loss[run] - loss[ds[0]]).abs().max() < 1e-4, run
    ddp = next(c for c in loss.columns if "_ddp_" in c)
    assert abs(loss.loc[0, ddp] - loss.loc[0, ds[0]]) < 1e-3
    # FSDP2's shards across the two nodes: both reshard settings train the same model as DDP.
    fsdp = sorted(c for c in loss.columns if "_fsdp2_" in c)
    assert [c.split("_")[-2] for c in fsdp] == ["reshardoff", "reshardon"]
    for run in fsdp:
        assert (loss[run] - loss[ddp]).abs().max() < 1e-3, run
    # The tokenizer the driver built travelled through the output root, one file for all runs.
    paths = {
        json.loads(p.read_text())["config"]["tokenizer_path"]
        for p in root.glob("runs/*/config.json")
    }
    assert len(paths) == 1 and Path(paths.pop()).parent == root / "tokenizers"


def test_data_prep_spreads_over_the_nodes_and_bad_cluster_input_is_refused(
    tmp_path, cluster, corpus
):
    from data_prep import synth

    # data_prep joins the cluster: its Ray Data tasks run on the worker nodes, which read the
    # corpus and write the outputs on the shared storage with the code the driver shipped; it
    # refuses an output root the nodes cannot see, and platform.tune refuses three bad inputs.
    # The five commands are independent: each joins the cluster as a driver of its own, and
    # they run at once (one at a time they took ~30 s of start-ups, each on one of 2 cores).
    raw = tmp_path / "raw"
    synth.make_corpus(raw, speakers=2, chapters=1, utts=4, seed=1)
    prepared = tmp_path / "prepared"
    copy = cluster.private / "corpus"  # a manifest only the driver can read
    subprocess.run(["cp", "-r", str(corpus.parent), str(copy)], check=True)

    def prep(out: Path):
        args = ("--input-root", raw, "--output-root", out, "--trim", "--manifest-path")
        args += (out / "m.tsv", "--address", cluster.address)
        return run_module("data_prep.librispeech", *args, timeout=300, env=cluster.env)

    def tune_smoke(*sets: str, root: Path):
        return tune(cluster, "smoke", root, *sets, "micro_batch=4", timeout=200)

    with ThreadPoolExecutor(max_workers=5) as pool:
        spread = pool.submit(prep, prepared)
        hidden = pool.submit(prep, cluster.private / "prep")
        # An output root on the driver's disk only.
        private_root = pool.submit(
            tune_smoke, f"manifest_path={corpus}", root=cluster.private / "out"
        )
        private_data = pool.submit(
            tune_smoke, f"manifest_path={copy / corpus.name}", root=tmp_path / "out2"
        )
        # More workers than nodes that can each hold one (STRICT_SPREAD).
        too_many = pool.submit(
            tune_smoke,
            f"manifest_path={corpus}",
            "train_workers=3",
            "placement_strategy=STRICT_SPREAD",
            root=tmp_path / "out3",
        )

    done = spread.result()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len(pd.read_csv(prepared / "m.tsv", sep="\t")) == 8
    refused = hidden.result()
    assert refused.returncode == 2 and "cannot see --output-root" in refused.stderr, refused.stderr

    def refusal(out: subprocess.CompletedProcess, root: Path) -> str:
        assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
        lines = [ln for ln in out.stderr.splitlines() if ln.startswith("platform.tune: error")]
        assert len(lines) == 1, out.stderr
        assert not (root / "run_manifest.tsv").exists()  # nothing half-written
        return lines[0]

    line = refusal(private_root.result(), cluster.private / "out")
    assert "cannot see the output root" in line and "storage every node mounts" in line
    assert not (cluster.private / "out").exists()
    line = refusal(private_data.result(), tmp_path / "out2")
    assert "cannot read the data of" in line and str(copy) in line
    line = refusal(too_many.result(), tmp_path / "out3")
    assert "places 3 train workers on 3 nodes" in line and "the cluster has 2 such node" in line


def test_a_driver_without_the_clusters_token_is_told_so_in_one_line(tmp_path, cluster):
    # The cluster's head runs with RAY_AUTH_MODE=token (what `ray start --head` defaults to):
    # a driver that sends no token, or another token, or has none to send was refused after
    # 20 s of gcs_client.cc lines as "cannot reach Ray ... check the address", with an empty
    # output root left behind. Now: one line naming the cause and the variables that fix it.
    from data_prep import synth

    synth.make_corpus(tmp_path / "raw", speakers=1, chapters=1, utts=1, seed=0)
    plain = {k: v for k, v in cluster.env.items() if not k.startswith("RAY_AUTH")}
    wrong = dict(plain, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 32)
    missing = dict(plain, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(tmp_path / "none"))
    commands = {
        "tune": ("platform.tune", ("--space", "smoke"), plain),
        "wrong": ("platform.tune", ("--space", "smoke"), wrong),
        "train": ("platform.train", ("--space", "train_smoke"), missing),
        "prep": ("data_prep.librispeech", ("--input-root", tmp_path / "raw"), plain),
    }

    def run(name: str):
        module, args, env = commands[name]
        args += ("--address", cluster.address, "--output-root", tmp_path / name)
        return run_module(module, *args, env=env, timeout=90)

    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        out = dict(zip(commands, pool.map(run, commands), strict=True))
    lines = {}
    for name, done in out.items():
        assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
        assert "gcs_client.cc" not in done.stdout + done.stderr
        assert not (tmp_path / name).exists()  # nothing written: the cluster never answered
        (lines[name],) = done.stderr.strip().splitlines()
    at = f"Ray at --address {cluster.address} refused this driver"
    for name, cli in (("tune", "platform.tune"), ("prep", "data_prep.librispeech")):
        assert lines[name].startswith(f"{cli}: error: {at}: the cluster uses token auth")
        assert "set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN to that cluster's token" in lines[name]
    assert f"{at}'s token (from RAY_AUTH_TOKEN): it is not that cluster's" in lines["wrong"]
    assert lines["train"].startswith("platform.train: error: RAY_AUTH_MODE=token but this driver")
    assert f"file cannot be opened or is empty: {tmp_path / 'none'}" in lines["train"]
    for line in lines.values():
        assert "cannot reach" not in line and "`ray get-auth-token` on its head" in line
