"""A real multi-node Ray cluster on one machine, for the multi-node tests.

A head raylet and worker raylets are separate ``ray start --block`` processes on distinct
loopback addresses, with token authentication. Each worker raylet runs in a mount namespace of
its own (``unshare -m``) where the project's directory and ``/tmp/ray`` are hidden behind empty
folders, as on another machine: a worker node has neither this checkout (Ray hands the driver's
``sys.path`` to its workers, which would otherwise find it through the shared filesystem) nor
the head's log files. Only the processes of this cluster are stopped, found by its session name.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.cli import ROOT


def ray_cli() -> list[str]:
    """The ``ray`` command (its console script, or the same through this Python where a bundle
    installed Ray without scripts)."""
    script = shutil.which("ray")
    return (
        [script]
        if script
        else [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]
    )


_HANDED: set[int] = set()  # ports given out already: the OS may offer a closed one again


def free_port() -> int:
    """A free port, never one this process handed out before (a head once got the same port
    for its GCS and its dashboard agent, and died)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED:
            _HANDED.add(port)
            return port


def can_unshare() -> str | None:
    """Why worker raylets cannot get a mount namespace here (None when they can)."""
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    if probe.returncode:
        return f"unshare -m is not permitted: {probe.stderr.strip()}"
    return None


class LocalCluster:
    """``with LocalCluster(tmp, workers=2) as c: c.address`` (GCS) and ``c.dashboard``."""

    def __init__(
        self,
        folder: Path,
        *,
        workers: int = 2,
        hide: tuple[Path, ...] = (),
        worker_cpus: int = 1,
        worker_gpus: list[str] | None = None,
        isolate: bool = True,
    ):
        """``worker_gpus``: each worker raylet's CUDA_VISIBLE_DEVICES (``["0", "1"]``: one GPU
        each); ``isolate``: run the worker raylets in mount namespaces (off where unshare is not
        permitted; the workers then see this checkout)."""
        self.folder = Path(folder)
        self.workers = workers
        self.worker_cpus = worker_cpus
        self.worker_gpus = worker_gpus
        self.isolate = isolate
        self.hide = tuple(Path(p) for p in hide)  # also hidden from the worker nodes
        self.port = free_port()
        self.dashboard_port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.dashboard = f"http://127.0.0.1:{self.dashboard_port}"
        self.env = dict(
            os.environ,
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN=secrets.token_hex(16),
            RAY_USAGE_STATS_ENABLED="0",
        )
        self.procs: list[subprocess.Popen] = []
        self.head_tmp: Path | None = None
        self.node_ips = [f"127.0.0.{i + 2}" for i in range(workers)]

    # --- lifecycle ---
    def __enter__(self) -> LocalCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _ports(self) -> list[str]:
        return [
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
        ]

    def _start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        # The head's temp dir is its own: ``ray start --head`` records the cluster in
        # <temp dir>/ray_current_cluster, where a plain ray.init() of any later test on this
        # machine would find it (and hang on it once it is gone).
        # (A short path: Ray's socket paths under it must stay within 107 characters.)
        head_tmp = self.head_tmp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
        head = [
            *ray_cli(), "start", "--head", "--block", "--disable-usage-stats", f"--temp-dir={head_tmp}",
            "--node-ip-address=127.0.0.1", f"--port={self.port}",
            f"--ray-client-server-port={free_port()}",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
            # The head runs the driver's side (Tune, the Train controller) and no train worker.
            "--num-cpus=0", "--num-gpus=0", *self._ports(),
        ]  # fmt: skip
        self._spawn(head, self.folder / "head.log")
        self._wait(lambda: self._listening(self.port), "the head's GCS port", 60)
        empty = self.folder / "empty"
        empty.mkdir(exist_ok=True)
        for i, ip in enumerate(self.node_ips):
            private_tmp = self.folder / f"node{i + 1}-tmp"
            private_tmp.mkdir(exist_ok=True)
            mounts = [
                f"mount --bind {empty} {ROOT}",
                f"mount --bind {private_tmp} /tmp/ray",
                f"mount --bind {private_tmp} {head_tmp}",
            ]
            mounts += [f"mount --bind {empty} {p}" for p in self.hide]
            start = " ".join(
                [
                    "exec " + shlex.join(ray_cli()) + " start --block --disable-usage-stats",
                    f"--address=127.0.0.1:{self.port} --node-ip-address={ip}",
                    f"--num-cpus={self.worker_cpus} --num-gpus=0",
                    "--resources='" + json.dumps({f"node{i + 1}": 1}) + "'",
                    *self._ports(),
                ]
            )
            gpus = self.worker_gpus[i] if self.worker_gpus else ""
            start = start.replace(
                "--num-gpus=0", f"--num-gpus={len(gpus.split(',')) if gpus else 0}"
            )
            if gpus:
                start = start.replace("exec ", f"exec env CUDA_VISIBLE_DEVICES={gpus} ", 1)
            if self.isolate:
                script = " && ".join(["mkdir -p /tmp/ray", *mounts, f"cd {private_tmp}", start])
                argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script]
            else:
                argv = ["sh", "-c", f"cd {private_tmp} && {start}"]
            self._spawn(argv, self.folder / f"node{i + 1}.log")
        # A client of the cluster costs a process start and ~1.3 CPU-s, taken from the raylets
        # that are starting: poll the worker nodes' own logs until every raylet says it started,
        # then ask the GCS, as the CLIs do (`ray status` lags behind: the autoscaler's view is
        # refreshed every 5 s).
        self._wait(self._raylets_started, "every worker raylet to start", 90)
        self._wait(lambda: self.alive_nodes() == self.workers + 1, "every node to join", 90)

    def _spawn(self, argv: list[str], log: Path) -> None:
        with open(log, "ab") as fh:
            self.procs.append(
                subprocess.Popen(
                    argv,
                    env=self.env,
                    cwd=self.folder,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def _listening(self, port: int) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            return False

    def _wait(self, ready, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ready():
                return
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(
                    f"a raylet exited while waiting for {what}: {dead}\n{self.logs()}"
                )
            time.sleep(0.5)
        raise RuntimeError(f"timed out waiting for {what}\n{self.logs()}")

    def _raylets_started(self) -> bool:
        return all(
            any(
                "Raylet of id" in log.read_text(errors="replace")
                for log in (self.folder / f"node{i + 1}-tmp").glob("session_*/logs/raylet.out")
            )
            for i in range(self.workers)
        )

    def alive_nodes(self) -> int:
        """The nodes the GCS holds alive (``ray.nodes()``, what the CLIs count)."""
        probe = (
            "import ray, sys; from stage1_common.cluster import alive_nodes; "
            "ray.init(address=sys.argv[1], logging_level='ERROR'); print(len(alive_nodes()))"
        )
        out = subprocess.run(
            [sys.executable, "-c", probe, self.address],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
        return int(out) if out.isdigit() else 0

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
            for p in sorted(self.folder.glob("*.log"))
        )

    def session_name(self) -> str | None:
        """This cluster's session name, read off its GCS server's command line."""
        import psutil

        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            if any(a == f"--gcs_server_port={self.port}" for a in cmd):
                for a in cmd:
                    if a.startswith("--session-name="):
                        return a.split("=", 1)[1]
        return None

    def stop(self) -> None:
        """Kill this cluster's processes (every process of its session, and the ``ray start``
        processes), never another cluster's."""
        import psutil

        session = self.session_name()
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if session:
            for proc in psutil.process_iter(["cmdline"]):
                if any(session in a for a in proc.info["cmdline"] or []):
                    try:
                        proc.kill()
                    except psutil.Error:
                        pass
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.head_tmp is not None:
            shutil.rmtree(self.head_tmp, ignore_errors=True)
