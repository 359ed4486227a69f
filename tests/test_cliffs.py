"""The driver's side of the performance cliffs (platform/analysis/verdicts/cliffs.py): a run whose
windows carry recompiles, CUDA graph re-recordings or skips (counted on the workers,
trainables/engine/compile_watch.py) gets the cliff verdict, with torch's words and what to
change, in its end-of-run console line, the run manifest, per_run_metrics.csv, summary.md/json
and the report; a known cliff is named before the first run."""

import io
import re
import time
from types import SimpleNamespace

import pandas as pd
import pytest

from platform.analysis.analyze import analyze
from platform.analysis.report.page import write_report
from platform.analysis.verdicts import cliffs
from platform.record.manifest import write_manifest, write_run_record
from platform.record.recorder import SweepRecorder
from platform.spaces.expand import RunSpec
from stage1_common.output_root import OutputRoot
from tests.test_report import check_filled
from trainables.config import TrialConfig

REASON = (
    "CUDA graph recorded again: Re-recording function=layer, mode=FORWARD, reason=static input "
    "data pointer changed. input name: primals_3. data pointer changed from 1 to 2."
)
FSDP2_RO = dict(strategy="fsdp2", torch_compile=True, compile_scope="layers")


def _windows(records: list[int], **counts: list[int]) -> pd.DataFrame:
    """Rank 0's windows of one run, 5 steps each, with CUDA graph recordings ``records``."""
    n = len(records)
    frame = pd.DataFrame(
        {
            "window": range(n),
            "steps_in_window": [5] * n,
            "recompiles": counts.get("recompiles", [0] * n),
            "graph_breaks": counts.get("graph_breaks", [0] * n),
            "cudagraph_records": records,
            "cudagraph_skips": counts.get("skips", [0] * n),
            "cliff_reason": [REASON if r else "" for r in records],
        }
    )
    return frame


def test_re_recordings_in_the_tail_are_a_cliff_and_fsdp2_gets_its_known_cause():
    fsdp2 = TrialConfig(use_gpu=True, compile_mode="reduce-overhead", **FSDP2_RO)
    figs = cliffs.figures(_windows([2, 20, 20, 20]), tail_points=3)
    verdict = cliffs.judge(figs, fsdp2)
    assert verdict["kind"] == "cudagraph re-records"
    assert (
        verdict["detail"] == "CUDA graphs recorded again 60 times in the last 3 windows (15 steps)"
    )
    assert verdict["reported"] == REASON
    assert verdict["try"] == cliffs.known_cliff(fsdp2)
    assert "pytorch/pytorch#183451" in verdict["try"]
    assert verdict["try"].endswith("use compile_mode=default")
    # DDP re-recording: the input torch names moves; no known cause.
    ddp = TrialConfig(use_gpu=True, torch_compile=True, compile_mode="reduce-overhead")
    assert "a graph input moves between steps" in cliffs.judge(figs, ddp)["try"]
    # The first window holds what the warm-up did not compile ahead (a run without one
    # compiles there): not a cliff. Skips are, in any window: the graphs run without.
    assert cliffs.judge(cliffs.figures(_windows([9, 0, 0], recompiles=[4, 0, 0]), 3)) is None
    skipped = cliffs.judge(cliffs.figures(_windows([0, 0, 0], skips=[1, 0, 0]), 2), ddp)
    assert (
        skipped["kind"] == "cudagraph skips" and skipped["detail"] == "CUDA graphs skipped 1 time"
    )
    recompiled_figs = cliffs.figures(
        _windows([0, 0, 0], recompiles=[0, 2, 1], graph_breaks=[0, 1, 0]), 2
    )
    recompiled = cliffs.judge(recompiled_figs, ddp)
    assert (
        recompiled["detail"]
        == "3 recompiles in the last 2 windows (10 steps), 1 graph break among them"
    )
    assert "crop_buckets_s" in recompiled["try"]
    # The manifest's row as pandas reads it (an empty cell is NaN) names the same fix.
    row = pd.read_csv(io.StringIO("strategy\tcrop_buckets_s\nddp\t\n"), sep="\t").iloc[0]
    assert cliffs.judge(recompiled_figs, row.to_dict()) == recompiled
    # Windows of an older sweep, which counted nothing: no verdict.
    old = _windows([5, 5]).drop(columns=["recompiles", "cudagraph_records"])
    assert cliffs.judge(cliffs.figures(old, 3)) is None


def test_a_known_cliff_is_named_before_the_first_run_and_runs_anyway():
    def spec(group, **keys):
        return SimpleNamespace(group=group, config=TrialConfig(use_gpu=True, **keys))

    runs = [
        spec("g_ro", compile_mode="reduce-overhead", **FSDP2_RO),
        spec("g_ro", compile_mode="reduce-overhead", **FSDP2_RO),  # a repeat: named once
        spec("g_default", **FSDP2_RO),
        spec("ddp_ro", torch_compile=True, compile_mode="reduce-overhead"),
    ]
    (line,) = cliffs.known_cliff_notes(runs)
    assert line.startswith("known cliff (g_ro): fsdp2 with compile_mode reduce-overhead: ")
    assert "use compile_mode=default; run anyway" in line
    assert not cliffs.known_cliff(
        TrialConfig(use_gpu=False, compile_mode="reduce-overhead", **FSDP2_RO)
    )


def _result(window: int, start: float, records: int) -> dict:
    """One window report of rank 0 (as trainables/observe/window_metrics.py builds it)."""
    return {
        "step": 5 * (window + 1),
        "window": window,
        "rank": 0,
        "max_steps": 20,
        "steps_in_window": 5,
        "iter_ms_p50": 2347.0,
        "iter_ms_p90": 2400.0,
        "iter_ms_mean": 2350.0,
        "data_ms_p50": 1.0,
        "data_ms_p90": 1.0,
        "data_ms_mean": 1.0,
        "step_ms_p50": 2300.0,
        "step_ms_p90": 2390.0,
        "samples_per_s": 107.3,
        "peak_mem_gib": 10.0,
        "mfu": 0.05,
        "startup_s": 5.0,
        "eta_s": 0.0,
        "loss": 1.0,
        "attempt_start_ts": start,
        "recompiles": 0,
        "graph_breaks": 0,
        "cudagraph_records": records,
        "cudagraph_skips": 0,
        "cliff_reason": REASON if records else "",
    }


def test_a_run_off_a_cliff_says_so_on_the_console_in_the_manifest_and_the_report(tmp_path):
    root = OutputRoot(tmp_path / "cliff_20261128-120000")
    cfg = TrialConfig(
        use_gpu=True, compile_mode="reduce-overhead", max_steps=20, log_every=5, **FSDP2_RO
    )
    run = RunSpec("g_r1", "g", 1, cfg, {"compile_mode": "reduce-overhead"})
    write_run_record(root, run, "cliff")
    lines: list[str] = []
    recorder = SweepRecorder(
        root,
        [run],
        flush_every_s=0.0,
        on_change=lambda status: write_manifest(root, [run], status),
        echo=lines.append,
    )
    trial = SimpleNamespace(trial_id="t1", config={"run": {"name": "g_r1"}})
    start = time.time()
    recorder.on_trial_start(0, [], trial)
    for window, records in enumerate([2, 20, 20, 20]):  # every step records again
        recorder.on_trial_result(0, [], trial, result=_result(window, start, records))
    recorder.on_trial_complete(0, [], trial)
    recorder.close()

    said = "cliff: CUDA graphs recorded again 60 times in the last 3 windows (15 steps)"
    end = lines[-1]
    assert re.match(r"^\[1/1\] g_r1: ok in [\d.]+ s; " + re.escape(said), end), end
    assert f"; torch: {REASON}; try: fsdp2 with compile_mode reduce-overhead: " in end
    assert end.endswith("use compile_mode=default")

    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False)
    (cell,) = manifest["cliff"]
    assert end.endswith(cell) and cell.startswith(said.removeprefix("cliff: "))
    summary = analyze(root)
    verdict = summary["cliffs"]["g_r1"]
    assert verdict["kind"] == "cudagraph re-records" and verdict["reported"] == REASON
    per_run = pd.read_csv(root / "per_run_metrics.csv", keep_default_na=False)
    assert list(per_run["cliff"]) == [cell]
    assert f"- g_r1: **cudagraph re-records**: {cell}" in summary["text"]

    found = check_filled(write_report(root).read_text())
    assert "pytorch/pytorch#183451" in found.text["cliffs"] and REASON in found.text["cliffs"]
    assert "cudagraph re-records" in found.text["ranking"]  # the ranking says why it is slow


@pytest.mark.parametrize("records", [[0, 0, 0, 0], [9, 0, 0, 0]])
def test_a_run_on_the_flat_has_no_cliff_anywhere(tmp_path, records):
    """No re-recording after the first window (which holds what the warm-up did not do)."""
    figs = cliffs.figures(
        pd.DataFrame([_result(w, 0.0, r) for w, r in enumerate(records)]), tail_points=3
    )
    assert cliffs.verdict_line(figs, TrialConfig(use_gpu=True, **FSDP2_RO)) == ""
