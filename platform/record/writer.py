"""The recorder's file writes, off Tune's loop: one thread writes part files, ``env.json``, the
run manifest and the ``--logger`` series in the order they were handed over, so a callback returns as soon as it has
buffered a window (Tune warns, and every trial waits, while a callback holds its loop). A write
handed over under a key replaces the one of that key still waiting (the manifest: only the
newest matters). ``drain`` waits until everything handed over is on disk; the sweep's end
drains before it reads or writes anything itself, so nothing measured is lost."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

__all__ = ["BackgroundWriter"]


class BackgroundWriter:
    """One daemon thread that runs the writes handed to ``submit``, in order."""

    def __init__(self, echo: Callable[[str], None]):
        self.echo = echo
        self._queue: deque[tuple[str | None, Callable[[], None]]] = deque()
        self._cond = threading.Condition()
        self._busy = False
        self.errors: list[str] = []
        self._thread: threading.Thread | None = None  # started by the first write

    # Tune pickles its callbacks with the Tuner (tune/tuner.pkl): a copy is a new, idle writer.
    def __getstate__(self) -> dict:
        return {"echo": self.echo}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["echo"])

    def submit(self, write: Callable[[], None], key: str | None = None) -> None:
        """Run ``write`` after everything handed over before it; with ``key``, instead of the
        write of the same key still waiting (which then does not run)."""
        with self._cond:
            if key is not None:
                self._queue = deque(item for item in self._queue if item[0] != key)
            self._queue.append((key, write))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="recorder-writer", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every write handed over is done; False if ``timeout`` came first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queue))
                _, write = self._queue.popleft()
                self._busy = True
            try:
                write()
            except Exception as exc:  # noqa: BLE001 - one line; the sweep goes on
                line = f"recorder: a write failed ({type(exc).__name__}: {exc})"
                self.errors.append(line)
                self.echo(line)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
