"""What a run costs on this machine: the seconds a budget plans with, measured and remembered.

A run costs its start (a worker group started, or a resident group already up; the model built;
with ``torch_compile`` the compile warm-up, cold the first time a shape compiles on the machine
and warm once the machine's compile cache holds it) and its steps. ``Costs`` answers both for a
run of a sweep: from what the sweep measured so far (its windows and finished runs), else from
what earlier sweeps on this machine measured (``costs.json`` in the machine's cache folder,
stage1_common/machine_cache.py, keyed by the configuration that decides the speed: every key
but the run's length, its windows, its seed and its paths), else from priors, which say what
they assume. A compiled configuration the machine has never run is planned with a cold compile:
the compile cache holds no shape of it.

``remember`` writes a finished sweep's measured costs into ``costs.json`` (every sweep, with or
without a budget), so the next ``--budget`` and ``--dry-run --budget`` on the machine plan from
numbers instead of priors.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stage1_common.fileio import atomic_write_text
from stage1_common.machine_cache import machine_cache
from trainables.config import TrialConfig

__all__ = ["COSTS", "Costs", "Prior", "cost_key", "read_memory", "remember"]

COSTS = "costs.json"  # in the machine's cache folder

# Keys that do not change how fast a step runs or how long a run takes to start.
_NOT_COST = {"max_steps", "log_every", "tail_timing_points", "run_timeout_s", "seed", "epochs"}


def cost_key(cfg: TrialConfig) -> str:
    """The configuration's fingerprint for the costs it has on a machine."""
    values = {
        k: v
        for k, v in cfg.to_dict().items()
        if k not in _NOT_COST and not k.endswith(("_path", "_dir"))
    }
    return hashlib.sha1(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]


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
    ``ended``), else remembered on the machine (``memory``: costs.json's entries), else
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
        from trainables.resident.shape import GroupKey

        key = GroupKey.of(cfg)
        self._starting[run] = cfg.executor != "resident" or key not in self.groups_up
        self.groups_up.add(key)

    def observe(self, run: str, cfg: TrialConfig, window: dict[str, Any], warmup: int) -> None:
        """One window of ``run``: its seconds per step once past the warm-up, and with its
        first window the run's start (startup_s)."""
        key = cost_key(cfg)
        self.batch[key] = _global_batch(cfg)
        index = int(window.get("window") or 0)
        if index > warmup and window.get("iter_ms_mean"):
            self.step_s.setdefault(key, []).append(float(window["iter_ms_mean"]) / 1000.0)
        if index == 1 and window.get("startup_s") is not None:
            startup = float(window["startup_s"])
            if self._starting.get(run, True):
                self.group_starts.append(startup)
            else:
                self.starts.setdefault(key, []).append(startup)

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

    def starts_group(self, cfg: TrialConfig) -> bool:
        """Whether a run of ``cfg`` handed out now would start a worker group."""
        from trainables.resident.shape import GroupKey

        return cfg.executor != "resident" or GroupKey.of(cfg) not in self.groups_up

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


# --- the machine's memory of costs ---
def memory_path(configured: str = "") -> Path:
    return machine_cache(configured) / COSTS


def read_memory(configured: str = "") -> dict[str, dict[str, Any]]:
    """costs.json's entries ({} when the machine has none, or an unreadable file)."""
    try:
        data = json.loads(memory_path(configured).read_text())
    except (OSError, ValueError):
        return {}
    return data.get("configs", {}) if isinstance(data, dict) else {}


def remember(rows: list[dict[str, Any]], configs: dict[str, TrialConfig]) -> Path | None:
    """Write what a sweep's ok runs measured (their manifest ``rows``; ``configs``: run ->
    its config) into the machine's costs.json: per configuration, its seconds per step (the
    median of its runs' tail iterations), the start of its first run (a group started) and of
    a later one. Returns the file (None when no run measured anything or it cannot be written:
    a budget then plans from priors, as before)."""
    from trainables.resident.shape import GroupKey

    by_key: dict[str, dict[str, Any]] = {}
    groups_up: set[GroupKey] = set()  # a resident run of a key not up started a group
    for row in rows:
        cfg = configs.get(row.get("run", ""))
        if cfg is None or row.get("status") != "ok":
            continue
        key = cost_key(cfg)
        entry = by_key.setdefault(key, {"group": row.get("group"), "steps": [], "next": []})
        iter_ms = _number(row.get("tail_mean_iter_p50_ms"))
        if iter_ms:
            entry["steps"].append(iter_ms / 1000.0)
        startup = _number(row.get("startup_s"))
        group_key = GroupKey.of(cfg)
        if startup is not None:
            if cfg.executor == "resident" and group_key in groups_up:
                entry["next"].append(startup)
            else:
                entry["first_start_s"] = startup
        groups_up.add(group_key)
    if not by_key:
        return None
    configured = next((c.compile_cache_dir for c in configs.values() if c.compile_cache_dir), "")
    path = memory_path(configured)
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        data = {}
    known = data.get("configs", {}) if isinstance(data, dict) else {}
    for key, entry in by_key.items():
        old = dict(known.get(key, {}))
        if entry["steps"]:
            old["step_s"] = statistics.median(entry["steps"])
        if "first_start_s" in entry:
            old["first_start_s"] = entry["first_start_s"]
        if entry["next"]:
            old["next_start_s"] = statistics.median(entry["next"])
        old.update(group=entry["group"], updated=time.time())
        known[key] = old
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"configs": known}, indent=1, sort_keys=True))
    except OSError:
        return None
    return path


def _number(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out
