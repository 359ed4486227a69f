"""A sweep's files turned into its tables and summary (``python -m platform.analyze``).

Reads ``run_manifest.tsv`` and ``timing.parquet/`` and writes, atomically: per_run_metrics.csv,
group_summary.csv, ranked_groups.csv, best_config.json (the winner's full resolved config and the
command that trains with it), summary.md and summary.json. ``platform.tune`` runs it at the end
of every sweep, also an interrupted one. Definitions are in platform/analysis/stats.py.
"""

from __future__ import annotations

import math
import textwrap
from typing import Any

import pandas as pd

from platform.analysis import answer, calibration, confidence, interrupted, pooled, stats
from platform.analysis.verdicts import cliffs
from platform.errors import UsageError
from platform.storage import results
from stage1_common.output_root import OutputRoot
from stage1_common.version import version_line

__all__ = ["FILES", "analyze", "format_ranked", "group_ranks", "ranked_groups"]

FILES = (
    OutputRoot.PER_RUN_METRICS,
    OutputRoot.GROUP_SUMMARY,
    OutputRoot.RANKED_GROUPS,
    OutputRoot.BEST_CONFIG,
    OutputRoot.SUMMARY_MD,
    OutputRoot.SUMMARY_JSON,
)


def analyze(root: OutputRoot, *, unstable_ratio: float = stats.UNSTABLE_RATIO) -> dict[str, Any]:
    """Write the analysis files; returns summary.json's content plus ``text`` (summary.md).
    The summary and the training command name the root as the user reaches it (``root.shown``:
    the bucket's address for a local copy of a root on object storage)."""
    manifest = results.read_manifest(root)
    timing = results.read_dataset(root.timing, results.TIMING_SCHEMA)
    per_run = stats.per_run_metrics(manifest, timing, unstable_ratio=unstable_ratio)
    found = _bottlenecks(root, per_run)
    per_run["bottlenecks"] = [";".join(b["kind"] for b in found.get(r, [])) for r in per_run["run"]]
    schedule = results.read_json(root.schedule)  # platform/control/race.py; absent before it
    # A warm race's confirmed groups rank on their runs here and their catalogue runs.
    pooling = pooled.pool(per_run, schedule, unstable_ratio, timing)
    groups = _race_verdicts(stats.group_summary(_ranked_runs(per_run, pooling)), schedule)
    ranked = _vs_baseline(root, manifest, stats.rank(groups))
    ranked, how_sure = confidence.of_sweep(manifest, timing, ranked, pooling)
    for name, df in (
        (root.PER_RUN_METRICS, per_run),
        (root.GROUP_SUMMARY, groups),
        (root.RANKED_GROUPS, ranked),
    ):
        results.atomic_write_text(root / name, df.to_csv(index=False))
    best = _best_config(root, manifest, ranked)
    if best is not None:
        results.write_json(root.best_config, best)
    summary = _summary(root, manifest, per_run, ranked, best, unstable_ratio)
    summary["pooled"] = pooling.summary() if pooling else None
    summary["confidence"] = how_sure  # the winner's P(fastest) and who is within noise of it
    summary["bottlenecks"] = found
    summary["cliffs"] = _cliffs(manifest, timing)
    summary["early_stopping"] = _early_stopping(manifest, per_run, schedule)
    summary["budget"] = _budget(manifest, schedule)
    summary["partial"] = interrupted.partial(manifest)
    # The platform against its references on the sweep's host, for the strategies it ranked.
    summary["calibration"] = calibration.for_sweep(root, manifest, list(ranked["group"]))
    text = _markdown(summary, ranked)
    results.write_json(root / root.SUMMARY_JSON, summary)
    results.atomic_write_text(root / root.SUMMARY_MD, text)
    return summary | {"text": text}


def group_ranks(root: OutputRoot) -> dict[str, int]:
    """Group -> its place in the sweep's ranking, as ``analyze`` ranks the groups (the
    catalogue keeps it: platform/storage/catalogue.py)."""
    manifest = results.read_manifest(root)
    timing = results.read_dataset(root.timing, results.TIMING_SCHEMA)
    ranked = ranked_groups(
        stats.per_run_metrics(manifest, timing), results.read_json(root.schedule), timing
    )
    return {str(g): int(r) for g, r in zip(ranked["group"], ranked["rank"], strict=True)}


def ranked_groups(
    per_run: pd.DataFrame, schedule: dict[str, Any], timing: pd.DataFrame | None = None
) -> pd.DataFrame:
    """The groups over their runs (``per_run``), the race's verdicts (``schedule``: the content
    of schedule.json) applied, in ranking order: from the sweep's own measurements, pooled with
    the catalogue's runs for the groups a warm race confirmed (platform/analysis/pooled.py;
    ``timing``: the sweep's windows, to cut a run stopped once confirmed after the warm-up)."""
    pooling = pooled.pool(per_run, schedule, timing=timing)
    return stats.rank(_race_verdicts(stats.group_summary(_ranked_runs(per_run, pooling)), schedule))


def _ranked_runs(per_run: pd.DataFrame, pooling: pooled.Pooling | None) -> pd.DataFrame:
    """The runs the ranking ranks on: the sweep's, or its pooled ones."""
    return per_run if pooling is None else pooling.per_run


def _race_verdicts(groups: pd.DataFrame, schedule: dict[str, Any]) -> pd.DataFrame:
    """``left_race``: why the race stopped a group (slower, unstable, failed; empty when it
    did not). A group the race found unstable by the Phase B limits is unstable here too, so
    it cannot rank above a stable one."""
    eliminated = schedule.get("eliminated") or {}
    kinds = [eliminated.get(g, {}).get("kind", "") for g in groups["group"]]
    groups = groups.assign(left_race=kinds)
    judged = groups["left_race"].isin(["unstable", "failed"])
    groups["unstable_group"] = groups["unstable_group"].astype(bool) | judged
    return groups


def _early_stopping(
    manifest: pd.DataFrame, per_run: pd.DataFrame, schedule: dict[str, Any]
) -> dict[str, Any] | None:
    """What the scheduler stopped, when and why, and the steps run against the full grid's
    (schedule.json; None for a sweep without a scheduler record or with nothing to say)."""
    if not schedule:
        return None
    sched, search = schedule.get("scheduler", {}), schedule.get("search", {})
    if sched.get("name", "fifo") == "fifo" and search.get("name", "grid") == "grid":
        return None
    steps_run = int(pd.to_numeric(per_run.get("last_step"), errors="coerce").fillna(0).sum())
    full = int((schedule.get("full_grid") or {}).get("steps") or 0)
    stops = schedule.get("stops") or {}
    counts = manifest["status"].value_counts().to_dict()
    line = (
        f"{sched.get('name')} + {search.get('name')}: {steps_run} of the full grid's {full} steps "
        f"run ({steps_run / full:.0%})"
        if full
        else f"{steps_run} steps run"
    ) + (
        f"; {counts.get('stopped_early', 0)} run(s) stopped early, "
        f"{counts.get('skipped', 0)} skipped"
    )
    unjudged = schedule.get("unjudged") or {}
    if unjudged:  # the race judged no window of these: say it where the steps are said
        line += f"; {len(unjudged)} group(s) never judged by the race (summary.md says why)"
    priors = schedule.get("priors") or {}
    if priors and (schedule.get("history") or {}).get("mode") == "confirm":
        states = [p.get("state") for p in priors.values()]
        line += (
            f"; catalogue priors for {len(priors)} group(s) (--history confirm): "
            f"{states.count('confirmed')} confirmed here (their catalogue runs stand in for "
            f"their repeats), {states.count('dropped')} dropped (run as cold)"
        )
    elif priors:
        stopped = sum(1 for e in (schedule.get("eliminated") or {}).values() if e.get("prior"))
        line += f"; catalogue priors for {len(priors)} group(s), {stopped} stopped on them"
    return {
        "scheduler": sched,
        "search": search,
        "steps_run": steps_run,
        "steps_full_grid": full,
        "steps_ratio": steps_run / full if full else None,
        "stops": stops,
        "eliminated": schedule.get("eliminated") or {},
        "readmitted": schedule.get("readmitted") or [],
        "skipped": schedule.get("skipped") or {},
        "picked": schedule.get("picked") or [],
        "priors": priors,
        "unjudged": unjudged,
        "line": line,
    }


def _budget(manifest: pd.DataFrame, schedule: dict[str, Any]) -> dict[str, Any] | None:
    """--budget: its seconds, when the runs ended, what ran, what it left unrun and why, and
    the runs its end cut short (schedule.json's ``budget``; None without one)."""
    from stage1_common.durations import shown

    record = schedule.get("budget")
    if not record:
        return None
    left = record.get("left_unrun") or {}
    ran = manifest[~manifest["status"].isin(["skipped", "pending"])]
    groups = manifest.groupby("group", sort=False)["run"]
    never = [g for g, runs in groups if runs.isin(left).all()]  # every run left by the budget
    used = record.get("used_s")
    line = (
        f"budget {shown(record['seconds'])}: "
        + (f"the runs ended at {shown(used)}; " if used is not None else "")
        + f"{len(ran)} of {len(manifest)} run(s) ran"
    )
    if left:
        line += f"; left unrun: {len(left)} run(s)"
        if never:
            line += f", of them every run of {len(never)} group(s) ({', '.join(never)})"
    if record.get("cut"):
        line += f"; cut short at its end: {', '.join(record['cut'])}"
    boxed = {r: b for r, b in (record.get("boxed") or {}).items() if b.get("step")}
    return {
        "seconds": record["seconds"],
        "used_s": used,
        "runs_ran": len(ran),
        "left_unrun": left,
        "groups_unrun": never,
        "cut": record.get("cut") or [],
        "boxed": boxed,
        "plans": record.get("plans") or [],
        "line": line,
    }


def _bottlenecks(root: OutputRoot, per_run: pd.DataFrame) -> dict[str, list[dict[str, str]]]:
    """What limits each run that measured something (platform/analysis/stats.py: bottlenecks)."""
    gpu = results.read_dataset(root / root.GPU_TELEMETRY, results.GPU_TELEMETRY_SCHEMA)
    out = {}
    for row in per_run.to_dict("records"):
        if not row.get("windows"):
            continue
        env = results.read_json(root.run_folder(row["run"]).env)
        totals = [float(g) for g in env.get("gpu_memory_gib") or []]
        throttle = gpu.loc[gpu["run"] == row["run"], "throttle_reasons"]
        found = stats.bottlenecks(row, throttle, min(totals) if totals else None)
        if found:
            out[row["run"]] = found
    return out


def _cliffs(manifest: pd.DataFrame, timing: pd.DataFrame) -> dict[str, dict[str, str]]:
    """Each run off a performance cliff: its verdict (platform/analysis/verdicts/cliffs.py: kind,
    detail, reported, try), judged from its windows and its manifest row."""
    figures = stats.run_figures(timing, stats.tail_points(manifest))
    found = {}
    for rec in manifest.to_dict("records"):
        verdict = cliffs.judge(figures[rec["run"]], rec) if rec["run"] in figures else None
        if verdict:
            found[rec["run"]] = verdict
    return found


def _run_record(root: OutputRoot, run: str) -> dict[str, Any]:
    return results.read_json(root.run_folder(run).config)


def _vs_baseline(root: OutputRoot, manifest: pd.DataFrame, ranked: pd.DataFrame) -> pd.DataFrame:
    """``vs_baseline``: each group's robust tail samples/s over the baseline group's (the
    space's ``baseline``; empty without one, or when the baseline has no ok run)."""
    ranked = ranked.assign(baseline=False, vs_baseline=math.nan)
    for group in ranked["group"]:
        runs = manifest.loc[manifest["group"] == group, "run"]
        if len(runs) and _run_record(root, str(runs.iloc[0])).get("baseline"):
            ranked.loc[ranked["group"] == group, "baseline"] = True
    base = ranked.loc[ranked["baseline"] & (ranked["runs_ok"] > 0), "tail_samples_per_sec_robust"]
    if len(base) == 1 and base.iloc[0] > 0:
        ranked["vs_baseline"] = ranked["tail_samples_per_sec_robust"] / base.iloc[0]
    return ranked


def _best_config(root: OutputRoot, manifest: pd.DataFrame, ranked: pd.DataFrame):
    winners = ranked[ranked["runs_ok"] > 0]
    if winners.empty:
        return None
    top = winners.iloc[0]
    # Its first ok run's record; a pooled winner's runs here may all have stopped once they
    # confirmed its prior (every planned run has a record, with the same config).
    mine = manifest[manifest["group"] == top["group"]]
    ok = mine[mine["status"] == "ok"]
    record = _run_record(root, str((ok if len(ok) else mine)["run"].iloc[0]))
    swept = record.get("swept", {})
    space = record.get("space") or root.path.name.rsplit("_", 1)[0]
    sets = {**swept, **_overrides(space, swept, record.get("config", {}), root)}
    sweep_command = " ".join(
        ["python -m platform.tune", f"--space {space}"]
        + [f"--set {k}={_yaml(v)}" for k, v in sets.items()]
        + ["--set repeats=1"]
    )
    # The final run: platform.train reads this file's resolved config (with checkpoints,
    # validation and restarts on; see platform/train.py).
    command = f"python -m platform.train --config {root.where(root.BEST_CONFIG)}"
    return {
        "space": space,
        "group": top["group"],
        "rank": 1,
        "tail_samples_per_sec_mean": stats.finite(top["tail_samples_per_sec_mean"]),
        "tail_samples_per_sec_std": stats.finite(top["tail_samples_per_sec_std"]),
        "tail_samples_per_sec_robust": stats.finite(top["tail_samples_per_sec_robust"]),
        "ci95": [stats.finite(top["ci95_low"]), stats.finite(top["ci95_high"])],
        "tail_mean_iter_p50_ms": stats.finite(top["tail_mean_iter_p50_ms"]),
        "runs_ok": int(top["runs_ok"]),
        "runs_catalogue": int(top.get("runs_catalogue", 0) or 0),  # of runs_ok (pooled.py)
        "unstable_group": bool(top["unstable_group"]),
        "swept": swept,
        "config": record.get("config", {}),
        "command": command,
        "sweep_command": sweep_command,
    }


def _overrides(space: str, swept: dict, config: dict, root: OutputRoot) -> dict[str, Any]:
    """The values the run had that the space alone would not give it (the sweep's --set):
    without them the command would not train the same configuration."""
    from platform.spaces.load import load_space
    from trainables.config import ConfigError, TrialConfig

    try:
        plain = TrialConfig.from_dict({**load_space(space).fixed, **swept}).to_dict()
    except (UsageError, ConfigError):
        return {}
    out = {}
    for key, value in config.items():
        if key in swept or key == "use_gpu" or plain.get(key) == value:
            continue  # use_gpu: `auto` resolved by the driver
        if key == "manifest_path" and str(value).startswith(str(root.data)):
            continue  # the space's generated corpus: made again by the command
        out[key] = value
    return out


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _summary(root: OutputRoot, manifest, per_run, ranked, best, unstable_ratio) -> dict[str, Any]:
    statuses = manifest["status"].value_counts().to_dict()
    noise = confidence.top_two_within_noise(ranked)
    unstable = per_run.loc[per_run["unstable_run_flag"].astype(bool), "run"].tolist()
    not_ok = manifest[manifest["status"] != "ok"]
    return {
        "output_root": root.shown,
        "written_by": version_line(),  # the code that wrote these files (report and notes show it)
        "runs": int(len(manifest)),
        "status_counts": {str(k): int(v) for k, v in statuses.items()},
        "groups": int(len(ranked)),
        "best_group": best["group"] if best else None,
        "top_two_within_noise": noise,
        "unstable_ratio": unstable_ratio,
        "unstable_runs": unstable,
        "unstable_groups": ranked.loc[ranked["unstable_group"].astype(bool), "group"].tolist(),
        "not_ok_runs": [
            {"run": r["run"], "status": r["status"], "reason": _text(r.get("failure_reason"))}
            for r in not_ok.to_dict("records")
        ],
        "ranking": [
            {k: (stats.finite(v) if isinstance(v, float) else v) for k, v in row.items()}
            for row in ranked.to_dict("records")
        ],
    }


def _text(value: Any) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def _markdown(summary: dict[str, Any], ranked: pd.DataFrame) -> str:
    """summary.md: the ranking table and its verdicts, then the notes of the sweep."""
    counts = ", ".join(f"{n} {s}" for s, n in summary["status_counts"].items())
    lines = [
        f"# Sweep summary: {summary['output_root']}",
        "",
        f"{summary['runs']} runs ({counts}) in {summary['groups']} groups.",
        "",
        *(
            [f"**{summary['partial']['line'].capitalize()}.**", ""]
            if summary.get("partial")
            else []
        ),
        f"| rank | group | ok/runs | samples/s (robust; stopped runs in brackets) | +-std | 95 % interval | iter p50 ms | share of runs p90/p50 > {summary['unstable_ratio']:g} | x baseline |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for g in ranked.to_dict("records"):
        mark = " (baseline)" if g.get("baseline") else ""
        lines.append(
            f"| {g['rank']} | {g['group']}{mark} | {_ok_runs(g)} | "
            f"{_sps(g)} | {_fmt(g['tail_samples_per_sec_std'])} | "
            f"{_interval(g)} | {_fmt(g['tail_mean_iter_p50_ms'])} | "
            f"{_fmt(g['unstable_run_ratio'], 2)} | {_fmt(g.get('vs_baseline'), 3)} |"
        )
    lines.append("")
    if summary.get("pooled"):
        lines += [f"**{_capital(summary['pooled']['line'])}.**", ""]
    if summary["best_group"]:
        lines.append(f"Best: **{summary['best_group']}** (best_config.json).")
    lines.append(answer.noise_line(summary["top_two_within_noise"]))
    if summary.get("confidence"):
        lines.append(f"How sure: {summary['confidence']['line']}.")
    if summary["unstable_groups"]:
        lines.append(
            f"Jittery (iter p90/p50 > {summary['unstable_ratio']:g} in most ok runs, or left the "
            f"race as unstable or failed), ranked after the others: "
            f"{', '.join(summary['unstable_groups'])}. This is the ranking's flag "
            "(unstable_group), not the Phase B check: python -m platform.stability judges that."
        )
    written = ["", f"Written by python -m platform.analyze, {summary['written_by']}."]
    return "\n".join(lines + _notes(summary) + written) + "\n"


def _ok_runs(g: dict[str, Any]) -> str:
    """summary.md's ok/runs: a pooled group's split into this sweep's runs and the catalogue's,
    and the repeats the catalogue's stood in for as not run, not failed ("3/4 (2 from the
    catalogue)" read like a failed repeat): "1/2 here + 2 from the catalogue (standing in for 1
    repeat not run)"."""
    n = int(stats.finite(g.get("runs_catalogue")) or 0)
    if not n:
        return f"{g['runs_ok']}/{g['runs']}"
    ok, runs = int(g["runs_ok"]) - n, int(g["runs"]) - n
    cell = f"{ok}/{runs} here + {n} from the catalogue"
    return cell + (f" (standing in for {runs - ok} repeat(s) not run)" if runs > ok else "")


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _notes(summary: dict[str, Any]) -> list[str]:
    """summary.md's sections after the ranking: the calibration, early stopping, bottlenecks,
    performance cliffs, runs not ok."""
    lines = []
    if summary.get("calibration"):
        lines += ["", "## Calibration (the platform against its references on this host)", ""]
        lines += [f"- {line}" for line in summary["calibration"]["lines"]]
    early = summary.get("early_stopping")
    if early:
        lines += ["", "## Early stopping", "", early["line"] + ".", ""]
        for back in early.get("readmitted") or []:
            lines.append(
                f"- group {back['group']} came back into the race ({back['why']}), where it had "
                f"left as {back['revoked']['kind']}: {back['revoked']['reason']}"
            )
        for group, e in early["eliminated"].items():
            lines.append(f"- group {group} left the race ({e['kind']}): {e['reason']}")
        for run, st in early["stops"].items():
            lines.append(
                f"- {run}: stopped at step {st['step']} (window {st['window']}) by {st['by']}: "
                f"{st['reason']}"
            )
        for group, line in (early.get("unjudged") or {}).items():
            lines.append(f"- group {group} {line}")
        for group, prior in (early.get("priors") or {}).items():
            lines.append(
                f"- group {group}: catalogue prior ({prior['catalogue']}; measured before on this "
                f"host, not by this sweep): {prior['line']}"
            )
        if early["picked"]:
            lines.append(f"- optuna picked, in order: {', '.join(early['picked'])}")
    budget = summary.get("budget")
    if budget:
        lines += ["", "## Budget", "", budget["line"] + ".", ""]
        lines += [f"- plan at {p['at_s']:g} s: {p['line']}" for p in budget["plans"]]
        lines += [f"- {run}: not run: {why}" for run, why in budget["left_unrun"].items()]
    if summary.get("bottlenecks"):
        lines += ["", "## Bottlenecks", ""]
        for run, found in summary["bottlenecks"].items():
            for b in found:
                lines.append(f"- {run}: **{b['kind']}**: {b['detail']}; try: {b['try']}")
    if summary.get("cliffs"):
        lines += ["", "## Performance cliffs (what torch did in the runs' tail windows)", ""]
        for run, verdict in summary["cliffs"].items():
            lines.append(f"- {run}: **{verdict['kind']}**: {cliffs.line(verdict)}")
    if summary["not_ok_runs"]:
        lines += ["", "## Runs that did not finish ok", ""]
    for r in summary["not_ok_runs"]:
        lines.append(f"- {r['run']}: {r['status']}" + (f" ({r['reason']})" if r["reason"] else ""))
    return lines


def format_ranked(
    ranking: list[dict[str, Any]], unstable_ratio: float = stats.UNSTABLE_RATIO
) -> str:
    """The ranking as a console table in its order, jittery groups (the ranking's
    ``unstable_group``) marked with * and, when there is one, the legend of * under it."""
    pooled = any(stats.finite(g.get("runs_catalogue")) for g in ranking)
    header = (
        f"{'rank':>4}  {'group':<40} {'ok/runs':>7} {'samples/s':>10} {'+-std':>8} "
        f"{'iter p50 ms':>11}  jittery" + ("  of them from the catalogue" if pooled else "")
    )
    lines = [header, "-" * len(header)]
    for g in ranking:
        line = (
            f"{g['rank']:>4}  {g['group']:<40} {g['runs_ok']:>3}/{g['runs']:<3} "
            f"{_sps(g):>10} {_fmt(g['tail_samples_per_sec_std']):>8} "
            f"{_fmt(g['tail_mean_iter_p50_ms']):>11}  " + ("*" if g["unstable_group"] else "")
        )
        there = int(stats.finite(g.get("runs_catalogue")) or 0)
        if there:  # under its heading: how many of ok/runs, and their sweeps
            line = f"{line:<{len(header) - 26}}{there} ({g['catalogue_sweeps']})"
        lines.append(line)
    if any(g["unstable_group"] for g in ranking):
        lines += textwrap.wrap(answer.jittery_legend(unstable_ratio), 100)
    return "\n".join(lines)


def _sps(g: dict[str, Any]) -> str:
    """The robust tail samples/s, or for a group with only stopped runs their partial figure
    in brackets (it ranks after every group with a finished run)."""
    if not g.get("runs_ok") and stats.finite(g.get("partial_samples_per_sec")) is not None:
        return f"({g['partial_samples_per_sec']:.1f})"
    return _fmt(g["tail_samples_per_sec_robust"])


def _interval(g: dict[str, Any]) -> str:
    """The 95 % interval as low-high, or - with fewer than 2 ok runs."""
    low, high = stats.finite(g["ci95_low"]), stats.finite(g["ci95_high"])
    return "-" if low is None or high is None else f"{low:.1f}-{high:.1f}"


def _fmt(value: Any, digits: int = 1) -> str:
    value = stats.finite(value)
    return "-" if value is None else f"{value:.{digits}f}"
