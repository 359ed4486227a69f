"""The Ray Data side of data preparation: one task row per utterance, processed in parallel by
:func:`process_row` (which runs in Ray workers), results streamed back to the driver."""

from __future__ import annotations

import logging
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

from data_prep.audio import AudioError, TrimSettings, process_file, read_prepared
from data_prep.layout import Utterance

__all__ = ["Progress", "ProcessRow", "make_tasks", "process_row", "run_ray_data", "run_serial"]

# Rows per Ray Data block: about 4 blocks per worker, within these bounds. Each block is one
# actor call; measured on 2 CPUs, 16-row blocks left the actors idle between blocks often
# enough to cost a third of the throughput, 128-row blocks did not (and still stream results
# back every ~1 s per worker).
MIN_ROWS_PER_BLOCK, MAX_ROWS_PER_BLOCK = 16, 128


def plan_blocks(n: int, workers: int) -> tuple[int, int]:
    """(blocks, workers worth starting): about 4 blocks per worker of 16-128 rows each, and no
    more actors than blocks (8 files never need 32 actors)."""
    rows = max(MIN_ROWS_PER_BLOCK, min(MAX_ROWS_PER_BLOCK, math.ceil(n / (4 * workers))))
    blocks = max(1, math.ceil(n / rows))
    return blocks, max(1, min(workers, blocks))


def make_tasks(
    utterances: list[Utterance],
    input_root: Path,
    output_root: Path,
    *,
    target_sr: int,
    trim: bool,
    settings: TrimSettings,
    force: bool,
) -> list[dict]:
    """Plain dicts (Ray Data rows) with everything a worker needs; outputs mirror the input
    layout: ``subset/speaker/chapter/<utt_id>.flac``."""
    return [
        {
            "utt_id": u.utt_id,
            "src": str(Path(input_root) / u.audio),
            "dst": str(Path(output_root) / u.subset / u.speaker / u.chapter / f"{u.utt_id}.flac"),
            "target_sr": target_sr,
            "trim": trim,
            "force": force,
            **{f"trim_{k}": v for k, v in asdict(settings).items()},
        }
        for u in utterances
    ]


def process_row(row: dict) -> dict:
    """Skip a finished output, else process the file; never raises (bad files become rows)."""
    settings = TrimSettings(**{k[5:]: row[k] for k in row if k.startswith("trim_")})
    out = {
        "utt_id": row["utt_id"],
        "status": "error",
        "reason": "",
        "num_samples": 0,
        "sample_rate": 0,
        "duration_s": 0.0,
        "trim_start_s": 0.0,
        "trim_end_s": 0.0,
    }
    dst, kwargs = (
        Path(row["dst"]),
        {"target_sr": row["target_sr"], "trim": row["trim"], "settings": settings},
    )
    try:
        facts = None if row["force"] else read_prepared(dst, **kwargs)
        status = "skipped"
        if facts is None:
            facts = process_file(Path(row["src"]), dst, **kwargs)
            status = "written"
        out.update(facts, status=status)
    except AudioError as exc:
        out["reason"] = str(exc)
    except Exception as exc:  # one bad file must never stop the corpus
        out["reason"] = f"{type(exc).__name__}: {exc}"
    return out


def run_serial(tasks: list[dict]) -> Iterator[dict]:
    """The same per-file work in this process, one file after another (the benchmark baseline)."""
    for row in tasks:
        yield process_row(row)


class ProcessRow:
    """Ray Data actor UDF: :func:`process_row` in a long-lived worker (imports paid once)."""

    def __call__(self, row: dict) -> dict:
        return process_row(row)


def run_ray_data(tasks: list[dict], workers: int) -> Iterator[dict]:
    """Process ``tasks`` with Ray Data on a pool of ``workers`` actors of one CPU each.

    An actor pool, not a task pool: on small clusters (measured on 2 CPUs, Ray 2.60) Ray Data's
    default backpressure kept a task pool at about one running task, while the pool of
    ``workers`` actors stays busy; its start-up (about 1.3 s) is nothing next to a real corpus.
    Its actors are not restarted (``max_restarts=0``): Ray Data's default (restart forever)
    makes Ray print a warning line on every run (constructor arguments in the object store,
    ray-project/ray#53727), and a prep that lost a worker is run again with the same
    command, which skips the files already written.
    """
    import ray.data

    # Ray Data logs each execution at INFO and warns that its bars are off; the CLI has its own.
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # the CLI prints its own progress line
    ctx.print_on_execution_start = False
    blocks, workers = plan_blocks(len(tasks), workers)
    with warnings.catch_warnings():
        # max_restarts has no named parameter yet; passed through **ray_remote_args, which
        # Ray 2.60 calls deprecated (to go in 2.64): said once here, not on every run.
        warnings.filterwarnings("ignore", message="`ray_remote_args` is deprecated")
        ds = ray.data.from_items(tasks, override_num_blocks=blocks).map(
            ProcessRow, compute=ray.data.ActorPoolStrategy(size=workers), num_cpus=1, max_restarts=0
        )
    yield from ds.iter_rows()


class Progress:
    """A live line (files done/total, files/s, ETA) on a terminal, plus a kept line every
    ``log_every`` files and at the end."""

    def __init__(
        self, total: int, log_every: int, stream=None, clock: Callable[[], float] = time.monotonic
    ):
        self.total, self.log_every = total, log_every
        self.stream = stream or sys.stderr
        self.clock = clock
        self.start = clock()
        self.done = 0
        self.live = getattr(self.stream, "isatty", lambda: False)()

    def line(self) -> str:
        elapsed = max(self.clock() - self.start, 1e-9)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else math.inf
        eta_text = "-" if math.isinf(eta) else f"{eta:.0f} s"
        return f"{self.done}/{self.total} files  {rate:.1f} files/s  ETA {eta_text}"

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.live:
            self.stream.write("\r" + self.line() + "\033[K")
            self.stream.flush()
        if self.done % self.log_every == 0 or self.done == self.total:
            self.stream.write(("\r" if self.live else "") + self.line() + "\n")
            self.stream.flush()
