"""``python -m platform.tune --space NAME``: run a named sweep as a Ray Tune grid search.

Each Tune trial runs one run of the sweep as a Ray Train ``TorchTrainer``
(trainables.trial.run_trial); platform.record.recorder.SweepRecorder writes every timing window to
``<output_root>/timing.parquet/`` and keeps ``run_manifest.tsv`` current; at the end the groups
are ranked and the winner's resolved config goes to ``best_config.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from platform.analysis.priors import HISTORY_MODES
from platform.analysis.verdicts.cliffs import known_cliff_notes
from platform.errors import EXIT_USAGE, UsageError
from platform.execution.inputs import check_inputs_only, prepare_inputs
from platform.execution.launch import LaunchRequest, launch
from platform.execution.resume import EARLY_STATUSES
from platform.execution.signals import interrupted_at_start
from platform.record.cli import cli_parser
from platform.record.loggers import add_logger_argument, check_loggers
from platform.spaces.describe import baseline_notes, format_plan
from platform.spaces.expand import expand_runs
from platform.spaces.keys import format_keys, matching_keys
from platform.spaces.load import list_spaces, load_space
from platform.storage.open_root import output_root_arg
from stage1_common.machine_cache import configured_cache
from stage1_common.output_root import OutputRoot
from trainables.config import ConfigError

__all__ = ["main"]

PROG = "platform.tune"  # the name its error lines start with


def build_parser() -> argparse.ArgumentParser:
    p = cli_parser(
        f"python -m {PROG}",
        "Run a named sweep of stage-1 training configurations on Ray Tune + Ray Train.",
    )
    p.add_argument(
        "--space",
        help="a space name (search_spaces/NAME.yaml) or a space file anywhere (PATH.yaml)",
    )
    p.add_argument(
        "--output-root", type=output_root_arg, help="default: outputs/<space>_<timestamp>"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key (YAML value; a list such as [4,8] makes it swept); repeatable",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the runs and check their inputs as a real run would (exit 2 on a problem); "
        "starts no Ray and writes nothing",
    )
    p.add_argument(
        "--from-env",
        action="store_true",
        help="the old runbook's environment variables (MODE, SWEEP_*, INCLUDE, ...; see "
        "platform/spaces/runbook.py) set the sweep, on the base space `runbook` or --space; prints "
        "the equivalent space YAML",
    )
    add_logger_argument(p)
    p.add_argument("--address", help="connect to this Ray cluster instead of starting a local one")
    p.add_argument("--list-spaces", action="store_true", help="list the spaces and exit")
    p.add_argument(
        "--keys",
        nargs="?",
        const="",
        metavar="PATTERN",
        help="list the config keys (type, default, doc) whose name or family holds PATTERN (a "
        "substring, or a glob such as 'inject_*'; all without it), and exit",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="finish the sweep in --output-root: keep its ok runs, rerun the others",
    )
    p.add_argument(
        "--from-ranked",
        type=Path,
        metavar="OUTPUT_ROOT",
        help="Phase A to B: sweep the best groups of this earlier sweep instead of the grid",
    )
    p.add_argument("--top", type=int, default=2, help="with --from-ranked: how many groups")
    p.add_argument("--repeats", type=int, help="repeats per group (the same as --set repeats=N)")
    p.add_argument(
        "--history",
        choices=HISTORY_MODES,
        help="what a race or a budget takes from this host's catalogue (same GPUs, driver, "
        "CUDA, torch, Ray, DeepSpeed, platform): confirm (default) runs the groups measured "
        "here first, skips points known to fail here, and lets a group's earlier runs stand in "
        "for its repeats once its first judged windows here fall in their band, the ranking "
        "pooling them (said per group); order does the same but for the repeats: priors only "
        "stop groups measured clearly slower, the ranking is this sweep's runs alone; off is "
        "--no-history",
    )
    p.add_argument(
        "--no-history",
        action="store_true",
        help="a race or a budget without the machine's catalogue (--history off): the space's "
        "order, no point skipped for a failure known on this host, no race prior, every repeat "
        "run",
    )
    p.add_argument(
        "--budget",
        type=_duration,
        metavar="DURATION",
        help="end within this time (90s, 4m, 1h30m): the runs, their steps and repeats planned "
        "to fit from what runs cost on this machine, re-planned as windows arrive; with "
        "--dry-run, print the plan",
    )
    p.add_argument(
        "--dashboard-host",
        default="127.0.0.1",
        help="address the Ray dashboard of a local cluster listens on; 0.0.0.0 opens it to the "
        "network",
    )
    p.add_argument(
        "--dashboard-port",
        type=_port,
        help="Ray dashboard port of a local cluster (default: 8265, or a free port where 8265 "
        "is taken)",
    )
    p.add_argument(
        "--metrics-port",
        type=_port,
        help="Prometheus endpoint port of a local cluster (default: Ray picks one)",
    )
    return p


def _history_mode(args: argparse.Namespace) -> str:
    """--history, with --no-history its ``off`` (both, disagreeing: refused in one line)."""
    if args.no_history and args.history not in (None, "off"):
        raise UsageError(f"--no-history and --history {args.history} disagree: give one of them")
    return "off" if args.no_history else args.history or HISTORY_MODES[0]


def _warm_start(runs, space, mode: str):
    """The runs ordered by what this host measured before, those known to fail here
    (platform/analysis/priors.py: warm_start), and for a race each group's figures there as
    its prior (race_priors; None otherwise), from the machine's catalogue; ``mode``: the
    history mode the race uses them in (its line says what it does)."""
    from platform.analysis.priors import prior_line, race_priors, warm_start
    from platform.storage.catalogue import fingerprint, host_now, read, store

    configured = configured_cache(r.config for r in runs)
    rows = read(store(configured)).to_pandas()
    if rows.empty:
        return runs, {}, [], None
    from platform.execution.resources import resolve_executors

    # Compared as the catalogue holds them: with their executor resolved.
    resolved = resolve_executors(runs, training=False)
    host = fingerprint(host_now())
    ordered, skips, lines = warm_start(resolved, rows, host)
    priors = None
    if space.scheduler.name == "race":
        from platform.record.provenance import git_facts

        # Pooled only with runs of this commit of the platform (the catalogue's git_commit).
        commit = git_facts()["git_commit_hash"]
        priors = race_priors(resolved, rows, host, space.scheduler, commit)
        lines += prior_line(priors, [r.group for r in resolved], space.scheduler, mode)
    by_name = {r.name: r for r in runs}
    return [by_name[r.name] for r in ordered], skips, lines, priors


def _check_resumed_history(root, mode: str) -> None:
    """--resume with --history or --no-history: a resumed race keeps the mode (and priors) its
    schedule.json kept, so a flag that disagrees is refused, not ignored."""
    import json

    try:
        state = json.loads(root.schedule.read_text())
    except (OSError, ValueError):
        return  # nothing decided yet: the resume starts the race as planned
    kept = (state.get("history") or {}).get("mode", "off")
    if kept != mode:
        given = "--no-history" if mode == "off" else f"--history {mode}"
        how = (f"raced with --history {kept}" if "history" in state
               else "raced without catalogue priors (--no-history, or none found)")  # fmt: skip
        raise UsageError(
            f"--resume: {root.shown} {how} (its schedule.json) and {given} disagrees: a resume "
            f"keeps its first mode; drop {given}, or start the sweep again in a new --output-root"
        )


def _check_budget(seconds: float) -> None:
    """A budget shorter than the sweep's own start and end and a little more: refused (one
    longer, but short of a first run, still runs its first run to the shortest length that
    ranks: platform/control/budget.py)."""
    from platform.control.costs import Prior

    prior = Prior()
    least = prior.launch_s + prior.end_s + 10
    if seconds < least:
        raise UsageError(
            f"--budget {seconds:g}s leaves no time for a run: a sweep's start and end take about "
            f"{prior.launch_s + prior.end_s:g} s; give at least {least:g}s (e.g. --budget 2m)"
        )


def _duration(text: str) -> float:
    """--budget's seconds (argparse: one line and exit 2 otherwise)."""
    from stage1_common.durations import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _port(text: str) -> int:
    """A TCP port number, 0-65535 (argparse: one line and exit 2 otherwise)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0-65535)")
    return value


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.list_spaces:
            _print_listing("\n".join(f"{n:<24} {d}" for n, d in list_spaces().items()))
            return 0
        if args.keys is not None:
            _print_listing(format_keys(matching_keys(args.keys)))
            return 0
        runbook = None
        if args.from_env:
            runbook = _apply_env(args)
        if not args.space:
            raise UsageError("--space NAME is required; see --list-spaces for the names")
        space = load_space(args.space)
        if args.top < 1:
            raise UsageError(f"--top must be >= 1, got {args.top}")
        if args.from_ranked is not None:
            from platform.control.promote import from_ranked

            space = from_ranked(
                space, OutputRoot(args.from_ranked.expanduser().resolve()), args.top
            )
        if args.repeats is not None:
            if args.repeats < 1:
                raise UsageError(f"--repeats must be >= 1, got {args.repeats}")
            space = dataclasses.replace(space, repeats=args.repeats)
        space = space.with_overrides(args.set)
        if runbook is not None:
            space.description = "the runbook command: " + " ".join(
                f"{k}={v}" for k, v in runbook.used.items() if k not in _NOT_THE_SWEEP
            )
        runs = expand_runs(space)
        loggers = check_loggers(args.logger)
        if runbook is not None:
            print(
                f"runbook variables: {' '.join(f'{k}={v}' for k, v in runbook.used.items())}\n"
                "the same sweep as a space file (save it, then python -m platform.tune --space "
                "FILE.yaml):\n---\n" + space.to_yaml() + "---",
                flush=True,
            )
        if args.resume and space.search.plans_late:
            raise UsageError(
                f"--resume of a search: {space.search.name} sweep is not supported yet; start it "
                "again in a new --output-root (or use search: random)"
            )
        from platform.execution.cluster import dashboard_port_problem
        from stage1_common.cluster import joining

        if not joining(args.address):  # a port of a local cluster, asked for by name
            problem = dashboard_port_problem(args.dashboard_host, args.dashboard_port)
            if problem:
                raise UsageError(problem)
        # What the dry run checks and the real run prepares: the same inputs, the same refusals.
        inputs = dict(address=args.address, resume=args.resume, output_root=args.output_root)
        if args.budget is not None and space.search.plans_late:
            raise UsageError(
                f"--budget with search: {space.search.name} is not supported yet (it picks its "
                "groups as it goes); use search: grid or random, with scheduler: race or asha"
            )
        skips, history_lines, priors = {}, [], None
        mode = _history_mode(args)
        warm = space.scheduler.name == "race" or args.budget is not None
        # A resume keeps its first order, and a race the priors its first attempt kept.
        if warm and mode != "off" and not args.resume:
            runs, skips, history_lines, priors = _warm_start(runs, space, mode)
        if args.budget is not None:
            _check_budget(args.budget)
        if args.dry_run:  # the plan, then what the real run would refuse, with its line
            lines = [format_plan(space, runs), *known_cliff_notes(runs), *history_lines]
            if args.budget is not None:
                from platform.control.budget import dry_plan
                from platform.execution.resources import resolve_executors

                resolved = resolve_executors(
                    [r for r in runs if r.name not in skips], training=False
                )
                lines.append(dry_plan(space, resolved, args.budget))
            _print_listing("\n".join(lines))
            check_inputs_only(space, runs, **inputs)
            return 0
        # As the dry run's plan says them: a moved baseline, the known cliffs (run anyway).
        for note in baseline_notes(space, runs) + known_cliff_notes(runs) + history_lines:
            print(note, flush=True)
        root, done = prepare_inputs(space, runs, **inputs)
        if (
            args.resume
            and space.scheduler.name == "race"
            and (args.history is not None or args.no_history)
        ):
            _check_resumed_history(root, mode)
    except (UsageError, ConfigError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    request = LaunchRequest(
        prog=PROG,
        space=space,
        runs=runs,
        root=root,
        report=report,
        address=args.address,
        dashboard_host=args.dashboard_host,
        dashboard_port=args.dashboard_port,
        metrics_port=args.metrics_port,
        done=done,
        resume=args.resume,
        loggers=loggers,
        budget_s=args.budget,
        skips=skips,
        priors=priors,
        history=mode,
    )
    try:
        return launch(request)
    except KeyboardInterrupt as stop:  # before the first trial: nothing was measured yet
        return interrupted_at_start(PROG, request.root, stop, "any run")


# Runbook variables that say how to run the sweep, not what it is.
_NOT_THE_SWEEP = ("DRY_RUN", "RESUME_RUNS", "OUTPUT_ROOT", "DRIVER_LOG_PATH")


def _print_listing(text: str) -> None:
    """Print a listing (--keys, --list-spaces, the dry run's plan). A reader that stopped early
    (``--keys | head``) has what it wanted: the rest goes to /dev/null, with no traceback, and
    the command ends as it would have."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the flush at exit must not fail again
        os.close(devnull)


def _apply_env(args: argparse.Namespace):
    """``--from-env``: the runbook's variables become the arguments (the command line wins)."""
    from platform.spaces.runbook import from_env

    plan = from_env(address=args.address)
    if plan.driver_log is not None and not (plan.dry_run or args.dry_run):
        _tee_console(plan.driver_log)  # a dry run creates nothing, this copy neither
    for warning in plan.warnings:
        print(f"{PROG}: warning: {warning}", file=sys.stderr, flush=True)
    args.space = args.space or "runbook"
    args.output_root = args.output_root or plan.output_root
    args.resume = args.resume or plan.resume
    args.dry_run = args.dry_run or plan.dry_run
    args.repeats = args.repeats if args.repeats is not None else plan.repeats
    args.set = plan.sets + args.set
    if plan.cuda_visible_devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = plan.cuda_visible_devices  # the local cluster's GPUs
    return plan


class _Tee:
    """DRIVER_LOG_PATH: everything the console shows (Ray's forwarded worker lines too) is also
    appended to this file, line by line."""

    def __init__(self, stream, log):
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.log.write(text)
        self.log.flush()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def __getattr__(self, name):  # fileno, isatty, encoding, ...
        return getattr(self.stream, name)


def _tee_console(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        log = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - open for the run
    except OSError as exc:
        raise UsageError(
            f"DRIVER_LOG_PATH={path}: cannot be written ({exc.strerror}); choose a writable path"
        ) from None
    sys.stdout = _Tee(sys.stdout, log)
    sys.stderr = _Tee(sys.stderr, log)


def report(manifest: list[dict[str, Any]], root: OutputRoot, wall_s: float) -> int:
    """Print the runs, run the analysis (platform.analyze) and print its ranking; the exit code
    is 0 when every run is ok."""
    print("\nruns:")
    for row in manifest:
        sps = row.get("tail_samples_per_sec_mean")
        startup = row.get("startup_s")
        print(
            f"  {row['run']:<40} {row['status']:<8} "
            f"startup {'-' if startup is None else f'{startup:.1f} s':>7}  "
            f"tail {'-' if sps is None else f'{sps:.1f}':>8} samples/s"
            + (f"  ({row['failure_reason']})" if row.get("failure_reason") else "")
            + (f"\n    cliff: {row['cliff']}" if row.get("cliff") else "")
        )
    from platform.analysis.analyze import analyze, format_ranked
    from platform.analysis.stats import UNSTABLE_RATIO

    try:
        # The tables, best_config.json and summary.md/json.
        summary = analyze(root)
    except Exception as exc:  # noqa: BLE001 - the runs are recorded; say how to redo this part
        print(
            f"\nanalysis failed ({type(exc).__name__}: {exc}); the runs are recorded, redo it with "
            f"python -m platform.analyze {root.shown}",
            file=sys.stderr,
        )
        summary = {"ranking": [], "best_group": None}
    print("\ngroups ranked by tail samples/s (steady groups first):")
    print(format_ranked(summary["ranking"], summary.get("unstable_ratio", UNSTABLE_RATIO)))
    if summary.get("pooled"):  # a warm race's: said before the winner it chose
        print(summary["pooled"]["line"])
    if summary["best_group"]:
        best = json.loads(root.best_config.read_text())
        where = root.where(OutputRoot.BEST_CONFIG)
        part = summary.get("partial")
        label = (
            f"best of the groups measured so far ({part['groups_measured']} of {part['groups']}; "
            "the sweep was interrupted)"
            if part
            else "best"
        )
        print(f"\n{label}: {best['group']} -> {where}")
        print(f"train with it: {best['command']}")
        if summary.get("confidence"):
            print(f"how sure: {summary['confidence']['line']}")
    print(f"summary: {root.where(OutputRoot.SUMMARY_MD)}")
    from platform.analysis.report.page import report_line

    print(report_line(root))
    failed = [r["run"] for r in manifest if r["status"] not in ("ok", *EARLY_STATUSES)]
    early = summary.get("early_stopping")
    if early:
        print(early["line"])
    if summary.get("budget"):
        print(summary["budget"]["line"])
    calibration = summary.get("calibration")  # the platform's own overhead on this host
    if calibration:
        print(calibration["line"])
    print(
        f"sweep wall time {wall_s:.1f} s; {runs_line(manifest, summary)}; results in {root.shown}"
    )
    return 0 if not failed else 1


def runs_line(manifest: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    """How the runs ended, by the manifest's statuses: 'N/N runs ok' when every run ran ok; else
    how many ran and how they ended, and how many never ran and why (``summary``'s budget
    names the runs it left unrun; other skipped runs left the race)."""
    count = Counter(r["status"] for r in manifest)
    total = len(manifest)
    if count["ok"] == total:
        return f"{total}/{total} runs ok"
    budget = set((summary.get("budget") or {}).get("left_unrun") or ())
    skipped = [r["run"] for r in manifest if r["status"] == "skipped"]
    by_budget = sum(run in budget for run in skipped)
    unrun = {
        "left unrun by the budget": by_budget,
        "skipped by the race or as known to fail here": len(skipped) - by_budget,
        "never started": count["pending"],
    }
    ran = total - sum(unrun.values())
    ended = {"stopped early by the scheduler": count["stopped_early"]}
    ended["failed or cut short"] = ran - count["ok"] - ended["stopped early by the scheduler"]
    line = f"{ran} of {total} runs ran, {count['ok']} ok"
    line += "".join(f", {n} {why}" for why, n in ended.items() if n)
    said = [f"{n} {why}" for why, n in unrun.items() if n]
    return line + (f"; {', '.join(said)}" if said else "")


if __name__ == "__main__":
    sys.exit(main())
