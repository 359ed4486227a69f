"""OutputRoot (stage1_common/output_root.py): the one home of an output root's file names, the
same names the README's "What a sweep writes" lists and the storage module's aliases use."""

import os
from pathlib import Path

from platform.storage import results
from stage1_common.output_root import OutputRoot

ROOT = Path(__file__).resolve().parent.parent


def test_paths_of_the_root_and_of_a_run(tmp_path):
    root = OutputRoot.of(tmp_path)
    assert OutputRoot.of(root) is root and os.fspath(root) == str(tmp_path)
    assert root.manifest == tmp_path / "run_manifest.tsv"
    assert root.timing == tmp_path / "timing.parquet"
    assert root / "summary.md" == tmp_path / "summary.md"
    assert root.run_config("r1") == tmp_path / "runs" / "r1" / "config.json"
    assert root.run_env("r1") == tmp_path / "runs" / "r1" / "env.json"
    assert root.fail_tail("r1") == tmp_path / "runs" / "r1" / "fail_tail.txt"
    assert root.workers_dir("r1") == tmp_path / "runs" / "r1" / "workers"
    assert root.stacks("r1", 2) == tmp_path / "runs" / "r1" / "stacks-rank2.txt"
    assert not root.holds_sweep()
    root.manifest.write_text("run\n")
    assert root.holds_sweep()


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
        f"{OutputRoot.RUNS}/<run>/{OutputRoot.RUN_CONFIG}",
        f"{OutputRoot.RUNS}/<run>/{OutputRoot.RUN_ENV}",
        f"{OutputRoot.RUNS}/<run>/{OutputRoot.FAIL_TAIL}",
    ):
        assert f"`{name}" in readme, name
