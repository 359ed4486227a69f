"""``--version`` and ``--help`` of every ``python -m platform.X`` tool (issue 27, item 4): one
version line naming the installed distribution and the checkout's commit; help that shows each
option's default."""

import re
import subprocess
from importlib import metadata

import pytest

from tests.cli import ROOT, run_module

CLIS = ("tune", "train", "analyze", "report", "stability", "leak", "grafana", "calibrate",
        "catalogue")  # fmt: skip


@pytest.mark.parametrize("cli", CLIS)
def test_version_is_one_line_with_the_package_version_and_commit(cli):
    out = run_module(f"platform.{cli}", "--version")
    assert out.returncode == 0, out.stderr
    (line,) = out.stdout.strip().splitlines()
    assert line.startswith(f"stage1-platform {metadata.version('stage1-platform')}")
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    if commit:  # a git checkout: its commit, abbreviated
        found = re.search(r"\(git ([0-9a-f]{12})(, dirty)?\)$", line)
        assert found and commit.startswith(found.group(1)), line


def test_version_and_the_run_manifest_name_a_commit_alike():
    """--version and the manifest's git_commit_short (platform/record/provenance.py) give the
    same short name of the checkout's commit (they differed: 7 against 12 characters)."""
    from platform.record.provenance import git_facts
    from stage1_common.version import version_line

    short = git_facts()["git_commit_short"]
    if short:  # a git checkout
        assert len(short) == 12 and f"(git {short}" in version_line()


@pytest.mark.parametrize("cli", CLIS)
def test_help_shows_defaults_and_no_empty_ones(cli):
    out = run_module(f"platform.{cli}", "--help")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # argparse wraps lines
    assert "--version" in text
    for empty in ("(default: None)", "(default: False)", "(default: [])"):
        assert empty not in text


def test_tune_and_stability_help_name_their_defaults():
    tune = " ".join(run_module("platform.tune", "--help").stdout.split())
    assert "Ray dashboard port of a local cluster (default: 8265, or a free port" in tune
    assert "with --from-ranked: how many groups (default: 2)" in tune
    assert "network (default: 127.0.0.1)" in tune
    stability = " ".join(run_module("platform.stability", "--help").stdout.split())
    assert "judged without its iter p50 CV) (default: 3)" in stability
    assert "tail iter p90/p50 (default: 1.5)" in stability
