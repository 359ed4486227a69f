"""What an interrupted sweep measured so far (issue 54 item 6): a sweep stopped by a signal
keeps its finished runs, and its console, summary and report must not read like a finished
sweep's: ``partial`` gives the counts and the line they say it with."""

from __future__ import annotations

from typing import Any

import pandas as pd

__all__ = ["partial"]


def partial(manifest: pd.DataFrame) -> dict[str, Any] | None:
    """An interrupted sweep (runs still pending or cut short): what it measured so far, and the
    line the console, summary.md and the report say it with; None when every run ended."""
    status = manifest["status"].astype(str)
    unfinished = status.isin(["pending", "interrupted"])
    if not unfinished.any():
        return None
    measured = manifest.loc[status.isin(["ok", "stopped_early"]), "group"].nunique()
    out = {
        "runs_finished": int((~unfinished).sum()),
        "runs": int(len(manifest)),
        "groups_measured": int(measured),
        "groups": int(manifest["group"].nunique()),
    }
    out["line"] = (
        f"partial: the sweep was interrupted ({out['runs_finished']} of {out['runs']} runs "
        f"finished, {measured} of {out['groups']} groups measured); the ranking and the best "
        "are of the groups measured so far: finish it with --resume"
    )
    return out
