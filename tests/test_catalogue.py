"""The catalogue (platform/storage/catalogue.py, platform/analysis/history.py and priors.py,
platform.catalogue): two writers at once lose no row, a host's fingerprint changes with its torch, a known out of
memory point is skipped with its reason, comparisons carry a noise band, the CLI's lines."""

from __future__ import annotations

import json
import math
import multiprocessing
import subprocess
import sys
import time

import pandas as pd
import pytest

from platform.analysis.history import compare, ratio_band, sweeps
from platform.analysis.priors import known_failures, prior_line, race_priors, warm_start
from platform.execution.resources import resolve_executors
from platform.spaces.expand import expand_runs
from platform.spaces.load import load_space
from platform.storage.catalogue import append, cost_key, fingerprint, host_now, read

H200 = {"gpu": "NVIDIA H200", "gpus": 2, "driver": "580.159.04", "cuda": "13.0",
        "torch": "2.11.0+cu130", "ray": "2.60.0", "deepspeed": "0.19.8", "platform": "0.1.0"}  # fmt: skip


def row(sweep, run, group, key, sps, status="ok", reason="", host=H200, ts=None, repeat=1,
        jitter=1.05, windows=None, rank=None, log_every=4):  # fmt: skip
    return {"sweep": sweep, "kind": "sweep", "output_root": f"/o/{sweep}", "space": "s",
            "host": fingerprint(host), **host, "run": run, "group": group, "repeat": repeat,
            "status": status, "failure_reason": reason, "cost_key": key,
            "config": json.dumps({"log_every": log_every}),
            "tail_samples_per_sec_mean": sps, "iter_p90_over_p50": jitter,
            "ts": ts or time.time(), "window_samples_per_s": windows,
            "tail_windows": None if windows is None else len(windows),
            "group_rank": rank}  # fmt: skip


def steady(mean, n=8):
    """A run's windows about ``mean``, +-0.5 %."""
    return [mean * (1 + d) for d in ([-0.005, 0.005] * n)[:n]]


def _writer(folder, n, tag):
    rows = [row(f"sweep-{tag}", f"run{i}", "g", "k", 100.0 + i) for i in range(n)]
    for i in range(0, n, 10):  # many small files, each written whole, while the other writes
        append(rows[i : i + 10], folder)


def test_two_writers_at_once_lose_no_row(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(tmp_path, 200, tag)) for tag in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    rows = read(tmp_path).to_pandas()
    assert len(rows) == 400 and set(rows["sweep"]) == {"sweep-a", "sweep-b"}
    assert not list(tmp_path.glob("*.tmp*"))  # no temporary left behind


def test_a_new_torch_is_a_new_host_and_this_machine_is_one_host():
    assert fingerprint(H200) != fingerprint({**H200, "torch": "2.12.0+cu130"})
    assert fingerprint(H200) == fingerprint(dict(H200))
    now = host_now()  # NVML and the installed versions, no torch import
    assert now["torch"] and now["ray"] and fingerprint(now) == fingerprint(host_now())


def test_a_resumed_sweeps_rows_replace_its_earlier_ones(tmp_path):
    append([row("s1", "r1", "g", "k", 100.0, status="interrupted")], tmp_path)
    append([row("s1", "r1", "g", "k", 110.0)], tmp_path)
    rows = read(tmp_path).to_pandas()
    assert rows["status"].tolist() == ["ok"] and rows["tail_samples_per_sec_mean"].tolist() == [110]


def race_runs():
    space = load_space("cpu_race").with_overrides(["scheduler=race"])
    return resolve_executors(expand_runs(space), training=False)


def test_warm_start_orders_by_what_was_measured_and_skips_a_known_oom(tmp_path):
    runs = race_runs()
    keys = {r.group: cost_key(r.config) for r in runs}
    groups = list(keys)
    host = fingerprint(H200)
    rows = pd.DataFrame([
        row("old", "a", groups[2], keys[groups[2]], 50.0),
        row("old", "b", groups[1], keys[groups[1]], 20.0),
        row("old", "j", groups[0], keys[groups[0]], 80.0, jitter=3.0),  # faster, jittery
        row("old", "c", groups[3], keys[groups[3]], 0.0, status="failed",
            reason="CUDA out of memory. Tried to allocate 2.00 GiB"),
        row("other", "d", groups[0], keys[groups[0]], 999.0, host={**H200, "torch": "2.12"}),
    ])  # fmt: skip
    ordered, skips, lines = warm_start(runs, rows, host)
    first_round = [r.group for r in ordered if r.repeat == 1]
    # Measured here: the steady groups fastest first, then the jittery one (a race's leader
    # must be steady), then what this host never measured (another host's figures do not count).
    assert first_round == [groups[2], groups[1], groups[0], groups[3]]
    assert set(skips) == {r.name for r in runs if r.group == groups[3]}
    assert all("out of memory" in why and "sweep old" in why for why in skips.values())
    assert sum(line.startswith(f"history: skipping {groups[3]}:") for line in lines) == 1
    # An OOM point that later ran ok there is no longer known to fail.
    later = pd.concat([rows, pd.DataFrame([row("new", "e", groups[3], keys[groups[3]], 30.0)])])
    assert keys[groups[3]] not in known_failures(later, host)


def test_compare_gives_ratios_with_a_noise_band():
    a = pd.DataFrame([row("a", f"r{i}", "g", "k", v) for i, v in enumerate([100, 102, 98])])
    same = pd.DataFrame([row("b", f"r{i}", "g", "k", v) for i, v in enumerate([101, 99, 100])])
    faster = pd.DataFrame([row("b", f"r{i}", "g", "k", v) for i, v in enumerate([130, 131])])
    one = pd.DataFrame([row("b", "r0", "g", "k", 100.0), row("b", "r1", "h", "x", 5.0)])
    assert compare(a, same).iloc[0]["within_noise"]
    fast = compare(a, faster).iloc[0]
    assert fast["ratio"] == pytest.approx(1.305) and not fast["within_noise"]
    single = compare(a, one)  # one run a side: the noise floor
    assert len(single) == 1 and single.iloc[0]["high"] - single.iloc[0]["low"] == pytest.approx(
        0.04
    )


def catalogue(*args, env=None):
    return subprocess.run([sys.executable, "-m", "platform.catalogue", *args],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip


def test_the_command_lists_compares_and_refuses_in_one_line(tmp_path):
    append([row("sweepA-1", "r1", "g", "k", 100.0), row("sweepA-1", "r2", "g", "k", 101.0)],
           tmp_path)  # fmt: skip
    append([row("sweepB-2", "r1", "g", "k", 120.0, host={**H200, "torch": "2.12"})], tmp_path)
    out = catalogue("list", "--catalogue", str(tmp_path))
    assert out.returncode == 0 and "sweepA-1" in out.stdout and "sweepB-2" in out.stdout
    out = catalogue("compare", "torch:2.11", "torch:2.12", "--catalogue", str(tmp_path))
    assert out.returncode == 0 and "1.194x" in out.stdout, out.stdout + out.stderr
    out = catalogue("compare", "nosuch", "sweepB", "--catalogue", str(tmp_path))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "nosuch" in out.stderr


def test_no_history_restores_the_cold_order_and_skips_nothing(tmp_path):
    import os

    runs = race_runs()
    groups = list(dict.fromkeys(r.group for r in runs))
    keys = {r.group: cost_key(r.config) for r in runs}
    here = host_now()
    append([
        row("old", "a", groups[3], keys[groups[3]], 90.0, host=here, windows=steady(90)),
        row("old", "b", groups[1], keys[groups[1]], 0.0, "failed", "out of memory", host=here),
    ], tmp_path / "catalogue")  # fmt: skip
    env = {**os.environ, "STAGE1_CACHE_DIR": str(tmp_path)}
    args = ["--space", "cpu_race", "--set", "scheduler=race", "--dry-run"]
    warm = subprocess.run([sys.executable, "-m", "platform.tune", *args], capture_output=True,
                          text=True, env=env, timeout=120)  # fmt: skip
    cold = subprocess.run([sys.executable, "-m", "platform.tune", *args, "--no-history"],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert warm.returncode == cold.returncode == 0, warm.stderr + cold.stderr
    assert (
        f"history: skipping {groups[1]}: known to fail on this host: out of memory" in warm.stdout
    )
    assert "history: race priors for 1 of 4 group(s)" in warm.stdout
    assert "catalogue runs stand in for its repeats" in warm.stdout  # --history confirm
    assert "history:" not in cold.stdout
    order = subprocess.run([sys.executable, "-m", "platform.tune", *args, "--history", "order"],
                           capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert order.returncode == 0 and "(not counted as this sweep's measurements)" in order.stdout
    both = subprocess.run([sys.executable, "-m", "platform.tune", *args, "--no-history",
                           "--history", "confirm"], capture_output=True, text=True, env=env,
                          timeout=120)  # fmt: skip
    assert both.returncode == 2 and both.stderr.count("\n") == 1 and "disagree" in both.stderr

    def first_listed(text):  # the plan's first run, in the order the runs go
        return next(line.split()[1] for line in text.splitlines() if line.strip().startswith("1 "))

    assert first_listed(warm.stdout).startswith(groups[3])  # measured here: first
    assert first_listed(cold.stdout).startswith(groups[0])  # the space's order


def test_a_fresh_machine_lists_nothing_and_a_broken_file_is_skipped_in_one_line(tmp_path):
    import os

    env = {**os.environ, "STAGE1_CACHE_DIR": str(tmp_path / "fresh")}
    out = catalogue(env=env)
    assert out.returncode == 0 and "no sweep in the catalogue" in out.stdout, out.stderr
    out = catalogue("compare", "a", env=env)  # a wrong count: said before anything is read
    assert out.returncode == 2 and "compare takes two sides" in out.stderr
    append([row("s1", "r1", "g", "k", 100.0)], tmp_path / "cat")
    (tmp_path / "cat" / "junk.parquet").write_text("not parquet")
    rows = read(tmp_path / "cat").to_pandas()
    assert len(rows) == 1


def test_this_machine_is_the_same_host_to_a_sweep_and_to_its_runs_records(tmp_path):
    from importlib import metadata

    from platform.storage.catalogue import host_of_env

    now = host_now()
    env = {"torch": metadata.version("torch"), "ray": metadata.version("ray"),
           "deepspeed": metadata.version("deepspeed"), "cuda": now["cuda"] or None,
           "gpus": [now["gpu"]] * now["gpus"] if now["gpus"] else [],
           "driver": now["driver"] or None}  # fmt: skip
    assert fingerprint(host_of_env(env)) == fingerprint(now)


def test_compares_band_tells_a_clearly_different_pair_from_an_equal_one():
    """Two runs a side, steady windows. Welch on the two runs' means (t at 1-2 degrees of
    freedom) held 1 for a 9.8 % difference; the windows' band does not, and still calls a
    pair 1 % apart within noise."""
    a = pd.DataFrame([row("a", f"r{i}", "g", "k", v, windows=steady(v))
                      for i, v in enumerate([100, 104])])  # fmt: skip
    faster = pd.DataFrame([row("b", f"r{i}", "g", "k", v, windows=steady(v))
                           for i, v in enumerate([110, 114])])  # fmt: skip
    equal = pd.DataFrame([row("b", f"r{i}", "g", "k", v, windows=steady(v))
                          for i, v in enumerate([101, 103])])  # fmt: skip
    fast = compare(a, faster).iloc[0]
    assert fast["ratio"] == pytest.approx(1.098, abs=1e-3) and not fast["within_noise"]
    assert (fast["a_windows"], fast["b_windows"]) == (16, 16)
    welch_half = 12.706 * 1.098 * (8 / 102**2 + 8 / 112**2) ** 0.5  # the old band, 1 dof
    assert fast["ratio"] - welch_half < 1.0  # it held 1
    assert compare(a, equal).iloc[0]["within_noise"]
    failed = pd.DataFrame([row("b", "r0", "g", "k", 0.0, status="failed", reason="boom")])
    assert compare(a, failed).empty  # no ok run on one side: nothing to compare


def test_compare_and_the_list_count_a_warm_races_runs_stopped_once_confirmed():
    """A warm race's runs stop once they confirm their prior (stopped_early, as far as they
    ran): compare holds them as that side's runs, and the list gives the sweep's best group its
    figure from them; a skipped run counts nowhere."""
    cold = pd.DataFrame([row("cold", f"r{i}", "g", "k", v, windows=steady(v))
                         for i, v in enumerate([100, 102])])  # fmt: skip
    warm = pd.DataFrame([
        row("warm", "r1", "g", "k", 101.0, status="stopped_early", windows=steady(101, 3), rank=1),
        row("warm", "r2", "g", "k", math.nan, status="skipped"),
    ])  # fmt: skip
    (shared,) = compare(cold, warm).to_dict("records")
    assert (shared["a_runs"], shared["b_runs"], shared["b_windows"]) == (2, 1, 3)
    assert shared["within_noise"] and shared["ratio"] == pytest.approx(101 / 101)
    listed = sweeps(warm).iloc[0]
    assert (listed["best"], listed["samples_per_s"], listed["ok"]) == ("g", 101.0, 0)


def test_the_run_to_run_term_counts_when_pooled_over_enough_configurations():
    """3 % apart on one run a side each, windows tight: outside the windows' band, inside once
    the run-to-run spread (2 %) is pooled over 8 degrees of freedom; 2 are not enough."""
    ratio, low, high = ratio_band([100.0], [103.0], steady(100), steady(103), (0.02, 8))
    assert low <= 1.0 <= high and high - ratio == pytest.approx(ratio * 2.306 * 0.02 * 2**0.5,
                                                                 rel=1e-3)  # fmt: skip
    _, low, _ = ratio_band([100.0], [103.0], steady(100), steady(103), (0.02, 2))
    assert low > 1.0


def test_a_sweeps_best_is_its_rankings_first():
    """Race 2 of benchmarks/results/warm_race_2xh200: mb192 nw6 had the higher mean but left
    the race unstable; the sweep ranked mb192 nw8 first. Rows without the rank: the fastest
    steady group."""
    rows = pd.DataFrame([
        row("s", "a", "nw6", "k6", 1709.4, rank=2), row("s", "b", "nw8", "k8", 1704.1, rank=1),
    ])  # fmt: skip
    assert sweeps(rows).iloc[0]["best"] == "nw8"
    assert sweeps(rows).iloc[0]["samples_per_s"] == 1704.1
    old = pd.DataFrame([
        row("s", "a", "jit", "kj", 1800.0, jitter=3.0), row("s", "b", "nw8", "k8", 1704.1),
    ])  # fmt: skip
    assert sweeps(old).iloc[0]["best"] == "nw8"


def test_race_priors_are_this_hosts_runs_of_the_same_config_after_the_warm_up():
    runs = race_runs()
    plan = load_space("cpu_race").with_overrides(["scheduler=race"]).scheduler
    keys = {r.group: cost_key(r.config) for r in runs}
    g = list(keys)
    host = fingerprint(H200)
    warmup = [1.0] * plan.warmup_windows  # the cold start's windows: left out
    rows = pd.DataFrame([
        row("old", "a1", g[0], keys[g[0]], 100.0, windows=warmup + steady(100)),
        row("old", "a2", g[0], keys[g[0]], 100.0, windows=warmup + steady(101)),
        row("old", "b1", g[1], keys[g[1]], 80.0, windows=warmup + steady(80)),
        row("old", "b2", g[1], keys[g[1]], 80.0, windows=warmup + steady(81)),
        row("old", "c1", g[2], keys[g[2]], 99.5, windows=warmup + steady(99.5)),
        row("new", "x1", g[3], keys[g[3]], 500.0, windows=steady(500),
            host={**H200, "torch": "2.12"}),  # another host: no prior
        row("old", "d1", g[3], keys[g[3]], 0.0, status="failed", reason="boom"),
        # A warm race's run stopped once confirmed (warm-up + 2 windows), and a run logged
        # every 8 steps: neither is a prior run.
        row("warm", "a3", g[0], keys[g[0]], 50.0, status="stopped_early",
            windows=warmup + steady(50, 2)),
        row("old", "a4", g[0], keys[g[0]], 50.0, windows=warmup + steady(50), log_every=8),
    ])  # fmt: skip
    priors = race_priors(runs, rows, host, plan)
    assert set(priors.groups) == {g[0], g[1], g[2]}
    assert [r.run for r in priors.groups[g[0]].runs] == ["a1", "a2"]
    assert priors.groups[g[0]].windows == steady(100) + steady(101)
    assert priors.noise[1] == 2  # two groups with two runs
    assert priors.clearly_slower(g[1], g[0]) and not priors.clearly_slower(g[2], g[0])
    (line,) = prior_line(priors, [r.group for r in runs], plan, "order")
    assert f"leader there: {g[0]}" in line and f"{g[1]} (0.80x)" in line and g[2] + " (" not in line
    (line,) = prior_line(priors, [r.group for r in runs], plan)  # --history confirm
    assert "3 of 4 group(s)" in line and "(5 run(s), sweep(s) old)" in line
    assert "catalogue runs stand in for its repeats" in line
    # Each run as the ranking would pool it: its tail figures and its tail windows.
    first = priors.groups[g[0]].runs[0]
    assert (first.sweep, first.run, first.samples_per_s, first.status) == ("old", "a1", 100.0, "ok")
    assert len(first.tail) == len(warmup + steady(100))  # tail_windows: the whole row here


def test_a_sweeps_rows_keep_each_runs_windows_and_its_groups_rank(tmp_path):
    from platform.storage import results
    from platform.storage.catalogue import rows_of
    from stage1_common.output_root import OutputRoot
    from trainables.config import TrialConfig

    root = OutputRoot(tmp_path / "root")
    root.timing.mkdir(parents=True)
    timing = [{"run": "r1", "group": "g", "rank": rank, "window": w, "attempt": 0,
               "samples_per_s": 100.0 + w + 1000 * rank} for w in (1, 0, 2) for rank in (0, 1)]  # fmt: skip
    results.write_part(root.timing, "r1-0", timing, results.TIMING_SCHEMA)
    manifest = [{"run": "r1", "group": "g", "repeat": 1, "status": "ok",
                 "git_commit_hash": "c0ffee" * 6 + "ab"},
                {"run": "r2", "group": "g", "repeat": 2, "status": "skipped"}]  # fmt: skip
    configs = {"r1": TrialConfig(manifest_path="/d/train.tsv"), "r2": TrialConfig()}
    rows = rows_of(root, manifest, configs, kind="sweep", space="s", ranks={"g": 1})
    assert rows[0]["window_samples_per_s"] == [100.0, 101.0, 102.0]  # rank 0, in order
    assert rows[1]["window_samples_per_s"] is None and rows[0]["group_rank"] == 1
    append(rows, tmp_path / "cat")
    back = read(tmp_path / "cat").to_pandas().set_index("run")
    assert list(back.loc["r1", "window_samples_per_s"]) == [100.0, 101.0, 102.0]
    # The commit that ran it and its corpus: what a race's prior must share to be pooled.
    assert (back.loc["r1", "git_commit"], back.loc["r1", "manifest_path"]) == (
        "c0ffee" * 6 + "ab", "/d/train.tsv")  # fmt: skip
    assert back.loc["r2", "git_commit"] == ""


def test_a_prior_of_another_corpus_is_none_and_of_another_commit_is_not_pooled():
    """Rows of the same configuration (cost key) on another corpus are no prior; rows of
    another platform commit, of an unknown one or of an unknown corpus (rows written before
    the columns) make a prior that --history confirm uses as order does, saying why."""
    runs = race_runs()
    plan = load_space("cpu_race").with_overrides(["scheduler=race"]).scheduler
    keys = {r.group: cost_key(r.config) for r in runs}
    g = list(keys)
    corpus = str(runs[0].config.manifest_path or "")
    windows = [1.0] * plan.warmup_windows + steady(100)

    def at(run, group, commit="abc", path=corpus):
        return {**row("old", run, group, keys[group], 100.0, windows=windows),
                "git_commit": commit, "manifest_path": path}  # fmt: skip

    rows = pd.DataFrame([
        at("a1", g[0]), at("a2", g[0], path="/other/corpus.tsv"),  # another corpus: left out
        at("b1", g[1], commit="def"), at("c1", g[2], commit=""), at("d1", g[3], path=None),
    ])  # fmt: skip
    priors = race_priors(runs, rows, fingerprint(H200), plan, "abc")
    assert [r.run for r in priors.groups[g[0]].runs] == ["a1"]
    assert priors.groups[g[0]].order_only == ""
    assert priors.groups[g[1]].order_only == "catalogue run(s) of commit def, this sweep abc"
    assert priors.groups[g[2]].order_only == "catalogue run(s) of an unknown commit"
    assert priors.groups[g[3]].order_only == "catalogue run(s) of an unknown corpus"
    unknown = race_priors(runs, rows, fingerprint(H200), plan, None)
    assert unknown.groups[g[0]].order_only == "this sweep's commit is unknown"
    (line,) = prior_line(priors, [r.group for r in runs], plan)
    assert f"; as --history order, never pooled: {g[1]} (catalogue run(s) of commit def" in line
