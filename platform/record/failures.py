"""What the driver records about a run that did not finish: a one-line reason, an exit code in
the runbooks' sense, whether it stalled (the stall watchdog left stack dumps), and the tails of
its workers' logs (``runs/<run>/fail_tail.txt``)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from stage1_common.fileio import atomic_write_text
from stage1_common.output_root import OutputRoot, RunFolder
from trainables.faults import KILL_NOTE
from trainables.run_folder.worker_logs import read_registrations, tail_lines

__all__ = [
    "EXIT_CODES",
    "RunFailure",
    "diagnose",
    "error_text",
    "exit_code",
    "fail_tail",
    "keep_failure",
    "raised_at",
    "failure_reason",
    "format_tails",
    "remote_tail",
    "restart_reason",
    "save_fail_tail",
    "save_restart_tail",
    "stderr_tails",
    "worker_tails",
]

# The exit status a shell runbook would have seen for the run (run_manifest.tsv: exit_code).
EXIT_CODES = {
    "ok": 0,
    "failed": 1,  # an exception in the training code (or a failure with no process exit)
    "killed": 137,  # a worker process died without an exception: SIGKILL, the OOM killer, a crash
    "timeout": 124,  # stopped by run_timeout_s or stall_timeout_s, as timeout(1) reports it
    "stalled": 124,
    "interrupted": 130,  # Ctrl-C; 143 when the sweep got SIGTERM
    "stopped_early": 0,  # stopped on purpose by the scheduler (race, asha); windows kept
}

_RANK_SNIPPET = re.compile(r"^\[Rank (\d+) Error Snippet\]:\s*$", re.MULTILINE)
_NOISE = ("File ", "^", "~", "During handling", "The above exception", "Traceback (most recent")
_DIED = ("worker process has died", "actor died unexpectedly", "NODE_OUT_OF_MEMORY")


# A rank whose error says only that a peer went away is a casualty, not the cause.
_PEER_LOST = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Read error",
    "Broken pipe",
    "remote process exited",
    "DistBackendError",
    "NCCL communicator was aborted",
    "Timed out",
)
# The line that names an exception: "torch.OutOfMemoryError: CUDA out of memory. ...".
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(\[[^\]]*\])?:")


def failure_reason(error_text: str | None, stderr_tails: dict[int, list[str]] | None = None) -> str:
    """One short line: the exception of the traceback (else its last meaningful line). When
    Ray Train names the ranks that failed (``[Rank N Error Snippet]``), the rank that caused
    it, prefixed with ``rank N:``: one whose process died, else one whose error is not just a
    lost peer, else the first. Ray cuts long snippets; when the exception line was cut, it is
    taken from that rank's stderr tail (``stderr_tails``: rank -> its last lines)."""
    if not error_text:
        return "failed (no error text recorded)"
    text = str(error_text)
    parts = _RANK_SNIPPET.split(text)  # [before, rank, body, rank, body, ...]
    ranks = list(zip(parts[1::2], parts[2::2], strict=True))
    if ranks:
        died = [r for r in ranks if any(s in r[1] for s in _DIED)]
        own = [r for r in ranks if not any(s in r[1] for s in _PEER_LOST)]
        rank, body = (died or own or ranks)[0]
        line = _exception_line(body.splitlines())
        if not line and not died and stderr_tails:
            line = _exception_line(stderr_tails.get(int(rank), []))
        line = line or _last_meaningful(body)
        if line:
            return f"rank {rank}: {line}"[:300]
    return (_exception_line(text.splitlines()) or _last_meaningful(text) or "failed")[:300]


def _exception_line(lines: list[str]) -> str:
    for line in reversed(lines):
        if _EXCEPTION_LINE.match(line.strip()):
            return line.strip()
    return ""


def _last_meaningful(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if not line.startswith(_NOISE):
            return line
    return lines[-1] if lines else ""


def exit_code(
    status: str, error_text: str | None = None, signal_name: str | None = None
) -> int | None:
    """The run's exit code for the manifest (None while it is pending or running)."""
    if status == "failed" and error_text and any(s in error_text for s in _DIED):
        return EXIT_CODES["killed"]
    if status == "interrupted" and signal_name == "SIGTERM":
        return 143
    return EXIT_CODES.get(status)


def worker_tails(run_dir: Path, lines: int, *, previous: bool = False) -> list[dict]:
    """Per registered worker (trainables/run_folder/worker_logs.py; of the attempt before a restart,
    with ``previous``): its record plus ``tails``, holding for ``stderr`` and ``stdout`` the last
    ``lines`` lines (a list) or why they cannot be read. A rank on another node of the cluster has
    its files read there, by a task on that node."""
    here = _driver_node_id()
    silent: dict[str, str] = {}  # node id -> why it did not answer (asked once, not per file)
    out = []
    for w in read_registrations(run_dir, previous=previous):
        tails: dict[str, list[str] | str] = {}
        remote = bool(here and w.get("node_id") and w["node_id"] != here)
        for stream in ("stderr", "stdout"):
            path = w.get(stream) or ""
            if not path:
                tails[stream] = "(not a file)"
                continue
            try:
                if remote and w["node_id"] in silent:
                    raise OSError(silent[w["node_id"]])
                tails[stream] = (
                    remote_tail(w["node_id"], path, lines)
                    if remote
                    else tail_lines(Path(path), lines)
                )
            except OSError as exc:
                if remote and str(exc).startswith("no answer from node"):
                    silent[w["node_id"]] = str(exc)
                where = "on its node" if remote else "from the driver"
                tails[stream] = (
                    f"(not readable {where}: {exc.strerror or exc}; it is on node "
                    f"{w.get('node_ip') or w.get('hostname')})"
                )
        out.append({**w, "tails": tails})
    return out


def _driver_node_id() -> str:
    """The Ray node the driver is attached to ('' when Ray is not running here)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    except Exception:
        return ""


def remote_tail(node_id: str, path: str, lines: int, timeout_s: float = 20.0) -> list[str]:
    """The last ``lines`` lines of ``path`` on the node ``node_id``, read by a task pinned there
    (its logs are that node's local files). Raises OSError when the node or file is gone."""
    import ray

    from stage1_common.cluster import pinned

    ref = pinned(tail_lines, node_id).remote(Path(path), lines)
    try:
        return ray.get(ref, timeout=timeout_s)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if isinstance(exc.cause, OSError) else None
        raise cause or OSError(str(exc).splitlines()[0]) from None
    except (ray.exceptions.GetTimeoutError, ray.exceptions.RayError) as exc:
        ray.cancel(ref, force=True)
        raise OSError(f"no answer from node {node_id[:12]} ({type(exc).__name__})") from None


def stderr_tails(workers: list[dict]) -> dict[int, list[str]]:
    """rank -> its stderr tail, for failure_reason."""
    return {
        int(w["rank"]): w["tails"]["stderr"]
        for w in workers
        if isinstance(w["tails"].get("stderr"), list)
    }


def format_tails(run_dir: Path, workers: list[dict]) -> str:
    if not workers:
        return (
            f"no worker registered in {RunFolder(run_dir).workers()} "
            "(the run failed before its workers started)\n"
        )
    parts = []
    for w in workers:
        where = (
            f"rank {w.get('rank')} (pid {w.get('pid')} on {w.get('hostname')} {w.get('node_ip')}"
            f"{' node ' + w['node_id'][:12] if w.get('node_id') else ''})"
        )
        for stream, tail in w["tails"].items():
            header = f"--- {where} {stream}: {w.get(stream) or '(not a file)'}"
            if isinstance(tail, list):
                parts.append(
                    f"{header} (last {len(tail)} lines)\n" + "".join(f"{ln}\n" for ln in tail)
                )
            elif w.get(stream):
                parts.append(f"{header}\n{tail}\n")
            else:
                parts.append(f"{header}\n")
    return "".join(parts)


def fail_tail(run_dir: Path, lines: int) -> str:
    """The last ``lines`` lines of every worker's stderr and stdout, per rank, as text."""
    if lines <= 0:
        return ""
    return format_tails(run_dir, worker_tails(run_dir, lines))


_PACKAGES = ("trainables", "data_prep", "stage1_common", "benchmarks")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


def raised_at(error: str | None, root: Path | None = None) -> str:
    """Where the error was raised, from its text: the innermost frame of the last traceback
    (``trainables/faults.py:76 in error: raise RuntimeError(``), a path inside the repository
    shown relative to it; '' when the text has none."""
    lines = (error or "").splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = _FRAME.match(lines[i])
        if m is None:
            continue
        where = Path(m["file"])
        base = root or Path(__file__).resolve().parents[2]
        if where.is_absolute() and where.is_relative_to(base):
            where = where.relative_to(base)
        elif where.is_absolute():  # the project's code as Ray shipped it to another node
            parts = where.parts
            ours = [i for i, p in enumerate(parts) if p in _PACKAGES]
            where = Path(*parts[ours[-1] :]) if ours else where
        code = lines[i + 1].strip() if i + 1 < len(lines) else ""
        code = "" if code.startswith(_NOISE) else code
        return f"{where.as_posix()}:{m['line']} in {m['func']}" + (f": {code}" if code else "")
    return ""


def error_text(trial) -> str | None:
    """The error of a failed Tune trial. Tune writes it to the trial's local folder before
    calling on_trial_error; the copy that ``trial.get_error()`` reads from storage is synced
    only later."""
    path = getattr(trial, "error_file", None)
    if path and os.path.isfile(path):
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    try:
        return trial.get_error()
    except Exception:  # no error text anywhere: the reason says so
        return None


@dataclass(frozen=True)
class RunFailure:
    """How a run that raised ended: ``failed``, or ``stalled`` when the stall watchdog dumped
    its ranks' stacks before the collectives timed out."""

    status: str
    reason: str
    exit_code: int | None
    workers: list[dict]  # worker_tails of the run, with at least 40 lines each


def diagnose(root: OutputRoot, run: str, error: str | None, lines: int) -> RunFailure:
    """Why ``run`` failed, from its error text, its workers' log tails (Ray cuts long error
    snippets: the exception line may be only there) and its stack dumps. ``lines``: the run's
    fail_tail_lines (the tails read are at least 40 lines, for the reason)."""
    folder = root.run_folder(run)
    workers = worker_tails(folder.path, max(lines, 40))
    reason = failure_reason(error, stderr_tails(workers))
    stacks = sorted(folder.path.glob(folder.stacks().name))
    if not stacks:
        return RunFailure("failed", reason, exit_code("failed", error), workers)
    names = ", ".join(p.name for p in stacks)
    reason = (
        f"stalled: no progress for stall_timeout_s; stacks in {OutputRoot.RUNS}/{run}/ "
        f"({names}); {reason}"
    )
    return RunFailure("stalled", reason, exit_code("stalled"), workers)


def _cut(workers: list[dict], lines: int) -> list[dict]:
    """``workers`` (worker_tails) with each tail cut to its last ``lines`` lines."""
    return [
        {**w, "tails": {k: v[-lines:] if isinstance(v, list) else v for k, v in w["tails"].items()}}
        for w in workers
    ]


def save_fail_tail(root: OutputRoot, run: str, workers: list[dict], lines: int) -> str:
    """Write the last ``lines`` lines of each worker's stderr and stdout (from ``workers``, as
    worker_tails gives them) to ``runs/<run>/fail_tail.txt``; returns that text."""
    text = format_tails(root.run_dir(run), _cut(workers, lines))
    atomic_write_text(root.run_folder(run).fail_tail, text)
    return text


def keep_failure(
    root: OutputRoot, run: str, error: str | None, workers: list[dict], lines: int
) -> list[str]:
    """A failed run's details, kept off the console: its error as Ray and Tune gave it
    (``runs/<run>/error.txt``) and its workers' last ``lines`` log lines (``fail_tail.txt``);
    returns the files written, relative to the root (the console names them)."""
    folder, saved = root.run_folder(run), []
    if error:
        atomic_write_text(folder.error, error)
        saved.append(folder.error)
    if lines > 0:
        save_fail_tail(root, run, workers, lines)
        saved.append(folder.fail_tail)
    return [p.relative_to(root.path).as_posix() for p in saved]


def restart_reason(tails: dict[int, list[str]]) -> str:
    """Why a worker group ended before its restart, from its ranks' stderr tails (rank -> last
    lines): a rank killed by inject_kill_at_step, else the first rank whose error is its own
    (not a lost peer), else a process that died without a word."""
    for rank, lines in sorted(tails.items()):
        note = next((ln.strip() for ln in reversed(lines) if KILL_NOTE in ln), "")
        if note:
            return f"rank {rank}: {note}"[:300]
    for rank, lines in sorted(tails.items()):
        line = _exception_line(lines)
        if line and not any(s in line for s in _PEER_LOST):
            return f"rank {rank}: {line}"[:300]
    return "a worker process died without an exception (SIGKILL, the OOM killer, a crash)"


def save_restart_tail(root: OutputRoot, run: str, attempt: int, lines: int) -> tuple[str, str]:
    """Attempt ``attempt`` (from 1) of ``run`` began after a restart: why the attempt before
    ended (restart_reason) and where the last ``lines`` lines of its workers' logs were saved
    (``runs/<run>/restart_tail-attempt<N>.txt``, relative to the root). ('', '') when no record
    of that attempt's workers is found."""
    run_dir = root.run_dir(run)
    workers = worker_tails(run_dir, max(lines, 40), previous=True)
    if not workers:
        return "", ""
    reason = restart_reason(stderr_tails(workers))
    path = root.run_folder(run).restart_tail(attempt)
    atomic_write_text(
        path,
        f"why attempt {attempt - 1} ended: {reason}\n"
        + format_tails(run_dir, _cut(workers, max(lines, 1))),
    )
    return reason, path.relative_to(root.path).as_posix()
