"""What a warm start takes from the catalogue (platform/analysis/history.py reads and compares
it): the groups' measured order, the points known to fail on the host, and each group's figures
as a race's prior.

A race's prior (``race_priors``, used by platform/control/race.py): for each group of the race,
its runs on this host fingerprint with the same configuration (ok or stopped early) that have
``MIN_TAIL`` (3) windows or more after the race's warm-up and this sweep's ``log_every`` (a
warm race's run stopped once it confirmed is not fed back as a prior run), each with its
windows after the warm-up and its tail figures as the ranking takes them. What the
race does with it is the sweep's history mode (``HISTORY_MODES``, ``--history``):

- ``confirm`` (the default): the catalogue's runs stand in for the group's repeats once its
  first judged windows here fall inside the prior's band (``Priors.confirms``): its run stops
  there, its later repeats are not run, and the sweep's ranking pools its run here with those
  catalogue runs (platform/analysis/pooled.py), saying so. Windows outside the band drop the
  prior: the group runs as cold, every repeat. A shift every group shares (their ratios'
  median, ``host_shift``, beyond the shift tolerance) drops every prior
  (platform/control/race.py); within it, the catalogue runs' figures are scaled by it wherever
  they are pooled with this host's (the race's bounds, the pooled ranking). A prior whose
  runs are of another or an unknown platform commit, or of an unknown corpus, is never pooled:
  it works as in ``order`` (``Prior.order_only``).
- ``order``: the prior only stops early a group the catalogue measured clearly slower than the
  leader (``Priors.versus``, the comparison's band, under 1), once the group's first judged
  windows here agree with it; the ranking is the sweep's own runs alone.
- ``off`` (``--no-history``): no catalogue at all, the cold race.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from platform.analysis.history import (
    NOISE_FLOOR,
    RUN_NOISE_MIN_DOF,
    WINDOWS,
    jittery,
    ratio_band,
    run_noise,
    window_values,
)
from platform.analysis.stats import t_quantile

__all__ = [
    "BAND_CAP",
    "HISTORY_MODES",
    "MIN_TAIL",
    "Prior",
    "PriorRun",
    "Priors",
    "host_shift",
    "known_failures",
    "measured_order",
    "prior_line",
    "prior_noise",
    "race_priors",
    "warm_start",
]

# A catalogue run is a race's prior run only with this many windows or more after the warm-up
# (race_priors): fewer is a partial run (a warm race's run stopped once it confirmed).
MIN_TAIL = 3
# A confirm band's half-width is at most this many noise floors (Priors.confirms says why).
BAND_CAP = 3
# What a warm start takes from the catalogue (the module docstring): the default first.
HISTORY_MODES = ("confirm", "order", "off")
# A failure that holds for a configuration on a host whatever the run: out of memory.
_LASTING = ("out of memory", "outofmemory", "cuda oom")


@dataclass(frozen=True)
class PriorRun:
    """One earlier run of a group in the catalogue on this host: its windows after the race's
    warm-up (what the race's bands use) and its tail figures as its sweep's ranking took them
    (what a pooled ranking counts: platform/analysis/pooled.py)."""

    sweep: str
    run: str
    windows: tuple[float, ...]
    tail: tuple[float, ...] = ()  # its tail windows' samples/s (the ranking's cut)
    samples_per_s: float = math.nan  # tail mean samples/s
    iter_p50_ms: float = math.nan  # tail mean iter p50
    iter_ratio: float = math.nan  # tail iter p90/p50
    status: str = "ok"  # or stopped_early: a partial run, measured as far as it ran

    @property
    def mean(self) -> float:
        return statistics.fmean(self.windows)

    def record(self) -> dict[str, Any]:
        """As the sweep's schedule.json keeps it (its ``priors``' ``catalogue_runs``)."""
        return {"sweep": self.sweep, "run": self.run, "status": self.status,
                "samples_per_s": _plain(self.samples_per_s), "iter_p50_ms": _plain(self.iter_p50_ms),
                "iter_ratio": _plain(self.iter_ratio), "tail": list(self.tail),
                "windows": list(self.windows)}  # fmt: skip

    @classmethod
    def of_record(cls, r: dict[str, Any]) -> PriorRun:
        return cls(str(r["sweep"]), str(r["run"]), tuple(r.get("windows") or ()),
                   tuple(r.get("tail") or ()), _number(r.get("samples_per_s")),
                   _number(r.get("iter_p50_ms")), _number(r.get("iter_ratio")),
                   str(r.get("status") or "ok"))  # fmt: skip


@dataclass(frozen=True)
class Prior:
    """One group's figures in the catalogue on this host: its earlier runs (``runs``), from
    ``sweeps``. A race's prior: never this sweep's measurement, and counted in its ranking only
    as the catalogue's, once confirmed (``--history confirm``)."""

    group: str
    runs: tuple[PriorRun, ...]
    sweeps: tuple[str, ...] = ()
    jittery: bool = False
    # Why its runs cannot be pooled with this sweep's (another or unknown commit, an unknown
    # corpus): --history confirm then uses it as --history order does; '' when they can.
    order_only: str = ""

    @property
    def run_means(self) -> list[float]:
        return [r.mean for r in self.runs]

    @property
    def windows(self) -> list[float]:
        return [x for r in self.runs for x in r.windows]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.run_means)

    def first_mean(self, k: int) -> float:
        """The mean over its runs of their first ``k`` windows after the warm-up: what a new
        run's first ``k`` judged windows are predicted at (a run's windows drift as it goes:
        1,887 then 1,796 samples/s in one H200 run of benchmarks/results/warm_race_2xh200/)."""
        return statistics.fmean(statistics.fmean(r.windows[:k]) for r in self.runs)

    def describe(self) -> str:
        return (f"{self.mean:.1f} samples/s over {len(self.runs)} run(s), {len(self.windows)} "
                f"windows, sweep(s) {', '.join(self.sweeps)}")  # fmt: skip


@dataclass(frozen=True)
class Priors:
    """A race's priors, per group, and the run-to-run noise pooled over them (``run_noise``)."""

    groups: dict[str, Prior] = field(default_factory=dict)
    noise: tuple[float, int] = (0.0, 0)
    floor: float = NOISE_FLOOR
    confidence: float = 0.95

    def versus(self, group: str, leader: str) -> tuple[float, float, float]:
        """``group``'s catalogue mean over ``leader``'s, and its band (``ratio_band``)."""
        g, lead = self.groups[group], self.groups[leader]
        return ratio_band(lead.run_means, g.run_means, lead.windows, g.windows, self.noise,
                          floor=self.floor, confidence=self.confidence)  # fmt: skip

    def clearly_slower(self, group: str, leader: str) -> bool:
        """Whether the catalogue measured ``group`` slower than ``leader`` beyond the noise:
        the band of their ratio lies under 1."""
        return self.versus(group, leader)[2] < 1.0

    def confirms(self, group: str, here: Sequence[float]) -> tuple[float, float, float]:
        """The mean of ``here`` (a run's first judged windows on this host) over the group's
        catalogue runs' mean over the same first windows (``Prior.first_mean``), and the band a new run's first ``len(here)`` windows fall in when the
        host is as the catalogue knew it: relative to 1, the widest of

        - runs: Student's t at the pooled degrees of freedom x the run-to-run spread pooled
          over the priors (``noise``) x sqrt(1 + 1/runs in the catalogue), when they are
          ``RUN_NOISE_MIN_DOF`` or more;
        - windows: Student's t x the spread of the group's catalogue windows x sqrt(1/len(here)
          + 1/their count);
        - the noise floor.

        A prediction band of the catalogue alone: few windows here do not widen it, so a host
        that changed shows as a ratio outside it (the run then races cold), never as a band
        wide enough to hold anything. Its half-width is capped at ``BAND_CAP`` x the noise
        floor (6 %): a wider band (a group whose catalogue runs or windows spread more) could
        not tell a host a few percent slower from the one the catalogue knew, the size of the
        gaps the ranking is there to tell apart; capped, such a group confirms only as close
        as that, else it runs cold (time spent, never a wrong pooling). A shift every group
        shares, inside each band, is the race's to catch (platform/control/race.py: the
        shared shift)."""
        prior = self.groups[group]
        ratio = statistics.fmean(here) / prior.first_mean(len(here))
        q = (1 + self.confidence) / 2
        half = self.floor
        sd, dof = self.noise
        if dof >= RUN_NOISE_MIN_DOF:
            half = max(half, t_quantile(q, dof) * sd * math.sqrt(1 + 1 / len(prior.runs)))
        windows = prior.windows
        if len(windows) > 1:
            spread = statistics.stdev(windows) / statistics.fmean(windows)
            width = math.sqrt(1 / len(here) + 1 / len(windows))
            half = max(half, t_quantile(q, len(windows) - 1) * spread * width)
        half = min(half, BAND_CAP * self.floor)
        return ratio, 1 - half, 1 + half

    def record(self) -> dict[str, Any]:
        """What a sweep keeps of them in schedule.json (``history``), to pool and to resume."""
        return {"noise": list(self.noise), "floor": self.floor, "confidence": self.confidence}

    @classmethod
    def of_schedule(cls, state: dict[str, Any]) -> Priors | None:
        """The priors a sweep's schedule.json kept (``--resume`` of a warm race); None when it
        kept none."""
        held, kept = state.get("priors") or {}, state.get("history") or {}
        groups = {}
        for group, record in held.items():
            runs = tuple(PriorRun.of_record(r) for r in record.get("catalogue_runs") or ())
            if runs:
                groups[group] = Prior(group, runs, tuple(record.get("sweeps") or ()),
                                      bool(record.get("jittery")),
                                      str(record.get("order_only") or ""))  # fmt: skip
        if not groups:
            return None
        noise = kept.get("noise") or (0.0, 0)
        return cls(groups, (float(noise[0]), int(noise[1])),
                   float(kept.get("floor", NOISE_FLOOR)), float(kept.get("confidence", 0.95)))  # fmt: skip


def host_shift(records: dict[str, dict[str, Any]]) -> tuple[float, int]:
    """The shift this host shows against the catalogue, and over how many groups: the median
    of the judged groups' ratios here over their catalogue runs (each prior record's ``here``
    in a race's schedule, ``Priors.confirms``' ratio, confirmed or dropped; not a prior used
    as ``order`` uses it, whose ratio is against a leader), one group's own ratio, (1.0, 0)
    before any was judged. The race judges it against the shift tolerance and scales the
    catalogue runs it pools by it (platform/control/race.py, platform/analysis/pooled.py)."""
    ratios = [float(r["here"]) for r in records.values()
              if "here" in r and not r.get("order_only")]  # fmt: skip
    return (statistics.median(ratios), len(ratios)) if ratios else (1.0, 0)


def race_priors(
    runs: list, rows: pd.DataFrame, host: str, plan, commit: str | None = None
) -> Priors:
    """Each group of ``runs`` (RunSpecs) that the catalogue measured on ``host`` with the same
    configuration (cost key), ok or stopped early, with windows: its runs, each with its windows
    after ``plan.warmup_windows`` (the race's SchedulerPlan) and its tail figures. Only runs
    with ``plan.warmup_windows`` + ``MIN_TAIL`` windows or more and this sweep's ``log_every``
    (``_comparable``): a warm race's run stopped once it confirmed (2 judged windows) would
    come back as an equal prior run, and another ``log_every`` cuts another warm-up.

    A row of another corpus (``manifest_path``; cost_key leaves paths out, as costs do not
    depend on them) is no prior. A prior whose runs are not all of ``commit`` (this sweep's
    platform commit) and of a known corpus is one ``--history confirm`` does not pool: it works
    as in ``order`` (``Prior.order_only`` says why)."""
    from platform.storage.catalogue import cost_key

    if WINDOWS not in rows:
        return Priors(floor=plan.noise_floor, confidence=plan.confidence)
    here = rows[(rows["host"] == host) & rows["status"].isin(["ok", "stopped_early"])]
    jittery = {k: j for k, (j, _) in measured_order(rows, host).items()}
    groups: dict[str, Prior] = {}
    for run in runs:
        key = cost_key(run.config)
        if run.group in groups:
            continue
        measured, kept = [], []
        corpus = str(getattr(run.config, "manifest_path", "") or "")
        for row in here[here["cost_key"] == key].sort_values("ts").to_dict("records"):
            values = window_values(row.get(WINDOWS))
            if _text(row.get("manifest_path")) not in (None, corpus):
                continue  # another corpus under the same configuration
            if _comparable(row, values, run.config, plan):
                measured.append(_prior_run(row, values, values[plan.warmup_windows :]))
                kept.append(row)
        if measured:
            sweeps = tuple(dict.fromkeys(r.sweep for r in measured))
            groups[run.group] = Prior(run.group, tuple(measured), sweeps,
                                      jittery.get(key, False), _order_only(kept, commit))  # fmt: skip
    return Priors(groups, prior_noise(groups.values()), floor=plan.noise_floor,
                  confidence=plan.confidence)  # fmt: skip


def _text(value: Any) -> str | None:
    """A catalogue text cell (None for none: a row written before the column)."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def _order_only(rows: list[dict[str, Any]], commit: str | None) -> str:
    """Why a prior's runs cannot be pooled with this sweep's (``--history confirm`` then uses
    it as ``order`` does): run(s) of another or an unknown platform commit, or of an unknown
    corpus; '' when they can."""
    why = []
    commits = [_text(r.get("git_commit")) or "" for r in rows]
    if not commit:
        why.append("this sweep's commit is unknown")
    elif any(not c for c in commits):
        why.append("catalogue run(s) of an unknown commit")
    elif any(c != commit for c in commits):
        other = next(c for c in commits if c != commit)
        why.append(f"catalogue run(s) of commit {other[:10]}, this sweep {commit[:10]}")
    if any(_text(r.get("manifest_path")) is None for r in rows):
        why.append("catalogue run(s) of an unknown corpus")
    return "; ".join(why)


def _comparable(row: dict[str, Any], values: list[float], cfg, plan) -> bool:
    """Whether a catalogue row can be a race's prior run: ``MIN_TAIL`` windows or more after
    the warm-up, and windows of this sweep's ``log_every`` (its config's; a row without one is
    left out)."""
    if len(values) < plan.warmup_windows + MIN_TAIL:
        return False
    try:
        logged = json.loads(row.get("config") or "{}").get("log_every")
    except (TypeError, ValueError):
        return False
    return logged is not None and int(logged) == int(cfg.log_every)


def prior_noise(priors) -> tuple[float, int]:
    """The run-to-run spread of the priors (``run_noise``) over the steady groups' whole runs:
    a jittery group's runs (one at 80, one at 96) or a partial one (stopped early, its mean
    over a few windows) would widen every group's band with a spread no steady run shows."""
    return run_noise([[r.mean for r in p.runs if r.status == "ok"] for p in priors
                      if not p.jittery])  # fmt: skip


def _prior_run(row: dict[str, Any], values: list[float], windows: list[float]) -> PriorRun:
    """A catalogue row as a prior's run: its tail the last ``tail_windows`` of its windows."""
    n = _number(row.get("tail_windows"))
    tail = values[-int(n) :] if math.isfinite(n) and n > 0 else values
    sps = _number(row.get("tail_samples_per_sec_mean"))
    return PriorRun(
        sweep=str(row["sweep"]),
        run=str(row["run"]),
        windows=tuple(windows),
        tail=tuple(tail),
        samples_per_s=sps if math.isfinite(sps) else statistics.fmean(tail),
        iter_p50_ms=_number(row.get("tail_mean_iter_p50_ms")),
        iter_ratio=_number(row.get("iter_p90_over_p50")),
        status=str(row.get("status") or "ok"),
    )


def _number(value: Any) -> float:
    """A catalogue or schedule cell as a float (NaN for none)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _plain(value: float) -> float | None:
    """A float for JSON (None for NaN)."""
    return None if value is None or not math.isfinite(value) else float(value)


def measured_order(rows: pd.DataFrame, host: str) -> dict[str, tuple[bool, float]]:
    """Cost key -> (jittery, mean samples/s) of its ok runs on ``host``: jittery when most of
    them had a tail iter p90/p50 above the ranking's limit (a race's leader must be steady)."""
    ok = rows[(rows["host"] == host) & (rows["status"] == "ok")]
    ok = ok[ok["tail_samples_per_sec_mean"].notna()]
    out = {}
    for key, df in ok.groupby("cost_key"):
        out[key] = (
            jittery(df["iter_p90_over_p50"]),
            float(df["tail_samples_per_sec_mean"].mean()),
        )
    return out


def known_failures(rows: pd.DataFrame, host: str) -> dict[str, dict[str, Any]]:
    """Cost key -> the newest failure on ``host`` that still holds (out of memory), for a
    configuration that never ran ok there since."""
    ran = ~rows["status"].isin(["skipped", "pending", "interrupted"])  # what a run said
    here = rows[(rows["host"] == host) & ran].sort_values("ts", kind="stable")
    out: dict[str, dict[str, Any]] = {}
    for key, df in here.groupby("cost_key"):
        last = df.iloc[-1]
        reason = str(last["failure_reason"] or "")
        if last["status"] != "ok" and any(w in reason.lower() for w in _LASTING):
            when = pd.to_datetime(last["ts"], unit="s").strftime("%Y-%m-%d %H:%M")
            out[key] = {"reason": reason.splitlines()[0][:200], "sweep": last["sweep"],
                        "when": when}  # fmt: skip
    return out


def prior_line(priors: Priors, groups: list[str], plan, mode: str = "confirm") -> list[str]:
    """The console's line for a warm race's priors (none without any): how many groups have
    one and, by ``mode`` (``HISTORY_MODES``), what the race does with them: ``confirm``, their
    catalogue runs stand in for their repeats once their first judged windows here fall in the
    prior's band, and the ranking pools them; ``order``, which groups the catalogue measured
    clearly slower than the prior leader (the steady group with the highest mean), so they stop
    once their first judged windows agree."""
    have = [g for g in dict.fromkeys(groups) if g in priors.groups]
    if not have:
        return []
    line = f"history: race priors for {len(have)} of {len(set(groups))} group(s) from this host's catalogue"
    if mode == "confirm":
        runs = sum(len(priors.groups[g].runs) for g in have)
        sweeps = list(dict.fromkeys(s for g in have for s in priors.groups[g].sweeps))
        return [
            line + f" ({runs} run(s), sweep(s) {', '.join(sweeps)}): a group whose first "
            f"{plan.confirm_windows} judged window(s) here fall in its prior's band stops there "
            "and its catalogue runs stand in for its repeats, the ranking pooling them (said "
            "per group); outside the band it runs as cold (--history order: priors only stop "
            "groups measured clearly slower; --no-history: none)" + _order_only_line(priors, have)
        ]
    line += " (not counted as this sweep's measurements)"
    steady = [g for g in have if not priors.groups[g].jittery]
    if steady:
        leader = max(steady, key=lambda g: priors.groups[g].mean)
        slower = [(g, priors.versus(g, leader)[0]) for g in have
                  if g != leader and priors.clearly_slower(g, leader)]  # fmt: skip
        line += f"; leader there: {leader}"
        if slower:
            line += (
                "; measured clearly slower, to stop once their first "
                f"{plan.confirm_windows} judged window(s) agree: "
                + ", ".join(f"{g} ({r:.2f}x)" for g, r in slower)
            )
        else:
            line += "; none measured clearly slower than it"
    return [line + " (--no-history: none)"]


def _order_only_line(priors: Priors, have: list[str]) -> str:
    """The confirm line's tail for the priors it cannot pool (``Prior.order_only``)."""
    held = [(g, priors.groups[g].order_only) for g in have if priors.groups[g].order_only]
    if not held:
        return ""
    return "; as --history order, never pooled: " + "; ".join(f"{g} ({why})" for g, why in held)


def warm_start(runs: list, rows: pd.DataFrame, host: str) -> tuple[list, dict[str, str], list[str]]:
    """A race or a budget on a host seen before: ``runs`` (RunSpecs, in their planned order)
    with each repeat round's groups ordered by what was measured there (steady groups fastest
    first: an early strong leader stops the slower groups sooner; jittery ones after them;
    groups never measured keep their place after those), the runs of groups known to fail there (``known_failures``) to skip (run -> why), and
    one line per skipped group and one for the order."""
    from platform.storage.catalogue import cost_key

    measured = measured_order(rows, host)
    failing = known_failures(rows, host)
    skips: dict[str, str] = {}
    lines: list[str] = []
    for run in runs:
        bad = failing.get(cost_key(run.config))
        if bad is None:
            continue
        why = f"known to fail on this host: {bad['reason']} (sweep {bad['sweep']}, {bad['when']})"
        skips[run.name] = f"not run: {why}"
        if not any(line.startswith(f"history: skipping {run.group}:") for line in lines):
            lines.append(f"history: skipping {run.group}: {why}")
    never = (True, True, 0.0)  # after every group measured here, in the space's order

    def place(run) -> tuple:
        found = measured.get(cost_key(run.config))
        return never if found is None else (False, found[0], -found[1])

    ordered = sorted(runs, key=lambda r: (r.repeat, place(r)))
    known = sum(1 for g in {cost_key(r.config) for r in runs} if g in measured)
    if known:
        lines.append(
            f"history: {known} of {len({r.group for r in runs})} group(s) measured on this host "
            "before; they run first, fastest first (--no-history: the space's order)"
        )
    return ordered, skips, lines
