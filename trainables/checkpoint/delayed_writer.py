"""Fault injection for tests (``inject_save_delay_s``): torch.distributed.checkpoint's file
writer, waiting before it writes a checkpoint's data, so that a test can kill a rank while an
asynchronous save is in flight. A module of its own: the writer process unpickles it by name."""

from __future__ import annotations

import time

from torch.distributed.checkpoint import FileSystemWriter

__all__ = ["DelayedWriter"]


class DelayedWriter(FileSystemWriter):
    def __init__(self, path, delay_s: float):
        super().__init__(path)
        self.delay_s = delay_s

    def write_data(self, plan, planner):
        time.sleep(self.delay_s)
        return super().write_data(plan, planner)
