"""What a run costs on this machine: the seconds a budget plans with, measured and remembered.

A run costs its start (a worker group started, or a resident group already up; the model built;
with ``torch_compile`` the compile warm-up, cold the first time a shape compiles on the machine
and warm once the machine's compile cache holds it) and its steps. ``Costs`` answers both for a
run of a sweep: from what the sweep measured so far (its windows and finished runs), else from
what earlier sweeps on this host measured (the machine's catalogue, platform/storage/
catalogue.py, which every sweep writes, by the configuration's cost key: every key but the
run's length, its windows, its seed and its paths), else from priors, which say what they
assume. A compiled configuration the host has never run is planned with a cold compile: the
compile cache holds no shape of it. A measured start holds the compile wherever it ran: the
warm-up's is in ``startup_s``; a run without it (unknown shapes: ``crop_policy limit_longest``)
compiles in its first window, which the steps' seconds leave out, so its start adds the
seconds torch compiled there (``compile_in_windows_s``: the first window's in a sweep, the
run's in the catalogue).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from platform.storage.catalogue import cost_key
from trainables.config import TrialConfig
from trainables.resident.shape import starts_group

__all__ = ["Costs", "Prior", "cost_key", "memory_of", "read_memory"]


@dataclass(frozen=True)
class Prior:
    """What a run is assumed to cost before anything on the machine says (seconds)."""

    first_start_s: float = 20.0  # a run that starts a worker group (17 s on 2x H200)
    next_start_s: float = 4.0  # a later run on a resident group (2-3 s on 2x H200)
    compile_cold_s: float = 75.0  # a shape the machine never compiled (62 s on 2x H200)
    compile_warm_s: float = 15.0  # the same from the machine's compile cache
    end_s: float = 10.0  # the sweep's end: the runs' records, the analysis, the groups' close
    launch_s: float = 15.0  # the sweep's beginning: Ray started, the inputs and nodes checked


@dataclass
class Costs:
    """The costs of a sweep's runs: measured by the sweep (``handed_out``, ``observe``,
    ``ended``), else remembered on the host (``memory``: ``memory_of`` its catalogue), else
    ``prior``."""

    memory: dict[str, dict[str, Any]] = field(default_factory=dict)
    prior: Prior = field(default_factory=Prior)
    step_s: dict[str, list[float]] = field(default_factory=dict)  # cost key -> windows' s/step
    batch: dict[str, int] = field(default_factory=dict)  # cost key -> global batch
    group_starts: list[float] = field(default_factory=list)  # runs that started a group
    starts: dict[str, list[float]] = field(default_factory=dict)  # cost key -> later runs'
    ends: list[float] = field(default_factory=list)  # runs' seconds after their last window
    groups_up: set[Any] = field(default_factory=set)  # resident group keys started
    _starting: dict[str, bool] = field(default_factory=dict)  # run -> it starts a group

    # --- what the sweep measures ---
    def handed_out(self, run: str, cfg: TrialConfig) -> None:
        """``run`` goes to a trial now: whether it starts a worker group."""
        self._starting[run] = starts_group(cfg, self.groups_up)

    def observe(self, run: str, cfg: TrialConfig, window: dict[str, Any], warmup: int) -> None:
        """One window of ``run``: its seconds per step once past the warm-up, and with its
        first window the run's start (startup_s; a later run of a configuration: with what it
        compiled in that window, compile_in_windows_s)."""
        key = cost_key(cfg)
        # What the window's steps held (batching duration: their mean), else the config's.
        self.batch[key] = int(window.get("global_batch") or _global_batch(cfg))
        index = int(window.get("window") or 0)  # numbered from 0
        if index >= warmup and window.get("iter_ms_mean"):
            self.step_s.setdefault(key, []).append(float(window["iter_ms_mean"]) / 1000.0)
        if index == 0 and window.get("startup_s") is not None:
            startup = float(window["startup_s"])
            if self._starting.get(run, True):
                self.group_starts.append(startup)  # any configuration's: without its compile
            else:
                compiled = float(window.get("compile_in_windows_s") or 0.0)
                self.starts.setdefault(key, []).append(startup + compiled)

    def ended(self, seconds_after_last_window: float) -> None:
        self.ends.append(max(0.0, seconds_after_last_window))

    # --- what a run is estimated to cost ---
    def step(self, cfg: TrialConfig) -> float | None:
        """Seconds per step of ``cfg``: measured, remembered, or from the samples/s the sweep
        measured of its other configurations (None: nothing measured or remembered yet)."""
        key = cost_key(cfg)
        if self.step_s.get(key):
            return statistics.median(self.step_s[key][-20:])
        if self.memory.get(key, {}).get("step_s"):
            return float(self.memory[key]["step_s"])
        rates = [self.batch[k] / statistics.median(v[-20:]) for k, v in self.step_s.items() if v]
        if rates:  # the same samples/s as the configurations measured so far
            return _global_batch(cfg) / statistics.median(rates)
        return None

    def start(self, cfg: TrialConfig, starts_group: bool) -> float:
        """Seconds of a run before its first timed step and after its last: a group started
        (``starts_group``) or a resident one reused, the model built, a compile warm-up."""
        key = cost_key(cfg)
        remembered = self.memory.get(key, {})
        own = self.starts.get(key)  # this configuration's later runs: their compile inside
        if starts_group and remembered.get("first_start_s") and not self.group_starts:
            base, compile_s = float(remembered["first_start_s"]), 0.0
        elif starts_group:
            base = self.group_starts[-1] if self.group_starts else self.prior.first_start_s
            compile_s = self._compile(cfg)
        elif own:
            base, compile_s = statistics.median(own), 0.0
        elif remembered.get("next_start_s"):
            base, compile_s = float(remembered["next_start_s"]), 0.0
        else:
            base, compile_s = self.prior.next_start_s, self._compile(cfg)
        return base + compile_s + (statistics.median(self.ends) if self.ends else 1.0)

    def _compile(self, cfg: TrialConfig) -> float:
        """A compile warm-up: none for an eager run; warm for a configuration the machine
        compiled before (remembered, or run by this sweep), else cold."""
        if not cfg.torch_compile:
            return 0.0
        key = cost_key(cfg)
        warm = key in self.memory or key in self.batch
        return self.prior.compile_warm_s if warm else self.prior.compile_cold_s


def _global_batch(cfg: TrialConfig) -> int:
    return cfg.micro_batch * cfg.train_workers * cfg.grad_accum_steps


# --- the machine's memory: its catalogue ---
def memory_of(rows: pd.DataFrame, host: str) -> dict[str, dict[str, Any]]:
    """Cost key -> what its ok runs on ``host`` measured, from the catalogue's ``rows``
    (platform/storage/catalogue.py): ``step_s`` (the median of the runs' tail iteration),
    ``first_start_s`` (the newest run that started a worker group) and ``next_start_s`` (the
    median of the runs on a resident group), each start with what the run compiled inside its
    windows (``compile_in_windows_s``; none in a catalogue written before it was kept)."""
    ok = rows[(rows["host"] == host) & (rows["status"] == "ok")].sort_values("ts")
    out: dict[str, dict[str, Any]] = {}
    for key, df in ok.groupby("cost_key"):
        entry: dict[str, Any] = {"group": df["group"].iloc[-1]}
        steps = df["tail_mean_iter_p50_ms"].dropna()
        if len(steps):
            entry["step_s"] = float(steps.median()) / 1000.0
        compiled = df.get("compile_in_windows_s", pd.Series(0.0, index=df.index))
        start = df["startup_s"] + compiled.fillna(0.0)
        group = df["starts_group"].fillna(True).astype(bool)
        starts = start[group].dropna()
        if len(starts):
            entry["first_start_s"] = float(starts.iloc[-1])
        later = start[~group].dropna()
        if len(later):
            entry["next_start_s"] = float(later.median())
        out[key] = entry
    return out


def read_memory(configured: str = "") -> dict[str, dict[str, Any]]:
    """What this host measured before, per cost key (``memory_of`` its catalogue; {} when it
    has none)."""
    from platform.storage.catalogue import fingerprint, host_now, read, store

    rows = read(store(configured)).to_pandas()
    return memory_of(rows, fingerprint(host_now())) if len(rows) else {}
