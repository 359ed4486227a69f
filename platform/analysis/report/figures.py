"""The report page's building blocks: HTML notes and tables, matplotlib figures inlined as PNG
data URIs (the page needs no network), labelled reference lines, and the folder's own saved
plots with what each shows. An image's alt text names what it draws, the same words the
section's heading uses (tests compare them). matplotlib is imported only when a figure is
drawn."""

from __future__ import annotations

import base64
import html
import io
import math
import numbers
import warnings
from typing import Any

import pandas as pd

from stage1_common.output_root import OutputRoot

__all__ = [
    "LEGEND_PT",
    "SAVED_PLOTS",
    "TITLE_PT",
    "as_text",
    "html_table",
    "new_figure",
    "note",
    "png",
    "rank0",
    "reference_line",
    "saved_plot",
]

# What each plot the notebooks save in a folder's plots/ draws (notebooks/*.ipynb): the heading
# and alt text of a section that shows one instead of a figure drawn from rows.
SAVED_PLOTS = {
    "iter_ms_over_steps.png": "iter_ms p50 per window of rank 0, per run",
    "gpu_util_power.png": "GPU utilisation and power over time, per run and rank",
    "host_rss_over_steps.png": "trainer RSS over steps, per run and node, with a fitted line",
    "rank_skew.png": "rank skew per window, per run",
}


# The page shows a figure the width of its column (~1,050 px, img.plot in report.py's style):
# drawn 10 in wide at DPI it is scaled to ~0.75, so LEGEND_PT and TICK_PT read as ~15 px.
DPI = 144
LEGEND_PT = 10
TICK_PT = 10
TITLE_PT = 11


def note(text: str) -> str:
    """A line in italics saying what a section lacks and why."""
    return f'<p class="note">{html.escape(text)}</p>'


def html_table(df: pd.DataFrame, columns: list[str] | None = None, digits: int = 2) -> str:
    """``df`` (those of ``columns`` it has) as an HTML table, floats with ``digits`` decimals."""
    if df.empty:
        return note("no rows")
    df = df[[c for c in (columns or list(df.columns)) if c in df.columns]]

    def cell(v: Any) -> str:
        if v is None or v is pd.NA:  # a hole in a column of whole numbers (pandas' Int64)
            return "<td>-</td>"
        if isinstance(v, float):
            return "<td>-</td>" if math.isnan(v) else f"<td>{v:,.{digits}f}</td>"
        if isinstance(v, numbers.Number):
            return f"<td>{v}</td>"
        return f'<td class="text">{html.escape(str(v))}</td>'  # text reads from the left

    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = "".join(
        "<tr>" + "".join(cell(v) for v in row) + "</tr>" for row in df.itertuples(index=False)
    )
    return f'<div class="wide"><table><tr>{head}</tr>{rows}</table></div>'


def as_text(value: Any) -> str:
    """``value`` as text; blank for None and NaN (an empty CSV cell)."""
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def png(fig, alt: str) -> str:
    """The figure as an inlined <img> whose alt text ``alt`` says what it draws; the figure is
    closed."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    with warnings.catch_warnings():
        # A legend of long group names (a sweep of many keys) leaves constrained layout no room:
        # matplotlib warns on the console and lays the axes out without it; bbox "tight" still
        # fits every label into the PNG, so the warning says nothing the page does not show.
        warnings.filterwarnings("ignore", "constrained_layout not applied", UserWarning)
        fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return (
        f'<img class="plot" alt="{html.escape(alt)}" '
        f'src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'
    )


def saved_plot(data: dict, name: str, caption: str = "") -> str:
    """The folder's own ``plots/<name>`` inlined with what it draws (``SAVED_PLOTS``), or ""
    when it has none; ``caption``: a line about reading it."""
    path = data["root"] / OutputRoot.PLOTS / name
    if not path.is_file():
        return ""
    return (
        f'<img alt="{html.escape(SAVED_PLOTS[name])}" src="data:image/png;base64,'
        f'{base64.b64encode(path.read_bytes()).decode()}">'
        + note(
            f"{OutputRoot.PLOTS}/{name} of this folder, drawn by a notebook: "
            f"{SAVED_PLOTS[name]} (no Parquet rows here to draw from). {caption}".strip()
        )
    )


def reference_line(ax, value: float, label: str, *, vertical: bool = False) -> None:
    """A dashed line at ``value`` named in the legend: no unlabelled line on the page."""
    draw = ax.axvline if vertical else ax.axhline
    draw(value, color="k", linestyle="--", linewidth=1, label=label)


def new_figure(rows: int = 1, cols: int = 1, height: float = 3.2, width: float = 10.0):
    """A figure ``width`` inches wide (the page's width: keep it, split it into ``cols``) with
    ``rows`` x ``cols`` axes (as a flat array), their ticks at ``TICK_PT``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        rows, cols, figsize=(width, height * rows), squeeze=False, layout="constrained"
    )
    for ax in axes.ravel():
        ax.tick_params(labelsize=TICK_PT)
    return fig, axes.ravel()


def rank0(timing: pd.DataFrame) -> pd.DataFrame:
    """Rank 0's timing rows (every rank's where it has no rank column)."""
    return timing[timing["rank"] == 0] if "rank" in timing else timing
