"""A run's tail: which of its timing windows its figures are taken over (the ranking and its
confidence, the cliffs, the race, the searchers, the torchrun reference's summary).

The tail is a run's last ``tail_timing_points`` windows after its first. The first window holds
what the compile warm-up did not do ahead (a compiled run without known shapes compiles there:
139-261 samples/s against about 1,600 steady on 2x H200, benchmarks/results/
budget_compiled_2xh200) and the loader's first fill, so a run short enough that its last
``tail_timing_points`` windows would reach back to it leaves it out. A run of one window has
that window as its tail, so it still has figures; the cliffs judge no window of it
(platform/analysis/verdicts/cliffs.py).
"""

from __future__ import annotations

__all__ = ["tail_start"]


def tail_start(windows: int, points: int) -> int:
    """Where a run's tail starts among its ``windows`` windows in order: its last ``points``
    windows after the first (0 for a run of one window)."""
    return max(0, min(1, windows - 1), windows - max(1, int(points)))
