"""``python -m platform.report OUTPUT_ROOT``: one self-contained ``report.html`` per sweep.

Written at the end of every sweep beside ``summary.md`` (platform/tune.py), and by hand for any
output root. The page needs no network: its plots are PNGs inlined as data URIs, its style is
inline, it has no script. Sections, each always filled (with the data, or with a line saying
why there is none):

ranking (with intervals), throughput per group, iteration time p50/p90 over steps, data share,
GPU utilisation/power/clocks/temperature and throttle reasons, host memory, rank skew,
bottlenecks with the setting to try next, stability and leak verdicts, failed runs with their
log tails, environment.

A folder holding only the analysis files (CSV/JSON, no Parquet rows: e.g. one committed to a
repository) is reported from what it has: its ``plots/`` (the notebooks' figures) stand in for
the plots drawn from rows, and its ``stability.log``/``leak.log`` for the verdicts.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from platform.errors import EXIT_USAGE, UsageError
from platform.storage import results

__all__ = ["SECTIONS", "main", "report_line", "write_report"]

REPORT = "report.html"
SECTIONS = (
    ("ranking", "Ranking"),
    ("throughput", "Throughput per group"),
    ("iteration", "Iteration time over steps (p50 and p90)"),
    ("data", "Data share of the iteration"),
    ("gpu", "GPU: utilisation, power, clocks, temperature, throttle reasons"),
    ("host", "Host memory"),
    ("skew", "Rank skew"),
    ("bottlenecks", "Bottlenecks and what to try next"),
    ("stability", "Stability and leak verdicts"),
    ("failed", "Failed runs"),
    ("environment", "Environment"),
)
_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}
.pass{color:#176f2c;font-weight:600}.fail{color:#b00020;font-weight:600}
.note{color:#555;font-style:italic}pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:12px}
img{max-width:100%;border:1px solid #eee}nav a{margin-right:.8em}
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m platform.report",
        description="Write OUTPUT_ROOT/report.html: one self-contained page about a sweep.",
    )
    p.add_argument("output_root", type=Path, help="a sweep's output root (or its analysis files)")
    p.add_argument(
        "--out", type=Path, help="where to write the page (default OUTPUT_ROOT/report.html)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        path = write_report(args.output_root, args.out)
    except UsageError as exc:
        print(f"platform.report: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"report: {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return 0


def report_line(output_root: Path) -> str:
    """``report: PATH`` after writing report.html beside summary.md (the end of every sweep,
    platform.analyze); a failure is this one line, never the end of the analysis."""
    try:
        return f"report: {write_report(output_root)}"
    except Exception as exc:  # noqa: BLE001
        return (
            f"report: not written ({type(exc).__name__}: {exc}); "
            f"python -m platform.report {output_root}"
        )


def write_report(output_root: Path, out: Path | None = None) -> Path:
    root = Path(output_root)
    if not root.is_dir() or not (
        (root / results.MANIFEST).is_file() or (root / "summary.json").is_file()
    ):
        raise UsageError(
            f"{root}: no sweep here (no run_manifest.tsv or summary.json); give a sweep's "
            "output root"
        )
    data = _load(root)
    body = []
    for key, title in SECTIONS:
        try:
            content = _SECTION[key](data)
        except Exception as exc:  # noqa: BLE001 - one broken section never loses the page
            content = _note(f"this section could not be drawn: {type(exc).__name__}: {exc}")
        body.append(f'<section id="{key}"><h2>{html.escape(title)}</h2>\n{content}\n</section>')
    nav = " ".join(f'<a href="#{k}">{html.escape(t.split(":")[0])}</a>' for k, t in SECTIONS)
    summary = data["summary"]
    head = (
        f"<h1>Sweep report: {html.escape(root.resolve().name)}</h1>"
        f"<p>{summary.get('runs', len(data['manifest']))} runs in "
        f"{summary.get('groups', len(data['ranked']))} groups; best group "
        f"<b>{html.escape(str(summary.get('best_group') or '-'))}</b>. Written "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')} by python -m platform.report from "
        f"<code>{html.escape(str(root))}</code>.</p><nav>{nav}</nav>"
    )
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>Sweep report {html.escape(root.name)}</title><style>{_STYLE}</style></head>"
        f"<body>{head}{''.join(body)}</body></html>\n"
    )
    path = Path(out) if out else root / REPORT
    results.atomic_write_text(path, page)
    return path


# --- data ---
def _load(root: Path) -> dict[str, Any]:
    from platform.analysis.analyze import read_manifest

    def csv(name: str) -> pd.DataFrame:
        path = root / name
        return pd.read_csv(path) if path.is_file() else pd.DataFrame()

    per_run = csv("per_run_metrics.csv")
    return {
        "root": root,
        # A folder of analysis files only has per_run_metrics.csv's runs (with their status).
        "manifest": read_manifest(root) if (root / results.MANIFEST).is_file() else per_run,
        "per_run": per_run,
        "groups": csv("group_summary.csv"),
        "ranked": csv("ranked_groups.csv"),
        "summary": results.read_json(root / "summary.json"),
        "best": results.read_json(root / results.BEST_CONFIG),
        # Empty, with their columns, where the folder has none.
        "timing": results.read_dataset(root / results.TIMING_DIR, results.TIMING_SCHEMA),
        "gpu": results.read_dataset(root / results.GPU_TELEMETRY_DIR, results.GPU_TELEMETRY_SCHEMA),
        "host": results.read_dataset(
            root / results.HOST_TELEMETRY_DIR, results.HOST_TELEMETRY_SCHEMA
        ),
    }


# --- pieces ---
def _note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'


def _table(df: pd.DataFrame, columns: list[str] | None = None, digits: int = 2) -> str:
    if df.empty:
        return _note("no rows")
    df = df[[c for c in (columns or list(df.columns)) if c in df.columns]]

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "-" if math.isnan(v) else f"{v:,.{digits}f}"
        return html.escape(str(v))

    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>"
        for row in df.itertuples(index=False)
    )
    return f"<table><tr>{head}</tr>{rows}</table>"


def _text(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=72, bbox_inches="tight")
    plt.close(fig)
    return (
        f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'
    )


def _saved_plot(data: dict, name: str) -> str:
    path = data["root"] / "plots" / name
    if not path.is_file():
        return ""
    return (
        f'<img alt="{html.escape(name)}" src="data:image/png;base64,'
        f'{base64.b64encode(path.read_bytes()).decode()}">'
        + _note(f"plots/{name} of this folder (no Parquet rows here to draw from)")
    )


def _figure(rows: int = 1, cols: int = 1, height: float = 3.2):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, cols, figsize=(10, height * rows), squeeze=False)
    return fig, axes.ravel()


def _rank0(timing: pd.DataFrame) -> pd.DataFrame:
    return timing[timing["rank"] == 0] if "rank" in timing else timing


# --- sections ---
def _ranking(data: dict) -> str:
    ranked = data["ranked"]
    if ranked.empty:
        return _note("no group measured anything yet (no ranked_groups.csv)")
    cols = [
        "rank",
        "group",
        "runs_ok",
        "tail_samples_per_sec_robust",
        "ci95_low",
        "ci95_high",
        "tail_mean_iter_p50_ms",
        "unstable_group",
        "vs_baseline",
        "left_race",
    ]
    noise = data["summary"].get("top_two_within_noise")
    out = _table(ranked, cols)
    if noise:
        out += _note("the top two groups are within noise of each other: repeat them to separate")
    return out


def _throughput(data: dict) -> str:
    ranked = data["ranked"]
    if ranked.empty:
        return _note("nothing measured")
    fig, (ax,) = _figure(height=max(2.5, 0.35 * len(ranked)))
    r = ranked.iloc[::-1]
    mean = r["tail_samples_per_sec_robust"].astype(float)
    low = (mean - r["ci95_low"].astype(float)).clip(lower=0).fillna(0)
    high = (r["ci95_high"].astype(float) - mean).clip(lower=0).fillna(0)
    colors = ["#b00020" if u else "#3a7bd5" for u in r["unstable_group"].astype(bool)]
    ax.barh(r["group"], mean, xerr=[low, high], color=colors, capsize=3)
    ax.set_xlabel("tail samples/s (robust mean, 95 % interval; red: unstable)")
    return _png(fig)


def _over_steps(data: dict, columns: list[str], ylabel: str, plot_name: str, what: str) -> str:
    timing = _rank0(data["timing"])
    if timing.empty:
        return _saved_plot(data, plot_name) or _note(f"no timing rows: {what} needs timing.parquet")
    fig, (ax,) = _figure()
    for run, df in timing.sort_values("step").groupby("run"):
        for i, col in enumerate(columns):
            ax.plot(df["step"], df[col], ls="-" if i == 0 else "--", label=f"{run} {col}")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7, ncol=2)
    return _png(fig)


def _iteration(data: dict) -> str:
    return _over_steps(
        data, ["iter_ms_p50", "iter_ms_p90"], "iter_ms", "iter_ms_over_steps.png", "iteration time"
    )


def _data_share(data: dict) -> str:
    timing = _rank0(data["timing"])
    per_run = data["per_run"]
    table = (
        _table(per_run, ["run", "data_share", "data_p90_over_p50"], 3)
        if "data_share" in per_run
        else ""
    )
    if timing.empty:
        return table or _note("no timing rows")
    timing = timing.assign(data_share=timing["data_ms_mean"] / timing["iter_ms_mean"])
    fig, (ax,) = _figure()
    for run, df in timing.sort_values("step").groupby("run"):
        ax.plot(df["step"], df["data_share"], label=run)
    ax.set_xlabel("step")
    ax.set_ylabel("data_ms / iter_ms")
    ax.legend(fontsize=7)
    return _png(fig) + table


def _gpu(data: dict) -> str:
    gpu = data["gpu"]
    if gpu.empty:
        saved = _saved_plot(data, "gpu_util_power.png")
        if saved:
            return saved
        use_gpu = set(map(str, data["manifest"].get("use_gpu", pd.Series(dtype=str))))
        why = (
            "this sweep ran on CPUs (use_gpu false)"
            if use_gpu <= {"False", "false"}
            else (
                "telemetry off or NVML missing (see gpu_telemetry_empty_flag in run_manifest.tsv)"
            )
        )
        return _note(f"no GPU samples: {why}")
    fig, axes = _figure(2, 2, height=2.8)
    gpu = gpu.assign(t=gpu["ts"] - gpu["ts"].min())
    for (run, rank), df in gpu.sort_values("t").groupby(["run", "rank"]):
        for ax, col in zip(
            axes, ("util_gpu_pct", "power_w", "sm_clock_mhz", "temp_c"), strict=True
        ):
            ax.plot(df["t"], df[col], label=f"{run} r{rank}")
            ax.set_title(col, fontsize=9)
    axes[0].legend(fontsize=6)
    from platform.analysis.stats import throttle_names

    reasons = gpu.groupby(["run", "rank"])["throttle_reasons"].agg(
        lambda s: (
            ", ".join(sorted({n for v in s.dropna() for n in throttle_names(int(v))})) or "none"
        )
    )
    summary = gpu.groupby(["run", "rank"]).agg(
        util_gpu_pct=("util_gpu_pct", "mean"),
        power_w=("power_w", "mean"),
        sm_clock_mhz=("sm_clock_mhz", "median"),
        temp_c_max=("temp_c", "max"),
    )
    summary["throttle_reasons"] = reasons
    return _png(fig) + _table(summary.reset_index(), digits=1)


def _host(data: dict) -> str:
    host = data["host"]
    if host.empty:
        return _saved_plot(data, "host_rss_over_steps.png") or _note(
            "no host samples (telemetry off?)"
        )
    host = host.assign(t=host["ts"] - host["ts"].min())
    fig, axes = _figure(1, 2, height=3)
    for (run, node), df in host.sort_values("t").groupby(["run", "node"]):
        axes[0].plot(df["t"], df["trainer_rss_mib"], label=f"{run} {node}")
        axes[1].plot(df["t"], df["mem_available_mib"], label=f"{run} {node}")
    axes[0].set_title("trainer + loader RSS, MiB", fontsize=9)
    axes[1].set_title("memory available, MiB", fontsize=9)
    axes[0].legend(fontsize=6)
    return _png(fig)


def _skew(data: dict) -> str:
    timing = data["timing"]
    per_run = data["per_run"]
    if not timing.empty and timing["rank_skew"].notna().any():
        fig, (ax,) = _figure()
        for run, df in _rank0(timing).sort_values("step").groupby("run"):
            ax.plot(df["step"], df["rank_skew"], label=run)
        ax.set_ylabel("max/min iter_ms p50 across ranks")
        ax.legend(fontsize=7)
        return _png(fig) + _table(per_run, ["run", "rank_skew_max"], 3)
    saved = _saved_plot(data, "rank_skew.png")
    if saved:
        return saved
    return _note("rank skew needs every rank's timing: run with --set timing_ranks=all")


def _bottlenecks(data: dict) -> str:
    found = data["summary"].get("bottlenecks")
    if found is None:
        return _note("no bottleneck analysis in summary.json")
    rows = [
        {"run": run, "kind": b["kind"], "detail": b.get("detail", ""), "try next": b.get("try", "")}
        for run, items in found.items()
        for b in items
    ]
    if not rows:
        return _note("no bottleneck found in any run (data share, rank skew, throttling, memory)")
    return _table(pd.DataFrame(rows))


def _stability(data: dict) -> str:
    from platform.analysis import stability

    out = []
    groups = data["groups"]
    limits = stability.build_parser().parse_args(["--output-root", str(data["root"])])
    if not groups.empty and "iter_ratio_median" in groups:
        verdicts = stability.check(
            groups,
            list(groups["group"]),
            min_repeats=limits.min_repeats,
            max_ratio_median=limits.max_iter_ratio_median,
            max_ratio_max=limits.max_iter_ratio_max,
            max_cv=limits.max_iter_p50_cv,
        )
        rows = "".join(
            f'<tr><td>{html.escape(v["group"])}</td><td class="{"pass" if v["passed"] else "fail"}">'
            f"{'PASS' if v['passed'] else 'FAIL'}</td><td>{v['runs_ok']}</td>"
            f"<td>{v['iter_ratio_median']:.3f}</td><td>{v['iter_ratio_max']:.3f}</td>"
            f"<td>{v['iter_p50_cv']:.4f}</td><td>{html.escape('; '.join(v['failures']))}</td></tr>"
            for v in verdicts
        )
        out.append(
            f"<p>Phase B limits (python -m platform.stability): at least {limits.min_repeats} ok "
            f"runs, iter p90/p50 median &le; {limits.max_iter_ratio_median:g} and max &le; "
            f"{limits.max_iter_ratio_max:g}, iter p50 CV &le; {limits.max_iter_p50_cv:g}.</p>"
            "<table><tr><th>group</th><th>verdict</th><th>ok runs</th><th>p90/p50 median</th>"
            f"<th>p90/p50 max</th><th>iter p50 CV</th><th>why</th></tr>{rows}</table>"
        )
    elif (data["root"] / "stability.log").is_file():
        out.append("<pre>" + html.escape((data["root"] / "stability.log").read_text()) + "</pre>")
    out.append("<h3>Leaks (python -m platform.leak)</h3>" + _leaks(data))
    return "".join(out)


def _leaks(data: dict) -> str:
    timing, host, gpu = data["timing"], data["host"], data["gpu"]
    if timing.empty:
        log = data["root"] / "leak.log"
        return (
            "<pre>" + html.escape(log.read_text()) + "</pre>"
            if log.is_file()
            else _note("no timing rows to fit memory against")
        )
    from platform.analysis import leak

    limits = leak.build_parser().parse_args([str(data["root"])])
    lines = []
    for run in sorted(set(timing["run"])):
        figures = leak.leak_figures(
            timing[timing["run"] == run],
            host[host["run"] == run],
            gpu[gpu["run"] == run],
            limits.skip_fraction,
        )
        lines.append(leak.verdict(run, figures, limits)[0])
    return "<pre>" + html.escape("\n".join(lines)) + "</pre>"


def _failed(data: dict) -> str:
    manifest = data["manifest"]
    if manifest.empty or "status" not in manifest:
        return _note("no run manifest")
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
            + _note(_text(row.get("failure_reason")) or "no reason recorded")
        )
        run_dir = data["root"] / "runs" / str(row["run"])
        tails = sorted(run_dir.glob("*tail*.log")) + sorted(run_dir.glob("*stack*"))
        for tail in tails[:4]:
            text = tail.read_text(errors="replace").splitlines()[-60:]
            out.append(
                f"<p>{html.escape(tail.name)}</p><pre>{html.escape(chr(10).join(text))}</pre>"
            )
    return "".join(out)


def _environment(data: dict) -> str:
    root = data["root"]
    envs = sorted((root / "runs").glob("*/env.json")) if (root / "runs").is_dir() else []
    out = []
    if envs:
        env = results.read_json(envs[0])
        versions = {k: v for k, v in env.items() if not isinstance(v, (dict, list))}
        for key in ("gpu_names", "gpu_memory_gib"):
            if env.get(key):
                versions[key] = ", ".join(map(str, env[key]))
        out.append(
            f"<p>From {html.escape(str(envs[0].relative_to(root)))} (every run has its own):</p>"
            + _table(pd.DataFrame(sorted(versions.items()), columns=["fact", "value"]))
        )
        allowed = env.get("env") or {}
        if allowed:
            out.append(
                "<p>Environment variables (allow-list, never a secret):</p>"
                + _table(pd.DataFrame(sorted(allowed.items()), columns=["variable", "value"]))
            )
    manifest = data["manifest"]
    git = [c for c in ("git_commit_short", "git_branch", "git_dirty") if c in manifest]
    if git and not manifest.empty:
        out.append(_table(manifest[git].drop_duplicates()))
    best = data["best"]
    if best.get("config"):
        out.append(
            f"<p>The winner's resolved config ({html.escape(str(best.get('group')))}); train with "
            f"<code>{html.escape(str(best.get('command', '')))}</code>:</p><pre>"
            + html.escape(json.dumps(best["config"], indent=1, sort_keys=True))
            + "</pre>"
        )
    readme = root / "README.md"
    if readme.is_file():
        out.append(
            "<p>This folder's README:</p><pre>" + html.escape(readme.read_text()[:4000]) + "</pre>"
        )
    return "".join(out) or _note("no env.json, manifest or best_config.json here")


_SECTION = {
    "ranking": _ranking,
    "throughput": _throughput,
    "iteration": _iteration,
    "data": _data_share,
    "gpu": _gpu,
    "host": _host,
    "skew": _skew,
    "bottlenecks": _bottlenecks,
    "stability": _stability,
    "failed": _failed,
    "environment": _environment,
}


if __name__ == "__main__":
    sys.exit(main())
