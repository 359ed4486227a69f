"""benchmarks/step_profile.py: a profiler trace's step split into its phases' GPU time, the
communication (and what of it no other kernel hid) and the GPU's idle time, per step."""

import json

import pytest

from benchmarks.step_profile import read_trace, summarise


def _x(cat, name, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


def _trace():
    """Two steps of 1,000 us each: in each, a forward kernel (100 us, launched in forward), a
    backward kernel (300 us, launched by another thread while the loop waits in backward), an
    all-reduce (200 us, of which 50 us beside the backward kernel), an optimizer kernel (50 us)."""
    events = []
    for i, t in enumerate((0, 1000)):
        c = 10 * i
        events += [
            _x("user_annotation", f"ProfilerStep#{i}", t, 1000),
            _x("user_annotation", "forward", t + 10, 150),
            _x("user_annotation", "backward", t + 200, 500),
            _x("user_annotation", "optimizer", t + 800, 100),
            _x("cuda_runtime", "cudaLaunchKernel", t + 20, 5, correlation=c + 1),
            _x("cuda_runtime", "cudaLaunchKernel", t + 210, 5, correlation=c + 2),
            _x("cuda_runtime", "cudaLaunchKernel", t + 220, 5, correlation=c + 3),
            _x("cuda_runtime", "cudaLaunchKernel", t + 810, 5, correlation=c + 4),
            _x("kernel", "sm90_gemm_forward", t + 30, 100, correlation=c + 1),
            _x("kernel", "sm90_gemm_backward", t + 250, 300, correlation=c + 2),
            _x("kernel", "ncclDevKernel_AllReduce_Sum_f32", t + 500, 200, correlation=c + 3),
            _x("kernel", "multi_tensor_apply_kernel", t + 820, 50, correlation=c + 4),
        ]
    return events


def test_a_step_splits_into_its_phases_communication_and_idle_gpu(tmp_path):
    s = summarise(_trace())
    assert s["steps"] == 2
    assert (s["step"], s["forward"], s["backward"], s["optimizer"]) == (1.0, 0.1, 0.3, 0.05)
    assert (s["comm"], s["comm_exposed"]) == (0.2, 0.15)  # 50 us of it beside the backward
    assert s["gpu_idle"] == pytest.approx(1.0 - (0.1 + 0.3 + 0.15 + 0.05))
    # As torch writes it: a file of {"traceEvents": [...]}.
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": _trace()}))
    assert summarise(read_trace(path)) == s


def test_a_trace_without_steps_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="prof.step"):
        summarise([_x("kernel", "k", 0, 1)])
