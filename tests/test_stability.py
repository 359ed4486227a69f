"""The Phase B stability check: verdicts exactly at each threshold, and the CLI's exit codes."""

import pandas as pd
import pytest

from platform.analysis.stability import StabilityLimits, check
from tests.cli import run_module
from tests.test_stats import make_root

LIMITS = StabilityLimits(
    min_repeats=3, max_iter_ratio_median=1.5, max_iter_ratio_max=2.5, max_iter_p50_cv=0.05
)


def group(name, runs_ok=3, median=1.2, top=2.0, cv=0.01):
    return {
        "group": name,
        "runs_ok": runs_ok,
        "iter_ratio_median": median,
        "iter_ratio_max": top,
        "iter_p50_cv": cv,
    }


@pytest.mark.parametrize(
    "figures, passed, why",
    [
        (dict(), True, ""),
        (dict(runs_ok=3, median=1.5, top=2.5, cv=0.05), True, ""),  # at every limit: passes
        (dict(runs_ok=2), False, "2 ok runs < 3"),
        (dict(median=1.5000001), False, "iter p90/p50 median 1.5 > 1.5"),
        (dict(top=2.5000001), False, "iter p90/p50 max 2.5 > 2.5"),
        (dict(cv=0.0500001), False, "iter p50 CV 0.05 > 0.05"),
        (dict(cv=float("nan")), False, "iter p50 CV unknown"),
    ],
)
def test_verdicts_at_and_just_past_each_threshold(figures, passed, why):
    (verdict,) = check(pd.DataFrame([group("g", **figures)]), ["g"], LIMITS)
    assert verdict["passed"] is passed
    assert why in "; ".join(verdict["failures"])


def stability(*args):
    return run_module("platform.stability", *args)


def test_the_cli_prints_a_verdict_per_group_and_exits_0_1_or_2(tmp_path):
    root = make_root(tmp_path)  # fast: 2 ok runs, iter p90/p50 1.1; slow: 1 ok run
    out = stability("--output-root", str(root), "--groups", "fast", "--min-repeats", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("PASS fast: 2 ok runs, iter p90/p50 median 1.100 max 1.100")
    out = stability("--output-root", str(root), "--min-repeats", "2")
    assert out.returncode == 1
    assert [ln.split()[0] for ln in out.stdout.splitlines()] == ["PASS", "FAIL"]
    assert "FAIL slow: 1 ok runs" in out.stdout and "1 ok runs < 2" in out.stdout
    bad = stability("--output-root", str(root), "--groups", "fast,nope")
    assert bad.returncode == 2
    (line,) = bad.stderr.strip().splitlines()
    assert "--groups: nope not in" in line and "its groups: fast, slow" in line
    assert stability("--output-root", str(tmp_path / "none")).returncode == 2
