"""The smoke sweep, run as a user of the old runbook would (its variables and script): a real
local Ray cluster, real Tune + Train (gloo), real Parquet, TensorBoard series and report.html.
One sweep, many assertions (each Tune trial costs ~20 s here)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from platform.spaces.runbook import VARIABLES
from stage1_common.tail import tail_start
from tests.cli import run_module
from tests.integration.cluster import LocalCluster
from tests.output_layout import check_layout

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


# The smoke space's sweep, started as the old runbook started its sweeps: its variables, its
# script (scripts/run_stage1_ab_bench.sh), the smoke space as the base (tiny models, CPUs, the
# generated corpus), and TensorBoard series on.
RUNBOOK = dict(
    MODE="sweep",
    REPEATS="1",
    STOP_ON_ERROR="0",
    MAX_STEPS="30",
    SWEEP_ZERO_STAGES="0",
    SWEEP_MICRO_BATCHES="4,8",
    SWEEP_NUM_WORKERS_LIST="0",
    SWEEP_PREFETCH_LIST="2",
    SWEEP_LOG_EVERY="5",
    TAIL_TIMING_POINTS="3",
)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("smoke") / "out"
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    env.update(RUNBOOK, OUTPUT_ROOT=str(root), DRIVER_LOG_PATH=str(root.parent / "driver.log"))
    env["PYTHON"] = sys.executable
    # Another Ray cluster on the machine, as shared GPU hosts often have (issue 43 item 7).
    with LocalCluster(tmp_path_factory.mktemp("other-cluster"), workers=0):
        out = subprocess.run(
            [str(ROOT / "scripts" / "run_stage1_ab_bench.sh"), "--space", "smoke"]
            + ["--logger", "tensorboard"],
            cwd=ROOT.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    (root.parent / "stdout.log").write_text(out.stdout + "\n--- stderr ---\n" + out.stderr)
    return root, out


def test_the_runbook_command_ran_the_smoke_sweep_and_kept_its_console(sweep):
    root, out = sweep
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "the same sweep as a space file" in out.stdout
    log = (root.parent / "driver.log").read_text()
    # Ray Train's placement-group cleaner asks the dashboard's State API whether its controller
    # lives: without the dashboard it warns every few seconds and could not clean up.
    assert "State API may be temporarily unavailable" not in out.stdout + out.stderr
    # Ray Train's preemption watcher is off on a local cluster: no process for it, and none of
    # the ERROR lines it printed at each worker group's start (ray-project/ray#53727).
    assert "PreemptionWatcher" not in out.stdout + out.stderr
    # A quiet console (issue 43 item 8): no Tune table of the experiment, no worker output.
    quoted = ("Number of trials", "Configuration for experiment", "Traceback", "pid=")
    for noise in (*quoted, "Token authentication is enabled", "MapWorker", "max_restarts"):
        assert noise not in out.stdout + out.stderr, noise
    # With another cluster running, Ray Train's placement-group cleaner still found its own
    # (every worker's RAY_ADDRESS: stage1_common.cluster.pin_ray_address); its worker logs,
    # off the console, hold no "Found multiple active Ray instances".
    record = json.loads(
        (root / "runs" / "sweep_z0_mb4_nw0_pf2_r1" / "workers" / "rank0.json").read_text()
    )
    logs = Path(record["stderr"]).parent
    errors = [
        f.name for f in logs.glob("*.err") if "multiple active Ray" in f.read_text(errors="replace")
    ]
    assert list(logs.glob("worker-*.err")) and errors == [], errors
    for line in ("[2/2] sweep_z0_mb8_nw0_pf2_r1: ok in", "groups ranked by tail samples/s"):
        assert line in log and line in out.stdout
    # The YAML it printed is the sweep it ran: the same runs from --space FILE.
    from platform.spaces.expand import expand_runs
    from platform.spaces.load import load_space

    mine = root.parent / "from_runbook.yaml"
    mine.write_text(out.stdout.split("\n---\n")[1].split("\n---")[0])
    runs = expand_runs(load_space(str(mine)))
    assert [r.name for r in runs] == ["sweep_z0_mb4_nw0_pf2_r1", "sweep_z0_mb8_nw0_pf2_r1"]
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t")
    saved = json.loads((root / "runs" / runs[0].name / "config.json").read_text())["config"]
    # The driver's: the corpus it prepared, and where the run trained (executor auto).
    filled = ("manifest_path", "tokenizer_path", "executor")
    planned = {k: v for k, v in runs[0].config.to_dict().items() if k not in filled}
    assert planned == {k: v for k, v in saved.items() if k in planned}
    assert list(manifest["strategy"]) == ["ddp", "ddp"]  # strategy auto: z0 is DDP
    assert list(manifest["executor"]) == ["resident", "resident"]  # executor auto: a sweep


def test_both_runs_trained_in_one_resident_group_that_gave_its_memory_back(sweep):
    """Issue 24: executor auto puts a sweep's runs in the resident group of their shape; the
    manifest and groups.json say where each trained, and what each run left behind."""
    root, _ = sweep
    m = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False).set_index("run")
    assert list(m["resident_group"]) == ["g1 run 1", "g1 run 2"]
    # No process start-up for the second run: the group's workers took it at once.
    assert float(m["startup_s"].iloc[1]) < 5, m["startup_s"]
    # The group imported the model code before its first run: counted as that run's imports.
    parts = [dict(p.split("=") for p in b.split()) for b in m["startup_breakdown"]]
    assert float(parts[0]["imports"]) > 0.5 and float(parts[1]["imports"]) < 0.1, parts
    (group,) = json.loads((root / "groups.json").read_text())["groups"]
    assert group["group"] == "g1" and group["ended"] == "closed at the end of the sweep"
    assert group["shape"]["train_workers"] == 2
    assert [r["run"] for r in group["runs"]] == list(m.index)
    assert {r["outcome"] for r in group["runs"]} == {"ok"}
    # Memory back at the baseline: the second run leaves the process (RSS) within 64 MB of where
    # the first left it (the first imports transformers' models, once per process); no loader
    # worker or thread of a run outlives it.
    first, second = (r["memory_after"] for r in group["runs"])
    assert abs(second["rss_mb"] - first["rss_mb"]) < 64, (first, second)
    before = group["runs"][0]["memory_before"]
    for done in (first, second):
        assert done["children"] == 0 and done["threads"] == before["threads"], (before, done)
    # Each release is timed by part. The heap was frozen after the imports, so its collections
    # walk only the run's objects: a few ms (walking the ~460k objects torch, Ray and
    # transformers made takes 0.2-0.4 s per collection here).
    for done in (first, second):
        assert sum(done["release_parts"].values()) == pytest.approx(done["release_s"], abs=0.01)
        assert done["release_parts"]["collect"] < 0.1, done


def test_the_sweep_writes_the_files_and_columns_recorded_before_the_restructuring(sweep):
    """Issue 23 moved every module; the files, their columns and keys stay the same."""
    assert check_layout(sweep[0], "smoke_sweep") == []


def test_tensorboard_finds_every_runs_samples_per_s_series(sweep):
    root, _ = sweep
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    timing = pd.read_parquet(root / "timing.parquet")
    for run in ("sweep_z0_mb4_nw0_pf2_r1", "sweep_z0_mb8_nw0_pf2_r1"):
        acc = EventAccumulator(str(root / "tensorboard" / run))
        acc.Reload()
        series = [(e.step, e.value) for e in acc.Scalars("perf/samples_per_s")]
        rows = timing[timing["run"] == run].sort_values("step")
        assert [s for s, _ in series] == list(rows["step"]) == [5, 10, 15, 20, 25, 30]
        assert [v for _, v in series] == pytest.approx(list(rows["samples_per_s"]), rel=1e-6)


def test_report_html_has_every_section_filled_and_opens_in_chromium(sweep, tmp_path):
    from tests.test_report import CHROMIUM, check_filled, chromium_dom, read_sections

    root, out = sweep
    page = root / "report.html"
    assert f"report: {page}" in out.stdout and page.stat().st_size < 3_000_000
    found = check_filled(page.read_text())
    for key in ("throughput", "iteration", "data", "host"):
        assert found.images[key] == 1, key  # drawn from this sweep's rows
    assert "no GPU samples: this sweep ran on CPUs" in found.text["gpu"]
    assert "timing_ranks=all" in found.text["skew"]
    assert "1 ok runs < 3" in found.text["stability"]  # one repeat: no Phase B verdict passes
    assert "sweep_z0_mb4_nw0_pf2_r1:" in found.text["stability"]  # a leak line per run
    assert "torch" in found.text["environment"] and "git_commit_short" in found.text["environment"]
    if CHROMIUM:
        assert list(read_sections(chromium_dom(page, tmp_path)).text) == list(found.text)


def test_sweep_exits_0_and_prints_progress_and_ranking(sweep):
    root, out = sweep
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "[1/2] sweep_z0_mb4_nw0_pf2_r1: step 5/30" in out.stdout
    assert "[2/2] sweep_z0_mb8_nw0_pf2_r1: ok in" in out.stdout
    assert "groups ranked by tail samples/s" in out.stdout
    assert "2/2 runs ok" in out.stdout


def test_timing_parquet_has_plausible_windows(sweep):
    root, _ = sweep
    df = pd.read_parquet(root / "timing.parquet")
    assert set(df["run"]) == {"sweep_z0_mb4_nw0_pf2_r1", "sweep_z0_mb8_nw0_pf2_r1"}
    assert (df.groupby("run").size() == 6).all()  # 30 steps / log_every 5
    assert (df["step_ms_p50"] > 0).all()
    assert (df["iter_ms_p50"] >= df["step_ms_p50"]).all()
    assert (df["data_ms_p50"] >= 0).all() and (df["report_ms"] >= 0).all()
    # The training thread's CPU time per step: some, and never more than the steps took (one
    # thread cannot compute longer than the wall clock ran).
    assert (df["cpu_ms_mean"] > 0).all()
    assert (df["cpu_ms_mean"] <= df["step_ms_mean"] + df["data_ms_mean"] + 1.0).all()
    assert (df["gc_collections"] >= 0).all() and (df["gc_ms"] >= 0).all()
    expected = df["global_batch"] / (df["iter_ms_mean"] / 1000.0)
    assert ((df["samples_per_s"] / expected - 1).abs() < 0.05).all()
    assert (df["world_size"] == 2).all()
    assert set(df.loc[df["run"].str.contains("mb8"), "global_batch"]) == {16}
    # A random model's global contrastive loss starts near ln(global batch).
    first = df[df["window"] == 0].set_index("run")
    for run, row in first.iterrows():
        assert row["loss"] == pytest.approx(math.log(row["global_batch"]), rel=0.3), run
    assert (df["startup_s"] > 0).all() and df["loss"].map(math.isfinite).all()
    # Real crops of 1-3 s (limit_longest): some padding in every batch, audio throughput
    # between 1x and 3x samples/s.
    assert ((df["padding_ratio"] > 0) & (df["padding_ratio"] < 0.67)).all()
    assert (df["audio_s_per_s"] >= df["samples_per_s"] * 0.99).all()
    assert (df["audio_s_per_s"] <= df["samples_per_s"] * 3.01).all()
    # FLOPs are counted on the CPU too; MFU and peak memory need a GPU (NaN here).
    assert (df["flops_per_sample"] > 0).all() and (df["model_tflops_per_s"] > 0).all()
    assert df["mfu"].isna().all() and df["peak_mem_gib"].isna().all()


def test_manifest_lists_both_runs_ok_with_figures_that_match_the_parquet(sweep):
    root, _ = sweep
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t")
    assert list(manifest["status"]) == ["ok", "ok"]
    assert list(manifest["last_step"]) == [30, 30]
    assert (manifest["duration_sec"] > 0).all()
    for column in ("micro_batch", "num_workers", "strategy", "bucket_mb", "max_steps", "use_gpu"):
        assert column in manifest
    assert list(manifest["micro_batch"]) == [4, 8]
    # Re-derive the tail figure from the Parquet rows: mean of the last 3 windows after the first.
    df = pd.read_parquet(root / "timing.parquet")
    for _, row in manifest.iterrows():
        windows = df[df["run"] == row["run"]].sort_values("window")
        tail = windows.iloc[tail_start(len(windows), 3) :]
        assert row["tail_samples_per_sec_mean"] == pytest.approx(
            tail["samples_per_s"].mean(), rel=1e-4
        )
        assert row["tail_mean_iter_p50_ms"] == pytest.approx(tail["iter_ms_p50"].mean(), rel=1e-4)
        # Where the start-up went: the parts add up to startup_s (trial start to first step).
        parts = {k: float(v) for k, v in (p.split("=") for p in row["startup_breakdown"].split())}
        assert {"imports", "model_build", "wrap", "first_step"} <= set(parts), parts
        assert sum(parts.values()) == pytest.approx(row["startup_s"], abs=0.2)
        assert row["compile_s"] == 0  # nothing compiled


def test_the_space_corpus_was_generated_and_prepared_before_the_runs(sweep):
    root, out = sweep
    assert (
        "data: synthetic corpus" in out.stdout
        and "32 written, 0 skipped as done, 0 errors" in out.stdout
    )
    prepared = root / "data" / "prepared" / "manifest_16k_trim.tsv"
    corpus = pd.read_csv(prepared, sep="\t", keep_default_na=False)
    assert len(corpus) == 32 and (corpus["sample_rate"] == 16000).all()
    assert all((prepared.parent / p).is_file() for p in corpus["path"])
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t")
    assert set(manifest["manifest_path"]) == {str(prepared)}


def test_best_config_names_the_fastest_group_with_its_full_config(sweep):
    root, _ = sweep
    best = json.loads((root / "best_config.json").read_text())
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t")
    fastest = manifest.sort_values("tail_samples_per_sec_mean").iloc[-1]["group"]
    assert best["group"] == fastest
    assert best["config"]["micro_batch"] == best["swept"]["micro_batch"]
    assert best["config"]["train_workers"] == 2 and best["config"]["use_gpu"] is False
    for run in manifest["run"]:
        saved = json.loads((root / "runs" / run / "config.json").read_text())
        assert saved["run"] == run and saved["config"]["max_steps"] == 30
    assert not list(root.rglob(".*.tmp"))  # no temporary file left behind


def test_the_same_loop_under_torchrun_matches_and_the_ratio_is_written(sweep):
    root, _ = sweep
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.ray_vs_torchrun", "--output-root", str(root)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads((root / "ray_vs_torchrun.json").read_text())
    assert result["nproc"] == 2 and result["ray_over_torchrun"] > 0
    best = json.loads((root / "best_config.json").read_text())
    ray = pd.read_parquet(root / "timing.parquet")
    ray_first = ray[(ray["group"] == best["group"]) & (ray["window"] == 0)]["loss"].item()
    torch_rows = [
        json.loads(line)
        for line in (root / "torchrun" / "torchrun_timing.jsonl").read_text().splitlines()
    ]
    # Same seed, same data order, same model: the first window's loss is the same number.
    assert torch_rows[0]["loss"] == pytest.approx(ray_first, abs=1e-5)
    assert len(torch_rows) == 6 and torch_rows[-1]["step"] == 30


def test_the_analysis_files_agree_with_the_timing_rows(sweep):
    root, out = sweep
    per_run = pd.read_csv(root / "per_run_metrics.csv").set_index("run")
    df = pd.read_parquet(root / "timing.parquet")
    for run, row in per_run.iterrows():
        windows = df[df["run"] == run].sort_values("window")
        tail = windows.iloc[tail_start(len(windows), 3) :]
        assert row["tail_samples_per_sec_mean"] == pytest.approx(tail["samples_per_s"].mean())
        ratios = tail["iter_ms_p90"] / tail["iter_ms_p50"].clip(lower=1.0)
        assert row["iter_p90_over_p50"] == pytest.approx(ratios.mean())
    ranked = pd.read_csv(root / "ranked_groups.csv")
    best = json.loads((root / "best_config.json").read_text())
    assert ranked.loc[0, "group"] == best["group"] and list(ranked["rank"]) == [1, 2]
    # The space's baseline (micro_batch 4): every group's samples/s over the baseline's.
    base = ranked[ranked["baseline"]]
    assert list(base["group"]) == ["sweep_z0_mb4_nw0_pf2"] and base["vs_baseline"].item() == 1.0
    other = ranked[~ranked["baseline"]].iloc[0]
    assert other["vs_baseline"] == pytest.approx(
        other["tail_samples_per_sec_robust"] / base["tail_samples_per_sec_robust"].item()
    )
    assert "| x baseline |" in (root / "summary.md").read_text()
    # benchmarks.fastest's table reads the same files: the baseline ratio, the figures per run.
    from benchmarks.fastest import group_table

    table = group_table(root).set_index("group")
    assert table.loc[other["group"], "vs_baseline"] == pytest.approx(other["vs_baseline"])
    assert bool(table.loc["sweep_z0_mb4_nw0_pf2", "baseline"])
    assert (table["startup_breakdown"].str.contains("first_step=")).all()
    assert best["command"] == f"python -m platform.train --config {root / 'best_config.json'}"
    assert f"train with it: {best['command']}" in out.stdout
    # The printed command trains the winner: its plan is the winner's config, training on.
    plan = run_module(*best["command"].split()[2:], "--dry-run")
    assert plan.returncode == 0, plan.stderr
    shown = plan.stdout.split()  # key=value pairs, grouped by family and wrapped
    assert f"micro_batch={best['config']['micro_batch']}" in shown
    assert "checkpoint_every=5" in shown and "max_failures=3" in shown
    assert (root / "summary.md").read_text().startswith("# Sweep summary")
