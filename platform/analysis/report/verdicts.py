"""The report's verdicts: performance cliffs (summary.json's, platform/analysis/verdicts/cliffs.py),
stability (``python -m platform.stability``) and memory leaks
(``python -m platform.leak``), each from the same function the command calls, under the limits
the folder's own log states (else the command's defaults, saying why), shown on the page with
the command that gives the same lines. Where the folder keeps its log, the page says whether
the two agree line for line, and shows the log where they do not. ``phase_b`` judges stability
once per page: the ranking and the throughput plot show the same verdicts."""

from __future__ import annotations

import html
import math
import re

import pandas as pd

from platform.analysis.report.figures import html_table, note
from platform.analysis.verdicts import cliffs as cliff_check
from platform.analysis.verdicts import leak as leak_check
from platform.analysis.verdicts import stability as stability_check
from platform.analysis.verdicts.limits import PREFIX, flag_text, flags_line
from platform.errors import UsageError
from stage1_common.output_root import OutputRoot

__all__ = ["CLASS", "cliff_groups", "cliffs", "leak", "phase_b", "stability", "verdicts"]

# The verdict words of both checks, with the colour the page gives each.
CLASS = {
    stability_check.PASS: "pass",
    stability_check.FAIL: "fail",
    stability_check.NOT_ENOUGH_REPEATS: "short",
    stability_check.NOT_RUN: "short",
    leak_check.OK: "pass",
    leak_check.LEAK: "fail",
    leak_check.NOT_JUDGED: "short",
}


def verdicts(data: dict) -> str:
    """The section: the stability part, then the leak part, each under its own heading."""
    return "".join(
        f'<div id="{key}"><h3>{html.escape(title)}</h3>{body}</div>'
        for key, (title, body) in (("stability-check", stability(data)), ("leak-check", leak(data)))
    )


def cliffs(data: dict) -> str:
    """The runs that fell off a performance cliff: what torch did in their tail windows, its
    own words, what to change (summary.json's ``cliffs``, as summary.md and the manifest's
    ``cliff`` say it)."""
    found = data["summary"].get("cliffs")
    if found is None:
        return note("no cliff verdicts in summary.json (written before runs were judged for them)")
    if not found:
        return note(
            "no run fell off a cliff: no recompile and no CUDA graph recorded again in a run's "
            "tail windows, no CUDA graph skipped (torch's own counts, from the end of the "
            "compile warm-up)"
        )
    rows = [
        {
            "run": run,
            "cliff": v.get("kind", ""),
            "what torch did": v.get("detail", ""),
            "torch's reason": v.get("reported", ""),
            "try next": v.get("try", ""),
        }
        for run, v in found.items()
    ]
    return html_table(pd.DataFrame(rows)) + note(cliff_check.RULE)


def cliff_groups(data: dict) -> dict[str, str]:
    """Group -> the cliffs its runs fell off (the ranking's ``cliff`` column)."""
    found, manifest = data["summary"].get("cliffs") or {}, data["manifest"]
    if not found or "run" not in manifest:
        return {}
    groups = dict(zip(manifest["run"].astype(str), manifest["group"].astype(str), strict=True))
    out: dict[str, list[str]] = {}
    for run, verdict in found.items():
        kinds = out.setdefault(groups.get(run, run), [])
        kinds += [k for k in verdict.get("kind", "").split(", ") if k and k not in kinds]
    return {group: ", ".join(kinds) for group, kinds in out.items()}


def phase_b(root: OutputRoot) -> dict:
    """The folder's stability check, as python -m platform.stability gives it: ``limits``,
    ``source`` (where they come from, in words), ``verdicts`` (``stability.check``'s) and
    ``error`` (why there are none; "" when judged)."""
    limits, source = stability_check.folder_limits(root)
    out = {"limits": limits, "source": source, "verdicts": [], "error": ""}
    try:
        out["verdicts"] = stability_check.judge(root, limits)
    except UsageError as exc:
        out["error"] = str(exc)
    except Exception as exc:  # noqa: BLE001 - an old group_summary.csv: say so, keep the page
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def stability(data: dict) -> tuple[str, str]:
    root, judged = data["root"], data["phase_b"]
    limits = judged["limits"]
    title = "Stability (python -m platform.stability)"
    if judged["error"]:
        return title, note(f"not judged: {judged['error']}")
    rows = "".join(
        f"<tr><td>{html.escape(v['group'])}</td>{_word(v['verdict'])}<td>{v['runs_ok']}</td>"
        f"<td>{_figure(v['iter_ratio_median'], 3)}</td><td>{_figure(v['iter_ratio_max'], 3)}</td>"
        f"<td>{_figure(v['iter_p50_cv'], 4)}</td>"
        f'<td class="text">{html.escape(stability_check.why(v))}</td></tr>'
        for v in judged["verdicts"]
    )
    body = (
        f"<p>Judged by {html.escape(judged['source'])}: at least {limits.min_repeats} ok runs, "
        f"iter p90/p50 median &le; {flag_text(limits.max_iter_ratio_median)} and max &le; "
        f"{flag_text(limits.max_iter_ratio_max)}, iter p50 CV &le; "
        f"{flag_text(limits.max_iter_p50_cv)}. <b>FAIL</b>: a figure above its limit (the why "
        "column names the figure, its value and the limit), a figure unknown although the "
        "group has the runs to know it, or no ok run. <b>NOT ENOUGH REPEATS</b>: no figure "
        "above its limit, but too few ok runs to tell. These are the ranking's Phase B column; "
        "its jittery column is another figure (the ranking's own flag).</p>"
        "<table><tr><th>group</th><th>verdict</th><th>ok runs</th><th>p90/p50 median</th>"
        f"<th>p90/p50 max</th><th>iter p50 CV</th><th>why</th></tr>{rows}</table>"
        + _command("platform.stability", f"--output-root {root.shown}", flags_line(limits))
        + _against_log(
            root / OutputRoot.STABILITY_LOG,
            [stability_check.verdict_line(v) for v in judged["verdicts"]],
        )
    )
    return title, body


def leak(data: dict) -> tuple[str, str]:
    root = data["root"]
    log = root / OutputRoot.LEAK_LOG
    if data["timing"].empty:
        return "Memory leaks (this folder's leak.log)", _log_only(log)
    limits, source = leak_check.folder_limits(root)
    lines = [v["line"] for v in leak_check.root_verdicts(root, None, limits)]
    body = (
        f"<p>Judged by {html.escape(source)}: host RSS (summed over nodes) &le; "
        f"{flag_text(limits.max_host_mb_per_1k_steps)} and GPU memory (the worst GPU) &le; "
        f"{flag_text(limits.max_gpu_mb_per_1k_steps)} MB per 1,000 steps, fitted after the "
        f"first {limits.skip_fraction:.0%} of the steps (--skip-fraction "
        f"{flag_text(limits.skip_fraction)}), from at least "
        f"{leak_check.MIN_SAMPLES} samples of each node and each GPU. <b>NOT JUDGED</b>: a "
        "node or a GPU with too few samples, or none spread over steps, to fit (the line "
        "names which; never OK on a growth nobody judged).</p>"
        + _lines(lines)
        + _command("platform.leak", root.shown, flags_line(limits))
        + _against_log(log, lines)
    )
    return "Memory leaks (python -m platform.leak)", body


def _figure(value: float, digits: int) -> str:
    return f"{value:.{digits}f}" if math.isfinite(value) else "-"


def _word(verdict: str) -> str:
    return f'<td class="{CLASS[verdict]}">{html.escape(verdict)}</td>'


def _lines(lines: list[str]) -> str:
    """A check's lines as it prints them, each verdict word coloured."""
    out = []
    for line in lines:
        word = next((w for w in CLASS if line.startswith(f"{w} ")), None)
        if word is None:
            out.append(html.escape(line))
        else:
            rest = line[len(word) :]
            out.append(f'<span class="{CLASS[word]}">{word}</span>{html.escape(rest)}')
    return "<pre>" + "\n".join(out) + "</pre>"


def _command(module: str, target: str, limits_line: str) -> str:
    flags = limits_line.removeprefix(PREFIX)
    return (
        f"<p>The same lines: <code>python -m {module} {html.escape(target)} "
        f"{html.escape(flags)}</code></p>"
    )


def _against_log(log, lines: list[str]) -> str:
    """Whether the folder's own log (if any) says the same as ``lines``; the log where not."""
    if not log.is_file():
        return ""
    logged = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    if sorted(ln for ln in logged if not ln.startswith(PREFIX)) == sorted(lines):
        return note(f"This folder's {log.name} says the same, line for line.")
    return note(
        f"This folder's {log.name} differs (written by another version, with other limits, or "
        "before the last rows); it says:"
    ) + ("<pre>" + html.escape("\n".join(logged)) + "</pre>")


def _log_only(log) -> str:
    """A folder without rows: its leak.log as it is, with what its verdicts mean."""
    if not log.is_file():
        return note("no timing rows to fit memory against, and no leak.log")
    text = log.read_text(errors="replace")
    out = note(
        "No Parquet rows here to judge from: this is the folder's leak.log, written by python "
        "-m platform.leak where the rows were."
    )
    # platform.leak before NOT JUDGED existed printed OK when host memory had too few samples.
    if re.search(r"^OK .*host RSS: too few samples", text, re.M):
        out += note(
            "This log was written by an older platform.leak: its OK lines whose host RSS had too "
            "few samples mean host memory was NOT JUDGED; only their GPU memory was."
        )
    return out + _lines(text.splitlines())
