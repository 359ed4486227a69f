"""report.html (platform/report.py) on the committed 2x H200 analysis folder, read as a page by
headless Chromium where the machine has one; the Grafana dashboard's JSON (platform/grafana.py).
The CPU smoke sweep's own report is checked in tests/integration/test_smoke_sweep.py."""

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from platform.analysis.report.page import SECTIONS
from tests.cli import run_module

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "benchmarks" / "results" / "analysis_2xh200"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# The sections of benchmarks/results/dashboard_1xh100/report.html (platform.report at 04e8fb5).
H100_PAGE_SECTIONS = [
    "ranking",
    "throughput",
    "iteration",
    "data",
    "gpu",
    "host",
    "skew",
    "bottlenecks",
    "stability",
    "failed",
    "environment",
]


class Sections(HTMLParser):
    """The text and images of each <section id=...> of a page."""

    def __init__(self):
        super().__init__()
        self.current, self.text, self.images, self.external = None, {}, {}, []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.current = attrs["id"]
            self.text[self.current], self.images[self.current] = "", 0
        elif tag == "img" and self.current:
            self.images[self.current] += 1
            assert attrs["src"].startswith("data:image/png;base64,")
        for key in ("src", "href"):
            if attrs.get(key, "").startswith(("http:", "https:", "//")):
                self.external.append(attrs[key])

    def handle_endtag(self, tag):
        if tag == "section":
            self.current = None

    def handle_data(self, data):
        if self.current:
            self.text[self.current] += data


def read_sections(page: str) -> Sections:
    parser = Sections()
    parser.feed(page)
    return parser


def check_filled(page: str, keys: list[str] | None = None) -> Sections:
    """Every section (``keys``; default: today's) is there with content, nothing broke,
    nothing is fetched from a network."""
    found = read_sections(page)
    keys = keys or [key for key, _ in SECTIONS]
    assert list(found.text) == keys
    for key in keys:
        body = found.text[key].strip()
        assert body or found.images[key], f"section {key} is empty"
        assert "could not be drawn" not in body, body
    assert found.external == []
    return found


def chromium_dom(page: Path, tmp_path: Path) -> str:
    """The page as headless Chromium parsed it (its DOM after loading the file)."""
    out = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'chromium'}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_the_committed_2xh200_analysis_folder_reports_every_section(tmp_path):
    folder = tmp_path / "analysis_2xh200"
    shutil.copytree(H200, folder)  # the committed folder stays as it is
    out = run_module("platform.report", folder)
    assert out.returncode == 0, out.stderr
    page = folder / "report.html"
    assert f"report: {page}" in out.stdout
    assert page.stat().st_size < 3_000_000
    found = check_filled(page.read_text())
    # Its figures: the winner and the intervals, the Phase B verdicts under the limits of its
    # stability.log (mb96 fails on its iter p50 CV 0.053), its leak.log, the bottlenecks with
    # the setting to try next, its plots.
    assert "sweep_z0_mb160_nw8_pf4" in found.text["ranking"]
    assert re.search(
        r"sweep_z0_mb96_nw8_pf4\s*FAIL.*iter p50 CV 0\.05\d+ > 0\.05", found.text["stability"]
    )
    assert re.search(r"sweep_z0_mb160_nw8_pf4\s*PASS", found.text["stability"])
    assert "NOT JUDGED sweep_z0_mb96_nw8_pf4_r1" in found.text["stability"]  # its leak.log
    assert "GPU memory +0.0 MB per 1,000 steps" in found.text["stability"]
    assert "a larger micro_batch may raise throughput" in found.text["bottlenecks"]
    for key in ("throughput", "iteration", "gpu", "host", "skew"):
        assert found.images[key] >= 1, key
    assert "Every run finished ok" in found.text["failed"]
    assert "fast_smoke" in found.text["environment"]  # the folder's README: how it was made
    if CHROMIUM:
        dom = chromium_dom(page, tmp_path)
        rendered = read_sections(dom)
        assert list(rendered.text) == [key for key, _ in SECTIONS]
        assert sum(rendered.images.values()) == sum(found.images.values())


def test_the_version_line_names_the_distribution_its_version_and_the_commit():
    from importlib.metadata import version

    from stage1_common.version import version_line

    line = version_line()
    assert line.startswith(f"stage1-platform {version('stage1-platform')}")
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    if commit:  # a git checkout: the commit it runs from, and whether tracked files differ
        assert re.fullmatch(rf"stage1-platform \S+ \(git {commit}(, dirty)?\)", line), line


def test_a_folder_without_a_sweep_is_one_line_and_exit_2(tmp_path):
    out = run_module("platform.report", tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"platform.report: error: {tmp_path}: no sweep here (no run_manifest.tsv or "
        "summary.json); give a sweep's output root"
    ]
    assert not (tmp_path / "report.html").exists()


def test_the_grafana_dashboard_draws_exactly_the_exported_gauges(tmp_path):
    from platform.record.grafana import UID, dashboard, gauges_in
    from trainables.observe.telemetry import RayGauges

    out = run_module("platform.grafana", "--out", tmp_path / "board.json")
    assert out.returncode == 0, out.stderr
    board = json.loads((tmp_path / "board.json").read_text())
    assert board == dashboard() and board["uid"] == UID
    assert gauges_in(board) == {f"ray_{name}" for name in RayGauges.NAMES}
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) == 5
    assert all(p["type"] == "timeseries" and p["targets"][0]["expr"] for p in board["panels"])
    # The names RayGauges declares are the ones it creates (read from its source).
    source = (ROOT / "trainables" / "observe" / "telemetry.py").read_text()
    assert set(re.findall(r'Gauge\(\s*"(stage1_\w+)"', source)) == set(RayGauges.NAMES)


@pytest.mark.parametrize("training, name", [(False, "Stage-1 sweep"), (True, "Stage-1 training")])
def test_the_dashboard_line_and_board_name_what_runs(tmp_path, monkeypatch, capsys, training, name):
    """platform.train's console and Grafana said "Stage-1 sweep" while it trained."""
    from types import SimpleNamespace

    from platform.execution.launch import _announce
    from platform.record import grafana

    session = tmp_path / "session"
    (session / "metrics" / "grafana" / "dashboards").mkdir(parents=True)
    installed = grafana.install
    monkeypatch.setattr(grafana, "install", lambda training: installed(session, training=training))
    cluster = SimpleNamespace(dashboard_url="http://127.0.0.1:8265", metrics_url="", joined=False)
    _announce(cluster, training)
    path = session / "metrics" / "grafana" / "dashboards" / grafana.FILENAME
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"Grafana dashboard '{name}': {path} (README: Dashboards)"
    board = json.loads(path.read_text())
    assert board["title"] == name and board["uid"] == name.lower().replace("-1 ", "1-")


def test_the_committed_h100_run_exported_every_dashboard_gauge_and_drew_its_gpus():
    """benchmarks/dashboard_gpu.sh on one H100: the GPU gauges, which no CPU run sets, were in
    the scrape, and the report's GPU section came from real NVML samples."""
    from platform.record.grafana import dashboard, gauges_in

    folder = ROOT / "benchmarks" / "results" / "dashboard_1xh100"
    scraped = set(re.findall(r"^(ray_stage1_\w+)\{", (folder / "scrape.txt").read_text(), re.M))
    assert gauges_in(dashboard()) == scraped
    # The page was written before issue 27 (its README): the sections of that version.
    found = check_filled((folder / "report.html").read_text(), H100_PAGE_SECTIONS)
    assert found.images["gpu"] == 1 and "throttle_reasons" in found.text["gpu"]
    assert "no GPU samples" not in found.text["gpu"]


def test_a_failed_runs_log_tails_and_a_restarts_are_on_the_page(tmp_path):
    # The page looked for *tail*.log; the driver writes fail_tail.txt (and, after a restart,
    # restart_tail-attempt<N>.txt): the README promises failed runs with their log tails.
    import pandas as pd

    from platform.analysis.report.sections import failed
    from stage1_common.output_root import OutputRoot

    root = OutputRoot.of(tmp_path)
    root.run_dir("a").mkdir(parents=True)
    rank0 = "".join(f"rank 0 line {i}\n" for i in range(80))
    root.run_folder("a").fail_tail.write_text(
        f"--- rank 0 stderr\n{rank0}--- rank 1 stderr\nValueError: x\n"
    )
    root.run_folder("a").restart_tail(1).write_text("why attempt 0 ended: rank 1: killed\n")
    manifest = pd.DataFrame(
        [
            {"run": "a", "status": "failed", "failure_reason": "rank 1: ValueError: x"},
            {"run": "b", "status": "ok", "failure_reason": ""},
        ]
    )
    page = failed({"manifest": manifest, "root": root})
    assert "fail_tail.txt" in page and "rank 0 line 0\n" in page and "ValueError: x" in page
    assert "restart_tail-attempt1.txt" in page and "why attempt 0 ended" in page


def test_a_legend_of_long_group_names_draws_without_a_console_warning():
    """On 2x H200 a sweep of four keys' cases printed matplotlib's 'constrained_layout not
    applied' warning twice among the platform's lines; the PNG is still whole."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from platform.analysis.report.figures import png

    fig, ax = plt.subplots(figsize=(3, 1), layout="constrained")
    for i in range(8):
        ax.plot([0, 1], [i, i], label="sweep_z0_mb256_nw6_pf4_cb1x1p5x2x2p5x3_torchcompileon_" * 2)
    fig.legend(loc="outside right upper")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        page = png(fig, "long names")
    assert page.startswith('<img class="plot" alt="long names" src="data:image/png;base64,')


def test_the_scheduler_section_says_what_the_race_and_the_budget_decided():
    from platform.analysis.report import sections

    results = ROOT / "benchmarks" / "results"
    race = json.loads((results / "warm_race_2xh200" / "race2_schedule.json").read_text())
    text = read_sections(f'<section id="s">{sections.scheduler({"schedule": race})}</section>')
    body = text.text["s"]
    assert "Scheduler race" in body and "4 groups, 8 runs, 2400 steps" in body
    assert "Groups that left the race" in body
    assert "sweep_z0_mb192_nw6_pf4" in body and "iter p50 CV 0.0554 > 0.05" in body
    budget = json.loads((results / "budget_2xh200" / "budget_schedule.json").read_text())
    body = read_sections(
        f'<section id="s">{sections.scheduler({"schedule": budget})}</section>'
    ).text["s"]
    assert "Runs not started" in body and "repeat 2 did not fit the budget" in body
    assert "The budget" in body and "240.0 s" in body
    assert "about 3m40s of 3m40s" in body  # the first plan, as said
    grid = {"scheduler": {"name": "fifo"}, "search": {"name": "grid"}, "stops": {}}
    assert "every run ran its steps" in sections.scheduler({"schedule": grid})
    assert "no schedule.json" in sections.scheduler({"schedule": {}})
