"""``python -m platform.tune --keys [PATTERN]``: every config key with its type, default and doc,
under one heading per family; the dry runs' keys grouped by family (tune's fixed keys, train's
config); "did you mean" for keys and spaces (issue 27); a listing whose reader stops early
(``--keys | head``) ends quietly."""

import dataclasses
import os
import subprocess
import sys

import pytest

from platform.spaces.keys import FAULTS, family, format_grouped, matching_keys
from tests.cli import ROOT, run_module
from tests.test_tune_cli import tune
from trainables.config import TrialConfig, field_doc, field_names


def listed(stdout: str) -> list[str]:
    """The keys --keys printed: lines indented by two spaces (docs are indented by six)."""
    return [ln.split()[0] for ln in stdout.splitlines() if ln[:2] == "  " and ln[2] != " "]


def by_family(keys: list[str]) -> list[str]:
    """``keys`` as --keys shows them: a family's keys together, families in the order each
    first appears in TrialConfig, keys in declaration order within one."""
    order = list(dict.fromkeys(family(k) for k in field_names()))
    return sorted(keys, key=lambda k: order.index(family(k)))


def test_keys_lists_every_key_with_its_type_default_and_doc():
    out = tune("--keys")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # One heading per family, though a family resumes further down the declarations.
    headings = [ln for ln in lines if ln and not ln.startswith(" ")]
    assert headings == [f"{f}:" for f in dict.fromkeys(family(k) for k in field_names())]
    assert listed(out.stdout) == by_family(field_names())
    assert "  micro_batch  int; default 8" in lines
    assert "  strategy  one of 'ddp', 'fsdp2', 'deepspeed', 'auto'; default ddp" in lines
    assert "  manifest_path  str; default ''" in lines
    i = lines.index("  micro_batch  int; default 8")
    assert lines[i + 1] == "      " + field_doc("micro_batch")
    assert lines[0] == "distributed:" and "faults:" in lines


@pytest.mark.parametrize(
    "pattern, keys",
    [
        ("micro", ["micro_batch"]),  # a substring
        ("inject_sleep_*", [k for k in field_names() if k.startswith("inject_sleep_")]),  # a glob
        ("*_s", [k for k in field_names() if k.endswith("_s")]),
        ("faults", [k for k in field_names() if k.startswith("inject_")]),  # a family's name
    ],
)
def test_keys_pattern_filters(pattern, keys):
    out = tune("--keys", pattern)
    assert out.returncode == 0, out.stderr
    assert listed(out.stdout) == by_family(keys)
    assert matching_keys(pattern) == keys


def test_an_unmatched_keys_pattern_says_so_with_the_closest_key():
    out = tune("--keys", "micro_bach")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        "platform.tune: error: --keys 'micro_bach': no config key matches; did you mean "
        "'micro_batch'?"
    ]
    out = tune("--keys", "zzzz")
    assert out.returncode == 2
    assert out.stderr.strip().endswith("no config key matches; --keys alone lists every key")


@pytest.mark.parametrize("typed", ["smok", "SMOKE"])
def test_an_unknown_space_gets_a_did_you_mean(typed, tmp_path):
    out = tune("--space", typed, "--dry-run", "--output-root", tmp_path / "out")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"platform.tune: error: unknown space {typed!r}; did you mean 'smoke'? (see --list-spaces)"
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args", [["--keys"], ["--list-spaces"], ["--space", "smoke", "--dry-run"]], ids=" ".join
)
def test_a_listing_whose_reader_stopped_early_ends_quietly(args):
    # `--keys | head`: the reader is gone before the listing is written (its end is closed).
    read, write = os.pipe()
    os.close(read)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "platform.tune", *args],
            cwd=ROOT,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert out.returncode == 0 and out.stderr == ""


def test_every_key_has_a_family_and_the_fault_family_is_the_injection_keys():
    assert {family(k) for k in field_names()} == {
        "distributed",
        "optimisation",
        "data",
        "model",
        "training",
        "timing/telemetry",
        FAULTS,
        "timeouts",
    }
    assert [k for k in field_names() if family(k) == FAULTS] == [
        k for k in field_names() if k.startswith("inject_")
    ]


def test_fixed_keys_are_grouped_wrapped_and_injection_shown_only_when_set():
    values = TrialConfig().to_dict()
    text = format_grouped(values)
    assert "inject_" not in text
    assert max(len(ln) for ln in text.splitlines()) <= 100
    assert text.splitlines()[0].startswith("  distributed       strategy=ddp ")
    assert "manifest_path=''" in text
    shown = {pair.split("=")[0] for ln in text.splitlines() for pair in ln[20:].split()}
    assert shown == {k for k in values if not k.startswith("inject_")}
    faulty = dataclasses.replace(TrialConfig(), inject_error_at_step=3).to_dict()
    lines = format_grouped(faulty).splitlines()
    assert [ln for ln in lines if "inject_" in ln] == ["  faults            inject_error_at_step=3"]


def test_the_dry_runs_fixed_block_is_readable():
    out = tune("--space", "smoke", "--dry-run", "--set", "inject_sleep_s=0.5")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    block = lines[lines.index("fixed:") + 1 : lines.index("") - 1]  # up to the data line
    assert all(len(ln) <= 100 for ln in block) and len(block) >= 8
    assert [ln.split()[0] for ln in block if not ln.startswith("    ")] == [
        "distributed",
        "optimisation",
        "data",
        "model",
        "training",
        "timing/telemetry",
        FAULTS,
        "timeouts",
    ]
    assert "inject_sleep_s=0.5" in out.stdout and "inject_error_at_step" not in out.stdout


def test_trains_dry_run_shows_the_run_then_its_keys_by_family():
    out = run_module("platform.train", "--space", "train_smoke", "--dry-run")
    assert out.returncode == 0, out.stderr
    name, *block = out.stdout.rstrip("\n").splitlines()
    assert name == "train_z0_mb16_nw0_pf2_r1:"
    assert all(len(ln) <= 100 for ln in block)
    assert [ln.split()[0] for ln in block if not ln.startswith("    ")][:2] == [
        "distributed",
        "optimisation",
    ]
    assert "max_failures=3" in out.stdout.split() and "inject_" not in out.stdout
    faulty = run_module(
        "platform.train", "--space", "train_smoke", "--dry-run", "--set", "inject_sleep_s=0.5"
    )
    assert "  faults            inject_sleep_s=0.5" in faulty.stdout.splitlines()
