"""The leak check's slope on hand-made telemetry, worked out by hand; its verdicts (a memory with
too few samples is NOT JUDGED, never OK); the CLI's lines, limits and exit codes."""

import math

import numpy as np
import pandas as pd
import pytest

from platform.analysis.verdicts.leak import LeakLimits, fit_mb_per_1k_steps, leak_figures, verdict
from platform.storage import results
from tests.cli import run_module


def timing(run="r", ts0=100.0):
    # Windows end at ts 100, 110, 120 with steps 10, 20, 30: 1 step per second.
    return pd.DataFrame(
        [
            {
                "run": run,
                "rank": 0,
                "window": i,
                "step": 10 * (i + 1),
                "window_end_ts": ts0 + 10 * i,
            }
            for i in range(3)
        ]
    )


def host(slopes_mb_per_step, ts0=100.0, run="r"):
    rows = []
    for node, per_step in slopes_mb_per_step.items():
        for ts in np.arange(ts0 - 20, ts0 + 30, 2.0):  # also before the first window
            step = 10 + (ts - ts0)  # 1 step per second
            rss = 5000.0 if ts < ts0 else 1000.0 + per_step * step  # start-up: not a leak
            rows.append({"run": run, "node": node, "ts": ts, "trainer_rss_mib": rss})
    return pd.DataFrame(rows)


def gpu(per_step, ts0=100.0, run="r"):
    rows = []
    for index, slope in enumerate(per_step):
        for ts in np.arange(ts0, ts0 + 21, 1.0):
            step = 10 + (ts - ts0)
            rows.append(
                {
                    "run": run,
                    "node": "a",
                    "gpu_index": index,
                    "ts": ts,
                    "mem_used_mib": 2000.0 + slope * step,
                }
            )
    return pd.DataFrame(rows)


def test_fit_is_mb_per_1000_steps():
    steps = np.array([0, 100, 200, 300])
    assert fit_mb_per_1k_steps(steps, 50 + 0.25 * steps) == pytest.approx(250.0)
    assert math.isnan(fit_mb_per_1k_steps(np.array([5, 5]), np.array([1.0, 2.0])))


def test_host_slopes_add_over_nodes_gpu_takes_the_worst_gpu_and_start_up_is_ignored():
    f = leak_figures(timing(), host({"a": 0.5, "b": 0.25}), gpu([0.0, 0.1]))
    # Nodes: 500 + 250 MB per 1,000 steps; the 5000 MiB start-up samples before the first
    # window are left out (with them the slope would be negative).
    assert f["host_mb_per_1k_steps"] == pytest.approx(750.0)
    # ts 100-120 every 2 s; the first quarter of steps 10-30 is warm-up: ts 106-120 count.
    assert f["host_samples"] == 2 * 8
    assert f["gpu_mb_per_1k_steps"] == pytest.approx(100.0)  # the worse of 0 and 100
    assert f["steps"] == [10, 30]


def test_too_few_samples_cannot_be_judged():
    no_gpu = pd.DataFrame(columns=["run", "node", "gpu_index", "ts", "mem_used_mib"])
    f = leak_figures(timing(), host({"a": 1.0}).head(12), no_gpu, skip_fraction=0.0)
    assert math.isnan(f["gpu_mb_per_1k_steps"]) and f["gpu_samples"] == 0
    assert f["host_samples"] == 2 and math.isnan(f["host_mb_per_1k_steps"])  # ts 100, 102


def test_every_node_and_gpu_needs_its_own_samples():
    """MIN_SAMPLES counts per node and per GPU: a node with one sample left is not judged (its
    NaN slope once added 0 to the sum, and the run came out OK), and the line names it."""
    two_nodes = pd.concat([host({"a": 0.0}), host({"b": 0.0}).query("ts == 110")])
    f = leak_figures(timing(), two_nodes, gpu([0.0]))
    assert f["host_samples"] == 8 + 1 and math.isnan(f["host_mb_per_1k_steps"])
    v = verdict("r", f, LeakLimits())
    assert v["verdict"] == "NOT JUDGED"
    assert v["host"] == "host RSS not judged (node b: too few samples: 1 after warm-up, 5 needed)"
    # Two GPUs, one with too few samples: not judged, naming it; the other one is shown.
    gpus = pd.concat([gpu([0.0]), gpu([0.0, 0.0]).query("gpu_index == 1 and ts <= 106")])
    v = verdict("r", leak_figures(timing(), host({"a": 0.0}), gpus), LeakLimits())
    assert v["verdict"] == "NOT JUDGED"
    assert v["gpu"] == (
        "GPU memory +0.0 MB per 1,000 steps (18 samples), not judged on GPU 1 of node a: too few "
        "samples: 2 after warm-up, 5 needed"
    )
    # A judged GPU over its limit is a leak, whatever the unjudged one would have shown.
    gpus = pd.concat([gpu([0.1]), gpu([0.0, 0.0]).query("gpu_index == 1 and ts <= 106")])
    assert verdict("r", leak_figures(timing(), host({"a": 0.0}), gpus), LeakLimits())[
        "verdict"
    ] == ("LEAK")


def test_samples_at_one_step_have_no_fit_and_say_so():
    """Enough samples but no step span: no slope, and the line says that, not "too few"."""
    at_one_step = gpu([0.0]).assign(ts=115.0)
    f = leak_figures(timing(), host({"a": 0.0}), at_one_step)
    assert f["gpu_samples"] == 21 and math.isnan(f["gpu_mb_per_1k_steps"])
    v = verdict("r", f, LeakLimits())
    assert v["verdict"] == "NOT JUDGED"
    assert (
        v["gpu"]
        == "GPU memory not judged (no fit: its 21 samples after warm-up are all at one step)"
    )


def figures(host=math.nan, host_n=0, gpu=math.nan, gpu_n=0):
    return {
        "host_mb_per_1k_steps": host,
        "host_samples": host_n,
        "gpu_mb_per_1k_steps": gpu,
        "gpu_samples": gpu_n,
    }


@pytest.mark.parametrize(
    "f, word",
    [
        (figures(host=10.0, host_n=8), "OK"),  # a CPU run: no GPU samples at all
        (figures(host=10.0, host_n=8, gpu=0.0, gpu_n=8), "OK"),
        (figures(host=50.0, host_n=8, gpu=20.0, gpu_n=8), "OK"),  # at both limits
        (figures(host=50.1, host_n=8, gpu=0.0, gpu_n=8), "LEAK"),
        (figures(host=0.0, host_n=8, gpu=20.1, gpu_n=8), "LEAK"),
        (figures(host_n=1, gpu=20.1, gpu_n=8), "LEAK"),  # a judged leak needs no other figure
        # The 2x H200 case: GPU memory flat and judged, host RSS 1 sample after warm-up.
        (figures(host_n=1, gpu=0.0, gpu_n=8), "NOT JUDGED"),
        (figures(host=0.0, host_n=8, gpu_n=3), "NOT JUDGED"),  # GPU sampled, too few
        (figures(), "NOT JUDGED"),
    ],
)
def test_a_run_is_ok_only_when_its_memory_was_judged(f, word):
    v = verdict("r", f, LeakLimits())
    assert v["verdict"] == word and v["passed"] is (word == "OK")
    assert v["line"].startswith(f"{word} r: host RSS")
    if f["host_samples"] < 5:
        assert (
            f"host RSS not judged (too few samples: {f['host_samples']} after warm-up" in v["line"]
        )


def leak_root(root):
    """An output root with Parquet rows: run ``leaky`` (host RSS +1000 MB per 1,000 steps) and
    run ``clean`` (flat), host telemetry only."""
    runs = [{"run": r, "group": r, "repeat": 1, "status": "ok"} for r in ("leaky", "clean")]
    results.write_tsv(root / results.MANIFEST, runs, list(runs[0]))
    for run, per_step in (("leaky", 1.0), ("clean", 0.0)):
        t = timing(run).assign(group=run, repeat=1)
        results.write_part(
            root / results.TIMING_DIR, run, t.to_dict("records"), results.TIMING_SCHEMA
        )
        h = host({"a": per_step}, run=run).assign(group=run, repeat=1, rank=0)
        results.write_part(
            root / results.HOST_TELEMETRY_DIR,
            run,
            h.to_dict("records"),
            results.HOST_TELEMETRY_SCHEMA,
        )
    return root


LINES = [
    "OK clean: host RSS +0.0 MB per 1,000 steps (8 samples); GPU memory: no samples",
    "LEAK leaky: host RSS +1000.0 MB per 1,000 steps (8 samples); GPU memory: no samples",
    "limits: --max-host-mb-per-1k-steps 50 --max-gpu-mb-per-1k-steps 20 --skip-fraction 0.25",
]


def test_cli_verdicts_and_bad_paths(tmp_path):
    root = leak_root(tmp_path / "out")

    def leak(*args):
        return run_module("platform.leak", *args)

    out = leak(root)
    assert out.returncode == 1
    assert out.stdout.splitlines() == LINES
    assert leak(root / "runs" / "clean").returncode == 0
    assert leak(root, "--max-host-mb-per-1k-steps", "1000").returncode == 0  # at the limit: ok
    assert leak(root, "--skip-fraction", "1").returncode == 2
    bad = leak(tmp_path / "nowhere")
    assert bad.returncode == 2 and "neither a sweep's output root nor a run folder" in bad.stderr

    # A sweep without timing rows: nothing judged, and it says so (it printed only its limits
    # and exited 0).
    empty = tmp_path / "empty"
    results.write_tsv(empty / results.MANIFEST, [{"run": "r1"}], ["run"])
    out = leak(empty)
    assert out.returncode == 1
    verdict_line, limits = out.stdout.splitlines()
    assert verdict_line == (
        f"NOT JUDGED {empty}: no run could be judged: no timing rows (no run recorded a window), "
        "so no memory sample can be placed on steps"
    )
    assert limits.startswith("limits: ")
