"""benchmarks/step_profile.py: a profiler trace's step split into its phases' GPU time, the
communication (and what of it no other kernel hid) and the GPU's idle time, per step."""

import json

import pytest

from benchmarks.step_profile import idle_gaps, read_trace, summarise, top_kernels


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


def test_top_kernels_rank_by_gpu_time_per_step():
    rows = top_kernels(_trace(), n=2)
    assert [r["kernel"] for r in rows] == ["sm90_gemm_backward", "ncclDevKernel_AllReduce_Sum_f32"]
    assert rows[0]["calls_per_step"] == 1 and rows[0]["ms_per_step"] == pytest.approx(0.3)
    assert rows[0]["share"] == pytest.approx(300 / 650)  # of all kernel time
    assert rows[0]["op"] == "cudaLaunchKernel"  # no host op around its launch: the launch


def test_top_kernels_name_the_host_op_holding_most_of_their_time():
    # A copy kernel launched by two host ops: aten::copy_ (in step 0, 40 us) and a compiled
    # graph's call (in step 1, 300 us): the kernel's row names the latter.
    events = [
        _x("user_annotation", "ProfilerStep#0", 0, 1000),
        _x("user_annotation", "ProfilerStep#1", 1000, 1000),
        _x("cpu_op", "aten::copy_", 100, 50),
        _x("cuda_runtime", "cudaLaunchKernel", 110, 5, correlation=1),
        _x("kernel", "memcpy32_post", 200, 40, correlation=1),
        _x("cpu_op", "## Call CompiledFxGraph f1 ##", 1100, 200),
        _x("cpu_op", "aten::copy_", 1150, 100),  # inside the graph: the innermost op
        _x("cuda_runtime", "cudaLaunchKernel", 1260, 5, correlation=2),  # after it ended
        _x("kernel", "memcpy32_post", 1300, 300, correlation=2),
    ]
    for e in events[2:]:
        e["tid"] = 7
    (row,) = top_kernels(events, n=1)
    assert row["kernel"] == "memcpy32_post" and row["calls_per_step"] == 1
    assert row["op"] == "## Call CompiledFxGraph f1 ##"


def test_the_cli_lists_each_traces_top_kernels(tmp_path, capsys):
    from benchmarks.step_profile import main

    path = tmp_path / "run_a" / "profile-rank0.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"traceEvents": _trace()}))
    assert main([str(path), "--kernels", "1", "--json", str(tmp_path / "s.json")]) == 0
    out = capsys.readouterr().out
    assert "run_a: the 1 kernels with the most GPU time" in out
    assert "| sm90_gemm_backward | 1 | 0.30 | 0.462 | cudaLaunchKernel |" in out
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["kernels"]["run_a"][0]["kernel"] == "sm90_gemm_backward"


def test_idle_gaps_are_charged_to_the_host_op_that_launched_late_or_to_the_queue():
    # One step: an eager layer norm launches its kernel 400 us after the previous kernel ended
    # (the GPU waited for the host); a kernel launched early starts 300 us after the one before
    # it ended (it waited in the queue); a third follows its predecessor with no gap.
    def on(tid, e):
        return {**e, "tid": tid}

    events = [
        _x("user_annotation", "ProfilerStep#0", 0, 2000),
        on(1, _x("user_annotation", "forward", 10, 1500)),
        on(1, _x("cpu_op", "aten::mm", 20, 20)),
        on(1, _x("cuda_runtime", "cudaLaunchKernel", 25, 5, correlation=1)),
        on(1, _x("cpu_op", "aten::layer_norm", 500, 40)),
        on(1, _x("cpu_op", "aten::native_layer_norm", 505, 30)),
        on(1, _x("cuda_runtime", "cudaLaunchKernel", 510, 5, correlation=2)),
        on(1, _x("cpu_op", "aten::mm", 540, 20)),
        on(1, _x("cuda_runtime", "cudaLaunchKernel", 545, 5, correlation=3)),
        on(1, _x("cuda_runtime", "cudaLaunchKernel", 560, 5, correlation=4)),
        _x("kernel", "gemm_a", 30, 100, correlation=1),  # busy until 130
        _x("kernel", "layer_norm_kernel", 530, 50, correlation=2),  # 400 us idle before
        _x("kernel", "gemm_b", 880, 100, correlation=3),  # launched at 545: queued 300 us
        _x("kernel", "gemm_c", 980, 10, correlation=4),  # no gap
    ]
    rows = idle_gaps(events)
    assert [(r["phase"], r["cause"], r["op"]) for r in rows] == [
        ("forward", "host", "aten::native_layer_norm"),  # the innermost op around the launch
        ("forward", "queued", "aten::mm"),
    ]
    assert rows[0]["ms_per_step"] == pytest.approx(0.4)
    assert rows[1]["ms_per_step"] == pytest.approx(0.3) and rows[1]["gaps_per_step"] == 1


def test_the_cli_charges_idle_gaps(tmp_path, capsys):
    from benchmarks.step_profile import main

    path = tmp_path / "run_b" / "profile-rank0.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"traceEvents": _trace()}))
    assert main([str(path), "--gaps", "5", "--json", str(tmp_path / "s.json")]) == 0
    assert "run_b: what the GPU waited for when idle" in capsys.readouterr().out
    saved = json.loads((tmp_path / "s.json").read_text())
    # Each step: the backward's kernel launched 80 us after the forward's ended, the optimizer's
    # 260 us after the all-reduce; step 2's forward kernel 160 us after step 1's last kernel.
    assert {(r["phase"], r["cause"]) for r in saved["gaps"]["run_b"]} == {
        ("forward", "host"),
        ("backward", "host"),
        ("optimizer", "host"),
    }
    # The step's idle time less its edges: the 30 us before the trace's first kernel and the
    # 130 us after its last, which no kernel ends (0.4 - 0.16 / 2 ms per step).
    total = sum(r["ms_per_step"] for r in saved["gaps"]["run_b"])
    assert summarise(_trace())["gpu_idle"] == pytest.approx(0.4)
    assert total == pytest.approx(0.32)


def test_a_trace_without_steps_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="prof.step"):
        summarise([_x("kernel", "k", 0, 1)])


def test_host_ops_names_the_loop_threads_extra_op_and_the_slower_launches():
    # benchmarks/probes/host_ops.py: the same workload's traces, the second with a host-side sum on
    # the loop's thread and slower launches on autograd's thread.
    from benchmarks.probes.host_ops import compare, per_thread, threads

    def trace(extra_sum_us, launch_us):
        events = []
        for i in range(2):
            t = 10_000 * i
            loop = [_x("user_annotation", "forward", t, 100), _x("cpu_op", "aten::linear", t, 50)]
            if extra_sum_us:  # a sum whose cast (a copy nested in it) takes most of its time
                loop.append(_x("cpu_op", "aten::sum", t + 60, extra_sum_us))
                loop.append(_x("cpu_op", "aten::copy_", t + 61, extra_sum_us - 1000))
            for e in loop:
                e["tid"] = 1
            grads = [_x("cpu_op", "AddmmBackward0", t + 8000 + 30 * k, 20) for k in range(3)]
            grads.append(_x("cuda_runtime", "cudaLaunchKernel", t + 8005, launch_us))
            for e in grads:
                e["tid"] = 2
            events += loop + grads
        return events

    base, other = trace(0, 5), trace(7000, 8)
    assert threads(other) == {"loop": 1, "autograd": 2}
    text = "\n".join(compare(per_thread(base), per_thread(other), top=2))
    # Own time: the copy's 6 ms out of the sum's 7 (an op's time less what is nested in it).
    assert "| aten::copy_ | 0 -> 1 | - -> 6000.0 | 0.0 -> 6.0 |" in text
    assert "| aten::sum | 0 -> 1 | - -> 1000.0 | 0.0 -> 1.0 |" in text
    assert "autograd thread: cudaLaunchKernel median 5.0 -> 8.0 us" in text
    # The launch nested in each step's first AddmmBackward0 comes off its own time (20 - 8 us).
    assert sorted(per_thread(other)["autograd"]["ops"]["AddmmBackward0"]) == [
        12.0,
        12.0,
        20.0,
        20.0,
        20.0,
        20.0,
    ]
    with pytest.raises(ValueError, match="without a 'forward' phase"):
        threads([_x("cpu_op", "aten::mm", 0, 1)])
