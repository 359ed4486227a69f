"""What torch's compiler did during a run's timed steps, window by window: the performance
cliffs it reports, carried in the window's metrics and judged by the driver
(platform/analysis/verdicts/cliffs.py).

Per window (``CompileWatch.take``), counted in the window's steps: neither the compile
warm-up, which compiles (and with reduce-overhead records the CUDA graphs of) every known shape
ahead, nor a validation (the model in eval mode, other shapes) counts:

- ``recompiles``: frames dynamo compiled (its ``CallbackTrigger.DYNAMO`` compile callback);
  after the warm-up each one is a recompile (a new shape, a guard that failed). A run without
  the warm-up (DeepSpeed, unknown shapes) compiles in its first window too.
- ``graph_breaks``: graph breaks dynamo met in those compiles (``counters["graph_break"]``).
- ``cudagraph_records``: CUDA graphs recorded (cudagraph trees' ``CUDAGRAPH_RECORDING``
  callback: torch keeps no counter of them); after the warm-up each is a re-recording, which
  torch does when a graph's inputs moved (a parameter at a new address: FSDP2) and without a
  limit for parameters (pytorch/pytorch#182531).
- ``cudagraph_skips``: functions inductor ran without CUDA graphs from then on
  (``counters["inductor"]["cudagraph_skips"]``); the first window's include the warm-up's
  (the steps run without those graphs).
- ``cliff_reason``: the first reason torch gave in the window, in its words: a CUDA graph
  re-recording (the debug line of torch._inductor.cudagraph_trees), a skip (its warning), a
  recompile (its compilation metrics' ``recompile_reason`` or ``fail_reason``), a graph break.

And per run (``CompileWatch.seconds``, the manifest's ``compile_in_windows_s``): the seconds
torch spent compiling in the steps so far (``compile_seconds``), what a run that compiles in its
windows (no warm-up: unknown shapes, DeepSpeed; a recompile) pays beyond its ``compile_s``.

CUDA graphs are counted only when the run uses them (reduce-overhead on a GPU): off a GPU
inductor skips them by design, and the run's ``fallbacks`` says so already.

Nothing here runs per step: torch calls the callbacks and filters at a compile, a recording or
a skip (events that cost far more than counting them), and ``take`` reads a few dicts once per
window.
"""

from __future__ import annotations

import logging
import re
from typing import Any

__all__ = ["COMPILE_TIMERS", "COUNTS", "CompileWatch", "compile_seconds"]

COUNTS = ("recompiles", "graph_breaks", "cudagraph_records", "cudagraph_skips")
REASON_CHARS = 240
# torch's compile timers (torch._dynamo.utils.compilation_time_metrics, seconds per call) that
# hold a compile: dynamo's compile of a frame (its forward graph's AOTAutograd and inductor
# inside) and AOTAutograd's compile of a backward graph at its first call, outside the first.
COMPILE_TIMERS = ("_compile.compile_inner", "backward._backward_impl")


def compile_seconds() -> float:
    """Seconds this process has spent compiling so far (COMPILE_TIMERS), by torch's own timers
    (trainables/engine/compile.py splits a warm-up's by the same)."""
    from torch._dynamo.utils import compilation_time_metrics

    return sum(sum(compilation_time_metrics.get(key, ())) for key in COMPILE_TIMERS)


def _first_lines(text: str, lines: int = 2) -> str:
    """``text``'s first non-empty lines on one line, cut to REASON_CHARS: a cell of a TSV."""
    kept = [ln.strip() for ln in str(text).splitlines() if ln.strip()][:lines]
    return " ".join(kept).replace("\t", " ")[:REASON_CHARS]


class _LogReasons(logging.Filter):
    """The messages a torch logger emits that start with ``prefix`` (its format string), kept
    as reasons. A filter of that logger, which is lowered to ``level`` while installed (where
    it was higher): it lets through only what the logger passed before, so nothing new reaches
    the console. The re-recording line is a debug line: asked for, it costs only a
    re-recording (which already costs a recording and a sync)."""

    def __init__(self, logger: str, prefix: str, level: int) -> None:
        super().__init__()
        self.logger, self.prefix, self.wanted = logging.getLogger(logger), prefix, level
        self.reasons: list[str] = []
        self.own: int | None = None  # the logger's own level, while installed
        self.passed = logging.WARNING  # the lowest level it let through before

    def install(self) -> None:
        if self.own is None:
            self.own, self.passed = self.logger.level, self.logger.getEffectiveLevel()
            self.logger.setLevel(min(self.passed, self.wanted))
            self.logger.addFilter(self)

    def remove(self) -> None:
        if self.own is not None:
            self.logger.removeFilter(self)
            self.logger.setLevel(self.own)
            self.own = None

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith(self.prefix) and len(self.reasons) < 8:
            text = record.getMessage()
            if text.startswith("["):  # "[compile id] Re-recording ...": the id says nothing here
                text = text.split("] ", 1)[-1]
            self.reasons.append(_first_lines(text))
        return record.levelno >= self.passed


class CompileWatch:
    """Counts what torch's compiler does while installed (``start`` to ``close``); ``take``
    returns the counts since the last take; ``forget`` drops them (the warm-up's, a
    validation's); ``seconds`` sums the seconds compiled in the takes so far. ``cudagraphs``:
    the run uses CUDA graphs (compile_mode reduce-overhead on a GPU). ``enabled`` false (no torch_compile): every take
    is zeros."""

    def __init__(self, *, enabled: bool = True, cudagraphs: bool = False) -> None:
        self.enabled, self.cudagraphs = enabled, cudagraphs
        self.compiles = self.records = 0  # by the callbacks, since the last take
        self._seen: dict[str, Any] = {}  # torch's counters at the last take
        self._metrics_seen: Any = None  # the newest compilation metrics record read
        self.seconds = 0.0  # compiled in the takes so far (the run's steps)
        self._seconds_seen = 0.0  # compile_seconds() at the last take
        self._logs = [
            _LogReasons(
                "torch._inductor.cudagraph_trees.__cudagraphs",
                "[%s] Re-recording",
                logging.DEBUG,
            ),
            _LogReasons(
                "torch._inductor.cudagraph_utils.__cudagraphs",
                "skipping cudagraph",
                logging.WARNING,
            ),
        ]

    def start(self) -> CompileWatch:
        if not self.enabled:
            return self
        from torch._dynamo.callback import callback_handler

        callback_handler.register_start_callback(self._on_start)
        if self.cudagraphs:
            for log in self._logs:
                log.install()
        self._seen = self._counters()
        self._metrics_seen = self._newest_metrics()
        self._seconds_seen = compile_seconds()
        return self

    def close(self) -> None:
        if not self.enabled:
            return
        from torch._dynamo.callback import callback_handler

        # torch._dynamo.reset (a resident worker's release) may have cleared it already.
        if self._on_start in callback_handler.start_callbacks:
            callback_handler.remove_start_callback(self._on_start)
        for log in self._logs:
            log.remove()

    def __enter__(self) -> CompileWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def forget(self, *, skips: bool = True) -> None:
        """What torch compiled and recorded since the last take was not the steps': the
        compile warm-up's (its purpose), a validation's (eval mode, its shapes). ``skips``
        false keeps its CUDA graph skips for the next take: the steps run without them."""
        kept = list(self._logs[1].reasons), self._seen.get("skips", 0)
        seconds = self.seconds
        self.take()
        self.seconds = seconds
        if not skips:
            self._logs[1].reasons[:], self._seen["skips"] = kept

    def take(self) -> dict[str, Any]:
        """The window's counts (COUNTS) and ``cliff_reason``, since the last take."""
        if not self.enabled:
            return dict.fromkeys(COUNTS, 0) | {"cliff_reason": ""}
        now = self._counters()
        breaks = {k: v - self._seen["breaks"].get(k, 0) for k, v in now["breaks"].items()}
        out = {
            "recompiles": self.compiles,
            "graph_breaks": sum(v for v in breaks.values() if v > 0),
            "cudagraph_records": self.records if self.cudagraphs else 0,
            "cudagraph_skips": max(0, now["skips"] - self._seen["skips"]) if self.cudagraphs else 0,
        }
        reasons = [
            *(f"CUDA graph recorded again: {r}" for r in self._logs[0].reasons),
            *(f"CUDA graph skipped: {r}" for r in self._logs[1].reasons),
            *self._compile_reasons(),
            *(f"graph break: {_first_lines(k)}" for k, v in breaks.items() if v > 0),
        ]
        out["cliff_reason"] = reasons[0][:REASON_CHARS] if reasons else ""
        # torch's timers only grow (torch._dynamo.reset keeps them); max() for a cleared one.
        now_s = compile_seconds()
        self.seconds += max(0.0, now_s - self._seconds_seen)
        self._seconds_seen = now_s
        self.compiles = self.records = 0
        for log in self._logs:
            log.reasons.clear()
        self._seen = now
        return out

    def _on_start(self, args: Any) -> None:
        """A compile callback (under torch's lock: nothing but counting here)."""
        name = getattr(args.callback_trigger, "name", "")
        if name == "DYNAMO":
            self.compiles += 1
        elif name == "CUDAGRAPH_RECORDING":
            self.records += 1

    @staticmethod
    def _counters() -> dict[str, Any]:
        from torch._dynamo.utils import counters

        return {
            "breaks": dict(counters["graph_break"]),
            "skips": counters["inductor"]["cudagraph_skips"],
        }

    @staticmethod
    def _newest_metrics() -> Any:
        from torch._dynamo.utils import get_compilation_metrics

        records = get_compilation_metrics()
        return records[-1] if records else None

    def _compile_reasons(self) -> list[str]:
        """Why dynamo compiled since the last take: its compilation metrics (the last 64
        compiles torch keeps) newer than the newest one read before."""
        from torch._dynamo.utils import get_compilation_metrics

        records = get_compilation_metrics()
        start = 0
        for i in range(len(records) - 1, -1, -1):
            if records[i] is self._metrics_seen:
                start = i + 1
                break
        self._metrics_seen = records[-1] if records else None
        out = []
        for rec in records[start:]:
            if getattr(rec, "recompile_reason", None):
                # "0/0: tensor 'x' size mismatch ...": the compile id says nothing here
                reason = re.sub(r"^\d+/\d+: ", "", _first_lines(rec.recompile_reason, 1))
                out.append(f"recompile: {reason}")
            elif getattr(rec, "fail_reason", None):
                out.append(f"compile failed: {_first_lines(rec.fail_reason, 1)}")
        return out
