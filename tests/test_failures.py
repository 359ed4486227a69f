"""What the driver records about a failed run: reason, exit code, and its workers' log tails."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from platform.record.failures import exit_code, fail_tail, failure_reason
from trainables.run_folder.worker_logs import read_registrations, tail_lines

ROOT = Path(__file__).resolve().parents[1]

# Ray Train's error after `kill -9` of rank 1 (shortened from a real run's error.txt).
KILLED = """Failure # 1 (occurred at 2026-11-21_13-21-11)
  File "/work/main/trainables/trial.py", line 56, in run_trial
    build_trainer(run).fit()
ray.train.WorkerGroupError: Training failed due to worker errors:
[Rank 1 Error Snippet]:
A worker health check failed.
The actor died unexpectedly before finishing this task.
\tclass_name: RayTrainWorker
\tpid: 2054
The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file.
"""

RAISED = """ray.train.WorkerGroupError: Training failed due to worker errors:
[Rank 0 Error Snippet]:
Traceback (most recent call last):
  File "/work/main/trainables/loop.py", line 212, in _train
    raise RuntimeError("injected error at step 7 on rank 0 (inject_error_at_step)")
RuntimeError: injected error at step 7 on rank 0 (inject_error_at_step)

[Rank 1 Error Snippet]:
Traceback (most recent call last):
RuntimeError: [gloo] Connection closed by peer
"""


def test_failure_reason_takes_the_last_meaningful_traceback_line():
    text = (
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in f\n'
        "    raise ValueError('bad')\n"
        "ValueError: bad micro_batch\n"
    )
    assert failure_reason(text) == "ValueError: bad micro_batch"
    assert failure_reason(None).startswith("failed")


# The same kill, when rank 0's error (its peer vanished mid all-reduce) is listed first.
KILLED_PEER_FIRST = """ray.train.WorkerGroupError: Training failed due to worker errors:
[Rank 0 Error Snippet]:
Traceback (most recent call last):
RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:41234: Connection reset by peer

[Rank 1 Error Snippet]:
A worker health check failed.
The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR
"""


def test_failure_reason_names_the_rank_that_caused_the_failure():
    assert failure_reason(RAISED) == (
        "rank 0: RuntimeError: injected error at step 7 on rank 0 (inject_error_at_step)"
    )
    reason = failure_reason(KILLED)
    assert reason.startswith("rank 1: The actor is dead because its worker process has died")
    assert len(reason) <= 300
    # The rank whose process died, not the rank that lost its peer.
    assert failure_reason(KILLED_PEER_FIRST).startswith("rank 1: The actor is dead")
    assert exit_code("failed", KILLED_PEER_FIRST) == 137


@pytest.mark.parametrize(
    "status, text, signal_name, code",
    [
        ("ok", None, None, 0),
        ("failed", RAISED, None, 1),
        ("failed", KILLED, None, 137),  # a worker process died without an exception
        ("timeout", None, None, 124),
        ("stalled", None, None, 124),
        ("interrupted", None, "SIGINT", 130),
        ("interrupted", None, "SIGTERM", 143),
        ("pending", None, None, None),
        ("running", None, None, None),
    ],
)
def test_exit_codes_follow_the_runbooks_conventions(status, text, signal_name, code):
    assert exit_code(status, text, signal_name) == code


def test_tail_lines_reads_the_end_of_a_large_file(tmp_path):
    path = tmp_path / "big.log"
    path.write_text("".join(f"line {i}\n" for i in range(200_000)))
    assert tail_lines(path, 3) == ["line 199997", "line 199998", "line 199999"]
    assert tail_lines(path, 3, block=7) == ["line 199997", "line 199998", "line 199999"]
    short = tmp_path / "short.log"
    short.write_text("a\nb")  # no newline at the end
    assert tail_lines(short, 10) == ["a", "b"]
    assert tail_lines(short, 0) == []
    (tmp_path / "empty.log").write_text("")
    assert tail_lines(tmp_path / "empty.log", 5) == []


def test_a_worker_registers_the_files_its_output_goes_to(tmp_path):
    # As under Ray: the process's stdout and stderr are redirected to files.
    out, err = tmp_path / "worker.out", tmp_path / "worker.err"
    code = (
        "import sys; from trainables.run_folder.worker_logs import register_worker; "
        f"r = register_worker({str(tmp_path / 'run')!r}, rank=1, local_rank=1); "
        "print('hello from rank 1', flush=True); print('boom', file=sys.stderr)"
    )
    with out.open("w") as o, err.open("w") as e:
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, stdout=o, stderr=e, check=True)
    (record,) = read_registrations(tmp_path / "run")
    assert record["rank"] == 1 and record["pid"] > 0
    assert Path(record["stdout"]) == out and Path(record["stderr"]) == err
    text = fail_tail(tmp_path / "run", 5)
    assert "rank 1 (pid" in text and "hello from rank 1" in text and "boom" in text


def test_fail_tail_says_where_a_log_it_cannot_read_is(tmp_path):
    run = tmp_path / "run"
    (run / "workers").mkdir(parents=True)
    log = tmp_path / "r0.err"
    log.write_text("".join(f"err {i}\n" for i in range(100)))
    (run / "workers" / "rank0.json").write_text(
        json.dumps(
            {
                "rank": 0,
                "pid": 10,
                "hostname": "a",
                "node_ip": "10.0.0.1",
                "stderr": str(log),
                "stdout": "",
            }
        )
    )
    (run / "workers" / "rank1.json").write_text(
        json.dumps(
            {
                "rank": 1,
                "pid": 11,
                "hostname": "b",
                "node_ip": "10.0.0.2",
                "stderr": "/nonexistent/r1.err",
                "stdout": "",
            }
        )
    )
    text = fail_tail(run, 4)
    assert "err 96\nerr 97\nerr 98\nerr 99\n" in text and "err 95" not in text
    assert "rank 1" in text and "not readable from the driver" in text and "10.0.0.2" in text
    assert fail_tail(tmp_path / "never-started", 4).startswith("no worker registered")
    assert fail_tail(run, 0) == ""


# A CUDA OOM on 2x H200 (micro_batch 4096): Ray cut rank 0's snippet inside the exception line.
OOM_CUT = """ray.train.WorkerGroupError: Training failed due to worker errors:
[Rank 0 Error Snippet]:
ray::ImplicitFunc.train() (pid=5922, ip=192.0.2.2, repr=run_trial)
  File "/work/main/trainables/loop.py", line 79, in train_loop_per_worker
    run_training(
... (Output truncated. See individual worker logs for full details) ...
0 GiB of which 34.83 GiB is free. Including non-PyTorch memory, this process has 104.95 GiB memory in use.
"""
OOM_TAIL = [
    '  File ".../transformers/activations.py", line 89, in forward',
    "    return self.act(input)",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 49.99 GiB. GPU 0 has a total "
    "capacity of 139.80 GiB of which 34.84 GiB is free.",
    "",
]


def test_a_cut_snippet_takes_the_exception_from_the_ranks_stderr_tail():
    assert failure_reason(OOM_CUT).startswith("rank 0: 0 GiB of which")  # all the text has
    reason = failure_reason(OOM_CUT, {0: OOM_TAIL, 1: ["ValueError: not this rank"]})
    assert reason.startswith(
        "rank 0: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"
    )
    # A rank whose process died keeps Ray's words: its log holds no exception of this failure.
    assert "worker process has died" in failure_reason(KILLED, {1: ["ValueError: stale"]})


def _register(run: Path, tmp_path: Path, rank: int, stderr: str) -> None:
    """A worker process of ``run`` (rank ``rank``) whose stderr says ``stderr``, registered as
    under Ray (its output redirected to files), run to its end."""
    err = tmp_path / f"rank{rank}-{len(list(tmp_path.glob('*.err')))}.err"
    code = (
        "import sys; from trainables.run_folder.worker_logs import register_worker; "
        f"register_worker({str(run)!r}, rank={rank}, local_rank={rank}); "
        f"sys.stderr.write({stderr!r})"
    )
    with err.open("w") as e:
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, stderr=e, check=True)


def test_a_restart_saves_the_ended_attempts_tails_and_says_why_in_one_line(tmp_path):
    from platform.record.failures import restart_reason, save_restart_tail
    from stage1_common.output_root import OutputRoot
    from trainables.faults import KILL_NOTE

    root = OutputRoot.of(tmp_path / "out")
    run = root.run_dir("r")
    # Attempt 0: rank 1 killed by the drill's fault, rank 0 lost its peer.
    _register(run, tmp_path, 0, "RuntimeError: Connection closed by peer [10.0.0.1]:1234\n")
    _register(run, tmp_path, 1, f"step 170 done\n{KILL_NOTE}: SIGKILL after step 170\n")
    assert save_restart_tail(root, "r", 1, 20) == ("", "")  # nothing restarted yet
    # Attempt 1's processes register: attempt 0's records move to workers/previous/.
    _register(run, tmp_path, 0, "")
    _register(run, tmp_path, 1, "")
    assert len(read_registrations(run)) == len(read_registrations(run, previous=True)) == 2
    reason, saved_to = save_restart_tail(root, "r", 1, 20)
    assert reason == f"rank 1: {KILL_NOTE}: SIGKILL after step 170"
    assert saved_to == "runs/r/restart_tail-attempt1.txt"
    text = (root.path / saved_to).read_text()
    assert text.startswith(f"why attempt 0 ended: {reason}\n")
    assert "Connection closed by peer" in text and "step 170 done" in text
    # Without the drill's note: a rank's own error, never a peer's lost connection.
    peer = ["RuntimeError: Connection closed by peer"]
    own = ["Traceback (most recent call last):", "ValueError: bad batch"]
    assert restart_reason({0: peer, 1: own}) == "rank 1: ValueError: bad batch"
    assert restart_reason({0: peer, 1: []}).startswith("a worker process died without an exc")


def test_raised_at_names_the_innermost_frame_of_the_last_traceback():
    """Issue 54 item 3: the console says where a run raised in one line; Ray nests the worker's
    traceback in the trial's, so the last frame of the text is the worker's."""
    from platform.record.failures import raised_at

    root = Path("/work/repo")
    error = (
        "Traceback (most recent call last):\n"
        '  File "/venv/ray/_private/worker.py", line 1053, in get_objects\n'
        "    raise value.as_instanceof_cause()\n"
        "trainables.resident.relay.ResidentRunError: ray.train.WorkerGroupError: Training failed\n"
        "[Rank 0,1 Error Snippet]:\n"
        '  File "/work/repo/trainables/faults.py", line 76, in error\n'
        "    raise RuntimeError(\n"
        "    ^^^^^^^^^^^^^^^^^^^\n"
        "RuntimeError: injected error at step 5 on rank 0 (inject_error_at_step)\n"
    )
    assert raised_at(error, root) == "trainables/faults.py:76 in error: raise RuntimeError("
    outside = '  File "/venv/torch/nn/modules/module.py", line 1, in _call_impl\n    ^^^\n'
    assert raised_at(outside, root) == "/venv/torch/nn/modules/module.py:1 in _call_impl"
    shipped = '  File "/tmp/ray/session_1/runtime_resources/working_dir_files/_ray_pkg_ab/trainables/faults.py", line 76, in error\n'
    assert raised_at(shipped, root) == "trainables/faults.py:76 in error"
    assert raised_at(None) == "" and raised_at("ValueError: no frames") == ""
