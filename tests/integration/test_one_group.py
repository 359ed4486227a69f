"""Time to answer (issue 40) on a real local Ray cluster: runs that differ only in CPU-side keys
(loader workers) train in one resident group, sized for the most demanding of them, and
compiled code is kept per machine, not per output root: a second sweep in a new root finds the
graphs the first one compiled (the manifest's ``compile_cache``)."""

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.integration.helpers import LiveCli, run_tune

pytestmark = pytest.mark.integration

COMMON = """
repeats: 1
max_concurrent_trials: 1
resources: {train_workers: 1, use_gpu: false, cpus_per_worker: 0}
fixed:
  executor: resident
  strategy: ddp
  dataset: synthetic
  audio_s: 1.0
  text_tokens: 8
  model_size: tiny
  proj_dim: 32
  max_steps: 6
  log_every: 2
  tail_timing_points: 2
  compile_scope: layers
"""
# Four eager runs over loader workers x micro-batch, one compiled (inductor) run, and a run of
# another shape (its process group's timeout follows stall_timeout_s).
FIRST = (
    """
description: issue 40 - loader keys in one group; a compiled run's code kept per machine
cases:
  - {torch_compile: false, grid: {num_workers: [0, 1], micro_batch: [2, 4]}}
  - {torch_compile: true, num_workers: 0, micro_batch: 2}
  - {torch_compile: false, num_workers: 0, micro_batch: 2, stall_timeout_s: 300.0}
"""
    + COMMON
)
# The compiled run again, in a new output root.
AGAIN = """
description: issue 40 - the compiled run again, in a new output root
grid: {micro_batch: [2]}
""" + COMMON.replace("fixed:\n", "fixed:\n  torch_compile: true\n  num_workers: 0\n")


def manifest(root: Path) -> pd.DataFrame:
    return pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False).set_index("run")


def cache_counts(text: str) -> dict[str, int]:
    """'fxgraph hit=3 miss=4 aot_autograd hit=0 miss=2' -> {'fxgraph_hit': 3, ...}."""
    words, out, kind = text.split(), {}, ""
    for word in words:
        if "=" in word:
            key, value = word.split("=")
            out[f"{kind}_{key}"] = int(value)
        else:
            kind = word
    return out


def test_loader_keys_share_one_group_and_compiled_code_outlives_the_output_root(tmp_path):
    cache = tmp_path / "machine-cache"
    (tmp_path / "first.yaml").write_text(FIRST)
    (tmp_path / "again.yaml").write_text(AGAIN)
    first = LiveCli("platform.tune", "--space", tmp_path / "first.yaml", "--output-root",
                    tmp_path / "a", "--set", f"compile_cache_dir={cache}")  # fmt: skip
    # The compiled run's graphs are in the machine cache once it has ended: the second sweep
    # starts then, while the first one's last run (another shape) starts its group and ends
    # (its compile leaves a core idle; one after the other the two sweeps took ~77 s here).
    first.wait_for("_torchcompileon_stall900_r1: ok in", timeout_s=600)
    again = run_tune(
        str(tmp_path / "again.yaml"), tmp_path / "b", f"compile_cache_dir={cache}", timeout=600
    )
    first.finish(timeout_s=600)
    assert first.proc.returncode == 0, first.out[-6000:]
    m = manifest(tmp_path / "a")
    assert list(m["status"]) == ["ok"] * 6
    # One group trained the first five runs: its workers reserve 2 CPUs (one loader worker + 1),
    # the most any run of the shape needs, so runs with 0 and 1 loader workers did not need
    # groups of their own. The run of another shape came last, in a second group, whose host
    # process was the first group's (closed to make room, cleanly).
    groups = json.loads((tmp_path / "a" / "groups.json").read_text())["groups"]
    assert len(groups) == 2 and groups[0]["shape"]["cpus_per_worker"] == 2
    assert [r["outcome"] for r in groups[0]["runs"]] == ["ok"] * 5
    assert groups[1]["shape"]["cpus_per_worker"] == 1  # its own run's: 0 loader workers + 1
    assert groups[1]["host"] == groups[0]["host"]
    assert groups[0]["ended"] == "closed to make room for another shape"
    assert sorted(m["resident_group"]) == [f"g1 run {i}" for i in range(1, 6)] + ["g2 run 1"]
    # The console had nothing of Tune's about a slow callback (the recorder writes off its loop).
    assert "performance bottleneck" not in first.out

    compiled = m[m["torch_compile"].astype(str) == "True"].iloc[0]
    cold = cache_counts(compiled["compile_cache"])
    assert cold["fxgraph_miss"] > 0 and compiled["compile_s"] > 0
    assert (cache / "inductor").is_dir() and any((cache / "flops").iterdir())
    assert not (tmp_path / "a" / "cache").exists()  # nothing of it in the output root

    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    warm = manifest(tmp_path / "b").iloc[0]
    counts = cache_counts(warm["compile_cache"])
    # Every graph the first sweep compiled was found; none compiled anew.
    assert counts["fxgraph_hit"] == cold["fxgraph_miss"] + cold["fxgraph_hit"]
    assert counts["fxgraph_miss"] == 0
    assert warm["compile_s"] < compiled["compile_s"]
