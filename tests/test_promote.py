"""Phase A to B: --from-ranked builds the retest sweep from the best groups of an earlier one."""

from platform.analysis.analyze import analyze
from tests.cli import run_module
from tests.test_stats import make_root


def tune(*args):
    return run_module("platform.tune", *args)


def test_the_top_groups_become_the_cases_with_the_new_repeats_and_settings(tmp_path):
    earlier = make_root(tmp_path)  # ranking: fast (micro_batch 16), slow (micro_batch 8)
    analyze(earlier)
    out = tune(
        "--space",
        "smoke",
        "--from-ranked",
        earlier,
        "--top",
        "1",
        "--repeats",
        "2",
        "--set",
        "max_steps=1000",
        "--dry-run",
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "retest of the top 1 groups of smoke_20261121-120000" in lines[0]
    assert "2 runs = 1 groups x 2 repeats" in lines[1]
    runs = [ln.split() for ln in lines if ln.split()[1:2] and ln.split()[1].startswith("sweep_")]
    assert [r[1] for r in runs] == [
        "sweep_z0_mb16_nw0_pf2_ddpstaticgraphon_r1",
        "sweep_z0_mb16_nw0_pf2_ddpstaticgraphon_r2",
    ]
    assert all(r[2:] == ["16", "True"] for r in runs)  # the winner's swept values
    assert "max_steps=1000" in out.stdout  # --set still applies, after the promotion
    both = tune("--space", "smoke", "--from-ranked", earlier, "--dry-run")  # --top 2 by default
    assert "2 runs = 2 groups x 1 repeats" in both.stdout


def test_bad_promotions_exit_2_with_one_line(tmp_path):
    out = tune("--space", "smoke", "--from-ranked", tmp_path, "--dry-run")
    assert out.returncode == 2 and "--from-ranked:" in out.stderr and "holds no sweep" in out.stderr
    earlier = make_root(tmp_path)
    for args, fragment in (
        (["--top", "0"], "--top must be >= 1"),
        (["--repeats", "0"], "--repeats must be >= 1"),
    ):
        out = tune("--space", "smoke", "--from-ranked", earlier, *args, "--dry-run")
        assert out.returncode == 2 and fragment in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1


def test_the_baseline_stays_only_when_it_is_promoted(tmp_path):
    import dataclasses

    from platform.control.promote import from_ranked
    from platform.spaces.expand import expand_runs
    from platform.spaces.load import load_space

    earlier = make_root(tmp_path)  # ranking: fast (micro_batch 16), slow (micro_batch 8)
    analyze(earlier)
    smoke = load_space("smoke")  # baseline: micro_batch 4, not among the promoted groups
    assert from_ranked(smoke, earlier, top=2).baseline == {}
    eight = dataclasses.replace(smoke, baseline={"micro_batch": 8})
    promoted = from_ranked(eight, earlier, top=2)
    assert promoted.baseline == {"micro_batch": 8}
    assert [r.config.micro_batch for r in expand_runs(promoted) if r.baseline] == [8]
    assert from_ranked(eight, earlier, top=1).baseline == {}  # only the fast group promoted
