"""The driver never holds Tune's loop: the recorder's callbacks return in well under 0.1 s even
when every file write and every logger series is slow (a disk, a mount, a big manifest, a
logger's first import), because they run on the recorder's own thread, in order; drained,
everything measured is on disk."""

import time
from types import SimpleNamespace

import pandas as pd

from platform.record.loggers import _TensorBoard
from platform.record.recorder import SweepRecorder
from platform.spaces.expand import RunSpec
from platform.storage import results
from stage1_common.output_root import OutputRoot
from trainables.config import TrialConfig

SLOW_S = 0.5  # each write, slowed
LIMIT_S = 0.1  # the most a callback may take


def _window(step: int, start: float) -> dict:
    return {
        "step": step,
        "window": step // 5 - 1,
        "rank": 0,
        "max_steps": 20,
        "iter_ms_p50": 40.0,
        "data_ms_p50": 1.0,
        "eta_s": 0.0,
        "samples_per_s": 100.0,
        "loss": 1.0,
        "attempt_start_ts": start,
        "env_facts": {"torch": "2"} if step == 5 else None,
        "host_samples": [{"ts": float(step), "rss_mb": 1.0}],
    }


def test_no_callback_waits_for_a_slow_write(tmp_path, monkeypatch):
    def slowed(write):
        def slow(*args, **kwargs):
            time.sleep(SLOW_S)
            return write(*args, **kwargs)

        return slow

    monkeypatch.setattr(results, "write_part", slowed(results.write_part))
    monkeypatch.setattr(results, "write_json", slowed(results.write_json))
    monkeypatch.setattr(_TensorBoard, "log", slowed(_TensorBoard.log))
    manifests: list[dict] = []
    run = RunSpec("r1", "g", 1, TrialConfig(use_gpu=False, max_steps=20, log_every=5), {})
    recorder = SweepRecorder(
        OutputRoot(tmp_path),
        [run],
        flush_every_s=0.0,  # every window is written at once
        on_change=slowed(lambda status: manifests.append(status)),
        echo=lambda line: None,
        loggers=["tensorboard"],  # its first series imports tensorboardX and opens a file
    )
    trial = SimpleNamespace(trial_id="t1", config={"run": {"name": "r1"}})
    took = []

    def timed(hook, *args, **kwargs):
        t0 = time.perf_counter()
        hook(0, [], trial, *args, **kwargs)
        took.append((hook.__name__, time.perf_counter() - t0))

    start = time.time()
    timed(recorder.on_trial_start)
    recorder.drain()  # (untimed) the manifest says the run started before its first window
    assert [m["r1"]["status"] for m in manifests] == ["running"]
    for step in (5, 10, 15, 20):
        timed(recorder.on_trial_result, result=_window(step, start))
    timed(recorder.on_trial_complete)
    assert max(t for _, t in took) < LIMIT_S, took

    recorder.drain()
    timing = pd.read_parquet(tmp_path / "timing.parquet")
    assert sorted(timing["step"]) == [5, 10, 15, 20]  # one part a window, none lost
    assert len(list((tmp_path / "timing.parquet").glob("r1-*.parquet"))) == 4
    assert results.read_json(tmp_path / "runs" / "r1" / "env.json")["torch"] == "2"
    # The manifest was written from a copy of the status taken when it changed.
    assert [m["r1"]["status"] for m in manifests] == ["running", "ok"]
    recorder.close()
    events = list((tmp_path / "tensorboard" / "r1").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0


def test_a_write_still_waiting_is_replaced_by_a_newer_one_of_its_key():
    import threading

    from platform.record.writer import BackgroundWriter

    writer, gate, done = BackgroundWriter(echo=print), threading.Event(), []
    writer.submit(gate.wait)  # the thread is busy until the gate opens
    writer.submit(lambda: done.append("manifest 1"), key="manifest")
    writer.submit(lambda: done.append("part"))
    writer.submit(lambda: done.append("manifest 2"), key="manifest")
    gate.set()
    assert writer.drain(timeout=10)
    assert done == ["part", "manifest 2"]
    writer.submit(lambda: 1 / 0)  # a failing write is one line, and the writer goes on
    writer.submit(lambda: done.append("after"))
    assert writer.drain(timeout=10) and done[-1] == "after"
    assert writer.errors == ["recorder: a write failed (ZeroDivisionError: division by zero)"]
