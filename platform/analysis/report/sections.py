"""The report's tables and the sections across groups: the ranking (with the swept values, MFU
and peak memory), throughput per group, tail samples/s against each swept key, bottlenecks,
failed runs and the environment. Each takes the data ``report._load`` gathered and returns an
HTML fragment, or ``(heading, html)`` where the heading depends on what was drawn; each is
always filled, with the data or with a line saying why there is none."""

from __future__ import annotations

import html
import json
import math
import numbers
from pathlib import Path

import pandas as pd

from platform.analysis.answer import noise_line
from platform.analysis.calibration import for_sweep
from platform.analysis.report import verdicts
from platform.analysis.report.figures import LEGEND_PT, as_text, html_table, new_figure, note, png
from platform.analysis.stats import UNSTABLE_RATIO
from platform.analysis.verdicts import stability
from platform.storage import results
from stage1_common.output_root import OutputRoot, RunFolder
from stage1_common.version import version_line

__all__ = [
    "bottlenecks",
    "calibration",
    "environment",
    "failed",
    "ranking",
    "scheduler",
    "sweep",
    "swept_values",
    "throughput",
]

# Per-run figures shown per group in the ranking, where the runs measured them: audio seconds
# per second (mean over the group's ok runs' tails, beside samples/s: batching duration trades
# one against the other), MFU as a percentage (the mean) and peak GPU memory (the largest).
AUDIO_RATE = "tail audio s/s"
MEASURED = {
    "tail_audio_s_per_s": (AUDIO_RATE, "mean", 1.0),
    "mfu": ("MFU %", "mean", 100.0),
    "peak_mem_gib": ("peak GiB", "max", 1.0),
}
# ranked_groups.csv's columns under shorter headings, so that the table fits the page.
RANKING_HEADERS = {
    "runs_ok": "ok runs",
    "runs_catalogue": "of them from the catalogue",
    "tail_samples_per_sec_robust": "tail samples/s (robust)",
    "ci95_low": "95 % low",
    "ci95_high": "95 % high",
    "tail_mean_iter_p50_ms": "iter p50 ms",
    "unstable_group": "jittery",
    "vs_baseline": "x baseline",
    "left_race": "left the race",
}


PHASE_B = "Phase B"
# The throughput plot's bar colour per Phase B verdict (the page's own colours of the words).
VERDICT_COLOURS = {
    stability.PASS: "#176f2c",
    stability.FAIL: "#b00020",
    stability.NOT_ENOUGH_REPEATS: "#d29a00",
    stability.NOT_RUN: "#999999",
    "-": "#999999",
}


def swept_values(root: OutputRoot, manifest: pd.DataFrame) -> pd.DataFrame:
    """One row per group with its value of each swept key (the ``swept`` of its first run's
    runs/<run>/config.json, as best_config.json takes it); no rows where the folder keeps no
    run folders (a folder of analysis files only)."""
    rows: dict[str, dict] = {}
    if "run" not in manifest:
        return pd.DataFrame(columns=["group"])
    for run, group in zip(manifest["run"], manifest["group"], strict=True):
        if group not in rows:
            swept = results.read_json(root.run_folder(str(run)).config).get("swept")
            if swept:
                rows[group] = {
                    k: v if isinstance(v, (int, float, str)) else str(v) for k, v in swept.items()
                }
    keys = list(dict.fromkeys(k for v in rows.values() for k in v))
    table = pd.DataFrame([{"group": g, **v} for g, v in rows.items()], columns=["group", *keys])
    # Whole numbers stay whole where a group lacks the key (a DDP group's zero_stage): 0, not 0.00.
    whole = [k for k in keys if all(type(v[k]) is int for v in rows.values() if k in v)]
    return table.astype({k: "Int64" for k in whole})


def ranking(data: dict) -> str:
    ranked = data["ranked"]
    if ranked.empty:
        return note("no group measured anything yet (no ranked_groups.csv)")
    swept = data["swept"]
    keys = [k for k in swept.columns if k != "group" and k not in ranked]
    table = ranked.merge(swept[["group", *keys]], on="group", how="left")
    measured = _measured(data["per_run"])
    table = table.merge(measured, on="group", how="left") if not measured.empty else table
    table["cliff"] = table["group"].map(verdicts.cliff_groups(data)).fillna("")
    cols = [
        "rank",
        "group",
        *keys,
        "runs_ok",
        *(["runs_catalogue"] if _pooled(table) else []),
        "tail_samples_per_sec_robust",
        AUDIO_RATE,
        "ci95_low",
        "ci95_high",
        "tail_mean_iter_p50_ms",
        *[c for c in measured.columns if c not in ("group", AUDIO_RATE)],
        PHASE_B,
        "unstable_group",
        *[c for c in ("vs_baseline", "left_race", "cliff") if _filled(table.get(c))],
    ]
    table = _flags(table, data["phase_b"])
    shown = table[[c for c in cols if c in table]]  # an older ranked_groups.csv lacks some
    out = html_table(shown.rename(columns=RANKING_HEADERS), digits=2)
    out += _flags_note(data)
    if AUDIO_RATE in shown:
        out += note(
            f"{AUDIO_RATE}: seconds of audio trained on per second (every rank's), beside "
            "samples/s: a run with batching duration holds more short utterances or fewer long "
            "ones per step, so one can rise while the other falls; compare both."
        )
    if keys:
        out += note(f"swept: {', '.join(keys)} (each group's values, from runs/<run>/config.json)")
    else:
        out += note(
            "swept values: not shown, this folder keeps no runs/<run>/config.json (a folder of "
            "analysis files only; best_config.json names the winner's)"
        )
    missing = [label for c, (label, _, _) in MEASURED.items() if label not in measured]
    missing = [label for label in missing if label != AUDIO_RATE]  # synthetic runs have audio
    if missing:
        out += note(
            f"{' and '.join(missing)}: not measured by these runs (MFU needs the GPU's peak "
            "FLOPs, peak memory a CUDA device)"
        )
    if data["summary"].get("pooled"):  # a warm race's pooled ranking, summary.md's words
        out += f"<p><b>{html.escape(data['summary']['pooled']['line'])}.</b></p>"
    if "top_two_within_noise" in data["summary"]:  # summary.md's line, word for word
        out += f"<p>{html.escape(noise_line(data['summary']['top_two_within_noise']))}</p>"
    if data["summary"].get("confidence"):  # summary.md's, word for word
        out += f"<p>{html.escape('How sure: ' + data['summary']['confidence']['line'] + '.')}</p>"
    if data["summary"].get("budget"):  # --budget: what it ran and what it left unrun
        out += f"<p>{html.escape(data['summary']['budget']['line'] + '.')}</p>"
    return out


def calibration(data: dict) -> str:
    """The platform against its references on the sweep's host (summary.json's calibration:
    what the analysis found; looked up now for a summary.json without one)."""
    found = data["summary"].get("calibration")
    if found is None:
        groups = list(data["ranked"]["group"]) if "group" in data["ranked"] else None
        found = for_sweep(data["root"], data["manifest"], groups)
    items = "".join(f"<li>{html.escape(line)}</li>" for line in found["lines"])
    return f"<ul>{items}</ul>" + note(
        "Each ratio: the platform's tail samples/s over its bare reference's at one point on "
        "this host (benchmarks/reference_compare.py), the median over its pairs of turns; 1.0 "
        "means the platform adds nothing. The sweep's own point may differ. Measured by python "
        f"-m platform.calibrate, kept in {found['cache']}."
    )


def _flags(table: pd.DataFrame, phase_b: dict) -> pd.DataFrame:
    """The Phase B verdict of each group (``report/verdicts.py``: ``phase_b``; "-" where it was not
    judged), and the ranking's flag as yes/no."""
    by_group = {v["group"]: v["verdict"] for v in phase_b["verdicts"]}
    table = table.assign(**{PHASE_B: table["group"].map(by_group).fillna("-")})
    if "unstable_group" in table:
        flag = table["unstable_group"].astype(str).str.lower() == "true"
        table["unstable_group"] = flag.map({True: "yes", False: "no"})
    return table


def _flags_note(data: dict) -> str:
    """What the two columns mean: they answer different questions, and may disagree."""
    ratio = data["summary"].get("unstable_ratio", UNSTABLE_RATIO)
    phase_b = data["phase_b"]
    judged = (
        f"not judged here ({phase_b['error']})"
        if phase_b["error"]
        else f"under {phase_b['source']}, as Stability and leak verdicts shows"
    )
    return note(
        f"{PHASE_B}: the acceptance check of python -m platform.stability ({judged}): PASS, FAIL "
        "(a figure over its limit, or no ok run) or NOT ENOUGH REPEATS. jittery: the ranking's "
        f"own flag (ranked_groups.csv's unstable_group): tail iter p90/p50 above {ratio:g} in "
        "most of the group's ok runs (or the race dropped the group as unstable); jittery "
        "groups rank after the others. The two may disagree: a group can be steady per window "
        "and still FAIL Phase B on its CV across repeats."
    )


def _pooled(table: pd.DataFrame) -> bool:
    """Whether a group ranks on runs from the catalogue (platform/analysis/pooled.py)."""
    there = pd.to_numeric(table.get("runs_catalogue", pd.Series(dtype=float)), errors="coerce")
    return bool((there.fillna(0) > 0).any())


def _filled(values: pd.Series | None) -> bool:
    """Whether a column has any value (a sweep without a baseline or a race has none)."""
    present = values.dropna() if values is not None else pd.Series(dtype=object)
    return bool((present.astype(str) != "").any())


def _measured(per_run: pd.DataFrame) -> pd.DataFrame:
    """Per group over its ok runs: the ``MEASURED`` figures that some run has."""
    if "group" not in per_run:
        return pd.DataFrame()
    ok = per_run[per_run["status"] == "ok"]
    out = pd.DataFrame({"group": pd.unique(ok["group"])})
    for column, (label, how, scale) in MEASURED.items():
        values = pd.to_numeric(ok[column], errors="coerce") if column in ok else None
        if values is not None and values.notna().any():
            out[label] = out["group"].map(values.groupby(ok["group"]).agg(how) * scale)
    return out if len(out.columns) > 1 else pd.DataFrame()


def throughput(data: dict) -> tuple[str, str] | str:
    ranked = data["ranked"]
    if ranked.empty:
        return note("nothing measured")
    fig, (ax,) = new_figure(height=max(2.5, 0.35 * len(ranked)))
    r = _flags(ranked.iloc[::-1], data["phase_b"])
    mean = r["tail_samples_per_sec_robust"].astype(float)
    low = (mean - r["ci95_low"].astype(float)).clip(lower=0).fillna(0)
    high = (r["ci95_high"].astype(float) - mean).clip(lower=0).fillna(0)
    colors = [VERDICT_COLOURS.get(v, VERDICT_COLOURS["-"]) for v in r[PHASE_B]]
    jittery = r.get("unstable_group", pd.Series("no", index=r.index)) == "yes"
    hatches = ["//" if j else "" for j in jittery]
    ax.barh(r["group"], mean, xerr=[low, high], color=colors, hatch=hatches, capsize=3)
    ax.set_xlabel("tail samples/s (robust mean, 95 % interval)")
    handles = _legend(set(r[PHASE_B]), bool(jittery.any()))
    ax.legend(handles=handles, fontsize=LEGEND_PT, loc="lower right")
    title = (
        "Throughput per group: robust mean of tail samples/s, 95 % interval (2+ ok runs), "
        "coloured by the Phase B verdict"
    )
    return title, png(fig, title) + note(
        "Colour: the group's Phase B verdict (python -m platform.stability, as in the ranking "
        "and under Stability and leak verdicts); hatched: jittery (the ranking's own flag)."
    )


def _legend(verdicts: set[str], jittery: bool) -> list:
    from matplotlib.patches import Patch

    handles = [
        Patch(color=colour, label=f"Phase B {word}" if word != "-" else "Phase B not judged")
        for word, colour in VERDICT_COLOURS.items()
        if word in verdicts
    ]
    if jittery:
        handles.append(Patch(facecolor="white", edgecolor="k", hatch="//", label="jittery"))
    return handles


def sweep(data: dict) -> tuple[str, str] | str:
    """One small panel per swept key: each ok run's tail samples/s at its value of that key
    (whatever the other keys were), and the mean of those runs per value."""
    swept, per_run = data["swept"], data["per_run"]
    keys = [k for k in swept.columns if k != "group"]
    if not keys:
        return note(
            "no swept values here (runs/<run>/config.json): nothing to plot against; the "
            "ranking's groups are the sweep's points"
        )
    ok = per_run[(per_run["status"] == "ok") & per_run["tail_samples_per_sec_mean"].notna()]
    runs = ok.merge(swept, on="group", how="inner")
    if runs.empty:
        return note("no ok run measured tail samples/s")
    cols = min(3, len(keys))
    fig, axes = new_figure(math.ceil(len(keys) / cols), cols, height=3.0)
    for ax, key in zip(axes, keys, strict=False):
        values = sorted(runs[key].dropna().unique(), key=_order)
        x = runs[key].map({v: i for i, v in enumerate(values)})
        ax.scatter(x, runs["tail_samples_per_sec_mean"], s=14, label="an ok run")
        means = runs.groupby(x)["tail_samples_per_sec_mean"].mean()
        ax.scatter(
            means.index, means.values, marker="_", s=400, color="k", label="mean of its runs"
        )
        ax.set_xticks(range(len(values)), [str(v) for v in values])
        ax.set_xlim(-0.5, len(values) - 0.5)
        ax.set_xlabel(key)
    for ax in axes[len(keys) :]:
        ax.set_visible(False)
    axes[0].set_ylabel("tail samples/s")
    axes[0].legend(fontsize=LEGEND_PT)
    title = f"Tail samples/s against each swept key ({', '.join(keys)})"
    return title, png(fig, title) + note(
        "Each dot is one ok run at its value of the key, whatever the other swept keys were; "
        "the bar is the mean of those runs."
    )


def _order(value):
    """Numbers in order, then text in order (a swept key may mix them)."""
    is_number = isinstance(value, numbers.Number)  # numpy's integers too
    return (0, float(value), "") if is_number else (1, 0.0, str(value))


def bottlenecks(data: dict) -> str:
    found = data["summary"].get("bottlenecks")
    if found is None:
        return note("no bottleneck analysis in summary.json")
    rows = [
        {"run": run, "kind": b["kind"], "detail": b.get("detail", ""), "try next": b.get("try", "")}
        for run, items in found.items()
        for b in items
    ]
    if not rows:
        return note("no bottleneck found in any run (data share, rank skew, throttling, memory)")
    return html_table(pd.DataFrame(rows))


def scheduler(data: dict) -> str:
    """What the scheduler and the budget decided (schedule.json): each early stop, each group
    that left the race and why, groups let back in, runs not started, groups the race could
    not judge, the catalogue's priors and what they decided, the budget's plans and what it
    left unrun."""
    sched = data.get("schedule") or {}
    if not sched:
        return note("no schedule.json (a sweep from before it, or an analysis folder)")
    name = (sched.get("scheduler") or {}).get("name", "-")
    grid = sched.get("full_grid") or {}
    out = [
        f"<p>Scheduler <b>{html.escape(str(name))}</b>, search "
        f"{html.escape(str((sched.get('search') or {}).get('name', '-')))}; the full grid: "
        f"{grid.get('groups', '-')} groups, {grid.get('runs', '-')} runs, "
        f"{grid.get('steps', '-')} steps.</p>"
    ]
    tables = (
        ("Runs stopped early", sched.get("stops"), "run"),
        ("Groups that left the race", sched.get("eliminated"), "group"),
        ("Groups the race could not judge", sched.get("unjudged"), "group"),
        ("The catalogue's priors (a warm start)", sched.get("priors"), "group"),
        ("Runs not started", sched.get("skipped"), "run"),
    )
    for title, entries, key in tables:
        if entries:
            out.append(f"<h3>{html.escape(title)}</h3>" + _keyed_table(entries, key))
    if sched.get("readmitted"):
        out.append("<h3>Groups let back in</h3>" + _rows_table(sched["readmitted"]))
    budget = sched.get("budget") or {}
    if budget:
        out.append(_budget(budget))
    if len(out) == 1:
        out.append("<p>Nothing was stopped, skipped or left out: every run ran its steps.</p>")
    return "".join(out)


def _keyed_table(entries: dict, key: str) -> str:
    """{name: record or reason} as a table with a ``key`` column first."""
    rows = [
        {key: name, **(value if isinstance(value, dict) else {"why": value})}
        for name, value in entries.items()
    ]
    return _rows_table(rows)


def _rows_table(rows: list) -> str:
    """Records as a table; nested values as compact JSON, time stamps left out."""
    flat = [
        {
            k: (json.dumps(v, default=str) if isinstance(v, dict | list) else v)
            for k, v in (row if isinstance(row, dict) else {"value": row}).items()
            if k != "ts"
        }
        for row in rows
    ]
    return f'<div class="wide">{html_table(pd.DataFrame(flat))}</div>'


def _budget(budget: dict) -> str:
    """The budget's seconds, its plans as said, and what it left unrun, cut or boxed."""
    used = budget.get("used_s")
    out = [
        "<h3>The budget</h3>",
        f"<p>{budget.get('seconds', '-')} s, {budget.get('end_s', '-')} s of them kept for the "
        f"sweep's end; used {'-' if used is None else f'{used:.0f}'} s.</p>",
    ]
    plans = [f"at {p.get('at_s', 0):.0f} s: {p.get('line', '')}" for p in budget.get("plans", [])]
    if plans:
        out.append("<pre>" + html.escape("\n".join(plans)) + "</pre>")
    for title, key, column in (
        ("Left unrun", "left_unrun", "run"),
        ("Cut short at the budget's end", "cut", "run"),
        ("Ended where they were (boxed)", "boxed", "run"),
    ):
        entries = budget.get(key)
        if isinstance(entries, dict) and entries:
            out.append(f"<h4>{title}</h4>" + _keyed_table(entries, column))
        elif isinstance(entries, list) and entries:
            out.append(f"<h4>{title}</h4>" + _rows_table(entries))
    return "".join(out)


def failed(data: dict) -> str:
    manifest = data["manifest"]
    if manifest.empty or "status" not in manifest:
        return note("no run manifest")
    bad = manifest[~manifest["status"].isin(["ok", "stopped_early", "skipped"])]
    counts = ", ".join(f"{k} {v}" for k, v in manifest["status"].value_counts().items())
    if bad.empty:
        return (
            f"<p>Every run finished ok or was stopped by the scheduler ({html.escape(counts)}).</p>"
        )
    out = [f"<p>{html.escape(counts)}</p>"]
    for row in bad.to_dict("records"):
        out.append(
            f"<h3>{html.escape(str(row['run']))}: {html.escape(str(row['status']))}</h3>"
            + note(as_text(row.get("failure_reason")) or "no reason recorded")
        )
        out += [_tail_block(path) for path in _tail_files(data["root"], str(row["run"]))]
    return "".join(out)


def _tail_files(root, run: str) -> list[Path]:
    """What a run that did not finish left to read: its workers' log tails (fail_tail.txt),
    a stalled run's stacks, the tails of the attempts a restart ended."""
    folder = root.run_folder(run)
    found = [folder.fail_tail] + sorted(folder.path.glob(folder.stacks().name))
    found += sorted(folder.path.glob(folder.restart_tail().name))
    return [path for path in found if path.is_file()][:6]


def _tail_block(path: Path, most: int = 400) -> str:
    """A file's text (its last ``most`` lines: every rank's tail of fail_tail.txt fits)."""
    lines = path.read_text(errors="replace").splitlines()
    cut = f" (its last {most} of {len(lines)} lines)" if len(lines) > most else ""
    text = html.escape("\n".join(lines[-most:]))
    return f"<p>{html.escape(path.name)}{cut}</p><pre>{text}</pre>"


def environment(data: dict) -> str:
    root = data["root"]
    out = [_versions(data)]
    envs = sorted(root.runs.glob(f"*/{RunFolder.ENV}")) if root.runs.is_dir() else []
    if envs:
        env = results.read_json(envs[0])
        versions = {k: v for k, v in env.items() if not isinstance(v, (dict, list))}
        for key in ("gpu_names", "gpu_memory_gib"):
            if env.get(key):
                versions[key] = ", ".join(map(str, env[key]))
        out.append(
            f"<p>From {html.escape(str(envs[0].relative_to(root.path)))} (every run has its own):</p>"
            + html_table(pd.DataFrame(sorted(versions.items()), columns=["fact", "value"]))
        )
        allowed = env.get("env") or {}
        if allowed:
            out.append(
                "<p>Environment variables (allow-list, never a secret):</p>"
                + html_table(pd.DataFrame(sorted(allowed.items()), columns=["variable", "value"]))
            )
    manifest = data["manifest"]
    git = [c for c in ("git_commit_short", "git_branch", "git_dirty") if c in manifest]
    if git and not manifest.empty:
        out.append(html_table(manifest[git].drop_duplicates()))
    out.append(_winner(data["best"]))
    readme = root / "README.md"
    if readme.is_file():
        out.append(
            "<p>This folder's README:</p><pre>" + html.escape(readme.read_text()[:4000]) + "</pre>"
        )
    return "".join(out)


def _versions(data: dict) -> str:
    """Which code wrote the page, and which wrote the analysis files it reads."""
    analysis = data["summary"].get("written_by") or (
        "not recorded (summary.json of a version that did not record itself)"
        if data["summary"]
        else "no summary.json"
    )
    return (
        f"<p>This page: python -m platform.report, {html.escape(version_line())}. The "
        f"analysis files (summary.json): {html.escape(analysis)}.</p>"
    )


def _winner(best: dict) -> str:
    """best_config.json: how to train the winner, and its resolved config."""
    if not best.get("config"):
        return note("no best_config.json here (no group finished a run)")
    command = best.get("command") or (
        "python -m platform.train --config OUTPUT_ROOT/best_config.json (this file names no "
        "command: it predates platform.train)"
    )
    out = (
        f"<p>The winner's resolved config ({html.escape(str(best.get('group')))}); train with "
        f"<code>{html.escape(str(command))}</code>"
    )
    if best.get("sweep_command"):
        out += f"; its sweep again: <code>{html.escape(str(best['sweep_command']))}</code>"
    out += ":</p>"
    if best.get("note"):
        out += note(str(best["note"]))
    return (
        out + "<pre>" + html.escape(json.dumps(best["config"], indent=1, sort_keys=True)) + "</pre>"
    )
