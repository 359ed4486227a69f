"""report.html tells what the folder's own checks tell: its stability and leak verdicts are the
lines of ``python -m platform.stability`` and ``python -m platform.leak`` on the same folder
(their ``main``, in this process; the commands run as subprocesses in test_stability and
test_leak), under the limits the folder's logs state; "not enough repeats" is not "unstable";
host memory with too few samples is NOT JUDGED, never OK; each heading names what its section
drew; the ranking has the swept values, MFU and peak memory."""

import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from platform import leak as leak_cli
from platform import stability as stability_cli
from platform.analysis.analyze import analyze
from platform.analysis.report.page import SECTIONS, write_report
from platform.analysis.verdicts.leak import LeakLimits
from platform.analysis.verdicts.limits import UnreadableLimits, flags_line, logged_limits
from platform.analysis.verdicts.stability import StabilityLimits, folder_limits
from platform.storage import results
from stage1_common.output_root import OutputRoot

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "benchmarks" / "results" / "analysis_2xh200"

# group -> (micro_batch, tail iter p50 ms of each repeat); every run is ok.
GROUPS = {
    "steady": (16, [100.0, 100.0, 100.0]),  # 3 ok runs, CV 0: PASS
    "twice": (8, [50.0, 50.0]),  # 2 ok runs, CV 0: NOT ENOUGH REPEATS under --min-repeats 3
    "shaky": (4, [20.0, 40.0, 60.0]),  # CV 0.5 > 0.05: FAIL
}
T0 = 1000.0


class Page(HTMLParser):
    """Per <section id=...>, and per <div id=...> inside one (a section's parts): its heading
    (h2 or h3), its text, the alt text of its images, its tables (rows of cell texts), the text
    of its <pre> blocks."""

    def __init__(self, page: str):
        super().__init__()
        self.sections, self.open, self.where = {}, [], None
        self.feed(page)

    @property
    def inner(self):
        return next((c for c in reversed(self.open) if c is not None), None)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("section", "div"):
            part = None
            if attrs.get("id"):
                part = {"heading": "", "text": "", "images": [], "tables": [], "pre": []}
                self.sections[attrs["id"]] = part
            self.open.append(part)
        elif self.inner is None:
            return
        elif tag in ("h2", "h3"):
            self.where = "heading"
        elif tag == "pre":
            self.inner["pre"].append("")
            self.where = "pre"
        elif tag == "img":
            self.inner["images"].append(attrs["alt"])
        elif tag == "table":
            self.inner["tables"].append([])
        elif tag == "tr":
            self.inner["tables"][-1].append([])
        elif tag in ("td", "th"):
            self.inner["tables"][-1][-1].append("")
            self.where = "cell"

    def handle_endtag(self, tag):
        if tag in ("section", "div"):
            self.open.pop()
        if tag in ("h2", "h3", "td", "th", "pre"):
            self.where = None

    def handle_data(self, data):
        for part in filter(None, self.open):
            part["text"] += data
        if self.where == "heading":
            self.inner["heading"] += data
        elif self.where == "cell":
            self.inner["tables"][-1][-1][-1] += data
        elif self.where == "pre":
            self.inner["pre"][-1] += data


def column(table: list[list[str]], name: str) -> dict[str, str]:
    """First cell of each row -> the cell under header ``name``."""
    at = table[0].index(name)
    return {row[0]: row[at] for row in table[1:]}


def timing_rows(run: str, group: str, repeat: int, iter_p50: float) -> list[dict]:
    return [
        {
            "run": run,
            "group": group,
            "repeat": repeat,
            "attempt": 0,
            "rank": 0,
            "window": i,
            "step": 10 * (i + 1),
            "global_batch": 16,
            "iter_ms_p50": iter_p50,
            "iter_ms_p90": 1.1 * iter_p50,
            "iter_ms_mean": iter_p50,
            "data_ms_p50": 0.05,  # a prefetched batch: the floored ratio is below 1
            "data_ms_p90": 0.3,
            "data_ms_mean": 0.1,
            "step_ms_p50": iter_p50,
            "step_ms_p90": iter_p50,
            "samples_per_s": 16_000.0 / iter_p50,
            "audio_s_per_s": 32_000.0 / iter_p50,  # 2 s per sample
            "mfu": 0.25,
            "peak_mem_gib": 3.5,
            "loss": 2.8 - 0.1 * i,
            "startup_s": 5.0,
            "window_end_ts": T0 + 10.0 * i,  # one step per second
        }
        for i in range(4)
    ]


def host_rows(run: str, mb_per_step: float, every_s: float) -> list[dict]:
    """Trainer RSS growing ``mb_per_step`` per step, sampled every ``every_s`` seconds."""
    return [
        {"run": run, "node": "n0", "ts": ts, "trainer_rss_mib": 1000.0 + mb_per_step * ts}
        for ts in [T0 + k * every_s for k in range(int(30 / every_s) + 1)]
    ]


def gpu_rows(run: str) -> list[dict]:
    return [
        {
            "run": run,
            "node": "n0",
            "rank": 0,
            "gpu_index": 0,
            "ts": T0 + k,
            "mem_used_mib": 2000.0,
            "util_gpu_pct": 90.0,
            "power_w": 300.0,
            "sm_clock_mhz": 1900.0,
            "temp_c": None,  # this GPU reported no temperature: the page must not promise one
            "throttle_reasons": None,
        }
        for k in range(31)
    ]


@pytest.fixture
def sweep(tmp_path) -> OutputRoot:
    """An output root with real Parquet files: 8 ok runs in 3 groups; host RSS of steady_r1
    leaks, of steady_r2 is flat, of every other run has one sample after warm-up; GPU memory of
    every run is flat and well sampled."""
    root = OutputRoot(tmp_path / "smoke_20261125-120000")
    manifest, timing, host, gpu = [], [], [], []
    for group, (micro_batch, p50s) in GROUPS.items():
        for repeat, p50 in enumerate(p50s, start=1):
            run = f"{group}_r{repeat}"
            manifest.append(
                {"run": run, "group": group, "repeat": repeat, "status": "ok"}
                | {"tail_timing_points": 2, "use_gpu": True}
            )
            timing += timing_rows(run, group, repeat, p50)
            slope, every = {"steady_r1": (1.0, 1.0), "steady_r2": (0.0, 1.0)}.get(run, (0, 20))
            host += host_rows(run, slope, every)
            gpu += gpu_rows(run)
            swept = {"micro_batch": micro_batch}
            record = {"space": "smoke", "run": run, "swept": swept, "config": swept}
            results.write_json(root / "runs" / run / "config.json", record)
    results.write_tsv(root / results.MANIFEST, manifest, list(manifest[0]))
    for name, rows, schema in (
        (results.TIMING_DIR, timing, results.TIMING_SCHEMA),
        (results.HOST_TELEMETRY_DIR, host, results.HOST_TELEMETRY_SCHEMA),
        (results.GPU_TELEMETRY_DIR, gpu, results.GPU_TELEMETRY_SCHEMA),
    ):
        results.write_part(root / name, "part-00000", rows, schema)
    analyze(root)
    return root


def report(root: OutputRoot) -> dict:
    return Page(write_report(root).read_text()).sections


class Out:
    def __init__(self, returncode: int, stdout: str):
        self.returncode, self.stdout = returncode, stdout


def run_check(capsys, cli, *args) -> Out:
    """The check's ``main`` on ``args`` as its command line: exit code and output."""
    capsys.readouterr()
    code = cli.main([str(a) for a in args])
    return Out(code, capsys.readouterr().out)


def cli_words(stdout: str) -> dict[str, str]:
    """The verdict of each named group or run in a check's output (its limits line left out)."""
    words = "PASS|FAIL|NOT ENOUGH REPEATS|OK|LEAK|NOT JUDGED"
    return {name: word for word, name in re.findall(rf"^({words}) (\S+):", stdout, re.M)}


def test_stability_verdicts_are_the_commands_under_the_limits_the_folder_states(sweep, capsys):
    page = report(sweep)["stability-check"]
    out = run_check(capsys, stability_cli, "--output-root", sweep)
    assert out.returncode == 1
    assert cli_words(out.stdout) == {
        "steady": "PASS",
        "twice": "NOT ENOUGH REPEATS",  # nothing over a limit: not unstable
        "shaky": "FAIL",
    }
    (table,) = page["tables"]
    assert column(table, "verdict") == cli_words(out.stdout)
    assert "twice: 2 ok runs" in out.stdout and "(2 ok runs < 3)" in out.stdout
    assert column(table, "why")["shaky"].startswith("iter p50 CV 0.5 > 0.05")
    assert "at least 3 ok runs" in page["text"]  # the limits it judged by are on the page
    flags = out.stdout.splitlines()[-1].removeprefix("limits: ")
    assert f"python -m platform.stability --output-root {sweep} {flags}" in page["text"]

    # The folder's own log, run with --min-repeats 2: the page judges by its limits and agrees.
    two = run_check(capsys, stability_cli, "--output-root", sweep, "--min-repeats", "2")
    (sweep / "stability.log").write_text(two.stdout)
    page = report(sweep)["stability-check"]
    assert column(page["tables"][0], "verdict") == cli_words(two.stdout)
    assert cli_words(two.stdout)["twice"] == "PASS"
    assert "limits of this folder's stability.log: at least 2 ok runs" in page["text"]
    assert "says the same, line for line" in page["text"]


def test_leak_verdicts_are_the_commands_and_too_few_samples_are_not_judged(sweep, capsys):
    out = run_check(capsys, leak_cli, sweep)
    assert out.returncode == 1
    words = cli_words(out.stdout)
    assert words["steady_r1"] == "LEAK" and words["steady_r2"] == "OK"
    # Flat, well-sampled GPU memory does not make a run OK whose host memory nobody judged.
    not_judged = [r for r in words if r not in ("steady_r1", "steady_r2")]
    assert {words[r] for r in not_judged} == {"NOT JUDGED"}
    assert "host RSS not judged (too few samples: 1 after warm-up, 5 needed)" in out.stdout
    page = report(sweep)["leak-check"]
    (lines,) = page["pre"]
    assert lines.splitlines() == out.stdout.splitlines()[:-1]  # the command's lines, as printed
    assert "host RSS +1000.0 MB per 1,000 steps (23 samples)" in lines  # steady_r1
    # Under the limits of the folder's leak.log (a host limit above the leak): OK, as the log.
    lenient = run_check(capsys, leak_cli, sweep, "--max-host-mb-per-1k-steps", "2000")
    (sweep / "leak.log").write_text(lenient.stdout)
    page = report(sweep)["leak-check"]
    assert cli_words(page["pre"][0]) == cli_words(lenient.stdout)
    assert cli_words(lenient.stdout)["steady_r1"] == "OK"
    assert "host RSS (summed over nodes) ≤ 2000" in page["text"]
    assert "says the same, line for line" in page["text"]


def test_each_heading_names_what_its_section_drew(sweep):
    sections = report(sweep)
    assert [k for k in sections if not k.endswith("-check")] == [key for key, _ in SECTIONS]
    for key, found in sections.items():
        for alt in found["images"]:
            assert alt in found["heading"] or found["heading"] in alt, key
    iteration, gpu = sections["iteration"], sections["gpu"]
    assert "p50 (solid) and p90 (dashed)" in iteration["heading"]
    # No temperature and no throttle reasons in these NVML rows: neither is promised.
    assert gpu["heading"] == "GPU: utilisation, power, SM clock"
    assert "throttle_reasons" not in gpu["text"]
    assert "Training loss over steps" in sections["loss"]["heading"] and sections["loss"]["images"]
    # The floored data ratio is named for what it is, and explained.
    data = sections["data"]
    header = data["tables"][0][0]
    assert "data p90 / max(p50, 1 ms)" in header and "data_p90_over_p50" not in header
    assert column(data["tables"][0], "data p90 / max(p50, 1 ms)")["steady_r1"] == "0.300"
    assert "Below 1 it means the data p90 itself is under 1 ms" in data["text"]


def test_the_ranking_has_the_swept_values_mfu_and_peak_memory_and_a_panel_per_key(sweep):
    sections = report(sweep)
    (table, *_) = sections["ranking"]["tables"]
    assert table[0][:3] == ["rank", "group", "micro_batch"]
    by_group = {row[1]: dict(zip(table[0], row, strict=True)) for row in table[1:]}
    assert {g: r["micro_batch"] for g, r in by_group.items()} == {
        "shaky": "4",
        "twice": "8",
        "steady": "16",
    }
    assert {r["MFU %"] for r in by_group.values()} == {"25.00"}
    # Audio seconds per second beside samples/s (batching duration trades one for the other).
    samples = table[0].index("tail samples/s (robust)")
    assert table[0][samples + 1] == "tail audio s/s"
    # The mean over the group's ok runs (samples/s beside it is the robust mean): 2 s a sample.
    assert by_group["steady"]["tail audio s/s"] == "320.00"
    assert by_group["twice"]["tail audio s/s"] == "640.00"
    assert {r["peak GiB"] for r in by_group.values()} == {"3.50"}
    sweep_panel = sections["sweep"]
    assert sweep_panel["heading"] == "Tail samples/s against each swept key (micro_batch)"
    assert sweep_panel["images"] == [sweep_panel["heading"]]


def test_the_committed_2xh200_folder_agrees_with_its_own_logs(tmp_path):
    import shutil

    folder = OutputRoot(tmp_path / "analysis_2xh200")
    shutil.copytree(H200, folder)
    sections = report(folder)
    stability = sections["stability-check"]
    # The log was run with --min-repeats 2: the page says PASS for mb160, as the log does.
    words = cli_words((H200 / "stability.log").read_text())
    assert words == {"sweep_z0_mb96_nw8_pf4": "FAIL", "sweep_z0_mb160_nw8_pf4": "PASS"}
    assert column(stability["tables"][0], "verdict") == words
    assert "says the same, line for line" in stability["text"]
    # No rows here: the leak section is the folder's leak.log, which judged no host memory.
    leak = sections["leak-check"]
    assert leak["heading"] == "Memory leaks (this folder's leak.log)"
    assert set(cli_words((H200 / "leak.log").read_text()).values()) == {"NOT JUDGED"}
    assert leak["pre"] == [(H200 / "leak.log").read_text().rstrip("\n")]
    assert "OK" not in cli_words(leak["pre"][0]).values()
    # Saved plots under their own headings: p50 only; utilisation and power only.
    assert "p90" not in sections["iteration"]["heading"]
    assert sections["gpu"]["heading"] == "GPU: utilisation and power (the folder's plot)"
    assert "not a verdict" in sections["host"]["text"]
    assert "dashed line at 1.2 is the straggler limit" in sections["skew"]["text"]
    best = json.loads((H200 / "best_config.json").read_text())
    assert best["command"].startswith("python -m platform.train --config ")
    assert "python -m platform.train" in sections["environment"]["text"]


@pytest.mark.parametrize(
    "limits",
    [
        StabilityLimits(min_repeats=2, max_iter_p50_cv=0.1),
        # :g wrote 1000000 as 1e+06 (not an int: the line was dropped) and kept 6 digits.
        StabilityLimits(
            min_repeats=1_000_000,
            max_iter_ratio_median=1.0000001,
            max_iter_ratio_max=1e6,
            max_iter_p50_cv=2.5e-7,
        ),
        LeakLimits(max_host_mb_per_1k_steps=1234567.891, max_gpu_mb_per_1k_steps=1e20),
        LeakLimits(skip_fraction=0.1 + 0.2),
    ],
)
def test_every_limit_written_reads_back_equal(tmp_path, limits):
    log = tmp_path / "check.log"
    log.write_text("PASS g: ...\n" + flags_line(limits) + "\n")
    assert logged_limits(type(limits), log) == limits


def test_limits_lines_read_back_and_an_unreadable_line_is_said_on_the_page(sweep):
    limits = StabilityLimits(min_repeats=2, max_iter_p50_cv=0.1)
    assert flags_line(limits) == (
        "limits: --min-repeats 2 --max-iter-ratio-median 1.5 --max-iter-ratio-max 2.5 "
        "--max-iter-p50-cv 0.1"
    )
    log = sweep / "stability.log"
    assert logged_limits(StabilityLimits, log) is None  # no log
    log.write_text("PASS g: ...\n")
    assert logged_limits(StabilityLimits, log) is None  # a log from before the limits line
    assert "states no limits" in folder_limits(sweep)[1]
    for bad, why in (
        ("limits: --min-repeats", "a flag without its value"),
        ("limits: --nope 3", "--nope is not one of the check's flags"),
        ("limits: --min-repeats 1e+06", "--min-repeats 1e+06 is not a number"),
        ("limits: --min-repeats 0", "--min-repeats must be >= 1"),
    ):
        log.write_text(bad + "\n")
        with pytest.raises(UnreadableLimits, match=re.escape(why)):
            logged_limits(StabilityLimits, log)
    # The page judges by the defaults then, and says that it could not read the log's limits.
    page = report(sweep)["stability-check"]
    assert "not this folder's stability.log: its limits line cannot be read" in page["text"]
    assert "at least 3 ok runs" in page["text"]
    assert math.isclose(StabilityLimits().max_iter_p50_cv, 0.05)


def test_the_page_gives_each_group_one_stability_verdict_everywhere(tmp_path):
    """The ranking's flag and the Phase B check answer different questions: the ranking shows
    both under their own names (mb96 is FAIL by its CV, and not jittery), and the throughput
    plot is coloured by the verdict the stability part gives. The page once said "unstable"
    for the flag (mb96: False, blue) and "FAIL: unstable" for the check (mb96: FAIL)."""
    import shutil

    folder = OutputRoot(tmp_path / "analysis_2xh200")
    shutil.copytree(H200, folder)
    sections = report(folder)
    ranking = sections["ranking"]["tables"][0]
    stability = column(sections["stability-check"]["tables"][0], "verdict")
    by_group = {row[1]: dict(zip(ranking[0], row, strict=True)) for row in ranking[1:]}
    assert {g: r["Phase B"] for g, r in by_group.items()} == stability
    assert stability["sweep_z0_mb96_nw8_pf4"] == "FAIL"
    assert {r["jittery"] for r in by_group.values()} == {"no"}
    assert "unstable" not in ranking[0]
    assert "jittery: the ranking's own flag" in sections["ranking"]["text"]
    assert (
        "tail iter p90/p50 above 1.5 in most of the group's ok runs"
        in (sections["ranking"]["text"])
    )
    throughput = sections["throughput"]
    assert throughput["heading"].endswith("coloured by the Phase B verdict")
    assert "Colour: the group's Phase B verdict" in throughput["text"]
    # FAIL says which figure is over which limit; "unstable" names neither.
    text = sections["stability-check"]["text"]
    assert "FAIL: a figure above its limit (the why column names the figure" in text
    assert "unstable" not in text
    assert column(sections["stability-check"]["tables"][0], "why")["sweep_z0_mb96_nw8_pf4"] == (
        "iter p50 CV 0.05318 > 0.05"
    )


def test_the_loss_chance_line_is_ln_of_the_candidates_not_of_the_global_batch(tmp_path):
    """With gradient accumulation the global batch counts samples a step adds, not the
    candidates a sample's loss scores against: micro_batch x world (global scope), or
    micro_batch (local). One dotted line per distinct number, each said in the note."""
    import pandas as pd

    from platform.analysis.report import plots as report_plots

    root = OutputRoot(tmp_path / "accum")
    runs = {  # run -> (micro_batch, grad_accum_steps, contrastive_scope)
        "global_r1": (8, 4, "global"),
        "local_r1": (8, 4, "local"),
        "plain_r1": (16, 1, "global"),
    }
    rows = []
    for run, (micro, accum, scope) in runs.items():
        config = {"micro_batch": micro, "grad_accum_steps": accum, "contrastive_scope": scope}
        results.write_json(root.run_folder(run).config, {"run": run, "config": config})
        for row in timing_rows(run, "g", 1, 100.0):
            rows.append(row | {"world_size": 2, "global_batch": micro * 2 * accum})
    data = {"root": root, "timing": pd.DataFrame(rows), "manifest": pd.DataFrame()}
    assert report_plots.candidates(data, data["timing"]) == {
        "global_r1": (16, "micro_batch 8 x 2 ranks, global scope"),  # not ln(64)
        "local_r1": (8, "micro_batch 8, local scope"),
        "plain_r1": (32, "micro_batch 16 x 2 ranks, global scope"),
    }
    heading, body = report_plots.loss(data)
    assert "ln(8) = 2.08 (micro_batch 8, local scope)" in body
    assert "ln(16) = 2.77 (micro_batch 8 x 2 ranks, global scope)" in body
    assert "ln(32) = 3.47" in body and "ln(64)" not in body
    # Rows of a version without world_size: the world from global_batch / (micro x accum);
    # a run with no micro_batch anywhere gets no line, and the note says so.
    old = data["timing"].assign(world_size=None)
    results.write_json(root.run_folder("plain_r1").config, {"run": "plain_r1", "config": {}})
    found = report_plots.candidates(data | {"timing": old}, old)
    assert found["global_r1"] == (16, "micro_batch 8 x 2 ranks, global scope")
    assert found["plain_r1"] is None
    assert "No chance line for plain_r1" in report_plots.loss(data | {"timing": old})[1]
