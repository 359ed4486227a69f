"""Two recorded races replayed through the race's own logic: cold (no catalogue) and warm
(seeded from the first race as the catalogue would hold it), with the steps each runs, its
modelled wall time and the ratio, and each one's winner and P(fastest). A replay of recorded
windows, not a measurement.

    python -m benchmarks.race_replay [--results benchmarks/results/warm_race_2xh200]
        [--space 4090_mainline] [--set KEY=VALUE ...] [--history confirm|order]
        [--warm-set KEY=VALUE ...] [--warm-scale X] [--out PATH]

What it reads: the two races' consoles (``race1.log``, ``race2.log``: each window's step, iter
p50 and samples/s, each run's start-up in the ``runs:`` block) and the epoch at each window's
end (``race_replay.txt``, from their timing.parquet). The consoles keep no iter p90: it is taken
as 1.2 x the p50 (the tails' p90/p50 were far under the Phase B limits), which only the
stability checks read.

How: the space expanded as the races ran it (``--set``s as they were), a ``Race`` over a
``Schedule`` in a temporary folder and a ``PlannedSearcher`` handing the runs out one at a time
(max_concurrent_trials 1). Each run handed out gets its recorded windows until the race stops it
(the last one handed again with ``done``, as Tune does), then ends; a run of a group out of the
race, or settled on its confirmed prior, is skipped. Cold: race 1's windows, the space's order,
no catalogue. Warm: race 2's windows, the order and the priors that ``warm_start`` and
``race_priors`` (platform/analysis/priors.py) take from catalogue rows made of race 1's runs
(all 8 ran ok), in the history mode ``--history`` (default ``confirm``, the platform's default).
The winner is the sweep's ranking (platform.analysis.analyze.ranked_groups: pooled with the
catalogue runs for the groups a ``confirm`` race settled, platform/analysis/pooled.py) over the
runs the replay ran, their tails from the windows fed; P(fastest) is the ranking's bootstrap
(platform/analysis/confidence.py) over the same runs' tail windows.

What-ifs: ``--history order`` (the priors only stop groups measured clearly slower; every
repeat of the others runs), ``--set scheduler.confirm_windows=N``, ``--warm-set KEY=VALUE``
(the warm race's space only) and ``--warm-scale X`` (race 2's samples/s x X and its iter p50 /
X: a host that changed since the catalogue's race; the priors are dropped and the race runs as
cold).

Modelled wall: per run run, its start-up (recorded) + each window fed x its steps x its iter
p50. The sweep's own start and end (the command wall less its runs: about 10-20 s here) are left
out of both.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from ray.tune.search import Searcher

from platform.analysis.analyze import ranked_groups
from platform.analysis.confidence import confidence
from platform.analysis.pooled import pool, scale_line
from platform.analysis.priors import HISTORY_MODES, prior_line, race_priors, warm_start
from platform.control.race import Race, Schedule
from platform.control.searchers import PlannedSearcher
from platform.spaces.expand import RunSpec, expand_runs
from platform.spaces.load import load_space
from platform.storage.catalogue import cost_key
from stage1_common.output_root import OutputRoot
from stage1_common.tail import tail_start

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "warm_race_2xh200"
# As benchmarks/warm_race_gpu.sh ran them: its --sets, then the command's (the last one wins).
SETS = ["manifest_path=/replay/manifest.tsv", "max_steps=600", "scheduler=race", "max_steps=300"]
P90_OVER_P50 = 1.2  # the consoles keep no p90
HOST = "replay"  # the catalogue's host fingerprint of both races (one host)
COMMIT = "replay"  # race 1 and race 2 ran one commit of the platform, on one corpus

_WINDOW = re.compile(
    r"\] (\S+): step (\d+)/\d+  iter p50 ([\d.]+) ms .*?  ([\d.]+) samples/s  loss"
)
_RUN = re.compile(r"^  (\S+)\s+(\S+)\s+startup\s+([\d.]+) s")
_EPOCHS = re.compile(r"^(\S+)\s+\[([\d, ]+)\]$")


@dataclass
class Recorded:
    """One recorded race: each run's windows (step, iter p50 ms, samples/s) in the order the
    runs started, their start-ups (s) and epochs at each window's end."""

    windows: dict[str, list[tuple[int, float, float]]]
    startup: dict[str, float]
    epochs: dict[str, list[int]] = field(default_factory=dict)


def read_log(path: Path) -> Recorded:
    windows: dict[str, list[tuple[int, float, float]]] = {}
    startup: dict[str, float] = {}
    for line in path.read_text().splitlines():
        if m := _WINDOW.search(line):
            windows.setdefault(m[1], []).append((int(m[2]), float(m[3]), float(m[4])))
        elif m := _RUN.match(line):
            startup[m[1]] = float(m[3])
    return Recorded(windows, startup)


def read_epochs(path: Path, race: str) -> dict[str, list[int]]:
    """``race_replay.txt``'s table for ``race`` (race1, race2): run -> epoch at each window end."""
    if not path.is_file():
        return {}
    text = path.read_text().split(f"{race} epoch at each window end", 1)
    if len(text) < 2:
        return {}
    out = {}
    for line in text[1].splitlines()[1:]:
        if m := _EPOCHS.match(line.strip()):
            out[m[1]] = [int(x) for x in m[2].split(",")]
        elif out:
            break
    return out


@dataclass
class Replayed:
    """What one replay ran and decided."""

    name: str
    handed: list[str]
    fed: dict[str, list[dict[str, Any]]]  # run -> the results it was fed
    stopped: dict[str, int]  # run -> the step the race stopped it at
    skipped: list[str]
    lines: list[str]
    wall_s: float
    steps: int
    full_steps: int
    winner: str
    state: dict[str, Any]
    ranking: pd.DataFrame  # the sweep's ranking (pooled where it pools), with p_fastest


def replay(name: str, runs: list[RunSpec], space, recorded: Recorded, priors=None,
           history: str = "confirm") -> Replayed:  # fmt: skip
    """``runs`` handed out one at a time through the race, each fed ``recorded``'s windows."""
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        schedule = Schedule(OutputRoot(Path(tmp)), space, runs)
        race = Race(runs, space, schedule, echo=lines.append, priors=priors, history=history)
        searcher = PlannedSearcher(runs, lambda r: {"run": r.name}, {}, race)
        handed, fed, stopped = [], {}, {}
        for i in itertools.count():
            param = searcher.suggest(f"t{i}")
            if param == Searcher.FINISHED or param is None:
                break
            run = param["run"]
            handed.append(run)
            fed[run] = []
            epochs = recorded.epochs.get(run, [])
            for j, (step, p50, sps) in enumerate(recorded.windows[run]):
                result = {"step": step, "iter_ms_p50": p50, "iter_ms_p90": P90_OVER_P50 * p50,
                          "samples_per_s": sps, "epoch": epochs[j] if j < len(epochs) else None}  # fmt: skip
                fed[run].append(result)
                if race.observe(run, result):
                    stopped[run] = step
                    break
            else:
                race.observe(run, dict(result, done=True))  # Tune hands the last one again
            searcher.on_trial_complete(f"t{i}", result=result)
        state = schedule.state
    wall = sum(_run_wall(recorded, run, fed[run]) for run in handed)
    steps = sum(results[-1]["step"] for results in fed.values() if results)
    ranking = _ranking(runs, fed, stopped, state)
    measured = ranking[ranking["runs_ok"] > 0]
    winner = str(measured.iloc[0]["group"]) if len(measured) else ""
    return Replayed(name, handed, fed, stopped, [r.name for r in runs if r.name not in fed],
                    lines, wall, steps, sum(r.config.max_steps for r in runs), winner, state,
                    ranking)  # fmt: skip


def _run_wall(recorded: Recorded, run: str, results: list[dict[str, Any]]) -> float:
    """A run's modelled seconds: start-up + each window's steps x its iter p50."""
    wall, before = recorded.startup.get(run, 0.0), 0
    for r in results:
        wall += (r["step"] - before) * r["iter_ms_p50"] / 1000
        before = r["step"]
    return wall


def _ranking(runs, fed, stopped, state) -> pd.DataFrame:
    """The sweep's ranking over the runs the replay ran (their tails: the last
    tail_timing_points windows fed after the first; a run stopped once it confirmed its prior,
    every window after the warm-up, as platform/analysis/pooled.py counts it), pooled as the
    analysis pools it, with each measured group's P(fastest) over the same tails (and the
    catalogue runs' where pooled)."""
    rows, tails = [], {}
    warmup = int(state["scheduler"]["warmup_windows"])
    confirmed = {g for g, r in (state.get("priors") or {}).items() if r.get("state") == "confirmed"}
    for spec in runs:
        results = fed.get(spec.name)
        if not results:
            continue
        if spec.name in stopped and spec.group in confirmed and len(results) > warmup:
            tail = results[warmup:]
        else:
            tail = results[tail_start(len(results), spec.config.tail_timing_points) :]
        tails[spec.name] = np.array([r["samples_per_s"] for r in tail])
        rows.append({
            "run": spec.name, "group": spec.group,
            "status": "stopped_early" if spec.name in stopped else "ok",
            "tail_samples_per_sec_mean": statistics.fmean(r["samples_per_s"] for r in tail),
            "tail_mean_iter_p50_ms": statistics.fmean(r["iter_ms_p50"] for r in tail),
            "iter_p90_over_p50": P90_OVER_P50, "unstable_run_flag": False,
        })  # fmt: skip
    per_run = pd.DataFrame(rows)
    ranked = ranked_groups(per_run, state)
    pooling = pool(per_run, state)
    counted = set(pooling.counted) if pooling else set()
    groups = {}
    for group in ranked.loc[ranked["runs_ok"] > 0, "group"]:
        mine = [tails[r["run"]] for r in rows if r["group"] == group
                and (r["status"] == "ok" or r["run"] in counted)]  # fmt: skip
        groups[group] = mine + (list(pooling.windows.get(group, [])) if pooling else [])
    if groups:
        table = confidence(groups, next(iter(groups))).set_index("group")
        ranked["p_fastest"] = ranked["group"].map(table["p_best"])
    return ranked


def catalogue_rows(runs: list[RunSpec], recorded: Recorded) -> pd.DataFrame:
    """Race 1 as the catalogue holds it after the race: one row per run, ok, with its windows."""
    rows = []
    for i, spec in enumerate(runs):
        ran = recorded.windows[spec.name]
        tail = ran[tail_start(len(ran), spec.config.tail_timing_points) :]
        rows.append({
            "sweep": "race1", "host": HOST, "run": spec.name, "group": spec.group,
            "status": "ok", "failure_reason": "", "cost_key": cost_key(spec.config),
            "tail_samples_per_sec_mean": statistics.fmean(w[2] for w in tail),
            "tail_mean_iter_p50_ms": statistics.fmean(w[1] for w in tail),
            "iter_p90_over_p50": P90_OVER_P50, "tail_windows": len(tail),
            "window_samples_per_s": [w[2] for w in ran], "ts": float(i),
            "config": json.dumps({"log_every": spec.config.log_every}),
            "git_commit": COMMIT, "manifest_path": str(spec.config.manifest_path or ""),
        })  # fmt: skip
    return pd.DataFrame(rows)


def describe(r: Replayed) -> list[str]:
    out = [f"== {r.name}: runs handed out in this order: {', '.join(r.handed)}"]
    out += [f"   {line}" for line in r.lines]
    for run in r.handed:
        end = r.fed[run][-1]["step"] if r.fed[run] else 0
        how = f"stopped at step {r.stopped[run]}" if run in r.stopped else f"ran to step {end}"
        out.append(f"   {run}: {how}")
    out += [f"   {run}: skipped" for run in r.skipped]
    for group, prior in (r.state.get("priors") or {}).items():
        out.append(f"   prior {group}: {prior['line']}")
    if "history" in r.state and r.ranking["runs_catalogue"].gt(0).any():
        kept = r.state["history"].get("scale") or {}
        by = scale_line(float(kept.get("factor", 1.0)), int(kept.get("judged", 0)))
        out.append(
            f"   ranking (pooled: a settled group's runs here and from the catalogue; {by}):"
        )
    else:
        out.append("   ranking (this sweep's runs):")
    for g in r.ranking.to_dict("records"):
        there = int(g["runs_catalogue"])
        runs = f"{int(g['runs_ok']) - there} here + {there} catalogue" if there else (
            f"{int(g['runs_ok'])} here")  # fmt: skip
        mean = f"{g['tail_samples_per_sec_mean']:.1f}" if g["runs_ok"] else "-"
        robust = f"{g['tail_samples_per_sec_robust']:.1f}" if g["runs_ok"] else "-"
        p_best = g.get("p_fastest")
        p_best = f"{p_best:.2f}" if isinstance(p_best, float) and p_best == p_best else "-"
        out.append(f"     {g['rank']}  {g['group']:<24} ok runs {runs:<20} mean {mean:>7}  "
                   f"robust {robust:>7}  P(fastest) {p_best}"
                   + (f"  (left the race: {g['left_race']})" if g["left_race"] else ""))  # fmt: skip
    out.append(f"   steps run {r.steps} of the full grid's {r.full_steps}; modelled wall "
               f"{r.wall_s:.1f} s; winner {r.winner}")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--space", default="4090_mainline")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="after the races' own --sets (e.g. scheduler.confirm_windows=1)")  # fmt: skip
    p.add_argument("--warm-set", action="append", default=[], metavar="KEY=VALUE",
                   help="the warm race's only (a what-if, e.g. repeats=1)")  # fmt: skip
    p.add_argument("--history", choices=HISTORY_MODES[:2], default=HISTORY_MODES[0],
                   help="the warm race's history mode (platform.tune --history)")  # fmt: skip
    p.add_argument("--warm-scale", type=float, default=1.0, metavar="X",
                   help="race 2's samples/s x X, its iter p50 / X: a host that changed")  # fmt: skip
    p.add_argument("--out", type=Path, help="also write the lines here")
    args = p.parse_args(argv)
    space = load_space(args.space).with_overrides([*SETS, *args.set])
    runs = expand_runs(space)
    races = []
    for n in (1, 2):
        recorded = read_log(args.results / f"race{n}.log")
        recorded.epochs = read_epochs(args.results / "race_replay.txt", f"race{n}")
        races.append(recorded)
    first, second = races
    if args.warm_scale != 1.0:
        second = scaled(second, args.warm_scale)
    cold = replay("cold: race 1's windows, no catalogue", runs, space, first)
    rows = catalogue_rows(runs, first)
    warm_space = space.with_overrides(args.warm_set)
    warm_runs = expand_runs(warm_space)
    ordered, _, history = warm_start(warm_runs, rows, HOST)
    priors = race_priors(ordered, rows, HOST, warm_space.scheduler, COMMIT)
    whatifs = [f"--set {' '.join(args.warm_set)}"] if args.warm_set else []
    whatifs += [f"samples/s x {args.warm_scale:g}"] if args.warm_scale != 1.0 else []
    what = f" (what-if: {'; '.join(whatifs)})" if whatifs else ""
    warm = replay(f"warm (--history {args.history}): race 2's windows, seeded from race 1{what}",
                  ordered, warm_space, second, priors, args.history)  # fmt: skip
    full = sum(_run_wall(first, run, [
        {"step": s, "iter_ms_p50": p50} for s, p50, _ in first.windows[run]
    ]) for run in first.windows)  # fmt: skip
    lines = [
        "A REPLAY OF RECORDED WINDOWS THROUGH platform.control.race, NOT A MEASUREMENT",
        f"space {args.space} with --set {' '.join(SETS[1:] + args.set)}"
        + (f", the warm race also {' '.join(args.warm_set)}" if args.warm_set else "")
        + "; "
        f"windows from {args.results.relative_to(ROOT) if args.results.is_relative_to(ROOT) else args.results}",
        f"scheduler: {space.scheduler}",
        *history,
        *prior_line(priors, [r.group for r in ordered], warm_space.scheduler, args.history),
        "",
        *describe(cold),
        "",
        *describe(warm),
        "",
        f"warm / cold: steps {warm.steps / cold.steps:.3f} ({warm.steps} / {cold.steps}), "
        f"modelled wall {warm.wall_s / cold.wall_s:.3f} ({warm.wall_s:.1f} s / {cold.wall_s:.1f} s)",
        f"warm / race 1 as it ran (the full grid, modelled the same way: {full:.1f} s): "
        f"{warm.wall_s / full:.3f}",
        f"same winner: {'yes' if warm.winner == cold.winner else 'no'} "
        f"(cold {cold.winner}, warm {warm.winner})",
    ]
    if args.warm_scale != 1.0:
        lines.append(f"(the warm race's host runs at {args.warm_scale:g}x the catalogue's: its "
                     "steps compare with the cold race's, its modelled wall does not)")  # fmt: skip
    if args.history == "order":
        lines += floor_lines(warm, second, warm_runs)
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


def scaled(recorded: Recorded, x: float) -> Recorded:
    """``recorded`` on a host ``x`` times as fast: samples/s x ``x``, iter p50 / ``x``."""
    windows = {run: [(step, p50 / x, sps * x) for step, p50, sps in ws]
               for run, ws in recorded.windows.items()}  # fmt: skip
    return Recorded(windows, dict(recorded.startup), dict(recorded.epochs))


def floor_lines(warm: Replayed, recorded: Recorded, runs: list[RunSpec]) -> list[str]:
    """What any warm race of this space must run while the leader and the groups within noise
    of it run all their repeats: those runs, whole (race 2's windows)."""
    stopped_groups = {g for g, e in warm.state["eliminated"].items() if e.get("prior")}
    kept = [r.name for r in runs if r.group not in stopped_groups]
    wall = sum(_run_wall(recorded, run, [
        {"step": s, "iter_ms_p50": p50} for s, p50, _ in recorded.windows[run]
    ]) for run in kept)  # fmt: skip
    return [
        f"floor: the runs of the groups the priors did not stop ({len(kept)} runs, whole) alone "
        f"model {wall:.1f} s",
    ]


if __name__ == "__main__":
    sys.exit(main())
