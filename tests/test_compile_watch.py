"""The workers' side of the performance cliffs: what torch's compiler did in a window's steps
(trainables/engine/compile_watch.py), counted from torch's own callbacks, counters and log
lines after the compile warm-up, and carried in the window's metrics."""

import logging
import math
from types import SimpleNamespace

import pytest
import torch

from trainables.config import TrialConfig
from trainables.engine.compile_watch import COUNTS, CompileWatch
from trainables.observe.window_metrics import Window, WindowMetrics
from trainables.run_folder.run_state import RunState

RERECORD_LOG = "torch._inductor.cudagraph_trees.__cudagraphs"


@pytest.fixture
def fresh_dynamo():
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _window_metrics(watch: CompileWatch) -> dict:
    """One window's metrics as rank 0 reports them (trainables/observe/window_metrics.py), of a
    made-up worker and engine: what matters here is what the watch adds."""
    cfg = TrialConfig(use_gpu=False, max_steps=10, log_every=5)
    worker = SimpleNamespace(
        device=torch.device("cpu"), world_size=1, rank=0, node="n", node_id="", start_ts=0.0
    )
    engine = SimpleNamespace(
        flops_per_sample=1.0, peak_tflops=math.nan, effective={}, lr=lambda: 1e-3
    )
    window = Window.on(torch.device("cpu"))
    window.add_audio({"audio": torch.zeros(2, 100)})
    window.timer.add(data_ms=1.0, step_ms=9.0, iter_ms=10.0)
    state = RunState(step=5)
    metrics = WindowMetrics(cfg, worker, engine, {}, None, watch)
    return metrics.build(window, state, epoch=0, first_step_ts=1.0, loop_start=0.0)


def test_a_recompile_after_the_warm_up_is_counted_in_its_window_with_torchs_reason(
    fresh_dynamo,
):
    double = torch.compile(lambda x: (2 * x).sum(), backend="aot_eager", dynamic=False)
    with CompileWatch(cudagraphs=False) as watch:
        double(torch.ones(3))  # the compile warm-up: a known shape, compiled ahead
        watch.forget(skips=False)
        double(torch.ones(3))  # a step of that shape: nothing compiled
        quiet = _window_metrics(watch)
        double(torch.ones(5))  # a shape the warm-up did not compile: dynamo compiles again
        double(torch.ones(5))
        window = _window_metrics(watch)
    assert {k: quiet[k] for k in (*COUNTS, "cliff_reason")} == {
        "recompiles": 0,
        "graph_breaks": 0,
        "cudagraph_records": 0,
        "cudagraph_skips": 0,
        "cliff_reason": "",
    }
    assert window["recompiles"] == 1 and window["graph_breaks"] == 0
    assert window["cliff_reason"] == (
        "recompile: tensor 'x' size mismatch at index 0. expected 3, actual 5"
    )
    assert window["samples_per_s"] > 0  # the rest of the window as before


def test_graph_breaks_cuda_graph_skips_and_recordings_are_counted(fresh_dynamo):
    from torch._dynamo.callback import CallbackTrigger, callback_handler
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    def talks(x):
        print("a graph break")  # dynamo cannot trace print: it breaks the graph here
        return x + 1

    with CompileWatch(cudagraphs=True) as watch:
        # The warm-up: its compiles and recordings are its purpose, its skips hold for the steps.
        log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to mutated inputs (1)")
        with callback_handler.install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING, "0/0"):
            pass
        watch.forget(skips=False)
        first = watch.take()
        torch.compile(talks, backend="aot_eager")(torch.ones(2))
        # A step that records its CUDA graphs again, in torch's words (its debug line).
        with callback_handler.install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING, "1/0"):
            logging.getLogger(RERECORD_LOG).debug(
                "[%s] Re-recording function=%s, mode=%s, reason=%s",
                "1/0",
                "layer",
                "FORWARD",
                # str(CheckInvariantStatus.StaticInputIdxMismatch), then log_data_ptr_mismatch's
                "static input data pointer changed.\ninput name: primals_3. data pointer "
                "changed from 1 to 2.",
            )
        second = watch.take()
    assert first == {
        "recompiles": 0,
        "graph_breaks": 0,
        "cudagraph_records": 0,
        "cudagraph_skips": 1,
        "cliff_reason": "CUDA graph skipped: skipping cudagraphs due to mutated inputs (1)",
    }
    assert second["recompiles"] >= 1 and second["graph_breaks"] == 1
    assert second["cudagraph_records"] == 1 and second["cudagraph_skips"] == 0
    assert second["cliff_reason"] == (
        "CUDA graph recorded again: Re-recording function=layer, mode=FORWARD, reason=static "
        "input data pointer changed. input name: primals_3. data pointer changed from 1 to 2."
    )


def test_off_a_gpu_or_without_compile_nothing_is_counted_and_torch_is_left_as_it_was(
    fresh_dynamo,
):
    from torch._dynamo.callback import CallbackTrigger, callback_handler
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    rerecords = logging.getLogger(RERECORD_LOG)
    level, callbacks = rerecords.level, list(callback_handler.start_callbacks)
    # Off a GPU inductor skips CUDA graphs by design (the run's fallbacks say so): not counted.
    with CompileWatch(cudagraphs=False) as watch:
        log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to cpu device")
        with callback_handler.install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING, "0/0"):
            pass
        assert watch.take() == dict.fromkeys(COUNTS, 0) | {"cliff_reason": ""}
        assert rerecords.level == level  # no debug line asked for
    with CompileWatch(cudagraphs=True):
        assert rerecords.getEffectiveLevel() == logging.DEBUG
    assert rerecords.level == level and callback_handler.start_callbacks == callbacks
    assert CompileWatch(enabled=False).start().take() == dict.fromkeys(COUNTS, 0) | {
        "cliff_reason": ""
    }


def test_a_compiled_run_that_compiles_in_its_windows_records_those_seconds(
    fresh_dynamo, gloo_world_of_one
):
    """A compiled run without the warm-up (unknown shapes: torch compiles at the first step)
    has compile_s 0 and its compile seconds in compile_in_windows_s, which the manifest keeps
    from its last window (issue 57's GPU check: 0.0 for every compiled run before)."""
    import time

    from trainables.loop import WorkerContext, run_training

    cfg = TrialConfig(model_size="tiny", proj_dim=16, use_gpu=False, torch_compile=True,
                      compile_backend="aot_eager", compile_warmup=False, micro_batch=2,
                      max_steps=4, log_every=2, num_workers=0, tail_timing_points=1)  # fmt: skip
    windows: list[dict] = []
    run_training(
        cfg,
        WorkerContext(
            rank=0,
            world_size=1,
            device=torch.device("cpu"),
            report=lambda metrics, checkpoint=None: windows.append(metrics),
            start_ts=time.time(),
        ),
    )
    first, last = windows[0], windows[-1]
    assert first["compile_s"] == 0.0 and first["recompiles"] >= 1
    assert first["compile_in_windows_s"] > 0
    assert last["compile_in_windows_s"] >= first["compile_in_windows_s"]
