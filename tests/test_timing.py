"""Window statistics, checked against values worked out by hand."""

import pytest

from trainables.observe.timing import WindowTimer, window_stats


def test_window_stats_by_hand():
    # sorted 1..10: p50 = 5.5; p90 (linear) = 9.1; mean = 5.5
    stats = window_stats([10, 1, 9, 2, 8, 3, 7, 4, 6, 5], "iter_ms")
    assert stats == pytest.approx({"iter_ms_p50": 5.5, "iter_ms_p90": 9.1, "iter_ms_mean": 5.5})


def test_summary_throughput_is_global_batch_over_mean_iter_time():
    timer = WindowTimer()
    for data, step, it in [(1, 10, 20), (2, 20, 30), (3, 30, 40), (4, 40, 110)]:
        timer.add(data_ms=data, step_ms=step, iter_ms=it)
    out = timer.summary(global_batch=16)
    assert out["iter_ms_mean"] == pytest.approx(50.0)
    assert out["samples_per_s"] == pytest.approx(16 / 0.050)
    assert out["data_ms_p50"] == pytest.approx(2.5)
    assert out["step_ms_p90"] == pytest.approx(37.0)
    assert out["steps_in_window"] == 4


def test_reset_and_empty_window():
    timer = WindowTimer()
    timer.add(data_ms=1, step_ms=1, iter_ms=2)
    timer.reset()
    assert len(timer) == 0
    with pytest.raises(ValueError, match="empty timing window"):
        timer.summary(global_batch=1)


def test_a_windows_audio_count_stays_on_the_device_until_the_report():
    # A CPU-side sum of the batch's mask read back every step held the loop's thread 7.4-20.6
    # ms per step on an H200 host (mb 128 of 2 s audio). On the meta device nothing can be
    # read back: a count that reads the mask per step fails; so does the CPU-side mask (its
    # sum, a 0-dim tensor, would still add to a device counter).
    import torch

    from trainables.observe.window_metrics import Window

    window = Window.on(torch.device("meta"))
    window.add_audio({"audio_mask": torch.ones(4, 32_000, dtype=torch.bool, device="meta")})
    assert window.audio_valid.device.type == "meta" and window.audio_total == 4 * 32_000
    with pytest.raises(ValueError, match=r"^audio_mask on cpu: pass the batch's mask on the run"):
        window.add_audio({"audio_mask": torch.ones(4, 8, dtype=torch.bool)})
    cpu = Window.on(torch.device("cpu"))
    for valid in (3, 5):
        mask = torch.zeros(2, 4, dtype=torch.bool)
        mask.view(-1)[:valid] = True
        cpu.add_audio({"audio": torch.zeros(2, 4), "audio_mask": mask})
    assert (int(cpu.audio_valid), cpu.audio_total) == (8, 16)
    cpu.add_audio({"audio": torch.zeros(2, 4)})  # no mask: no row padded
    assert (int(cpu.audio_valid), cpu.audio_total) == (16, 24)
    cpu.next()
    assert (int(cpu.audio_valid), cpu.audio_total) == (0, 0)


def test_a_windows_samples_are_the_optimizer_steps_global_batch():
    """samples_per_s counts micro_batch x world size x grad_accum_steps samples per step."""
    from types import SimpleNamespace

    from trainables.config import TrialConfig, global_batch
    from trainables.observe.window_metrics import WindowMetrics

    cfg = TrialConfig(micro_batch=4, grad_accum_steps=3)
    metrics = WindowMetrics(cfg, SimpleNamespace(world_size=2), None, {}, None)
    assert metrics.global_batch == 24
    assert metrics.global_batch == global_batch(micro_batch=4, world_size=2, grad_accum_steps=3)


def test_timing_ranks_all_gathers_every_ranks_window_to_rank_0():
    import socket

    import torch.multiprocessing as mp

    from tests import _gloo_loss_worker
    from tests._forked import start

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = mp.Manager().dict()
    start(_gloo_loss_worker.gather_windows, (3, port, out), nprocs=3)  # tests/_forked.py
    assert out[1] == out[2] == {}  # only rank 0's report reaches the driver
    others = out[0]["rank_windows"]
    assert [w["rank"] for w in others] == [1, 2]
    assert [w["iter_ms_p50"] for w in others] == [20.0, 30.0]
    assert out[0]["rank_skew"] == pytest.approx(3.0)


def test_the_process_group_timeout_follows_the_stall_timeout():
    from trainables.observe.watchdog import pg_timeout_for

    assert pg_timeout_for(0, 1800) == 1800  # watchdog off: the configured timeout
    assert pg_timeout_for(8, 1800) == 13  # a 5 s grace for the stack dumps
    assert pg_timeout_for(900, 1800) == 990  # 10 % grace
    assert pg_timeout_for(3000, 1800) == 1800  # never above pg_timeout_s


def test_a_stuck_resident_worker_outlives_the_process_groups_timeout():
    from trainables.observe.watchdog import pg_timeout_for, resident_end_after

    # With several workers the collectives' timeout must end a hung run first (as in a fresh
    # run): the worker's own end comes 10 s after it, at least 15 s after the stall dump.
    for stall, pg in ((4, 1800), (120, 1800), (900, 1800), (3000, 1800)):
        assert stall + resident_end_after(stall, pg, 2) >= pg_timeout_for(stall, pg) + 10
    assert resident_end_after(4, 1800, 2) == 15.0  # the fault drill's (the timeout: 9 s)
    assert resident_end_after(900, 1800, 2) == 100.0  # the default (was 30: before the timeout)
    assert resident_end_after(3000, 1800, 2) == 15.0  # the timeout (capped) fires before the stall
    # One worker: no collective can end it; its stacks are written before the wait starts.
    assert resident_end_after(4, 1800, world_size=1) == 1.0


def test_the_watchdog_dumps_every_thread_once_when_progress_stops(tmp_path):
    import threading
    import time

    from trainables.observe.watchdog import StallWatchdog

    dog = StallWatchdog(0.4, tmp_path, rank=3).start()
    release = threading.Event()
    helper = threading.Thread(target=release.wait, name="helper")
    helper.start()
    dog.beat(7)
    time.sleep(0.2)
    dog.beat(8)  # progress: nothing written
    assert not (tmp_path / "stacks-rank3.txt").exists()
    time.sleep(1.5)  # no progress for longer than 0.4 s
    text = (tmp_path / "stacks-rank3.txt").read_text()
    dog.stop()
    release.set()
    helper.join()
    assert text.startswith("no progress for ") and "after step 8" in text
    assert "test_the_watchdog_dumps_every_thread_once" in text  # the main thread's frame
    assert text.count("Thread 0x") + text.count("Current thread 0x") >= 3  # all threads


def test_the_collector_clock_times_collections_inside_it_only():
    import gc

    from trainables.observe.gc_control import CollectorClock

    with CollectorClock() as clock:
        assert clock.take() == {"gc_ms": 0.0, "gc_collections": 0}
        gc.collect()
        gc.collect(0)
        first = clock.take()
        assert first["gc_collections"] == 2 and first["gc_ms"] > 0
        assert clock.take() == {"gc_ms": 0.0, "gc_collections": 0}  # taken: reset
    gc.collect()  # after the run: not counted, and the callback is gone
    assert clock.take()["gc_collections"] == 0
    assert clock._callback not in gc.callbacks


def test_the_collector_is_paused_for_imports_and_put_back_as_it_was():
    import gc

    from trainables.observe.gc_control import CollectorClock, collector_paused

    assert gc.isenabled()
    with CollectorClock() as clock:
        with collector_paused():
            assert not gc.isenabled()
            cycles = []
            for _ in range(50_000):  # far past generation 0's threshold: no automatic pass
                node: list = []
                node.append(node)
                cycles.append(node)
            with collector_paused():  # nested (an import inside an import): still paused
                pass
            assert not gc.isenabled() and clock.take()["gc_collections"] == 0
        assert gc.isenabled()  # and the next allocations collect again
        del cycles
        for _ in range(2_000):
            node = []
            node.append(node)
        assert clock.take()["gc_collections"] > 0
        with pytest.raises(ValueError), collector_paused():
            raise ValueError("an import that failed")
        assert gc.isenabled()  # back on after an error too
        gc.disable()  # paused by someone else before: left paused
        try:
            with collector_paused():
                pass
            assert not gc.isenabled()
        finally:
            gc.enable()
