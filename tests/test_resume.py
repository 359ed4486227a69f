"""--resume's bookkeeping: which runs are kept, and what of the others' earlier attempts goes."""

import pytest

from platform.errors import UsageError
from platform.execution.resume import drop_rows, previous_status
from platform.record.manifest import MANIFEST_COLUMNS, write_manifest
from platform.spaces.expand import expand_runs
from platform.spaces.load import load_space
from platform.storage import results
from stage1_common.output_root import OutputRoot
from tests.test_results import timing_row


@pytest.fixture
def runs():
    return expand_runs(load_space("smoke"))  # two runs: mb4, mb8


def test_only_runs_recorded_ok_are_kept_with_their_figures(tmp_path, runs):
    first, second = runs
    status = {
        first.name: {
            "status": "ok",
            "duration_sec": 12.5,
            "exit_code": 0,
            "effective": {"strategy_effective": "ddp"},
            "host_telemetry_rows": 7,
        },
        second.name: {"status": "failed", "failure_reason": "boom", "exit_code": 1},
    }
    write_manifest(OutputRoot(tmp_path), runs, status)
    done = previous_status(OutputRoot(tmp_path), runs)
    assert list(done) == [first.name]
    kept = done[first.name]
    assert kept["status"] == "ok" and kept["exit_code"] == 0 and kept["duration_sec"] == 12.5
    assert kept["effective"] == {"strategy_effective": "ddp"} and kept["host_telemetry_rows"] == 7
    assert "exit_code" in MANIFEST_COLUMNS


def test_a_root_whose_first_attempt_died_before_its_manifest_resumes_from_scratch(tmp_path, runs):
    (tmp_path / "data" / "synth").mkdir(parents=True)  # killed while making the corpus
    assert previous_status(OutputRoot(tmp_path), runs) == {}
    with pytest.raises(UsageError, match="holds no sweep"):
        previous_status(OutputRoot(tmp_path / "nothing-here"), runs)


def test_a_resume_runs_in_the_first_attempts_order_and_refuses_another_sweep(tmp_path, runs):
    first, second = runs
    write_manifest(OutputRoot(tmp_path), [second, first], {})  # a warm start put mb8 first
    again = [first, second]  # the space's order, as --resume expands it
    previous_status(OutputRoot(tmp_path), again)
    assert again == [second, first]
    with pytest.raises(UsageError, match="holds a different sweep"):
        previous_status(OutputRoot(tmp_path), [first])


def test_drop_rows_removes_every_trace_of_the_rerun_runs_only(tmp_path, runs):
    first, second = runs
    for run in runs:
        results.write_part(
            tmp_path / results.TIMING_DIR,
            f"{run.name}-00000",
            [timing_row(run.name, 0)],
            results.TIMING_SCHEMA,
        )
        run_dir = tmp_path / "runs" / run.name
        (run_dir / "workers").mkdir(parents=True)
        for name in ("stacks-rank1.txt", "fail_tail.txt", "workers/rank0.json", "config.json"):
            (run_dir / name).write_text("x")
    stale = tmp_path / results.TIMING_DIR / f".{second.name}-00001.parquet.abc.tmp"
    stale.write_bytes(b"half")  # a write a SIGKILL cut short
    assert drop_rows(OutputRoot(tmp_path), [second.name]) == 1
    left = sorted(p.name for p in (tmp_path / results.TIMING_DIR).iterdir())
    assert left == [f"{first.name}-00000.parquet"]
    gone = tmp_path / "runs" / second.name
    assert sorted(p.name for p in gone.rglob("*") if p.is_file()) == ["config.json"]
    kept = tmp_path / "runs" / first.name
    assert len([p for p in kept.rglob("*") if p.is_file()]) == 4


STOP_PROBE = """
import os, signal, sys, time
from platform.execution.signals import StopSignals
seen = []
signal.signal(signal.SIGINT, lambda s, f: seen.append("sigint"))  # stands in for Tune's handler
stop = StopSignals()
with stop:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
print(seen, stop.received, stop.exit_code, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
"""


def test_sigterm_becomes_tunes_graceful_sigint_stop_and_exit_143():
    import subprocess
    import sys
    from pathlib import Path

    from platform.execution.signals import StopSignals

    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-c", STOP_PROBE], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    # SIGTERM reached the SIGINT handler (Tune's graceful stop), was noted, and the previous
    # SIGTERM handler came back after the sweep.
    assert out.stdout.split() == ["['sigint']", "SIGTERM", "143", "True"]
    assert StopSignals().exit_code == 1  # nothing received
    ctrl_c = StopSignals()
    ctrl_c.received = "SIGINT"  # what run_sweep notes when Tune's SIGINT handler ended fit()
    assert ctrl_c.exit_code == 130


def test_a_resumed_sweep_reuses_its_prepared_corpus(tmp_path, capsys):
    from platform.execution.inputs import prepare_corpus
    from platform.spaces.plans import DataPlan

    manifest = tmp_path / "data" / "prepared" / "manifest_16k_trim.tsv"
    manifest.parent.mkdir(parents=True)
    manifest.write_text("utt_id\tpath\tnum_samples\tsample_rate\ttranscript\n")
    plan = DataPlan(synth={"speakers": 1, "chapters": 1, "utts": 1, "seed": 0})
    assert prepare_corpus(plan, OutputRoot(tmp_path)) == manifest
    assert "data: reusing" in capsys.readouterr().out
    assert not (tmp_path / "data" / "synth").exists()  # nothing generated again


def test_the_printed_resume_command_names_the_root_the_sweep_used():
    """Issue 54 item 4: the quick start lets the platform choose the output root; the line
    after an interrupt must be a command that finishes that sweep as it is copied."""
    import shlex

    from platform.execution.signals import resume_command

    root = OutputRoot.of("outputs/smoke_20261128-120000")
    line = resume_command("platform.tune", ["--space", "smoke"], root)
    assert shlex.split(line) == [
        "python", "-m", "platform.tune", "--space", "smoke",
        "--output-root", "outputs/smoke_20261128-120000", "--resume",
    ]  # fmt: skip
    # A root given by the user stays as written; --resume is not doubled; spaces are quoted.
    given = ["--space", "my space.yaml", "--output-root=/tmp/r", "--resume"]
    assert shlex.split(resume_command("platform.train", given, root)) == [
        "python", "-m", "platform.train", *given,
    ]  # fmt: skip
