"""The Phase B stability check: verdicts exactly at each threshold, "not enough repeats" apart
from "unstable", and the CLI's lines, limits and exit codes."""

import pandas as pd
import pytest

from platform.analysis.verdicts.stability import StabilityLimits, check, verdict_line
from tests.cli import run_module
from tests.test_report import H200
from tests.test_stats import make_root

nan = float("nan")
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
    "figures, verdict, why",
    [
        (dict(), "PASS", ""),
        (dict(runs_ok=3, median=1.5, top=2.5, cv=0.05), "PASS", ""),  # at every limit: passes
        (dict(median=1.5000001), "FAIL", "iter p90/p50 median 1.5 > 1.5"),
        (dict(top=2.5000001), "FAIL", "iter p90/p50 max 2.5 > 2.5"),
        (dict(cv=0.0500001), "FAIL", "iter p50 CV 0.05 > 0.05"),
        (dict(cv=nan), "FAIL", "iter p50 CV unknown"),  # 3 ok runs should have known it
        # Too few ok runs, nothing over a limit: steadiness cannot be told yet.
        (dict(runs_ok=2), "NOT ENOUGH REPEATS", "2 ok runs < 3"),
        (dict(runs_ok=1, cv=nan), "NOT ENOUGH REPEATS", "1 ok runs < 3; iter p50 CV unknown"),
        # Every run failed: more repeats of it would not help, so it is no shortfall.
        (dict(runs_ok=0, median=nan, top=nan, cv=nan), "FAIL", "no ok run"),
        # Too few ok runs and a figure over its limit: unstable already.
        (dict(runs_ok=2, cv=0.2), "FAIL", "iter p50 CV 0.2 > 0.05; 2 ok runs < 3"),
    ],
)
def test_verdicts_at_and_just_past_each_threshold(figures, verdict, why):
    (v,) = check(pd.DataFrame([group("g", **figures)]), ["g"], LIMITS)
    assert v["verdict"] == verdict
    assert v["passed"] is (verdict == "PASS")
    assert why in "; ".join(v["failures"] + v["short"])
    assert verdict_line(v).startswith(f"{verdict} g: {v['runs_ok']} ok runs")


ONE = StabilityLimits(min_repeats=1)


@pytest.mark.parametrize(
    "figures, verdict, why",
    [
        # --min-repeats 1 asks for one run to be enough: its CV (none) is not judged.
        (dict(runs_ok=1, cv=nan), "PASS", "iter p50 CV not judged: one ok run"),
        (
            dict(runs_ok=1, median=1.6, top=1.6, cv=nan),
            "FAIL",
            "iter p90/p50 median 1.6 > 1.5; iter p50 CV not judged: one ok run",
        ),
        # Two ok runs have a CV: it is judged again.
        (dict(runs_ok=2, cv=0.2), "FAIL", "iter p50 CV 0.2 > 0.05"),
        (dict(runs_ok=2, cv=nan), "FAIL", "iter p50 CV unknown"),
        (dict(runs_ok=0, median=nan, top=nan, cv=nan), "FAIL", "no ok run"),
    ],
)
def test_min_repeats_1_judges_a_single_run_without_its_cv(figures, verdict, why):
    (v,) = check(pd.DataFrame([group("g", **figures)]), ["g"], ONE)
    assert v["verdict"] == verdict
    assert "; ".join(v["failures"] + v["short"] + v["notes"]) == why
    assert verdict_line(v).endswith(f"({why})")


def stability(*args):
    return run_module("platform.stability", *args)


def test_the_cli_prints_a_verdict_per_group_its_limits_and_exits_0_1_or_2(tmp_path):
    root = make_root(tmp_path)  # fast: 2 ok runs, iter p90/p50 1.1; slow: 1 ok run
    out = stability("--output-root", str(root), "--groups", "fast", "--min-repeats", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "PASS fast: 2 ok runs, iter p90/p50 median 1.100 max 1.100, iter p50 CV 0.0000",
        "limits: --min-repeats 2 --max-iter-ratio-median 1.5 --max-iter-ratio-max 2.5 "
        "--max-iter-p50-cv 0.05",
    ]
    out = stability("--output-root", str(root), "--min-repeats", "2")
    assert out.returncode == 1
    *verdicts, limits = out.stdout.splitlines()
    assert [ln.split(":")[0] for ln in verdicts] == ["PASS fast", "NOT ENOUGH REPEATS slow"]
    assert "(1 ok runs < 2; iter p50 CV unknown)" in verdicts[1]
    assert limits.startswith("limits: --min-repeats 2 ")
    bad = stability("--output-root", str(root), "--groups", "fast,nope")
    assert bad.returncode == 2
    (line,) = bad.stderr.strip().splitlines()
    assert "--groups: nope not in" in line and "its groups: fast, slow" in line
    assert stability("--output-root", str(tmp_path / "none")).returncode == 2


def test_a_folder_of_analysis_files_only_is_judged_from_its_group_summary():
    """The committed 2x H200 folder keeps no rows: the check reads its group_summary.csv, and
    gives the lines of the stability.log it keeps (run there with --min-repeats 2)."""
    out = stability("--output-root", str(H200), "--min-repeats", "2")
    assert out.returncode == 1  # mb96's iter p50 CV 0.053 > 0.05
    assert out.stdout == (H200 / "stability.log").read_text()


def test_a_group_the_interrupted_sweep_never_ran_is_not_run_not_failed():
    """Issue 54 item 6: no ok run because every run failed is FAIL; because the sweep was
    interrupted before any of its runs ended it is NOT RUN (nothing to judge yet)."""
    failed, waiting = (group(n, runs_ok=0) for n in ("failed", "waiting"))
    verdicts = check(pd.DataFrame([failed, waiting]), ["failed", "waiting"], LIMITS, {"waiting"})
    assert [v["verdict"] for v in verdicts] == ["FAIL", "NOT RUN"]
    assert verdicts[1]["failures"] == [] and "interrupted" in verdicts[1]["short"][0]


def test_an_interrupted_sweep_is_marked_partial_with_what_it_measured():
    from platform.analysis.interrupted import partial

    manifest = pd.DataFrame(
        {
            "run": ["a_r1", "a_r2", "b_r1", "c_r1"],
            "group": ["a", "a", "b", "c"],
            "status": ["ok", "interrupted", "pending", "failed"],
        }
    )
    part = partial(manifest)
    assert (part["runs_finished"], part["runs"]) == (2, 4)
    assert (part["groups_measured"], part["groups"]) == (1, 3)
    assert "of the groups measured so far" in part["line"]
    assert partial(manifest.assign(status="ok")) is None
