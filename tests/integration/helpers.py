"""Helpers of the integration tests: the CLIs run as a user runs them, in subprocesses."""

import subprocess
import sys
import threading
import time
from pathlib import Path

from data_prep.librispeech import prepare_serial
from tests.cli import run_module


def run_tune(
    space: str, root: Path, *sets: str, timeout: int = 600, flags: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """``python -m platform.tune --space SPACE --output-root ROOT --set ... FLAGS`` from the repo
    root."""
    args = [a for item in sets for a in ("--set", item)]
    return run_module(
        "platform.tune", "--space", space, "--output-root", root, *args, *flags, timeout=timeout
    )


def smoke_manifest(folder: Path) -> Path:
    """The smoke space's corpus (its ``data:`` section), made and prepared in this process, for
    sweeps that pass ``manifest_path`` instead of preparing it on their cluster (~8 s each)."""
    from data_prep import synth

    synth.make_corpus(folder / "raw", speakers=2, chapters=2, utts=8, seed=0)
    return prepare_serial(folder / "raw", folder / "prepared")


class LiveCli:
    """``python -m MODULE ARGS`` in a subprocess from the repo root, its output read as it
    comes (for tests that act on a line: kill a worker, stop the driver)."""

    def __init__(self, module: str, *args: str, own_group: bool = False):
        """``own_group``: the command leads a process group of its own (with the local Ray
        cluster it starts), as a batch job's command does, for a signal to the whole group."""
        from tests.cli import ROOT

        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *map(str, args)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=own_group,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout))
        self.reader.start()

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def wait_for(self, fragment: str, timeout_s: float = 300, after: int = 0) -> int:
        """Wait for a line holding ``fragment`` (from line ``after`` on); its index."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for i, line in enumerate(list(self.lines)[after:], start=after):
                if fragment in line:
                    return i
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"no line with {fragment!r}:\n{self.out[-4000:]}")

    def stop(self, sig) -> float:
        """Send ``sig``; seconds until the driver exited."""
        t0 = time.monotonic()
        self.proc.send_signal(sig)
        self.finish(timeout_s=60)
        return time.monotonic() - t0

    def crash(self) -> None:
        """SIGKILL the driver, as a crash would, then stop what its local Ray cluster leaves.
        The raylet and GCS follow the driver (fate-sharing), but Ray's dashboard and runtime-env
        agents outlive them by about a minute, holding the agent's port (52365): the next local
        cluster's agent retries it for 3-4 s, then runs without its HTTP server. Only this
        driver's own descendants, listed before the kill, are stopped."""
        import psutil

        left = psutil.Process(self.proc.pid).children(recursive=True)
        self.proc.kill()
        self.finish(timeout_s=30)
        _, alive = psutil.wait_procs(left, timeout=2)  # fate-sharing ends most of them
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=10)

    def finish(self, timeout_s: float = 400) -> None:
        self.proc.wait(timeout=timeout_s)
        self.reader.join(timeout=10)
