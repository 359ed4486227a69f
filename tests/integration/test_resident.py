"""Resident worker groups (executor: resident) against fresh processes per run, with real Ray
Train workers (gloo): the same losses step for step, the same ranking, memory back where it was
after each run; and the failure paths of a resident group (a hang, an exception), each failing
its own trial with today's reason while the next run trains on a rebuilt group. The kill -9 of a
resident worker, the race and --resume on resident groups are in test_interrupt_resume.py and
test_race_sweep.py (resident is the default)."""

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.integration.helpers import run_tune, smoke_manifest

pytestmark = pytest.mark.integration


def manifest(root: Path) -> pd.DataFrame:
    return pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False).set_index("run")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The smoke sweep with fresh processes (1 repeat) and in a resident group (2 repeats), on
    one prepared corpus (one tokenizer: the same token ids in both)."""
    base = tmp_path_factory.mktemp("resident")
    corpus = smoke_manifest(base / "corpus")
    out = {}
    for executor, repeats in (("fresh", 1), ("resident", 2)):
        root = base / executor
        done = run_tune(
            "smoke",
            root,
            f"executor={executor}",
            f"repeats={repeats}",
            f"manifest_path={corpus}",
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        out[executor] = root
    return out


def test_resident_runs_give_the_losses_and_ranking_of_fresh_runs(pair):
    fresh, resident = (pd.read_parquet(pair[e] / "timing.parquet") for e in ("fresh", "resident"))
    keys = ["run", "rank", "window"]
    both = fresh[keys + ["loss"]].merge(resident[keys + ["loss"]], on=keys, suffixes=("_f", "_r"))
    assert len(both) == len(fresh) == 12  # 2 runs x 6 windows (rank 0's: timing_ranks rank0)
    # Bit-exact: the same seeds, data order and kernels; nothing of an earlier run leaks in.
    assert (both["loss_f"] == both["loss_r"]).all(), both
    r1 = resident[resident["repeat"] == 1].sort_values(keys)
    r2 = resident[resident["repeat"] == 2].sort_values(keys)
    assert list(r1["loss"]) == list(r2["loss"])  # the 3rd and 4th run in the group, too
    ranking = {
        e: [g["group"] for g in json.loads((pair[e] / "summary.json").read_text())["ranking"]]
        for e in pair
    }
    assert ranking["fresh"] == ranking["resident"]


def test_the_manifest_and_groups_json_say_where_each_run_trained(pair):
    m = manifest(pair["resident"])
    assert set(m["executor"]) == {"resident"}
    assert set(manifest(pair["fresh"])["executor"]) == {"fresh"}
    assert list(m["resident_group"]) == [f"g1 run {i}" for i in range(1, 5)]
    # No process start-up after the first run: the group's workers took the run at once.
    assert (m["startup_s"].iloc[1:] < 5).all(), m["startup_s"]
    # The group imported the model code before its first run: counted as that run's imports.
    parts = [dict(p.split("=") for p in b.split()) for b in m["startup_breakdown"]]
    assert float(parts[0]["imports"]) > 0.5 and all(float(p["imports"]) < 0.1 for p in parts[1:])
    assert (manifest(pair["fresh"])["startup_s"] > 5).all()
    groups = json.loads((pair["resident"] / "groups.json").read_text())["groups"]
    assert [g["group"] for g in groups] == ["g1"]
    (group,) = groups
    assert group["ended"] == "closed at the end of the sweep"
    assert group["shape"]["train_workers"] == 2
    assert [r["run"] for r in group["runs"]] == list(m.index)
    assert {r["outcome"] for r in group["runs"]} == {"ok"}
    # Memory back at the baseline: each later run leaves the process (RSS) within 64 MB of where
    # the first left it (the first imports transformers' models, once per process).
    after = [r["memory_after"]["rss_mb"] for r in group["runs"]]
    assert all(abs(a - after[0]) < 64 for a in after[1:]), after
    # Each release is timed by part. The heap was frozen after the imports, so its collections
    # walk only the run's objects: a few ms (walking the ~460k objects torch, Ray and
    # transformers made takes 0.2-0.4 s per collection here).
    for r in group["runs"]:
        done = r["memory_after"]
        assert sum(done["release_parts"].values()) == pytest.approx(done["release_s"], abs=0.01)
        assert done["release_parts"]["collect"] < 0.1, done


FAULTS = """
description: a resident group's failure paths - a hang, an exception, then a clean run
repeats: 1
max_concurrent_trials: 1
resources: {train_workers: 1, use_gpu: false, cpus_per_worker: 1}
cases:
  - {inject_sleep_at_step: 3, inject_error_at_step: 0}
  - {inject_sleep_at_step: 0, inject_error_at_step: 3}
  - {inject_sleep_at_step: 0, inject_error_at_step: 0}
fixed:
  executor: resident
  strategy: ddp
  num_workers: 0
  dataset: synthetic
  audio_s: 1.0
  micro_batch: 2
  text_tokens: 8
  model_size: tiny
  proj_dim: 32
  max_steps: 10
  log_every: 2
  tail_timing_points: 2
  inject_sleep_s: 600.0
  stall_timeout_s: 4.0
"""


def test_a_hang_and_an_error_fail_their_own_runs_and_the_next_run_gets_a_new_group(tmp_path):
    space = tmp_path / "resident_faults.yaml"
    space.write_text(FAULTS)
    root = tmp_path / "out"
    done = run_tune(str(space), root, timeout=400)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]  # runs failed
    m = manifest(root)
    hang, error, clean = m.index
    assert list(m["status"]) == ["stalled", "failed", "ok"]
    assert list(m["exit_code"]) == [124, 1, 0]
    # The one worker stuck in its sleep wrote its stacks, then ended its process (no collective
    # would time out with one worker): the sweep went on.
    assert m.loc[hang, "failure_reason"].startswith("stalled: no progress for stall_timeout_s")
    assert (root / "runs" / hang / "stacks-rank0.txt").is_file()
    assert "injected error at step 3 on rank 0" in m.loc[error, "failure_reason"]
    assert list(m["resident_group"]) == ["g1 run 1", "g2 run 1", "g3 run 1"]
    groups = json.loads((root / "groups.json").read_text())["groups"]
    assert [g["group"] for g in groups] == ["g1", "g2", "g3"]
    assert groups[0]["ended"].startswith("failed")
    assert "injected error" in groups[1]["ended"]
    assert groups[2]["ended"] == "closed at the end of the sweep"
    assert [r["outcome"] for r in groups[2]["runs"]] == ["ok"]
    assert int(m.loc[clean, "last_step"]) == 10
