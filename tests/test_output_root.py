"""OutputRoot (stage1_common/output_root.py): the one home of an output root's file names, the
same names the README's "What a sweep writes" lists and the storage module's aliases use."""

import os
from pathlib import Path

from platform.storage import results
from stage1_common.output_root import CheckpointFolder, OutputRoot, RunFolder

ROOT = Path(__file__).resolve().parent.parent


def test_paths_of_the_root_and_of_a_run(tmp_path):
    root = OutputRoot.of(tmp_path)
    assert OutputRoot.of(root) is root and os.fspath(root) == str(tmp_path)
    assert root.manifest == tmp_path / "run_manifest.tsv"
    assert root.timing == tmp_path / "timing.parquet"
    assert root / "summary.md" == tmp_path / "summary.md"
    run = tmp_path / "runs" / "r1"
    folder = root.run_folder("r1")
    assert folder == RunFolder(run) and root.run_dir("r1") == run
    assert folder.config == run / "config.json"
    assert folder.env == run / "env.json"
    assert folder.fail_tail == run / "fail_tail.txt"
    assert folder.restart_tail(2) == run / "restart_tail-attempt2.txt"
    assert folder.workers() == run / "workers"
    assert folder.worker(3) == run / "workers" / "rank3.json"
    assert folder.worker(3, previous=True) == run / "workers" / "previous" / "rank3.json"
    assert folder.worker_log(3, "stderr") == run / "workers" / "rank3.stderr.log"
    assert folder.stacks(2) == run / "stacks-rank2.txt"
    assert folder.stacks().name == "stacks-rank*.txt"
    assert folder.faults_armed(1) == run / "faults_armed-rank1.json"
    assert folder.curves == run / "curves.png"
    assert folder.export == run / "export"
    assert not root.holds_sweep()
    root.manifest.write_text("run\n")
    assert root.holds_sweep()


def test_checkpoint_folders_of_a_run(tmp_path):
    folder = RunFolder(tmp_path)
    assert folder.checkpoint(200) == tmp_path / "checkpoint_step0000200"
    assert RunFolder.checkpoint_step("checkpoint_step0000200") == 200
    assert RunFolder.checkpoint_step("checkpoint_step") is None
    assert RunFolder.checkpoint_step("checkpoint_2025-01-01_00-00-00.000000") is None
    for step in (10_000_000, 300, 20):  # oldest first by step, not by name
        folder.checkpoint(step).mkdir()
    (tmp_path / "checkpoint_step0000400").write_text("")  # a file, not a folder
    (tmp_path / "checkpoint_manager_snapshot.json").write_text("{}")
    assert [p.name for p in folder.checkpoints()] == [
        "checkpoint_step0000020",
        "checkpoint_step0000300",
        "checkpoint_step10000000",
    ]
    assert RunFolder.uploaded_by_ray_train("checkpoint_manager_snapshot.json")
    assert RunFolder.uploaded_by_ray_train(folder.checkpoint(1).name)
    assert not RunFolder.uploaded_by_ray_train(RunFolder.EXPORT)
    parts = CheckpointFolder(folder.checkpoint(20))
    assert parts.meta == folder.checkpoint(20) / "meta.json"
    assert parts.state.name == "state.pt" and parts.deepspeed.name == "ds"
    assert parts.rng(1).name == "rng-rank1.pt" and parts.done(1).name == "done-rank1.json"
    assert CheckpointFolder.dcp_name("ab12") == "dcp-ab12"


def test_storage_names_are_output_roots_and_the_readme_lists_them():
    assert results.MANIFEST == OutputRoot.MANIFEST
    assert results.TIMING_DIR == OutputRoot.TIMING
    assert results.BEST_CONFIG == OutputRoot.BEST_CONFIG
    readme = (ROOT / "README.md").read_text()
    for name in (
        OutputRoot.MANIFEST,
        OutputRoot.TIMING,
        OutputRoot.GPU_TELEMETRY,
        OutputRoot.HOST_TELEMETRY,
        OutputRoot.PER_RUN_METRICS,
        OutputRoot.RANKED_GROUPS,
        OutputRoot.BEST_CONFIG,
        OutputRoot.SCHEDULE,
        OutputRoot.REPORT,
        f"{OutputRoot.RUNS}/<run>/{RunFolder.CONFIG}",
        f"{OutputRoot.RUNS}/<run>/{RunFolder.ENV}",
        f"{OutputRoot.RUNS}/<run>/{RunFolder.FAIL_TAIL}",
    ):
        assert f"`{name}" in readme, name
