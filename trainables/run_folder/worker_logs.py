"""Where each train worker's output goes, so that the driver can show a failed run's log tails.

Ray redirects a worker process's stdout and stderr to files in its session's log folder
(``worker-<id>-<job>-<pid>.out`` / ``.err``). At start, every rank writes
``runs/<run>/workers/rank<r>.json`` with its pid, node and those two paths; when the run fails
(an exception, a rank killed, a hang), the driver reads the last ``fail_tail_lines`` lines of each
(platform/record/failures.py). The record is written before anything can fail, so it exists even for a
rank killed during start-up. A restarted worker group moves the records of the attempt before
to ``workers/previous/``: the driver reads their tails to say why the run restarted.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from stage1_common.fileio import write_json
from stage1_common.output_root import RunFolder

__all__ = ["register_worker", "read_registrations", "tail_lines"]


def _fd_target(fd: int) -> str:
    """The file behind one of this process's descriptors ('' when it is not a regular file)."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc (not Linux) or the descriptor is closed
        return ""
    return target if os.path.isfile(target) else ""


def register_worker(run_dir: Path, rank: int, local_rank: int) -> dict[str, Any]:
    """Write this worker's record under ``run_dir/workers/``; returns it. The record of an
    earlier process of this rank (the attempt before a restart) moves to
    ``workers/previous/``."""
    node_ip = node_id = ""  # outside Ray (torchrun): the hostname says where the logs are
    try:
        import ray

        if ray.is_initialized():  # asking otherwise would start a local Ray cluster
            node_ip = ray.util.get_node_ip_address()
            node_id = ray.get_runtime_context().get_node_id()
    except Exception:
        pass
    record = {
        "rank": rank,
        "local_rank": local_rank,
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "node_ip": node_ip,
        "node_id": node_id,
        # Where this rank imported the workload from: on a cluster joined with --address, the
        # copy the driver shipped (runtime_env py_modules), not a path of the driver's machine.
        "code_path": str(Path(__file__).resolve().parent),
        "stdout": _fd_target(1),
        "stderr": _fd_target(2),
        "started_ts": time.time(),
    }
    folder = RunFolder(run_dir)
    _keep_previous(folder, rank, record["pid"], record["hostname"])
    write_json(folder.worker(rank), record)
    return record


def _keep_previous(folder: RunFolder, rank: int, pid: int, hostname: str) -> None:
    """Move the rank's record to ``previous/`` when another process wrote it."""
    import json

    path = folder.worker(rank)
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if (old.get("pid"), old.get("hostname")) == (pid, hostname):
        return
    previous = folder.worker(rank, previous=True)
    previous.parent.mkdir(parents=True, exist_ok=True)
    os.replace(path, previous)


def read_registrations(run_dir: Path, *, previous: bool = False) -> list[dict[str, Any]]:
    """The records of a run's workers (of the attempt before, with ``previous``), in rank
    order (unreadable ones are skipped)."""
    import json

    pattern = RunFolder(run_dir).worker("*", previous=previous)
    out = []
    for path in sorted(pattern.parent.glob(pattern.name)):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda r: r.get("rank", 0))


def tail_lines(path: Path, n: int, *, block: int = 65536) -> list[str]:
    """The last ``n`` lines of a text file, read from its end (worker logs can be large)."""
    if n <= 0:
        return []
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        pos = fh.tell()
        data = b""
        while pos > 0 and data.count(b"\n") <= n:
            step = min(block, pos)
            pos -= step
            fh.seek(pos)
            data = fh.read(step) + data
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-n:]
