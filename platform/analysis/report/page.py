"""One self-contained ``report.html`` per sweep (``python -m platform.report OUTPUT_ROOT``).

Written at the end of every sweep beside ``summary.md`` (platform/tune.py, platform/analyze.py),
and by hand for any output root. The page needs no network: its plots are PNGs inlined as data
URIs, its style is inline, it has no script. Sections (``SECTIONS``), each always filled (with
the data, or with a line saying why there is none):

ranking (with intervals, swept values, MFU, peak memory, the Phase B verdict, the ranking's
own jittery flag and the cliffs its runs fell off), the calibration (the platform against its
references on the sweep's host, for the strategies ranked: platform/analysis/calibration.py),
throughput per group (coloured by the Phase B verdict), tail samples/s against each swept key,
iteration time over steps, loss curves (with ln of the candidates per sample), data wait, GPU
telemetry, host memory, rank skew, bottlenecks with the setting to try next, performance cliffs
(recompiles, CUDA graphs recorded again or skipped: torch's counts and reason, and what to
change), stability and leak verdicts (one part each, as ``platform.stability`` and
``platform.leak`` give them, under the limits of the folder's own logs), failed runs with their
log tails, environment and versions.

A section's heading names what it drew (a renderer returns ``(heading, html)`` where that
depends on the data); ``SECTIONS`` holds the headings of the others. A folder holding only the
analysis files (CSV/JSON, no Parquet rows: e.g. one committed to a repository) is reported from
what it has: its ``plots/`` (the notebooks' figures, under their own headings) stand in for the
plots drawn from rows, its group_summary.csv for the stability figures, its ``leak.log`` for the
leak verdicts. The folder's stability.log and leak.log otherwise supply only the limits judged by.

This module assembles the page; the sections are drawn by sections.py (tables, across
groups), plots.py (over steps and time) and verdicts.py (stability, leaks).
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from platform.analysis import answer
from platform.analysis.report import plots, sections, verdicts
from platform.analysis.report.figures import note
from platform.errors import UsageError
from platform.storage import results
from stage1_common.output_root import OutputRoot
from stage1_common.version import version_line

__all__ = ["RENDERERS", "REPORT", "SECTIONS", "report_line", "write_report"]

REPORT = OutputRoot.REPORT
# (key, heading where the renderer does not name one after what it drew), in page order.
SECTIONS = (
    ("ranking", "Ranking"),
    ("calibration", "Calibration: the platform against its references on this host"),
    ("throughput", "Throughput per group"),
    ("sweep", "Tail samples/s against each swept key"),
    ("iteration", "Iteration time over steps"),
    ("loss", "Training loss over steps"),
    ("data", "Data wait"),
    ("gpu", "GPU telemetry"),
    ("host", "Host memory"),
    ("skew", "Rank skew"),
    ("bottlenecks", "Bottlenecks and what to try next"),
    ("cliffs", "Performance cliffs: what torch reported and what to change"),
    ("stability", "Stability and leak verdicts"),
    ("scheduler", "What the scheduler and the budget decided"),
    ("failed", "Failed runs"),
    ("environment", "Environment and versions"),
)
RENDERERS: dict[str, Callable[[dict], str | tuple[str, str]]] = {
    "ranking": sections.ranking,
    "calibration": sections.calibration,
    "throughput": sections.throughput,
    "sweep": sections.sweep,
    "iteration": plots.iteration,
    "loss": plots.loss,
    "data": plots.data_share,
    "gpu": plots.gpu,
    "host": plots.host,
    "skew": plots.skew,
    "bottlenecks": sections.bottlenecks,
    "cliffs": verdicts.cliffs,
    "stability": verdicts.verdicts,
    "scheduler": sections.scheduler,
    "failed": sections.failed,
    "environment": sections.environment,
}
_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child,td.text{text-align:left}.wide{overflow-x:auto}
.pass{color:#176f2c;font-weight:600}.fail{color:#b00020;font-weight:600}
.short{color:#8a5a00;font-weight:600}
.note{color:#555;font-style:italic}pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:12px}
img{max-width:100%;border:1px solid #eee}img.plot{width:100%}nav a{margin-right:.8em}
.verdict{font-size:15px;background:#f2f6fb;border-left:4px solid #2c6db5;padding:.5em .8em}
"""


def report_line(root: OutputRoot) -> str:
    """``report: PATH`` after writing report.html beside summary.md (the end of every sweep,
    platform.analyze); a failure is this one line, never the end of the analysis."""
    try:
        path = write_report(root)
        return f"report: {root.where(path.name)}"
    except Exception as exc:  # noqa: BLE001
        return (
            f"report: not written ({type(exc).__name__}: {exc}); "
            f"python -m platform.report {root.shown}"
        )


def write_report(root: OutputRoot, out: Path | None = None) -> Path:
    """Write the page (to ``out``, default ``<root>/report.html``) and return its path;
    UsageError when the folder holds neither a sweep nor its analysis files. The page and the
    errors name the root as the user reaches it (``root.shown``: the bucket's address for a
    local copy of a root on object storage)."""
    name = root.shown
    if not root.path.is_dir() or not (root.holds_sweep() or (root / root.SUMMARY_JSON).is_file()):
        raise UsageError(
            f"{name}: no sweep here (no {root.MANIFEST} or {root.SUMMARY_JSON}); give a sweep's "
            "output root"
        )
    data = _load(root)
    sections = [(key, *_section(key, default, data)) for key, default in SECTIONS]
    body = "".join(
        f'<section id="{key}"><h2>{html.escape(title)}</h2>\n{content}\n</section>'
        for key, title, content in sections
    )
    nav = " ".join(
        f'<a href="#{key}">{html.escape(default.split(" (")[0])}</a>' for key, default in SECTIONS
    )
    summary = data["summary"]
    head = (
        f"<h1>Sweep report: {html.escape(root.path.resolve().name)}</h1>{_verdict(data)}"
        f"<p>{_count(summary.get('runs', len(data['manifest'])), 'run')} in "
        f"{_count(summary.get('groups', len(data['ranked'])), 'group')}; best group "
        f"<b>{html.escape(str(summary.get('best_group') or '-'))}</b>. Written "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')} by python -m platform.report "
        f"({html.escape(version_line())}) from <code>{html.escape(name)}</code>.</p>"
        + (
            f'<p class="partial"><b>{html.escape(summary["partial"]["line"].capitalize())}.</b></p>'
            if summary.get("partial")
            else ""
        )
        + f"<nav>{nav}</nav>"
    )
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>Sweep report {html.escape(root.path.name)}</title><style>{_STYLE}</style></head>"
        f"<body>{head}{body}</body></html>\n"
    )
    path = Path(out) if out else root / root.REPORT
    results.atomic_write_text(path, page)
    return path


def _verdict(data: dict) -> str:
    """The page's first line (platform/analysis/answer.py), its commands as code; a retest
    command only where the root is a folder holding the sweep (--from-ranked reads its files)."""
    root = data["root"]
    retest = str(root.folder) if root.folder and root.holds_sweep() else ""
    line = answer.verdict(data["summary"], data["ranked"].to_dict("records"), data["best"], retest)
    marked = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(line))
    return f'<p class="verdict">{marked.replace("Verdict:", "<b>Verdict:</b>", 1)}</p>'


def _section(key: str, default: str, data: dict) -> tuple[str, str]:
    """(heading, html) of one section; a section that breaks says so, never loses the page."""
    try:
        content = RENDERERS[key](data)
    except Exception as exc:  # noqa: BLE001
        return default, note(f"this section could not be drawn: {type(exc).__name__}: {exc}")
    return content if isinstance(content, tuple) else (default, content)


def _load(root: OutputRoot) -> dict[str, Any]:
    """Everything the sections draw from, read once (``root``: the OutputRoot)."""

    def csv(name: str) -> pd.DataFrame:
        path = root / name
        return pd.read_csv(path) if path.is_file() else pd.DataFrame()

    per_run = csv(root.PER_RUN_METRICS)
    # A folder of analysis files only has per_run_metrics.csv's runs (with their status).
    manifest = results.read_manifest(root) if root.holds_sweep() else per_run
    return {
        "root": root,
        "manifest": manifest,
        "swept": sections.swept_values(root, manifest),
        "per_run": per_run,
        "ranked": csv(root.RANKED_GROUPS),
        "summary": results.read_json(root / root.SUMMARY_JSON),
        "schedule": results.read_json(root.schedule),
        "best": results.read_json(root.best_config),
        # Empty, with their columns, where the folder has none.
        "timing": results.read_dataset(root.timing, results.TIMING_SCHEMA),
        "gpu": results.read_dataset(root / root.GPU_TELEMETRY, results.GPU_TELEMETRY_SCHEMA),
        "host": results.read_dataset(root / root.HOST_TELEMETRY, results.HOST_TELEMETRY_SCHEMA),
        # Judged once: the ranking, the throughput plot and the stability part show the same.
        "phase_b": verdicts.phase_b(root),
    }


def _count(n: int, word: str) -> str:
    """'1 run', '2 runs'."""
    return f"{n} {word}{'' if n == 1 else 's'}"
