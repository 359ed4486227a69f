"""The report's sections over steps and time: iteration time, loss, data wait, GPU telemetry,
host memory and rank skew. Each returns ``(heading, html)``: the heading names what was drawn
(the figure's alt text uses the same words), so a folder that holds only the notebooks' saved
plots gets the headings of those plots, not of the figures drawn from Parquet rows."""

from __future__ import annotations

import math

import pandas as pd

from platform.analysis.report.figures import (
    LEGEND_PT,
    TITLE_PT,
    html_table,
    new_figure,
    note,
    png,
    rank0,
    reference_line,
    saved_plot,
)
from platform.analysis.stats import BOTTLENECK_LIMITS, P50_FLOOR_MS, throttle_names
from platform.storage import results
from trainables.config import global_batch

__all__ = ["candidates", "data_share", "gpu", "host", "iteration", "loss", "skew"]

# The NVML columns the GPU section can draw, with the words its heading uses for each.
GPU_PANELS = {
    "util_gpu_pct": "utilisation",
    "power_w": "power",
    "sm_clock_mhz": "SM clock",
    "temp_c": "temperature",
}
FLOORED_RATIO = f"data p90 / max(p50, {P50_FLOOR_MS:g} ms)"


def _drawn(df: pd.DataFrame, columns) -> list[str]:
    """Those of ``columns`` with at least one value in ``df``: only they are drawn."""
    return [c for c in columns if c in df and df[c].notna().any()]


def iteration(data: dict) -> tuple[str, str]:
    timing = rank0(data["timing"])
    if timing.empty:
        saved = saved_plot(data, "iter_ms_over_steps.png")
        if saved:
            return "Iteration time over steps (p50; the folder's plot)", saved
        return "Iteration time over steps", note("no timing rows: iteration time needs them")
    drawn = _drawn(timing, ("iter_ms_p50", "iter_ms_p90"))
    if not drawn:
        return "Iteration time over steps", note("the timing rows hold no iteration time")
    what = " (solid) and ".join(c.removeprefix("iter_ms_") for c in drawn)
    what += " (dashed)" if len(drawn) == 2 else ""
    fig, (ax,) = new_figure()
    for run, df in timing.sort_values("step").groupby("run"):
        (line,) = ax.plot(df["step"], df[drawn[0]], label=run)
        for col in drawn[1:]:
            ax.plot(df["step"], df[col], ls="--", color=line.get_color())
    ax.set_xlabel("step")
    ax.set_ylabel("iter_ms per window")
    ax.legend(fontsize=LEGEND_PT, ncol=2)
    title = f"Iteration time over steps: {what}, rank 0, per window"
    return title, png(fig, title)


def loss(data: dict) -> tuple[str, str]:
    timing = rank0(data["timing"])
    title = "Training loss over steps: rank 0's mean per window, per run"
    if timing.empty:
        return "Training loss over steps", note(
            "no timing rows here: the loss curves need timing.parquet (a committed analysis "
            "folder keeps the tables, not the rows)"
        )
    timing = timing.dropna(subset=["loss"])
    if timing.empty:
        return "Training loss over steps", note("the timing rows hold no loss")
    fig, (ax,) = new_figure()
    for run, df in timing.sort_values("step").groupby("run"):
        ax.plot(df["step"], df["loss"], label=run)
    chance = _chance_lines(ax, candidates(data, timing))
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=LEGEND_PT, ncol=2)
    return title, png(fig, title) + chance


def candidates(data: dict, timing: pd.DataFrame) -> dict[str, tuple[int, str] | None]:
    """Per run: how many candidates each sample's contrastive loss scores against (a random
    model's loss starts near ln of it), and how that number is made; None where the run does
    not record its micro_batch (or, for global scope, its world size). Global scope: micro_batch x world (every rank's embeddings
    are gathered); local: micro_batch; batching duration: the windows' mean count per step.
    Not the global batch: gradient accumulation adds samples to a step, not candidates to a
    sample's loss (trainables/model/stage1.py)."""
    manifest = data["manifest"]
    rows = {r["run"]: r for r in manifest.to_dict("records")} if "run" in manifest else {}
    out: dict[str, tuple[int, str] | None] = {}
    for run, windows in timing.groupby("run"):
        config = results.read_json(data["root"].run_folder(str(run)).config).get("config") or {}
        known = {**rows.get(run, {}), **config}  # the run's own config.json first
        micro = _known(known, "micro_batch")
        if micro is None:
            out[run] = None
            continue
        micro, accum = int(micro), int(_known(known, "grad_accum_steps", 1))
        if _known(known, "batching", "count") == "duration":
            out[run] = _duration_candidates(windows, accum, known)
            continue
        world = _column_max(windows, "world_size")
        if not world or math.isnan(world):  # rows of a version that did not record it
            per_rank = global_batch(micro_batch=micro, world_size=1, grad_accum_steps=accum)
            world = _column_max(windows, "global_batch") / per_rank
        if _known(known, "contrastive_scope", "global") == "local":
            out[run] = (micro, f"micro_batch {micro}, local scope")
        elif math.isfinite(world):
            world = int(world)
            out[run] = (micro * world, f"micro_batch {micro} x {world} ranks, global scope")
        else:
            out[run] = None
    return out


def _duration_candidates(windows: pd.DataFrame, accum: int, known: dict):
    """batching duration: a step's count varies (short utterances: more of them, so more
    negatives per sample), so the candidates are the windows' mean count per micro-step."""
    if "global_batch" not in windows:
        return None
    mean = pd.to_numeric(windows["global_batch"], errors="coerce").mean() / accum
    world = _column_max(windows, "world_size")
    if not math.isfinite(mean) or not math.isfinite(world):
        return None
    if _known(known, "contrastive_scope", "global") == "local":
        n = max(1, round(mean / world))
        return (n, f"about {n}: a rank's utterances per step, batching duration, local scope")
    n = max(1, round(mean))
    return (n, f"about {n}: every rank's utterances per step (mean), batching duration")


def _column_max(df: pd.DataFrame, column: str) -> float:
    """The largest number in ``df[column]``; NaN where there is none."""
    if column not in df:
        return math.nan
    return float(pd.to_numeric(df[column], errors="coerce").max())


def _known(values: dict, key: str, default=None):
    """``values[key]``, or ``default`` where it is missing or blank (NaN: an empty cell)."""
    v = values.get(key)
    return default if v is None or (isinstance(v, float) and math.isnan(v)) else v


def _chance_lines(ax, found: dict[str, tuple[int, str] | None]) -> str:
    """A dotted line at ln(N) per distinct N of the runs (up to 4), and the note that says
    what each is."""
    by_n: dict[int, set[str]] = {}
    for n_how in filter(None, found.values()):
        by_n.setdefault(n_how[0], set()).add(n_how[1])
    notes = []
    if len(by_n) > 4:
        notes.append(
            f"No chance lines: the runs score against {len(by_n)} different numbers of "
            "candidates (their micro_batch, world size or contrastive_scope differ)."
        )
    elif by_n:
        levels = {n: math.log(n) if n > 1 else 0.0 for n in sorted(by_n)}
        for n, level in levels.items():
            ax.axhline(level, color="grey", ls=":", label=f"ln({n}) = {level:.2f}: chance")
        notes.append(
            "Dotted: where a random model's contrastive loss starts, ln(N) for N candidates "
            "per sample: "
            + ", ".join(
                f"ln({n}) = {level:.2f} ({'; '.join(sorted(by_n[n]))})"
                for n, level in levels.items()
            )
            + "."
        )
    unknown = sorted(run for run, n_how in found.items() if n_how is None)
    if unknown:
        notes.append(
            f"No chance line for {', '.join(unknown)}: micro_batch or world size not recorded."
        )
    return note(" ".join(notes)) if notes else ""


def data_share(data: dict) -> tuple[str, str]:
    timing = rank0(data["timing"])
    per_run = data["per_run"]
    table = _data_table(per_run, timing) if "data_share" in per_run else ""
    if table:
        table += note(
            f"{FLOORED_RATIO} is per_run_metrics.csv's data_p90_over_p50: the mean over the tail "
            "windows of each window's data p90 over its p50, the p50 floored at "
            f"{P50_FLOOR_MS:g} ms (a prefetched batch waits ~0 ms, and a ratio over ~0 says "
            f"nothing). Below 1 it means the data p90 itself is under {P50_FLOOR_MS:g} ms, not "
            "that the p90 is below the p50."
        )
    if timing.empty:
        return "Data wait per run (tail)", table or note("no timing rows")
    timing = timing.assign(data_share=timing["data_ms_mean"] / timing["iter_ms_mean"])
    fig, (ax,) = new_figure()
    for run, df in timing.sort_values("step").groupby("run"):
        ax.plot(df["step"], df["data_share"], label=run)
    limit = BOTTLENECK_LIMITS["data_share"]
    reference_line(ax, limit, f"{limit:g}: data-bound above (bottleneck attribution)")
    ax.set_xlabel("step")
    ax.set_ylabel("data_ms / iter_ms")
    ax.legend(fontsize=LEGEND_PT)
    title = "Data wait: share of the iteration (data_ms / iter_ms), rank 0, per window"
    return title, png(fig, title) + table


def _data_table(per_run: pd.DataFrame, timing: pd.DataFrame) -> str:
    """Per run: the tail's data share and floored ratio and, where the rows are here, the tail's
    data wait p50 and p90 in ms (what the ratio is made of)."""
    table = per_run[["run", "data_share", "data_p90_over_p50"]].copy()
    if not timing.empty:
        p50, p90 = [], []
        for run, windows in zip(per_run["run"], per_run["tail_windows"].fillna(0), strict=True):
            # The run's tail as stats.run_figures takes it: its last windows, last attempt.
            rows = timing[timing["run"] == run].sort_values(["attempt", "window"])
            tail = rows.tail(int(windows))
            p50.append(tail["data_ms_p50"].mean())
            p90.append(tail["data_ms_p90"].mean())
        table["tail data_ms p50"], table["tail data_ms p90"] = p50, p90
    return html_table(table.rename(columns={"data_p90_over_p50": FLOORED_RATIO}), digits=3)


def gpu(data: dict) -> tuple[str, str]:
    gpu = data["gpu"]
    if gpu.empty:
        saved = saved_plot(data, "gpu_util_power.png")
        if saved:
            return "GPU: utilisation and power (the folder's plot)", saved
        use_gpu = set(map(str, data["manifest"].get("use_gpu", pd.Series(dtype=str))))
        why = (
            "this sweep ran on CPUs (use_gpu false)"
            if use_gpu <= {"False", "false"}
            else "telemetry off or NVML missing (see gpu_telemetry_empty_flag in run_manifest.tsv)"
        )
        return "GPU telemetry", note(f"no GPU samples: {why}")
    drawn = _drawn(gpu, GPU_PANELS)
    has_reasons = gpu["throttle_reasons"].notna().any()
    words = [GPU_PANELS[c] for c in drawn] + (["throttle reasons"] if has_reasons else [])
    title = "GPU: " + ", ".join(words)
    rows = math.ceil(len(drawn) / 2)
    fig, axes = new_figure(rows, 2 if len(drawn) > 1 else 1, height=2.8)
    gpu = gpu.assign(t=gpu["ts"] - gpu["ts"].min())
    for (run, rank), df in gpu.sort_values("t").groupby(["run", "rank"]):
        for ax, col in zip(axes, drawn, strict=False):
            ax.plot(df["t"], df[col], label=f"{run} r{rank}")
            ax.set_title(f"{GPU_PANELS[col]} ({col})", fontsize=TITLE_PT)
    for ax in axes[len(drawn) :]:
        ax.set_visible(False)
    axes[0].legend(fontsize=LEGEND_PT)
    axes[-1].set_xlabel("seconds since the first sample")
    summary = gpu.groupby(["run", "rank"]).agg(
        util_gpu_pct=("util_gpu_pct", "mean"),
        power_w=("power_w", "mean"),
        sm_clock_mhz=("sm_clock_mhz", "median"),
        temp_c_max=("temp_c", "max"),
    )
    if has_reasons:
        summary["throttle_reasons"] = gpu.groupby(["run", "rank"])["throttle_reasons"].agg(
            lambda s: (
                ", ".join(sorted({n for v in s.dropna() for n in throttle_names(int(v))})) or "none"
            )
        )
    return title, png(fig, title) + html_table(summary.reset_index(), digits=1)


def host(data: dict) -> tuple[str, str]:
    host = data["host"]
    if host.empty:
        saved = saved_plot(
            data,
            "host_rss_over_steps.png",
            "The MB per 1,000 steps in its legend are the notebook's own fit, not a verdict: the "
            "leak verdicts (warm-up left out, a minimum of samples, the limits) are under Stability "
            "and leak verdicts.",
        )
        if saved:
            return "Host memory: trainer RSS over steps (the folder's plot)", saved
        return "Host memory", note("no host samples (telemetry off?)")
    host = host.assign(t=host["ts"] - host["ts"].min())
    fig, axes = new_figure(1, 2, height=3)
    for (run, node), df in host.sort_values("t").groupby(["run", "node"]):
        axes[0].plot(df["t"], df["trainer_rss_mib"], label=f"{run} {node}")
        axes[1].plot(df["t"], df["mem_available_mib"], label=f"{run} {node}")
    axes[0].set_title("trainer + loader RSS, MiB", fontsize=TITLE_PT)
    axes[1].set_title("memory available, MiB", fontsize=TITLE_PT)
    for ax in axes:
        ax.set_xlabel("seconds since the first sample")
    axes[0].legend(fontsize=LEGEND_PT)
    title = "Host memory: trainer + loader RSS and memory available over time, per run and node"
    return title, png(fig, title) + note(
        "The leak verdicts on these samples are under Stability and leak verdicts."
    )


def skew(data: dict) -> tuple[str, str]:
    timing = data["timing"]
    limit = BOTTLENECK_LIMITS["rank_skew"]
    if not timing.empty and timing["rank_skew"].notna().any():
        fig, (ax,) = new_figure()
        for run, df in rank0(timing).sort_values("step").groupby("run"):
            ax.plot(df["step"], df["rank_skew"], label=run)
        reference_line(ax, limit, f"{limit:g}: straggler above (bottleneck attribution)")
        ax.set_xlabel("step")
        ax.set_ylabel("max/min iter_ms p50 across ranks")
        ax.legend(fontsize=LEGEND_PT)
        title = "Rank skew: max/min iter p50 across ranks, per window"
        return title, png(fig, title) + html_table(data["per_run"], ["run", "rank_skew_max"], 3)
    saved = saved_plot(
        data,
        "rank_skew.png",
        f"Its dashed line at {limit:g} is the straggler limit of the bottleneck attribution.",
    )
    if saved:
        return "Rank skew per window (the folder's plot)", saved
    return "Rank skew", note("rank skew needs every rank's timing: run with --set timing_ranks=all")
