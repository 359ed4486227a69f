"""The report page's sections, one renderer each: the data ``report._load`` gathered in, an
HTML fragment out. Each section is always filled, with the data or with a line saying why there
is none; a folder of analysis files only (no Parquet rows) shows its own ``plots/`` and its
``stability.log``/``leak.log`` instead."""

from __future__ import annotations

import html
import json

import pandas as pd

from platform.analysis.figures import (
    as_text,
    html_table,
    new_figure,
    note,
    png,
    rank0,
    saved_plot,
)
from platform.analysis.leak import LeakLimits, verdicts
from platform.analysis.stability import StabilityLimits, check
from platform.analysis.stats import throttle_names
from platform.storage import results
from stage1_common.output_root import OutputRoot

__all__ = ["RENDERERS"]


def ranking(data: dict) -> str:
    ranked = data["ranked"]
    if ranked.empty:
        return note("no group measured anything yet (no ranked_groups.csv)")
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
    out = html_table(ranked, cols)
    if noise:
        out += note("the top two groups are within noise of each other: repeat them to separate")
    return out


def throughput(data: dict) -> str:
    ranked = data["ranked"]
    if ranked.empty:
        return note("nothing measured")
    fig, (ax,) = new_figure(height=max(2.5, 0.35 * len(ranked)))
    r = ranked.iloc[::-1]
    mean = r["tail_samples_per_sec_robust"].astype(float)
    low = (mean - r["ci95_low"].astype(float)).clip(lower=0).fillna(0)
    high = (r["ci95_high"].astype(float) - mean).clip(lower=0).fillna(0)
    colors = ["#b00020" if u else "#3a7bd5" for u in r["unstable_group"].astype(bool)]
    ax.barh(r["group"], mean, xerr=[low, high], color=colors, capsize=3)
    ax.set_xlabel("tail samples/s (robust mean, 95 % interval; red: unstable)")
    return png(fig)


def _over_steps(data: dict, columns: list[str], ylabel: str, plot_name: str, what: str) -> str:
    timing = rank0(data["timing"])
    if timing.empty:
        return saved_plot(data, plot_name) or note(f"no timing rows: {what} needs timing.parquet")
    fig, (ax,) = new_figure()
    for run, df in timing.sort_values("step").groupby("run"):
        for i, col in enumerate(columns):
            ax.plot(df["step"], df[col], ls="-" if i == 0 else "--", label=f"{run} {col}")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7, ncol=2)
    return png(fig)


def iteration(data: dict) -> str:
    return _over_steps(
        data, ["iter_ms_p50", "iter_ms_p90"], "iter_ms", "iter_ms_over_steps.png", "iteration time"
    )


def data_share(data: dict) -> str:
    timing = rank0(data["timing"])
    per_run = data["per_run"]
    table = (
        html_table(per_run, ["run", "data_share", "data_p90_over_p50"], 3)
        if "data_share" in per_run
        else ""
    )
    if timing.empty:
        return table or note("no timing rows")
    timing = timing.assign(data_share=timing["data_ms_mean"] / timing["iter_ms_mean"])
    fig, (ax,) = new_figure()
    for run, df in timing.sort_values("step").groupby("run"):
        ax.plot(df["step"], df["data_share"], label=run)
    ax.set_xlabel("step")
    ax.set_ylabel("data_ms / iter_ms")
    ax.legend(fontsize=7)
    return png(fig) + table


def gpu(data: dict) -> str:
    gpu = data["gpu"]
    if gpu.empty:
        saved = saved_plot(data, "gpu_util_power.png")
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
        return note(f"no GPU samples: {why}")
    fig, axes = new_figure(2, 2, height=2.8)
    gpu = gpu.assign(t=gpu["ts"] - gpu["ts"].min())
    for (run, rank), df in gpu.sort_values("t").groupby(["run", "rank"]):
        for ax, col in zip(
            axes, ("util_gpu_pct", "power_w", "sm_clock_mhz", "temp_c"), strict=True
        ):
            ax.plot(df["t"], df[col], label=f"{run} r{rank}")
            ax.set_title(col, fontsize=9)
    axes[0].legend(fontsize=6)
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
    return png(fig) + html_table(summary.reset_index(), digits=1)


def host(data: dict) -> str:
    host = data["host"]
    if host.empty:
        return saved_plot(data, "host_rss_over_steps.png") or note(
            "no host samples (telemetry off?)"
        )
    host = host.assign(t=host["ts"] - host["ts"].min())
    fig, axes = new_figure(1, 2, height=3)
    for (run, node), df in host.sort_values("t").groupby(["run", "node"]):
        axes[0].plot(df["t"], df["trainer_rss_mib"], label=f"{run} {node}")
        axes[1].plot(df["t"], df["mem_available_mib"], label=f"{run} {node}")
    axes[0].set_title("trainer + loader RSS, MiB", fontsize=9)
    axes[1].set_title("memory available, MiB", fontsize=9)
    axes[0].legend(fontsize=6)
    return png(fig)


def skew(data: dict) -> str:
    timing = data["timing"]
    per_run = data["per_run"]
    if not timing.empty and timing["rank_skew"].notna().any():
        fig, (ax,) = new_figure()
        for run, df in rank0(timing).sort_values("step").groupby("run"):
            ax.plot(df["step"], df["rank_skew"], label=run)
        ax.set_ylabel("max/min iter_ms p50 across ranks")
        ax.legend(fontsize=7)
        return png(fig) + html_table(per_run, ["run", "rank_skew_max"], 3)
    saved = saved_plot(data, "rank_skew.png")
    if saved:
        return saved
    return note("rank skew needs every rank's timing: run with --set timing_ranks=all")


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


def stability(data: dict) -> str:
    out = []
    groups = data["groups"]
    root = data["root"]
    limits = StabilityLimits()  # the defaults of python -m platform.stability
    if not groups.empty and "iter_ratio_median" in groups:
        rows = "".join(
            f'<tr><td>{html.escape(v["group"])}</td><td class="{"pass" if v["passed"] else "fail"}">'
            f"{'PASS' if v['passed'] else 'FAIL'}</td><td>{v['runs_ok']}</td>"
            f"<td>{v['iter_ratio_median']:.3f}</td><td>{v['iter_ratio_max']:.3f}</td>"
            f"<td>{v['iter_p50_cv']:.4f}</td><td>{html.escape('; '.join(v['failures']))}</td></tr>"
            for v in check(groups, list(groups["group"]), limits)
        )
        out.append(
            f"<p>Phase B limits (python -m platform.stability): at least {limits.min_repeats} ok "
            f"runs, iter p90/p50 median &le; {limits.max_iter_ratio_median:g} and max &le; "
            f"{limits.max_iter_ratio_max:g}, iter p50 CV &le; {limits.max_iter_p50_cv:g}.</p>"
            "<table><tr><th>group</th><th>verdict</th><th>ok runs</th><th>p90/p50 median</th>"
            f"<th>p90/p50 max</th><th>iter p50 CV</th><th>why</th></tr>{rows}</table>"
        )
    elif (root / root.STABILITY_LOG).is_file():
        out.append("<pre>" + html.escape((root / root.STABILITY_LOG).read_text()) + "</pre>")
    out.append("<h3>Leaks (python -m platform.leak)</h3>" + leaks(data))
    return "".join(out)


def leaks(data: dict) -> str:
    timing, host, gpu = data["timing"], data["host"], data["gpu"]
    if timing.empty:
        log = data["root"] / OutputRoot.LEAK_LOG
        return (
            "<pre>" + html.escape(log.read_text()) + "</pre>"
            if log.is_file()
            else note("no timing rows to fit memory against")
        )
    # The defaults of python -m platform.leak.
    lines = [line for line, _ in verdicts(timing, host, gpu, LeakLimits())]
    return "<pre>" + html.escape("\n".join(lines)) + "</pre>"


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
        run_dir = data["root"].run_dir(str(row["run"]))
        tails = sorted(run_dir.glob("*tail*.log")) + sorted(run_dir.glob("*stack*"))
        for tail in tails[:4]:
            text = tail.read_text(errors="replace").splitlines()[-60:]
            out.append(
                f"<p>{html.escape(tail.name)}</p><pre>{html.escape(chr(10).join(text))}</pre>"
            )
    return "".join(out)


def environment(data: dict) -> str:
    root = data["root"]
    envs = sorted(root.runs.glob(f"*/{root.RUN_ENV}")) if root.runs.is_dir() else []
    out = []
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
    return "".join(out) or note("no env.json, manifest or best_config.json here")


RENDERERS = {
    "ranking": ranking,
    "throughput": throughput,
    "iteration": iteration,
    "data": data_share,
    "gpu": gpu,
    "host": host,
    "skew": skew,
    "bottlenecks": bottlenecks,
    "stability": stability,
    "failed": failed,
    "environment": environment,
}
