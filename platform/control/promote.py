"""Phase A to Phase B: a retest sweep made of the best groups of an earlier sweep.

``python -m platform.tune --space NAME --from-ranked OUTPUT_ROOT --top 2 --repeats 2 --set
max_steps=1000`` takes the first ``--top`` groups of OUTPUT_ROOT's ranking that have ok runs
(stable groups rank first), and makes them the cases of NAME's space, in place of its grid: each
case holds the values that group was swept over, the space's fixed values hold the rest.
"""

from __future__ import annotations

import dataclasses
import json

import pandas as pd

from platform.errors import UsageError
from platform.spaces.space import SearchSpace
from stage1_common.output_root import OutputRoot

__all__ = ["from_ranked"]


def from_ranked(space: SearchSpace, root: OutputRoot, top: int) -> SearchSpace:
    """``space`` with the first ``top`` groups of the ranking of the earlier sweep in ``root``
    that have ok runs as its cases, in place of its grid (the module docstring)."""
    if not root.holds_sweep():
        raise UsageError(
            f"--from-ranked: {root} holds no sweep ({root.MANIFEST} is missing); "
            "give the output root of a finished sweep"
        )
    ranked_csv = root / root.RANKED_GROUPS
    if not ranked_csv.is_file():  # a sweep from before the analysis files: make them
        from platform.analysis.analyze import analyze

        analyze(root)
    ranked = pd.read_csv(ranked_csv)
    winners = ranked[ranked["runs_ok"] > 0].head(top)
    if winners.empty:
        raise UsageError(f"--from-ranked: no group of {root} has an ok run to promote")
    manifest = pd.read_csv(root.manifest, sep="\t", keep_default_na=False)
    cases = []
    for group in winners["group"]:
        run = manifest.loc[(manifest["group"] == group) & (manifest["status"] == "ok"), "run"]
        record = root.run_folder(str(run.iloc[0])).config
        try:
            swept = json.loads(record.read_text())["swept"]
        except (OSError, ValueError, KeyError):
            raise UsageError(
                f"--from-ranked: {record} is missing or unreadable; the group's swept values "
                "cannot be known"
            ) from None
        cases.append(swept)
    note = f"retest of the top {len(cases)} groups of {root.path.name}"
    # The space's baseline stays only when it is one of the promoted groups.
    kept = [c for c in cases if all(c.get(k) == v for k, v in space.baseline.items())]
    return dataclasses.replace(
        space,
        grid={},
        cases=cases,
        baseline=dict(space.baseline) if space.baseline and len(kept) == 1 else {},
        description=f"{space.description} ({note})" if space.description else note,
    )
