"""``python -m platform.tune``: dry run, listing, and every bad input of issue 2."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Runs main() like `python -m platform.tune`, then says whether Ray was ever imported.
PROBE = (
    "import sys\n"
    "from platform.tune import main\n"
    "rc = main(sys.argv[1:])\n"
    "print('RAY_IMPORTED' if 'ray' in sys.modules else 'NO_RAY')\n"
    "sys.exit(rc)\n"
)


def tune(*args, probe=False, spaces=None):
    cmd = (
        [sys.executable, "-c", PROBE, *args]
        if probe
        else [sys.executable, "-m", "platform.tune", *args]
    )
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_dry_run_prints_both_runs_quickly_without_ray():
    start = time.monotonic()
    out = tune("--space", "smoke", "--dry-run", probe=True)
    elapsed = time.monotonic() - start
    assert out.returncode == 0, out.stderr
    assert "sweep_z0_mb4_nw0_pf2_r1" in out.stdout and "sweep_z0_mb8_nw0_pf2_r1" in out.stdout
    assert "train_workers=2" in out.stdout  # resolved fixed values are shown
    assert "data: synthetic corpus" in out.stdout
    assert out.stdout.strip().endswith("NO_RAY")
    assert elapsed < 5.0


def test_dry_run_shows_set_overrides():
    out = tune(
        "--space", "smoke", "--dry-run", "--set", "micro_batch=[2,4,6]", "--set", "max_steps=12"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("_pf2_r1") == 3 and "max_steps=12" in out.stdout


def test_a_set_that_sweeps_a_fixed_key_keeps_one_baseline_group_in_the_plan():
    out = tune(
        "--space", "smoke", "--set", "strategy=auto", "--set", "zero_stage=[0,2]", "--dry-run"
    )
    assert out.returncode == 0, out.stderr
    marked = [ln.split()[1] for ln in out.stdout.splitlines() if ln.endswith("(baseline)")]
    assert marked == ["sweep_z0_mb4_nw0_pf2_r1"]  # the space's zero_stage 0, as before the --set
    assert "sweep_z2_mb8_nw0_pf2_r1" in out.stdout


def test_a_baseline_moved_by_a_set_list_is_said_by_the_plan_and_the_real_run(tmp_path):
    note = (
        "baseline: micro_batch 4 is not in --set micro_batch=[8, 16]; the baseline is now "
        "sweep_z0_mb8_nw0_pf2 (micro_batch 8, the list's first value)"
    )
    args = ("--space", "smoke", "--set", "micro_batch=[8,16]")
    plan = tune(*args, "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.splitlines().count(note) == 1
    # The real run says it before it starts (here refused at its output root: no Ray needed).
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    real = tune(*args, "--output-root", str(blocker), probe=True)
    assert real.returncode == 2 and "is a file" in real.stderr
    assert real.stdout.splitlines() == [note, "NO_RAY"]
    assert note not in tune("--space", "smoke", "--dry-run").stdout  # the space's own baseline


def test_a_space_file_anywhere_runs_under_its_stem_and_is_recorded_by_path(tmp_path):
    mine = tmp_path / "team_repo" / "my_sweep.yml"
    mine.parent.mkdir()
    mine.write_text((ROOT / "search_spaces" / "smoke.yaml").read_text())
    out = tune("--space", str(mine), "--dry-run", "--set", "micro_batch=[3,5]")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("space my_sweep: CPU smoke sweep")
    assert "sweep_z0_mb3_nw0_pf2_r1" in out.stdout and "sweep_z0_mb5_nw0_pf2_r1" in out.stdout
    from platform.spaces.load import load_space

    space = load_space(str(mine))
    assert space.name == "my_sweep" and space.ref == str(mine.resolve())
    assert load_space("smoke").ref == "smoke"
    assert not list((ROOT / "search_spaces").glob("my_sweep*"))


def test_list_spaces():
    out = tune("--list-spaces")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert any(ln.startswith("smoke ") and "CPU smoke sweep" in ln for ln in lines)
    assert any(ln.startswith("cpu_strategies ") for ln in lines)


@pytest.fixture
def bad_yaml(tmp_path):
    path = tmp_path / "my_spaces" / "bad_yaml.yaml"  # a space file outside the repository
    path.parent.mkdir()
    path.write_text("grid:\n  micro_batch: [4, 8\nfixed: {}\n")
    return path


@pytest.fixture
def bad_key_space(tmp_path):
    path = tmp_path / "bad_key.yaml"
    path.write_text("grid: {micro_batch: [4]}\nfixed: {bucket: 25}\n")
    return path


CASES = {
    "unknown space": (
        ["--space", "nope"],
        "unknown space 'nope'; known spaces: 4090_fastest, 4090_mainline, 4090_phaseb",
    ),
    "unknown --set key": (
        ["--space", "smoke", "--set", "micro_bach=4"],
        "did you mean 'micro_batch'",
    ),
    "micro_batch 0": (
        ["--space", "smoke", "--set", "micro_batch=0"],
        "micro_batch: must be >= 1, got 0",
    ),
    "wrong type": (["--space", "smoke", "--set", "micro_batch=eight"], "micro_batch: expected int"),
    "zero_stage 4": (
        ["--space", "smoke", "--set", "zero_stage=4"],
        "zero_stage: must be 0, 1, 2 or 3",
    ),
    "log_every > max_steps": (
        ["--space", "smoke", "--set", "log_every=100"],
        "log_every: 100 is larger than max_steps 30",
    ),
    "ddp with zero_stage": (
        ["--space", "smoke", "--set", "zero_stage=2"],
        "needs strategy deepspeed",
    ),
    "no space": ([], "--space NAME is required"),
    "missing space file": (
        ["--space", "/nonexistent/my_space.yaml"],
        "--space /nonexistent/my_space.yaml: no such file; give a YAML space file or a name",
    ),
    "missing checkpoint": (
        ["--space", "smoke", "--set", "speech_pretrained_path=/nonexistent/w2v"],
        "speech_pretrained_path: /nonexistent/w2v is not a folder; give a folder written by "
        "save_pretrained",
    ),
    "bucketing fixed slices": (
        ["--space", "smoke", "--set", "crop_policy=fixed_slice", "--set", "length_bucketing=true"],
        "length_bucketing: groups crops of different lengths",
    ),
    "resume where no sweep is": (
        ["--space", "smoke", "--resume"],
        "holds no sweep (run_manifest.tsv is missing); drop --resume to start one there",
    ),
    "stop_on_error not a bool": (
        ["--space", "smoke", "--set", "stop_on_error=maybe"],
        "stop_on_error must be true or false, got 'maybe'",
    ),
    "address nothing listens at": (
        ["--space", "smoke", "--address", "127.0.0.1:1"],
        "cannot reach Ray at --address 127.0.0.1:1: nothing answers at 127.0.0.1:1",
    ),
    "address not host:port": (
        ["--space", "smoke", "--address", "headnode"],
        "'headnode' is not HOST:PORT",
    ),
    "fp16 weights under ddp": (
        ["--space", "smoke", "--set", "model_load_dtype=fp16"],
        "model_load_dtype: fp16 needs a GPU",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_gives_one_line_exit_2_no_ray_nothing_written(case, tmp_path):
    args, fragment = CASES[case]
    root = tmp_path / "out"
    out = tune(*args, "--output-root", str(root), probe=True)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("platform.tune: error: ")
    assert fragment in lines[0]
    assert out.stdout.strip() == "NO_RAY"
    assert not root.exists()


def test_yaml_syntax_error_names_file_and_line(bad_yaml, tmp_path):
    out = tune("--space", str(bad_yaml), "--output-root", str(tmp_path / "out"))
    assert out.returncode == 2
    assert f"{bad_yaml}:" in out.stderr and "YAML syntax error" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_unknown_key_in_the_space_file(bad_key_space, tmp_path):
    out = tune("--space", str(bad_key_space), "--output-root", str(tmp_path / "out"))
    assert out.returncode == 2
    assert "unknown key 'bucket'" in out.stderr and "did you mean 'bucket_mb'" in out.stderr


def test_unwritable_output_root(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    out = tune("--space", "smoke", "--output-root", str(blocker / "out"), probe=True)
    assert out.returncode == 2
    assert "cannot be written" in out.stderr and "choose a writable --output-root" in out.stderr
    assert out.stdout.strip() == "NO_RAY"


def test_output_root_holding_a_sweep_is_refused(tmp_path):
    (tmp_path / "run_manifest.tsv").write_text("run\n")
    out = tune("--space", "smoke", "--output-root", str(tmp_path), probe=True)
    assert out.returncode == 2 and "already holds a sweep" in out.stderr
    assert out.stdout.strip() == "NO_RAY"


def test_job_environment_forwards_communication_settings_and_sets_the_report_poll_and_watcher():
    from platform.execution.cluster import train_env_vars

    env = train_env_vars(
        {
            "NCCL_NVLS_ENABLE": "0",
            "NVSHMEM_DISABLE_NVLS": "1",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "CUDA_VISIBLE_DEVICES": "0,1",
            "MY_API_TOKEN": "secret",
            "HOME": "/root",
            "STAGE1_CACHE_DIR": "/fast/cache",
        }
    )
    assert env == {
        "NCCL_NVLS_ENABLE": "0",
        "NVSHMEM_DISABLE_NVLS": "1",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "STAGE1_CACHE_DIR": "/fast/cache",  # the machine cache of every node, as the driver's
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25",
    }
    assert (
        train_env_vars({"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "2"})[
            "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
        ]
        == "2"
    )
    # Ray Train's preemption watcher: off on a local cluster (nothing can drain its one node),
    # Ray's default on a joined one; the user's setting wins on either.
    watcher = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
    assert train_env_vars({}, local=True)[watcher] == "0"
    assert watcher not in train_env_vars({}, local=False)
    assert train_env_vars({watcher: "1"}, local=True)[watcher] == "1"
    assert train_env_vars({watcher: "0"}, local=False)[watcher] == "0"


def test_resume_refuses_a_root_without_a_sweep_or_with_another_sweep(tmp_path):
    out = tune("--space", "smoke", "--resume", probe=True)
    assert out.returncode == 2 and "--resume needs the --output-root" in out.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tune("--space", "smoke", "--output-root", str(empty), "--resume", probe=True)
    assert out.returncode == 2 and out.stdout.strip() == "NO_RAY"
    assert f"--resume: {empty} holds no sweep (run_manifest.tsv is missing)" in out.stderr
    other = tmp_path / "other"
    other.mkdir()
    (other / "run_manifest.tsv").write_text("run\tstatus\nsweep_z9_r1\tok\n")
    out = tune("--space", "smoke", "--output-root", str(other), "--resume", probe=True)
    assert out.returncode == 2 and "holds a different sweep" in out.stderr
    assert sorted(p.name for p in other.iterdir()) == ["run_manifest.tsv"]  # nothing written


def test_resume_refuses_a_history_flag_that_disagrees_with_the_kept_mode(tmp_path):
    """A resumed race keeps the history mode its schedule.json kept: --history order, or
    --no-history, against a race kept as confirm is refused in one line naming both and the
    fix, before anything is written; the same mode, or no flag, is not refused for it."""
    import json

    from platform.spaces.expand import expand_runs
    from platform.spaces.load import load_space

    root = tmp_path / "root"
    root.mkdir()
    names = [r.name for r in expand_runs(load_space("smoke").with_overrides(["scheduler=race"]))]
    (root / "run_manifest.tsv").write_text(
        "run\tstatus\n" + "".join(f"{n}\tpending\n" for n in names)
    )
    (root / "schedule.json").write_text(json.dumps({"history": {"mode": "confirm"}}))
    before = sorted(p.name for p in root.iterdir())
    for flag, given in ((["--history", "order"], "--history order"),
                        (["--no-history"], "--no-history")):  # fmt: skip
        out = tune("--space", "smoke", "--set", "scheduler=race", "--output-root", str(root),
                   "--resume", *flag, probe=True)  # fmt: skip
        assert out.returncode == 2 and out.stdout.strip() == "NO_RAY"
        (line,) = out.stderr.strip().splitlines()
        assert f"raced with --history confirm (its schedule.json) and {given} disagrees" in line
        assert f"drop {given}, or start the sweep again in a new --output-root" in line
    assert sorted(p.name for p in root.iterdir()) == before
