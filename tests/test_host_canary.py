"""The host-speed canary (benchmarks/probes/host_canary.py) and the tails adjusted for it
(benchmarks/probes/host_adjust.py): a real sampler process, and a fit that recovers what was
planted."""

import json
import random
import statistics
import time

import pytest

from benchmarks.probes.host_adjust import host_adjusted
from benchmarks.probes.host_canary import Canary, host_over, neighbours_fresh, read_samples
from benchmarks.time_to_answer_compare import compare, markdown


def planted(effect: float, noise: float = 0.0) -> list[dict]:
    """Two groups; the fresh runs on a fast host, the resident runs while it was slow, and one
    of each in between: tail = k_group * copy ** 0.3 * hash ** 0.2 * effect."""
    rng = random.Random(0)
    runs = []
    speeds = {
        "fresh": ((7.0, 1250.0), (7.2, 1200.0), (6.0, 1150.0)),
        "resident": ((5.0, 1000.0), (5.1, 1080.0), (6.1, 1180.0)),
    }
    for group, k in (("mb160", 60.0), ("mb256", 80.0)):
        for executor, at in speeds.items():
            for copy, hash_ in at:
                tail = k * copy**0.3 * hash_**0.2 * (effect if executor == "resident" else 1.0)
                tail *= 1 + rng.uniform(-noise, noise)
                runs.append(
                    {"group": group, "executor": executor, "tail": tail}
                    | {"copy_gb_s": copy, "hash_mb_s": hash_}
                )
    return runs


def test_the_fit_takes_the_hosts_drift_out_and_keeps_the_executors_own_difference():
    runs = planted(effect=0.98)
    raw = [r["tail"] for r in runs if r["group"] == "mb160"]
    assert sorted(raw[3:])[1] / sorted(raw[:3])[1] < 0.90  # raw medians: 10 % apart
    fit = host_adjusted(runs)
    assert fit["elasticity"]["copy_gb_s"] == pytest.approx(0.3, abs=1e-6)
    assert fit["elasticity"]["hash_mb_s"] == pytest.approx(0.2, abs=1e-6)
    assert fit["resident_effect"] == pytest.approx(0.98, abs=1e-6)
    lo, hi = fit["resident_effect_95"]
    assert lo == pytest.approx(0.98, abs=1e-6) and hi == pytest.approx(0.98, abs=1e-6)
    assert fit["r2"] == pytest.approx(1.0) and fit["r2_without_host"] < 0.99
    for g in ("mb160", "mb256"):
        assert fit["groups"][g]["ratio"] == pytest.approx(0.98, abs=1e-6)


def test_with_noise_the_ratio_stays_near_the_planted_one_inside_its_interval():
    fit = host_adjusted(planted(effect=1.0, noise=0.01))
    lo, hi = fit["resident_effect_95"]
    assert lo < 1.0 < hi and hi - lo < 0.2
    assert all(abs(g["ratio"] - 1) < 0.03 for g in fit["groups"].values())


def test_nothing_is_fitted_without_two_host_speeds_or_enough_runs():
    one_speed = [dict(r, copy_gb_s=6.0) for r in planted(effect=1.0)]
    assert host_adjusted(one_speed) is None
    assert host_adjusted(planted(effect=1.0)[:5]) is None
    assert host_adjusted([dict(r, hash_mb_s=None) for r in planted(effect=1.0)]) is None


def test_compare_puts_the_adjusted_ratio_beside_the_raw_one():
    def variant(executor):
        runs = [r for r in planted(effect=0.98) if r["executor"] == executor]
        tails = {g: [r["tail"] for r in runs if r["group"] == g] for g in ("mb160", "mb256")}
        return {
            "scheduler": "fifo",
            "executor": executor,
            "exit_code": 0,
            "wall_s": 100.0,
            "groups": {
                g: {"robust": statistics.median(tails[g]), "run_tails": tails[g]} for g in tails
            },
            "runs": [
                {"group": r["group"], "tail_samples_per_s": r["tail"], "host": r} for r in runs
            ],
        }

    variants = {"fifo_fresh": variant("fresh"), "fifo_resident": variant("resident")}
    got = compare(variants, ["fifo"], ["fresh", "resident"])
    t = got["tail_samples_per_s"]["mb160"]
    assert t["within_3pct"] is False and t["ratio"] < 0.9
    assert t["ratio_host_adjusted"] == pytest.approx(0.98, abs=1e-6)
    assert t["within_3pct_host_adjusted"] is True
    text = markdown("s", {}, got)  # no variants: only the comparison's own lines
    assert "resident effect 0.980" in text


def test_the_canary_samples_in_a_process_of_its_own_until_the_block_ends(tmp_path):
    out = tmp_path / "canary.jsonl"
    with Canary(out, period=0.1) as c:
        deadline = time.monotonic() + 30
        while len(read_samples(out)) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
    assert c.proc.returncode is not None  # stopped with the block
    samples = read_samples(out)
    assert len(samples) >= 3
    assert all(s["hash_mb_s"] > 0 and s["copy_gb_s"] > 0 for s in samples)
    n = len(samples)
    time.sleep(0.5)
    assert len(read_samples(out)) == n  # nothing written after the block
    got = host_over(samples, samples[0]["t"], samples[1]["t"])
    assert got["samples"] == 2
    assert got["copy_gb_s"] == pytest.approx(
        (samples[0]["copy_gb_s"] + samples[1]["copy_gb_s"]) / 2
    )
    assert host_over(samples, 0, 1) == {}


def test_a_probe_run_is_compared_with_the_fresh_runs_next_to_it():
    runs = [
        {"case": "buckets", "step": s, "tail_samples_per_s": t}
        for s, t in [("fresh", 100), ("first", 1), ("fresh", 110), ("release", 1), ("fresh", 90)]
    ]
    assert neighbours_fresh(runs, 1) == 105 and neighbours_fresh(runs, 3) == 100
    assert neighbours_fresh(runs, 0) == 110  # the first fresh run: only the one after it
    assert json.dumps(runs)  # plain data, as the probe's JSON
