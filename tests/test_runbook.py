"""The old runbook's variables: scripts/run_stage1_ab_bench.sh and platform.tune --from-env plan
exactly the runs the runbook ran, with its names; the printed YAML loads back to the same sweep;
bad values stop with one line and exit 2. No Ray here (DRY_RUN=1 starts none)."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from platform.errors import UsageError
from platform.spaces.expand import expand_runs
from platform.spaces.load import load_space
from platform.spaces.runbook import VARIABLES, from_env

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "run_stage1_ab_bench.sh"
MANIFEST = "manifest_16k_trim.tsv"

# Section 3.1 of the runbook: the seeds' 2x4090 sweep.
MAINLINE = dict(
    MODE="sweep",
    INCLUDE="localhost:0,1",
    REPEATS="1",
    STOP_ON_ERROR="0",
    MAX_STEPS="600",
    SWEEP_ZERO_STAGES="0,1",
    SWEEP_MICRO_BATCHES="128,160,192",
    SWEEP_NUM_WORKERS_LIST="4,6,8",
    SWEEP_PREFETCH_LIST="2,4",
    SWEEP_LOG_EVERY="50",
    TAIL_TIMING_POINTS="10",
    # DATASET_MANIFEST_PATH: the ls16k fixture's manifest (bench sets it)
)
STRAGGLER = dict(
    MODE="sweep",
    INCLUDE="localhost:0,1",
    REPEATS="1",
    MAX_STEPS="600",
    SWEEP_ZERO_STAGES="0,1",
    SWEEP_MICRO_BATCHES="160",
    SWEEP_NUM_WORKERS_LIST="6",
    SWEEP_PREFETCH_LIST="4",
    TAIL_TIMING_POINTS="6",
    ENABLE_CUDA_SYNC_TIMING="1",
    TIMING_RANK_SCOPE="all",
)
LEAK = dict(
    MODE="sweep",
    INCLUDE="localhost:0,1",
    REPEATS="1",
    MAX_STEPS="10000",
    SWEEP_ZERO_STAGES="0",
    SWEEP_MICRO_BATCHES="128",
    SWEEP_NUM_WORKERS_LIST="6",
    SWEEP_PREFETCH_LIST="4",
    SWEEP_LOG_EVERY="100",
    ENABLE_HOST_TELEMETRY="1",
    ENABLE_GPU_TELEMETRY="1",
    HOST_TELEMETRY_INTERVAL_SEC="10",
    GPU_TELEMETRY_INTERVAL_SEC="10",
)


@pytest.fixture(scope="module")
def ls16k(tmp_path_factory) -> Path:
    """The runbook's dataset folder. DRY_RUN checks the inputs as a real run would, so its
    manifest is a real file: a data_prep manifest's columns, and 2,000 rows of 3 s (no audio:
    nothing reads it), enough for a full global batch of every runbook space's micro-batch."""
    from trainables.data.manifest_table import MANIFEST_REQUIRED

    folder = tmp_path_factory.mktemp("runbook-ls16k")
    values = {"num_samples": "48000", "sample_rate": "16000", "transcript": "A WORD"}
    rows = ["\t".join(values.get(c, f"{c}-{i}") for c in MANIFEST_REQUIRED) for i in range(2000)]
    (folder / MANIFEST).write_text("\n".join(["\t".join(MANIFEST_REQUIRED), *rows]) + "\n")
    return folder


@pytest.fixture
def bench(ls16k):
    """The runbook's command line: variables in the environment (DATASET_MANIFEST_PATH the
    fixture's manifest unless given), the script run from anywhere (here the dataset folder:
    the default output root is checked there, and not created). The runs must fit the local
    cluster: Ray is told the CPUs of a 2x4090 host (INCLUDE gives its 2 GPUs)."""

    def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
        clean = {k: v for k, v in os.environ.items() if k not in VARIABLES}
        manifest = {"DATASET_MANIFEST_PATH": str(ls16k / MANIFEST)}
        host = {"RAY_OVERRIDE_RESOURCES": '{"CPU": 32}'}
        return subprocess.run(
            [str(SCRIPT), *args],
            cwd=ls16k,
            env={**clean, "PYTHON": sys.executable, "DRY_RUN": "1", **manifest, **host, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run


def planned(env: dict[str, str], base: str = "runbook"):
    plan = from_env(env)
    space = load_space(base)
    if plan.repeats:
        space = dataclasses.replace(space, repeats=plan.repeats)
    return plan, expand_runs(space.with_overrides(plan.sets))


def run_names(stdout: str) -> list[str]:
    rows = (ln.split() for ln in stdout.splitlines())
    return [r[1] for r in rows if len(r) > 1 and r[0].isdigit() and r[1].startswith("sweep_")]


def test_the_seeds_2x4090_sweep_plans_its_36_runs_with_the_runbooks_names(bench, ls16k, tmp_path):
    out = bench(MAINLINE)
    assert out.returncode == 0, out.stderr
    expected = [
        f"sweep_z{z}_mb{mb}_nw{nw}_pf{pf}_r1"
        for z in (0, 1)
        for mb in (128, 160, 192)
        for nw in (4, 6, 8)
        for pf in (2, 4)
    ]
    assert run_names(out.stdout) == expected
    assert "36 runs = 36 groups x 1 repeats" in out.stdout
    assert out.stderr == ""  # every variable has a counterpart: no warning
    # z0 is DDP, z1 DeepSpeed; 2 GPUs from INCLUDE; the runbook's figures.
    manifest = str(ls16k / MANIFEST)  # what bench passed
    _, runs = planned(dict(MAINLINE, DATASET_MANIFEST_PATH=manifest))
    assert [r.name for r in runs] == expected
    for run in runs:
        cfg = run.config
        assert cfg.strategy == ("ddp" if cfg.zero_stage == 0 else "deepspeed")
        assert (cfg.train_workers, cfg.use_gpu, cfg.max_steps) == (2, True, 600)
        assert cfg.manifest_path == manifest
    # The printed YAML is the same sweep: saved anywhere, --space FILE plans the same runs.
    yaml_text = out.stdout.split("\n---\n")[1].split("\n---")[0]
    mine = tmp_path / "from_runbook.yaml"
    mine.write_text(yaml_text)
    again = expand_runs(load_space(str(mine)))
    assert [(r.name, r.config) for r in again] == [(r.name, r.config) for r in runs]


@pytest.mark.parametrize(
    "env, space",
    [(STRAGGLER, "rank_straggler_diag"), (LEAK, "leak_4090_z0")],
    ids=["straggler", "leak"],
)
def test_the_straggler_and_leak_commands_run_what_their_spaces_run(bench, env, space):
    out = bench(env)
    assert out.returncode == 0, out.stderr
    _, runs = planned(env)
    ours = expand_runs(load_space(space))
    assert run_names(out.stdout) == [r.name for r in runs]
    assert [r.name for r in runs] == [
        f"sweep_z{z}_mb{mb}_nw{nw}_pf{pf}_r1"
        for z in env["SWEEP_ZERO_STAGES"].split(",")
        for mb in [env["SWEEP_MICRO_BATCHES"]]
        for nw in [env["SWEEP_NUM_WORKERS_LIST"]]
        for pf in [env["SWEEP_PREFETCH_LIST"]]
    ]
    assert [r.config for r in runs] == [r.config for r in ours]  # the same configurations


def test_each_variable_reaches_its_key():
    env = dict(
        MAINLINE,
        SWEEP_ZERO_STAGES="0,2",
        NSA_DDP_BUCKET_MB="100",
        NSA_DDP_STATIC_GRAPH="1",
        NSA_DDP_COMPRESS="1",
        NSA_OPT_FUSED="0",
        ATTN_IMPL="sdpa",
        TEXT_ATTN_IMPL="eager",
        PRECISION_MODE="bf16",
        ENABLE_TF32="true",
        MATMUL_PRECISION="high",
        ENABLE_TORCH_COMPILE="1",
        TORCH_COMPILE_MODE="max-autotune",
        TORCH_COMPILE_DYNAMIC="0",
        RUN_TIMEOUT_SEC="3600",
        FAIL_TAIL_LINES="80",
        HEARTBEAT_EVERY_SEC="15",
        STALL_ALERT_RATIO="3",
        ENABLE_LENGTH_FIXED_SLICE="1",
        FIXED_SLICE_SECONDS="2.5",
        SWEEP_VALIDATION_EVERY="200",
        SWEEP_CHECKPOINT_EVERY="300",
        INCLUDE="localhost:2,3,5",
    )
    plan, runs = planned(env)
    z0 = next(r.config for r in runs if r.config.zero_stage == 0)
    z2 = next(r.config for r in runs if r.config.zero_stage == 2)
    assert (z0.strategy, z0.ddp_comm_hook, z0.ddp_static_graph) == ("ddp", "bf16", True)
    assert (z2.strategy, z2.ddp_comm_hook) == ("deepspeed", "none")  # DDP knobs: DDP runs only
    assert z0.bucket_mb == z2.bucket_mb == 100 and z0.optimizer == "adamw_torch_foreach"
    assert (z0.speech_attention, z0.text_attention, z0.precision) == ("sdpa", "eager", "bf16")
    assert (z0.tf32, z0.matmul_precision, z0.torch_compile) == (True, "high", True)
    assert (z0.compile_mode, z0.compile_dynamic) == ("max-autotune", False)
    assert (z0.run_timeout_s, z0.fail_tail_lines, z0.heartbeat_every_s) == (3600, 80, 15)
    assert (z0.stall_alert_ratio, z0.crop_policy, z0.fixed_slice_s) == (3.0, "fixed_slice", 2.5)
    assert (z0.val_every, z0.checkpoint_every) == (200, 300)
    assert z0.train_workers == 3 and plan.cuda_visible_devices == "2,3,5"
    assert z0.val_speakers == 2 and plan.warnings == [
        "SWEEP_VALIDATION_EVERY: validation holds out 2 speakers of the manifest (val_speakers); "
        "--set val_manifest_path=PATH.tsv uses a split of your own"
    ]
    assert plan.stop_on_error is False and plan.repeats == 1


def test_dataset_root_resume_and_dump_tail(tmp_path):
    plan, runs = planned(
        {"DATASET_ROOT": "/data/ls16k", "DATASET_USE_TRIM": "0", "FAILURE_DUMP_TAIL": "0"}
    )
    assert runs[0].config.manifest_path == "/data/ls16k/manifest_16k.tsv"
    assert runs[0].config.fail_tail_lines == 0
    plan, _ = planned({"DATASET_ROOT": "/data/ls16k", "DATASET_USE_TRIM": "1"})
    assert "manifest_path=/data/ls16k/manifest_16k_trim.tsv" in plan.sets
    # A path that plain YAML would cut at '#' or read as a mapping reaches the config whole.
    odd = "/data/run #2/ls: 16k/manifest.tsv"
    _, runs = planned({"DATASET_MANIFEST_PATH": odd, "TIMING_RANK_SCOPE": "all"})
    assert runs[0].config.manifest_path == odd and runs[0].config.timing_ranks == "all"
    # RESUME_RUNS resumes only a folder that holds a sweep.
    env = {"RESUME_RUNS": "1", "OUTPUT_ROOT": str(tmp_path)}
    assert from_env(env).resume is False
    (tmp_path / "run_manifest.tsv").write_text("run\tstatus\n")
    assert from_env(env).resume is True and from_env(env).output_root == tmp_path


def test_variables_without_a_counterpart_are_named_in_one_warning(bench):
    out = bench(dict(MAINLINE, SWEEP_GRAD_CLIP="1.0", ENABLE_ETA_LOGGING="0"))
    assert out.returncode == 0
    warnings = out.stderr.strip().splitlines()
    assert warnings == [
        "platform.tune: warning: SWEEP_GRAD_CLIP has no counterpart in the platform and is ignored",
        "platform.tune: warning: ENABLE_ETA_LOGGING=0: progress lines always show the ETA",
    ]
    plan = from_env({"ENABLE_GPU_TELEMETRY": "0", "ENABLE_HOST_TELEMETRY": "1"})
    assert "telemetry=true" in plan.sets and "ENABLE_GPU_TELEMETRY=0 is ignored" in plan.warnings[0]
    assert "telemetry=false" in from_env({"ENABLE_GPU_TELEMETRY": "0"}).sets


@pytest.mark.parametrize(
    "env, fragment",
    [
        ({"MAX_STEPS": "abc"}, "MAX_STEPS=abc: expected an integer"),
        (
            {"SWEEP_MICRO_BATCHES": "128,,160"},
            "SWEEP_MICRO_BATCHES=128,,160: expected a comma list",
        ),
        ({"SWEEP_PREFETCH_LIST": "2,2"}, "SWEEP_PREFETCH_LIST=2,2: a value is listed twice"),
        ({"STOP_ON_ERROR": "maybe"}, "STOP_ON_ERROR=maybe: expected 0 or 1"),
        ({"TIMING_RANK_SCOPE": "some"}, "TIMING_RANK_SCOPE=some: expected one of rank0, all"),
        ({"MODE": "train"}, "MODE=train: expected one of sweep"),
        ({"INCLUDE": "0,1"}, "INCLUDE=0,1: expected DeepSpeed's HOST:GPU,GPU"),
        ({"INCLUDE": "a:0,1@b:0,1"}, "INCLUDE names 2 hosts: start a Ray cluster"),
        ({"RESUME_RUNS": "1"}, "RESUME_RUNS=1 needs OUTPUT_ROOT"),
        (
            {"DATASET_OFFLINE_TRIMMED": "0", "DATASET_USE_TRIM": "1"},
            "the platform trims only offline",
        ),
        ({"SWEEP_MICRO_BATCHES": "0"}, "SWEEP_MICRO_BATCHES=0: must be >= 1"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable_and_exit_2(bench, env, fragment, tmp_path):
    with pytest.raises(UsageError) as err:
        from_env(env)
    assert fragment in str(err.value)
    if env.get("MAX_STEPS") == "abc":  # and through the script, as a user sees it
        out = bench(dict(env, OUTPUT_ROOT=str(tmp_path / "out")))
        assert out.returncode == 2 and out.stdout == ""
        assert out.stderr.strip().splitlines() == [f"platform.tune: error: {err.value}"]
        assert not (tmp_path / "out").exists()


def test_a_cluster_include_needs_the_same_gpus_per_host_and_sets_nodes():
    plan = from_env({"INCLUDE": "h1:0,1@h2:0,1"}, address="10.0.0.1:6379")
    assert "nodes=2" in plan.sets and "train_workers=4" in plan.sets
    with pytest.raises(UsageError, match="same number of GPUs"):
        from_env({"INCLUDE": "h1:0,1@h2:0"}, address="10.0.0.1:6379")


def test_driver_log_path_copies_a_real_runs_console_and_a_dry_run_creates_no_log(bench, tmp_path):
    log = tmp_path / "logs" / "driver.log"
    env = dict(MAINLINE, DRIVER_LOG_PATH=str(log))
    dry = bench(dict(env, OUTPUT_ROOT=str(tmp_path / "out")))
    assert dry.returncode == 0, dry.stderr
    assert list(tmp_path.iterdir()) == []  # no log, not even its folder
    # A real run copies its console: here refused at its output root, before Ray starts.
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    real = bench(dict(env, DRY_RUN="0", OUTPUT_ROOT=str(blocker)))
    assert real.returncode == 2
    (error,) = real.stderr.strip().splitlines()
    assert error.startswith("platform.tune: error: output root ") and "is a file" in error
    assert log.read_text() == real.stdout + real.stderr
