"""``--dry-run`` refuses what the real run refuses, with the same one line and exit 2, while it
starts no Ray and writes nothing (issue 27, item 2); an output root that is a file is named so."""

import re
import subprocess
import sys

import pytest

from tests.cli import ROOT, run_module
from tests.test_tune_cli import tune


def _error_line(out) -> str:
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "a_file"
    path.write_text("not a folder")
    return path


def test_a_missing_manifest_is_refused_by_the_dry_run_with_the_real_runs_line(tmp_path):
    root = tmp_path / "out"
    args = ("--space", "4090_mainline", "--output-root", root)
    dry = tune(*args, "--dry-run", probe=True)
    assert dry.returncode == 2
    line = _error_line(dry)
    assert line.startswith("platform.tune: error: ") and "needs manifest_path" in line
    assert "set manifest_path=PATH/manifest_16k_trim.tsv" in line
    assert "sweep_z0_mb160_nw6_pf4_r1" in dry.stdout  # the plan is still shown
    assert dry.stdout.strip().endswith("NO_RAY") and not root.exists()
    real = tune(*args, probe=True)
    assert real.returncode == 2 and _error_line(real) == line
    assert real.stdout.strip() == "NO_RAY" and not root.exists()
    absent = tmp_path / "absent.tsv"
    dry = tune(*args, "--set", f"manifest_path={absent}", "--dry-run")
    assert dry.returncode == 2
    assert _error_line(dry).endswith(
        f"manifest_path {absent} does not exist; make it with python -m data_prep.librispeech"
    )


@pytest.mark.parametrize("below", [False, True])
def test_an_output_root_that_cannot_be_one_is_refused_by_dry_and_real_runs_alike(a_file, below):
    root = a_file / "out" if below else a_file
    why = (
        f"cannot be written ({a_file} is a file); choose a writable --output-root"
        if below
        else "is a file; choose a folder for --output-root"
    )
    for cli, space in (("platform.tune", "smoke"), ("platform.train", "train_smoke")):
        for dry in (["--dry-run"], []):
            out = run_module(cli, "--space", space, "--output-root", root, *dry)
            assert out.returncode == 2, (cli, dry, out.stderr)
            assert _error_line(out) == f"{cli}: error: output root {root} {why}"
        assert a_file.read_text() == "not a folder"  # untouched


def test_an_output_root_holding_a_sweep_is_refused_by_the_dry_run(tmp_path):
    (tmp_path / "run_manifest.tsv").write_text("run\n")
    out = tune("--space", "smoke", "--output-root", tmp_path, "--dry-run")
    assert out.returncode == 2
    assert _error_line(out) == (
        f"platform.tune: error: output root {tmp_path} already holds a sweep; choose another "
        "--output-root"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run_manifest.tsv"]


def test_an_unknown_key_is_refused_by_the_dry_run(tmp_path):
    out = tune("--space", "smoke", "--set", "micro_bach=4", "--dry-run", "--output-root", tmp_path)
    assert out.returncode == 2
    assert "unknown key 'micro_bach'" in _error_line(out)
    assert "did you mean 'micro_batch'" in out.stderr and out.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_a_dry_run_of_smoke_passes_and_creates_no_root(tmp_path):
    root = tmp_path / "deeper" / "out"
    out = tune("--space", "smoke", "--output-root", root, "--dry-run", probe=True)
    assert out.returncode == 0, out.stderr
    assert out.stderr == "" and out.stdout.strip().endswith("NO_RAY")
    assert list(tmp_path.iterdir()) == []


def test_the_default_output_root_is_checked_but_not_created(tmp_path, monkeypatch):
    from platform.errors import UsageError
    from platform.execution.inputs import check_inputs_only
    from platform.spaces.expand import expand_runs
    from platform.spaces.load import load_space

    space = load_space("smoke")
    runs = expand_runs(space)
    monkeypatch.chdir(tmp_path)  # outputs/<space>_<stamp> is relative to the working folder
    check_inputs_only(space, runs, address=None, resume=False, output_root=None)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "outputs").write_text("a file where the folder of outputs goes")
    with pytest.raises(UsageError, match=r"outputs is a file\); choose a writable --output-root"):
        check_inputs_only(space, runs, address=None, resume=False, output_root=None)
    assert [p.name for p in tmp_path.iterdir()] == ["outputs"]


def test_a_dry_run_of_resume_reads_the_root_and_writes_nothing(tmp_path):
    out = tune("--space", "smoke", "--output-root", tmp_path, "--resume", "--dry-run")
    assert out.returncode == 2
    assert "holds no sweep (run_manifest.tsv is missing)" in _error_line(out)
    assert list(tmp_path.iterdir()) == []


def test_a_micro_batch_the_corpus_cannot_fill_is_refused_before_ray_naming_the_largest(
    tmp_path, prepared_corpus
):
    """12 utterances of 2 speakers, 2 workers: 12 // 2 = 6 per worker at most; one speaker held
    out leaves 6 utterances, 3 per worker. Found by the driver, not after the workers start."""
    manifest, _ = prepared_corpus
    root = tmp_path / "out"
    base = ("--space", "smoke", "--output-root", root, "--set", f"manifest_path={manifest}")
    fits = tune(*base, "--set", "micro_batch=6", "--dry-run")
    assert fits.returncode == 0, fits.stderr
    for sets, best, after in (
        (("micro_batch=8",), 6, ""),
        (("micro_batch=4", "val_speakers=1"), 3, " after holding out val_speakers=1"),
    ):
        args = [a for s in sets for a in ("--set", s)]
        for dry in (["--dry-run"], []):
            out = tune(*base, *args, *dry, probe=True)
            assert out.returncode == 2, out.stderr
            line = _error_line(out)
            mb = sets[0].split("=")[1]
            assert (
                f"micro_batch {mb}: {manifest} gives no full global batch ({mb} x 2 workers)"
                in line
            )
            assert line.endswith(
                f"{after}; the largest that fits is {best}: --set micro_batch={best}"
            )
            assert "NO_RAY" in out.stdout and not root.exists()


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ("--set", "val_manifest_path=/nope.tsv"),
            "val_manifest_path /nope.tsv does not exist; make it with python -m "
            "data_prep.librispeech",
        ),
        (
            ("--set", "tokenizer_path=/nope.json"),
            "tokenizer_path /nope.json does not exist; leave it empty",
        ),
        (
            ("--set", "use_gpu=true"),
            "use_gpu true: run sweep_z0_mb4_nw0_pf2_r1 needs 2 GPU(s), this machine has 0; "
            "set use_gpu=auto",
        ),
        (("--dashboard-port", "99999"), "argument --dashboard-port: '99999' is not a port"),
    ],
)
def test_a_first_hours_mistake_is_one_line_and_exit_2_before_ray(tmp_path, monkeypatch, args, line):
    """Issue 43 items 1-3: found by the driver, in the dry run and the real run alike, before
    Ray starts and before the output root is made."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # what Ray would count here: no GPU
    root = tmp_path / "out"
    for dry in (["--dry-run"], []):
        out = tune("--space", "smoke", "--output-root", root, *args, *dry, probe=True)
        assert out.returncode == 2, out.stderr
        assert line in out.stderr.strip().splitlines()[-1]
        assert not root.exists()
        assert out.stdout.strip().endswith("NO_RAY") or "error: argument" in out.stderr


def test_a_dashboard_port_in_use_is_refused_naming_it(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = tune("--space", "smoke", "--dashboard-port", str(port), "--dry-run", probe=True)
    assert out.returncode == 2
    assert _error_line(out) == (
        f"platform.tune: error: --dashboard-port {port} is in use on 127.0.0.1 (another Ray "
        "cluster?); choose a free port, or leave --dashboard-port out (a free one is then taken)"
    )


def test_every_key_that_names_a_file_or_folder_is_checked_before_ray():
    from platform.spaces.preflight import PATH_KEYS
    from trainables.config import field_names

    named = {k for k in field_names() if k.endswith(("_path", "_dir", "_file"))}
    assert named == set(PATH_KEYS), "add the new key's check to preflight.PATH_KEYS"


def test_data_that_no_run_reads_is_refused_naming_dataset_manifest(tmp_path, prepared_corpus):
    """Issue 54 item 1: a data: section or a manifest_path with dataset synthetic (the default)
    trained every run on generated tensors, silently; refused by the dry and the real run alike,
    before Ray. A grid over dataset reads the manifest in its manifest groups: not refused."""
    manifest, _ = prepared_corpus
    smoke = (ROOT / "search_spaces" / "smoke.yaml").read_text()
    assert "  dataset: manifest" in smoke
    mine = tmp_path / "my_smoke.yaml"  # the README's template once had no dataset: line
    mine.write_text("\n".join(ln for ln in smoke.splitlines() if "dataset:" not in ln))
    root = tmp_path / "out"
    for args, line in (
        (
            ("--space", mine),
            f"{mine}: no run reads the corpus of its data: section (dataset is synthetic, the "
            "default: generated tensors); set dataset: manifest under fixed: (or --set "
            "dataset=manifest), or drop the data: section",
        ),
        (
            ("--space", "cpu_race", "--set", f"manifest_path={manifest}"),
            f"manifest_path {manifest}: no run reads it (dataset is synthetic: generated "
            "tensors); set dataset=manifest (or drop manifest_path)",
        ),
    ):
        for dry in (["--dry-run"], []):
            out = tune(*args, "--output-root", root, *dry, probe=True)
            assert out.returncode == 2, out.stderr
            assert _error_line(out) == f"platform.tune: error: {line}"
            assert out.stdout.strip().endswith("NO_RAY") and not root.exists()
    both = ("--set", f"manifest_path={manifest}", "--set", "dataset=[synthetic,manifest]")
    out = tune("--space", "cpu_race", *both, "--dry-run")
    assert out.returncode == 0, out.stderr


# platform.tune as `python -m` runs it, with a Ray cluster that must not start.
NO_CLUSTER = """\
import sys

import platform.execution.cluster as cluster


def started(**_):
    print("RAY_STARTED", flush=True)
    sys.exit(3)


cluster.start_cluster = started
from platform.tune import main

sys.exit(main(sys.argv[1:]))
"""


def test_a_micro_batch_the_data_sections_corpus_cannot_fill_is_refused_before_ray(tmp_path):
    """Issue 54 item 2: with the space's data: section the corpus was made after Ray started,
    and such a run failed in its trial (exit 1, a Tune traceback). The corpus's size refuses
    what it cannot fill in the dry run too; what only the made corpus shows (crop buckets) is
    refused once it is made, before Ray starts, and the refusal leaves no output root."""
    root = tmp_path / "out"

    def tune_without_ray(space, *args):
        cmd = [sys.executable, "-c", NO_CLUSTER, "--space", space, "--output-root", root]
        return subprocess.run(
            [*map(str, cmd), *args], cwd=ROOT, capture_output=True, text=True, timeout=120
        )

    for dry in (["--dry-run"], []):
        out = tune_without_ray("smoke", "--set", "micro_batch=64", *dry)
        assert out.returncode == 2, out.stdout + out.stderr
        assert _error_line(out) == (
            "platform.tune: error: micro_batch 64: the data: section's corpus has 32 training "
            "utterances, no full global batch (64 x 2 workers) in sweep_z0_mb64_nw0_pf2_r1; the "
            "largest that can fit is 16: --set micro_batch=16"
        )
        assert "RAY_STARTED" not in out.stdout and not root.exists()
    tiny = tmp_path / "tiny_smoke.yaml"  # smoke with a corpus of 4 utterances: made in ~1 s
    smoke = (ROOT / "search_spaces" / "smoke.yaml").read_text()
    tiny.write_text(smoke.replace("chapters: 2, utts: 8", "chapters: 1, utts: 2"))
    out = tune_without_ray(tiny, "--set", "micro_batch=2", "--set", "crop_buckets_s=1,2,3")
    assert out.returncode == 2, out.stdout + out.stderr
    assert re.fullmatch(
        rf"platform\.tune: error: micro_batch 2: {re.escape(str(root))}/data/prepared/"
        r"manifest_16k_trim\.tsv "
        r"gives no full global batch \(2 x 2 workers\) in sweep_z0_mb2_nw0_pf2_r1 after grouping "
        r"crops by crop_buckets_s; the largest that fits is \d: --set micro_batch=\d",
        _error_line(out),
    )
    assert "data: synthetic corpus" in out.stdout and "RAY_STARTED" not in out.stdout
    assert not root.exists()


def test_a_run_this_machine_cannot_hold_is_refused_by_the_dry_run(tmp_path, monkeypatch):
    """Issue 54 item 9: the dry run holds the runs to the CPUs and GPUs of the local cluster it
    would start (this machine's, as Ray counts them), by the real run's rule; it exited 0."""
    from stage1_common.cluster import local_cpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # what Ray would count here: no GPU
    cpus = local_cpus()
    per_worker = max(1, cpus // 2)  # 4 train workers x 1 CPU on 2 CPUs: the case
    root = tmp_path / "out"
    args = ("--set", "train_workers=4", "--set", f"cpus_per_worker={per_worker}")
    for dry in (["--dry-run"], []):
        out = tune("--space", "smoke", "--output-root", root, *args, *dry, probe=True)
        assert out.returncode == 2, out.stderr
        assert _error_line(out) == (
            f"platform.tune: error: run sweep_z0_mb4_nw0_pf2_r1 needs {4 * per_worker} CPUs "
            f"and 0 GPUs (4 train workers x {per_worker} CPUs), this machine has {cpus} CPUs "
            "and 0 GPUs; lower train_workers, num_workers or cpus_per_worker"
        )
        assert out.stdout.strip().endswith("NO_RAY") and not root.exists()
