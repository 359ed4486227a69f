"""Multi-node pieces that need no cluster: placement keys and their checks against a cluster's
nodes, the job's runtime_env (code shipping, Ray Job merging), the node check's file probes,
where each rank ran, and the tokenizer that travels through the output root."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from platform.errors import UsageError
from platform.execution.cluster import WORKER_PACKAGES
from platform.execution.inputs import prepare_tokenizers
from platform.execution.resources import resolve_resources
from platform.spaces.expand import RunSpec, expand_runs
from platform.spaces.load import load_space
from stage1_common.output_root import OutputRoot
from trainables.config import ConfigError, TrialConfig


@pytest.mark.parametrize(
    "values, fragment",
    [
        ({"train_workers": 3, "nodes": 2}, "cannot be split evenly over 2 nodes"),
        (
            {"train_workers": 4, "nodes": 2, "placement_strategy": "STRICT_SPREAD"},
            "nodes must be 4",
        ),
        ({"train_workers": 4, "nodes": 2, "placement_strategy": "STRICT_PACK"}, "STRICT_PACK"),
        ({"placement_strategy": "SPREAD_OUT"}, "one of 'PACK', 'SPREAD'"),
        ({"nodes": -1}, ">= 0"),
    ],
)
def test_placement_keys_are_validated(values, fragment):
    with pytest.raises(ConfigError) as info:
        TrialConfig.from_dict(values)
    assert str(info.value).startswith(("nodes:", "placement_strategy:")) and fragment in str(
        info.value
    )


def test_workers_per_node():
    assert TrialConfig(train_workers=4, nodes=2).workers_per_node == 2
    assert TrialConfig(train_workers=4).workers_per_node == 4
    assert TrialConfig(train_workers=3, placement_strategy="STRICT_SPREAD").workers_per_node == 1


def _run(**values) -> RunSpec:
    return RunSpec(
        name="r", group="g", repeat=1, swept={}, config=TrialConfig(use_gpu=False, **values)
    )


def test_a_placement_the_nodes_cannot_hold_is_refused_before_any_trial():
    nodes = [{"CPU": 0.0}, {"CPU": 2.0}, {"CPU": 2.0}]
    totals = {"CPU": 4.0}
    spread = _run(train_workers=3, cpus_per_worker=1, placement_strategy="STRICT_SPREAD")
    with pytest.raises(UsageError) as info:
        resolve_resources([spread], totals, nodes)
    assert "places 3 train workers on 3 nodes of 1 each" in str(info.value)
    assert "the cluster has 2 such node(s) of 3" in str(info.value)
    # Two per node on two nodes fits; on nodes of one free CPU it does not.
    pair = _run(train_workers=4, cpus_per_worker=1, nodes=2)
    assert resolve_resources([pair], {"CPU": 4.0}, [{"CPU": 2.0}, {"CPU": 2.0}])
    with pytest.raises(UsageError, match="needs 2 nodes with 2 CPUs"):
        resolve_resources([pair], {"CPU": 4.0}, [{"CPU": 1.0}] * 4)
    # GPUs count per node too.
    gpus = TrialConfig(use_gpu=True, train_workers=4, nodes=2, cpus_per_worker=1)
    gpu_run = RunSpec(name="r", group="g", repeat=1, swept={}, config=gpus)
    two_by_two = [{"CPU": 8.0, "GPU": 2.0}, {"CPU": 8.0, "GPU": 2.0}]
    assert resolve_resources([gpu_run], {"CPU": 16.0, "GPU": 4.0}, two_by_two)
    with pytest.raises(UsageError, match="2 GPUs free"):
        resolve_resources([gpu_run], {"CPU": 16.0, "GPU": 4.0}, [{"CPU": 8.0, "GPU": 1.0}] * 4)
    # PACK without nodes: only the totals matter.
    assert resolve_resources([_run(train_workers=2, cpus_per_worker=1)], totals, nodes)


def test_the_multinode_spaces_expand():
    smoke = expand_runs(load_space("multinode_smoke"))
    assert [r.config.strategy for r in smoke] == ["ddp", "deepspeed"]
    assert {(r.config.train_workers, r.config.nodes, r.config.micro_batch) for r in smoke} == {
        (4, 2, 128)
    }
    cpu = expand_runs(load_space("cpu_multinode"))
    assert cpu[0].config.placement_strategy == "STRICT_SPREAD" and cpu[0].config.nodes == 2


def test_runtime_env_ships_the_workload_when_joining_and_defers_to_a_ray_job(monkeypatch):
    import data_prep
    import stage1_common
    import trainables
    from stage1_common.cluster import joining, runtime_env

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert not joining(None) and joining("10.0.0.5:6379")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert joining(None)

    local = runtime_env({"A": "1"}, ship_code=False)
    hook = local.pop("worker_process_setup_hook")  # every worker knows its own cluster
    assert local == {"env_vars": {"A": "1"}}
    # It runs before a worker has the driver's sys.path: shipped by value, it loads where this
    # project cannot be imported (a GPU host where the project is not installed).
    from ray import cloudpickle

    blocked = "import sys, pickle; sys.modules['stage1_common'] = None; "
    load = blocked + "f = pickle.loads(sys.stdin.buffer.read()); print(callable(f))"
    loaded = subprocess.run(
        [sys.executable, "-c", load], input=cloudpickle.dumps(hook), capture_output=True
    )
    assert loaded.stdout.strip() == b"True", loaded.stderr.decode()[-2000:]
    with pytest.raises(ValueError, match="needs the packages to ship"):
        runtime_env({"A": "1"}, ship_code=True)
    shipped = runtime_env({"A": "1"}, ship_code=True, modules=WORKER_PACKAGES)
    assert shipped["py_modules"] == [trainables, data_prep, stage1_common]
    assert "__pycache__" in shipped["excludes"]
    # A driver submitted with `ray job submit --working-dir .`: the job ships the code, and
    # Ray refuses keys set twice, so ours gives way.
    job = {"runtime_env": {"working_dir": "gcs://_ray_pkg_x.zip", "env_vars": {"A": "job"}}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    in_job = runtime_env({"A": "1", "B": "2"}, ship_code=True, modules=WORKER_PACKAGES)
    assert in_job.pop("worker_process_setup_hook") is not None
    assert in_job == {"env_vars": {"B": "2"}}
    job["runtime_env"]["worker_process_setup_hook"] = "their.hook"
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    assert "worker_process_setup_hook" not in runtime_env({}, ship_code=False)


def test_node_check_probes(tmp_path, prepared_corpus):
    from stage1_common.cluster import read_token as _read_token
    from trainables.node_check import _read_manifest, audio_sample, versions

    probe = str(tmp_path / "probe")
    Path(probe).write_text("abc")
    assert _read_token(probe, "abc") == ""
    assert "another sweep's token" in _read_token(probe, "xyz")
    assert "cannot read" in _read_token(str(tmp_path / "missing"), "abc")

    manifest, _ = prepared_corpus
    sample = audio_sample(manifest, "", sample=4)
    assert len(sample) == 4 and all(Path(p).is_file() for p in sample)
    assert _read_manifest(manifest, sample) == ""
    assert "cannot read manifest" in _read_manifest(tmp_path / "none.tsv", [])
    gone = tmp_path / "gone.flac"
    assert f"cannot read audio file {gone}" in _read_manifest(manifest, [*sample, str(gone)])
    assert set(versions()) == {"python", "ray", "torch"}


def test_placement_fields_say_where_each_rank_ran():
    from trainables.distributed import placement_fields

    same_host = [("n1", "10.0.0.5", 11), ("n2", "10.0.0.6", 12), ("n2", "10.0.0.6", 13)]
    assert placement_fields(same_host) == {
        "rank_nodes": "0=10.0.0.5 1=10.0.0.6 2=10.0.0.6",
        "nodes_used": 2,
    }


def test_the_tokenizer_travels_through_the_output_root(tmp_path, prepared_corpus):
    from trainables.data.text import load_or_build_tokenizer

    manifest, _ = prepared_corpus
    runs = [
        _run(dataset="manifest", manifest_path=str(manifest)),
        _run(dataset="manifest", manifest_path=str(manifest), micro_batch=4),
        _run(dataset="synthetic"),
    ]
    out = prepare_tokenizers(runs, OutputRoot(tmp_path))
    paths = [r.config.tokenizer_path for r in out]
    assert paths[0] == paths[1] and paths[2] == ""
    saved = Path(paths[0])
    assert saved.parent == tmp_path / "tokenizers" and saved.is_file()
    # Every rank loads that file, whatever sits beside the manifest on its node.
    tok = load_or_build_tokenizer(Path("/nonexistent/m.tsv"), [], 1000, str(saved))
    assert tok.to_str() == saved.read_text()
    # A run that names a tokenizer keeps it.
    own = _run(dataset="manifest", manifest_path=str(manifest), tokenizer_path=str(saved))
    assert prepare_tokenizers([own], OutputRoot(tmp_path / "other"))[
        0
    ].config.tokenizer_path == str(saved)


def test_output_root_accepts_paths_file_uris_and_buckets_and_names_the_fix_for_others():
    import argparse

    from platform.storage.open_root import output_root_arg

    assert output_root_arg("outputs/x") == Path("outputs/x")
    assert output_root_arg("file:///shared/sweeps/a") == Path("/shared/sweeps/a")
    assert output_root_arg("s3://bucket/sweeps") == "s3://bucket/sweeps"  # staged, mirrored
    assert output_root_arg("gs://bucket/sweeps") == "gs://bucket/sweeps"
    with pytest.raises(argparse.ArgumentTypeError, match="use a folder .* or s3:// / gs://"):
        output_root_arg("hdfs://namenode/sweeps")
    # Credentials belong in the environment: the root's address is written into every output.
    for uri in ("s3://AKIA:s3cr3t@bucket/sweeps", "s3://bucket/sweeps?secret_key=s3cr3t"):
        with pytest.raises(argparse.ArgumentTypeError) as info:
            output_root_arg(uri)
        assert "s3cr3t" not in str(info.value) and "set them in the environment" in str(info.value)


def test_what_a_node_check_answer_says():
    from platform.execution.nodes import node_problem

    node = {"NodeManagerAddress": "10.0.0.6", "NodeID": "abcdef0123456789"}
    mine = {"python": "3.11.7", "ray": "2.60.0", "torch": "2.13.0"}
    good = {"versions": dict(mine), "output_root": "", "manifests": {"/d/m.tsv": ""}}
    assert node_problem(node, good, mine) is None
    old_torch = dict(good, versions=dict(mine, torch="2.11.0"))
    line = node_problem(node, old_torch, mine)
    assert line.startswith("node 10.0.0.6 (node abcdef012345) runs torch 2.11.0 (driver 2.13.0)")
    unseen = dict(good, output_root="cannot read /o/.node-probe-1 (No such file or directory)")
    assert "cannot see the output root /o" in node_problem(
        node, unseen, mine, OutputRoot(Path("/o"))
    )
    # A root on object storage: the node reaches the bucket with its own credentials, or not.
    staged = OutputRoot(Path("/tmp/stage1-roots/a-1"), remote="s3://sweeps/a")
    denied = dict(good, output_root="cannot read s3://sweeps/a/.node-probe-1 (no credentials)")
    line = node_problem(node, denied, mine, staged)
    assert line.startswith("node 10.0.0.6 (node abcdef012345) cannot reach the output root s3://")
    assert "credentials for the bucket" in line and "AWS_ENDPOINT_URL" in line
    unread = dict(good, manifests={"/d/m.tsv": "cannot read manifest /d/m.tsv (Permission denied)"})
    assert "cannot read the data of /d/m.tsv" in node_problem(node, unread, mine)
    no_code = ModuleNotFoundError("No module named 'trainables'")
    assert "cannot run the workload's code: No module named 'trainables'" in node_problem(
        node, no_code, mine
    )
    assert "did not run the node check" in node_problem(node, TimeoutError("180 s"), mine)
    for fact in (old_torch, unseen, unread, no_code):
        assert "\n" not in node_problem(node, fact, mine, OutputRoot(Path("/o")))


def test_no_address_means_a_new_local_cluster_not_one_ray_start_left_running(monkeypatch):
    from stage1_common.cluster import init_address

    # A bare ray.init() would join the cluster /tmp/ray/ray_current_cluster names (measured:
    # a sweep without --address ran on a `ray start --head --num-cpus=1` cluster and was
    # refused for its CPUs), and hangs for minutes when that cluster is gone.
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert init_address(None) == "local"
    assert init_address("10.0.0.5:6379") == "10.0.0.5:6379"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")  # a Ray Job's driver: Ray's own address
    assert init_address(None) is None


@pytest.mark.parametrize(
    "files",
    [
        {},
        {"cpu/cpu.cfs_quota_us": "150000", "cpu/cpu.cfs_period_us": "100000"},
        {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"},
        {"cpu.max": "300000 100000"},
        {"cpu.max": "max 100000"},
        {"cpu.max": "50000 100000", "cpuset/cpuset.cpus": "0-3"},
        {"cpuset/cpuset.cpus": "0-3,8,10-11\n"},
        {"cpu.max": "400000 100000", "cpuset/cpuset.cpus": "2"},
    ],
)
def test_the_cpus_of_a_local_cluster_are_counted_as_ray_counts_them(tmp_path, files):
    """What the dry run holds the runs to without starting Ray (stage1_common.cluster.local_cpus)
    is Ray's own count: the container limits read from the same files."""
    from ray._private.utils import _get_docker_cpus, get_num_cpus

    from stage1_common.cluster import cgroup_cpus, local_cpus

    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    ray_reads = _get_docker_cpus(
        cpu_quota_file_name=str(tmp_path / "cpu/cpu.cfs_quota_us"),
        cpu_period_file_name=str(tmp_path / "cpu/cpu.cfs_period_us"),
        cpuset_file_name=str(tmp_path / "cpuset/cpuset.cpus"),
        cpu_max_file_name=str(tmp_path / "cpu.max"),
    )
    assert cgroup_cpus(tmp_path) == ray_reads
    assert local_cpus() == get_num_cpus(override_docker_cpu_warning=True)


def test_the_counts_ray_is_told_are_the_local_clusters(monkeypatch):
    """RAY_OVERRIDE_RESOURCES gives a node Ray starts here its CPUs and GPUs: the dry run's too
    (a plan for another machine's counts)."""
    from stage1_common.cluster import local_cpus, local_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("RAY_OVERRIDE_RESOURCES", '{"CPU": 7, "GPU": 3}')
    assert (local_cpus(), local_gpus()) == (7, 3)
    monkeypatch.setenv("RAY_OVERRIDE_RESOURCES", '{"memory": 1e9}')
    assert local_gpus() == 0
