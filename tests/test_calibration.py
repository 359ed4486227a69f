"""The instrument's own overhead (platform/calibrate.py, platform/analysis/calibration.py): a
reference_compare.json stored as this machine's calibration in the machine cache, a newer one
of the same host in place of the older; bad input in one line, nothing written; a sweep's
summary, report and console showing the ratios of the strategies it ranked, or saying there is
no calibration and how to make one. No reference or sweep runs here."""

import json
import os

import pandas as pd
import pytest

from benchmarks import reference_compare as rc
from platform.analysis import calibration
from platform.analysis.analyze import analyze
from platform.analysis.report.page import write_report
from platform.storage import results
from tests.cli import run_module
from tests.test_report import check_filled
from tests.test_stats import make_root

TORCH = "2.11.0+cu130"


def compare_record(ratios: dict[str, list[float]], *, device="NVIDIA H200", world=2, **extra):
    """A reference_compare.json as benchmarks/reference_compare.py writes it: each comparison's
    platform / reference ratio per turn (the reference at 1000 samples/s)."""
    turns = len(next(iter(ratios.values())))
    ref = {"tail_samples_per_s": 1000.0, "device": device, "world_size": world, "torch": TORCH}
    pairs = [
        ({s: ref for s in ratios}, {s: 1000.0 * r[i] for s, r in ratios.items()})
        for i in range(turns)
    ]
    rows = rc.compare(pairs, {s: s for s in ratios})
    record = {"command": ["reference_compare.py"], "rows": rows, "turns": pairs, "sweep_exits": [0]}
    return record | extra


def write_record(folder, record):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "reference_compare.json").write_text(json.dumps(record))
    return folder


def calibrate(*args, cache=None):
    env = {**os.environ, "STAGE1_CACHE_DIR": str(cache)} if cache else None
    return run_module("platform.calibrate", *args, env=env)


def test_from_stores_a_measurement_and_a_newer_one_replaces_its_hosts(tmp_path):
    cache = tmp_path / "cache"
    first = write_record(
        tmp_path / "h200_a",
        compare_record(
            {"ddp": [0.911, 0.96, 1.009], "zero1": [0.74, 0.75, 0.76]},
            measured="2026-11-28T10:00:00Z",
            commit="4499f17a1b2c",
            dirty=False,
        ),
    )
    out = calibrate("--from", first, cache=cache)  # STAGE1_CACHE_DIR: the machine cache
    assert out.returncode == 0, out.stderr
    assert f"calibration of 2x NVIDIA H200, torch {TORCH}, measured 2026-11-28T10:00:00Z" in (
        out.stdout
    )
    assert "ddp: platform at 0.960 of its reference (3 pairs, 0.911-1.009)" in out.stdout
    (entry,) = json.loads((cache / "calibration.json").read_text())["entries"]
    assert entry["host"] == {"device": "NVIDIA H200", "count": 2, "torch": TORCH}
    assert entry["commit"] == "4499f17a1b2c" and entry["pairs"] == 3
    assert entry["comparisons"]["ddp"] == {
        "reference": "ddp",
        "ratio": pytest.approx(0.96),
        "low": pytest.approx(0.911),
        "high": pytest.approx(1.009),
        "pairs": 3,
    }
    # A CPU host beside it (--compile-cache-dir names the cache), then a newer H200 one.
    cpu = write_record(tmp_path / "cpu", compare_record({"ddp": [0.5]}, device="cpu", world=2))
    out = calibrate("--from", cpu / "reference_compare.json", "--compile-cache-dir", cache)
    assert out.returncode == 0, out.stderr
    newer = compare_record({"ddp": [0.99, 0.98]}, measured="2026-11-29T10:00:00Z")
    out = calibrate("--from", write_record(tmp_path / "h200_b", newer), cache=cache)
    assert "replacing the one measured 2026-11-28T10:00:00Z" in out.stdout
    entries = json.loads((cache / "calibration.json").read_text())["entries"]
    assert [calibration.host_name(e["host"]) for e in entries] == [
        f"2x cpu, torch {TORCH}",
        f"2x NVIDIA H200, torch {TORCH}",
    ]
    assert entries[1]["comparisons"]["ddp"]["ratio"] == pytest.approx(0.985)
    assert "zero1" not in entries[1]["comparisons"] and entries[1]["commit"] is None
    # The first, measured before the one stored now, is refused: the file stays as it is.
    kept = (cache / "calibration.json").read_text()
    out = calibrate("--from", first, cache=cache)
    assert out.returncode == 2 and "holds a later calibration" in out.stderr
    assert (cache / "calibration.json").read_text() == kept
    assert not list(cache.glob(".*.tmp"))


@pytest.mark.parametrize(
    "args, said",
    [
        (["--from", "{tmp}/missing"], "no such file"),
        (["--from", "{tmp}/no_rows"], "holds no rows"),
        (["--from", "{tmp}/no_references"], "no reference result names its device and torch"),
        (["--from", "{tmp}/not_json"], "not readable JSON"),
        (["--from", "{tmp}/no_rows", "--pairs", "2"], "--pairs only go with a new one"),
        (["--strategies", "ddp,zero3"], "--strategies ddp,zero3: unknown zero3"),
        (["--pairs", "0"], "--pairs 0: at least 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_and_writes_nothing(tmp_path, args, said):
    write_record(tmp_path / "no_rows", {"command": [], "turns": []})
    bare = compare_record({"ddp": [0.9]})
    bare["turns"] = [({}, {})]
    write_record(tmp_path / "no_references", bare)
    (tmp_path / "not_json").mkdir()
    (tmp_path / "not_json" / "reference_compare.json").write_text("{rows")
    cache = tmp_path / "cache"
    out = calibrate(*[a.format(tmp=tmp_path) for a in args], "--compile-cache-dir", cache)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("platform.calibrate: error: ") and said in line, line
    assert not cache.exists() and out.stdout == ""


def test_an_older_record_of_one_turn_is_one_pair():
    """benchmarks/results/reference_compare_2xh200 predates --pairs: ``references``, no turns."""
    older = compare_record({"fsdp2": [1.03]})
    older["references"] = older.pop("turns")[0][0]
    for row in older["rows"]:
        for key in ("pairs", "ratio_low", "ratio_high", "reference"):
            row.pop(key)
    entry = calibration.entry_of(older, measured="2026-11-28T04:34:53Z", source="x")
    assert entry["comparisons"]["fsdp2"] == {
        "reference": "fsdp2",
        "ratio": 1.03,
        "low": 1.03,
        "high": 1.03,
        "pairs": 1,
    }


def test_each_reference_compare_case_is_the_comparison_of_its_platform_config():
    """The reader names a run's comparison without importing benchmarks/: its table and
    reference_compare.CASES stay the same."""
    assert list(calibration.REFERENCES) == list(rc.CASES)
    for name, case in rc._filled({k: v[1] for k, v in rc.CASES.items()}).items():
        assert calibration.comparison_of(case) == name
    assert calibration.comparison_of({"strategy": "deepspeed", "zero_stage": 3}) is None
    assert calibration.comparison_of({"strategy": "auto", "zero_stage": "2"}) == "zero2"
    row = {"strategy": "ddp", "torch_compile": "True", "compile_mode": "max-autotune"}
    assert calibration.comparison_of(row) is None


def sweep_root(tmp_path, *, torch=TORCH, cache=""):
    """test_stats' output root (groups fast and slow) as a 2-process CPU sweep of ddp (fast)
    and ZeRO-1 (slow), its runs' env.json naming torch ``torch``."""
    root = make_root(tmp_path)
    m = results.read_manifest(root)
    strategy = {"fast": ("ddp", 0), "slow": ("deepspeed", 1)}
    m["strategy"] = [strategy[g][0] for g in m["group"]]
    m["zero_stage"] = [strategy[g][1] for g in m["group"]]
    m = m.assign(torch_compile=False, compile_mode="default", train_workers=2)
    m["compile_cache_dir"] = str(cache)
    results.write_tsv(root / results.MANIFEST, m.to_dict("records"), list(m.columns))
    for name in m["run"]:
        env = {"torch": torch, "gpus": [], "hostname": "h"}
        results.write_json(root / "runs" / name / "env.json", env)
    return root


def test_a_sweep_shows_its_hosts_ratios_in_summary_report_and_console(tmp_path, capsys):
    cache = tmp_path / "cache"
    record = compare_record(
        {"ddp": [0.911, 1.009]}, device="cpu", measured="2026-11-28T10:00:00Z", commit="4499f17"
    )
    calibration.store(cache, calibration.entry_of(record, measured="", source="x"))
    root = sweep_root(tmp_path, cache=cache)
    summary = analyze(root)
    found = summary["calibration"]
    said = (
        "ddp: platform at 0.960 of a bare torchrun DDP on this host (2 pairs, 0.911-1.009), "
        "measured 2026-11-28, git 4499f17"
    )
    command = (
        f"python -m platform.calibrate --strategies ddp,zero1 --nproc 2 --compile-cache-dir {cache}"
    )
    assert found["lines"] == [
        said,
        f"zero1: not in the calibration of 2x cpu, torch {TORCH}; measure it: {command}",
    ]
    assert found["cache"] == str(cache / "calibration.json")
    assert json.loads((root / "summary.json").read_text())["calibration"] == found
    text = (root / "summary.md").read_text()
    assert "## Calibration (the platform against its references on this host)" in text
    assert f"- {said}" in text
    page = check_filled(write_report(root).read_text())
    assert said in page.text["calibration"]

    from platform.tune import report

    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t").to_dict("records")
    report(manifest, root, wall_s=1.0)
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("calibration"))
    assert line == (
        f"calibration: 1 of the 2 ranked strategies measured against their references on 2x "
        f"cpu, torch {TORCH} (ddp 0.960; measured 2026-11-28); the others: {command}"
    )


def test_a_sweep_of_another_host_is_told_there_is_no_calibration(tmp_path, monkeypatch):
    cache = tmp_path / "cache"  # the machine cache of STAGE1_CACHE_DIR: no compile_cache_dir
    monkeypatch.setenv("STAGE1_CACHE_DIR", str(cache))
    record = compare_record({"ddp": [0.96]}, device="cpu")
    calibration.store(cache, calibration.entry_of(record, measured="", source="x"))
    root = sweep_root(tmp_path, torch="2.12.0")
    found = analyze(root)["calibration"]
    none = (
        "no calibration for 2x cpu, torch 2.12.0 on this machine: run python -m "
        "platform.calibrate --strategies ddp,zero1 --nproc 2"
    )
    assert found["lines"] == [none]
    assert found["line"] == "calibration: none for" + none.removeprefix("no calibration for")
    assert f"- {none}" in (root / "summary.md").read_text()
    assert none in check_filled(write_report(root).read_text()).text["calibration"]
    # A folder whose runs recorded no host (no env.json): said so, nothing looked up.
    for env in root.path.glob("runs/*/env.json"):
        env.unlink()
    assert analyze(root)["calibration"]["lines"] == [
        "no calibration looked up: no run here recorded its host (runs/<run>/env.json)"
    ]
