"""The report page's building blocks: HTML notes and tables, and matplotlib figures inlined as
PNG data URIs (the page needs no network). matplotlib is imported only when a figure is drawn."""

from __future__ import annotations

import base64
import html
import io
import math
from typing import Any

import pandas as pd

from stage1_common.output_root import OutputRoot

__all__ = ["as_text", "html_table", "new_figure", "note", "png", "rank0", "saved_plot"]


def note(text: str) -> str:
    """A line in italics saying what a section lacks and why."""
    return f'<p class="note">{html.escape(text)}</p>'


def html_table(df: pd.DataFrame, columns: list[str] | None = None, digits: int = 2) -> str:
    """``df`` (those of ``columns`` it has) as an HTML table, floats with ``digits`` decimals."""
    if df.empty:
        return note("no rows")
    df = df[[c for c in (columns or list(df.columns)) if c in df.columns]]

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "-" if math.isnan(v) else f"{v:,.{digits}f}"
        return html.escape(str(v))

    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>"
        for row in df.itertuples(index=False)
    )
    return f"<table><tr>{head}</tr>{rows}</table>"


def as_text(value: Any) -> str:
    """``value`` as text; blank for None and NaN (an empty CSV cell)."""
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def png(fig) -> str:
    """The figure as an inlined <img>; the figure is closed."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=72, bbox_inches="tight")
    plt.close(fig)
    return (
        f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'
    )


def saved_plot(data: dict, name: str) -> str:
    """The folder's own ``plots/<name>`` inlined, or "" when it has none."""
    path = data["root"] / OutputRoot.PLOTS / name
    if not path.is_file():
        return ""
    return (
        f'<img alt="{html.escape(name)}" src="data:image/png;base64,'
        f'{base64.b64encode(path.read_bytes()).decode()}">'
        + note(f"{OutputRoot.PLOTS}/{name} of this folder (no Parquet rows here to draw from)")
    )


def new_figure(rows: int = 1, cols: int = 1, height: float = 3.2):
    """A figure ten inches wide with ``rows`` x ``cols`` axes (as a flat array)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(rows, cols, figsize=(10, height * rows), squeeze=False)
    return fig, axes.ravel()


def rank0(timing: pd.DataFrame) -> pd.DataFrame:
    """Rank 0's timing rows (every rank's where it has no rank column)."""
    return timing[timing["rank"] == 0] if "rank" in timing else timing
