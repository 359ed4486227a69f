"""Paths the CLIs cannot use are refused before any work, exit 2, nothing written: an empty
``--output-root`` (it would mean the current folder), and a report ``--out`` that is a folder
or lies under a file."""

import pytest

from tests.cli import ROOT, run_module

# A committed sweep: the page could be written from it, were --out usable.
SWEEP = ROOT / "benchmarks" / "results" / "foundation_2xh200"


@pytest.mark.parametrize(
    "cli, space, root, dry",
    [
        ("platform.tune", "smoke", "", ["--dry-run"]),
        ("platform.tune", "smoke", "", []),
        ("platform.tune", "smoke", "  ", ["--dry-run"]),
        ("platform.train", "train_smoke", "", ["--dry-run"]),
    ],
    ids=["tune-dry", "tune-real", "tune-blank", "train-dry"],
)
def test_an_empty_output_root_is_refused(cli, space, root, dry):
    out = run_module(cli, "--space", space, "--output-root", root, *dry)
    assert out.returncode == 2 and out.stdout == ""
    # argparse's usage block, then its one error line naming the option and the fix.
    assert out.stderr.strip().splitlines()[-1] == (
        f"python -m {cli}: error: argument --output-root: is empty; give a folder (e.g. "
        "outputs/NAME) or s3://bucket/prefix, or leave --output-root out for "
        "outputs/<space>_<timestamp>"
    )


def test_a_report_out_under_a_file_or_on_a_folder_is_one_line(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    cases = {
        a_file / "x.html": f"cannot be written ({a_file} is a file); choose a path in a "
        "writable folder",
        a_file / "deeper" / "x.html": f"cannot be written ({a_file} is a file); choose a path "
        "in a writable folder",
        tmp_path: f"is a folder; give a file, e.g. {tmp_path / 'report.html'}",
    }
    for target, why in cases.items():
        out = run_module("platform.report", SWEEP, "--out", target)
        assert out.returncode == 2 and out.stdout == ""
        assert out.stderr.strip().splitlines() == [f"platform.report: error: --out {target} {why}"]
    assert a_file.read_text() == "not a folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # nothing written
