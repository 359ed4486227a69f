"""The sweep's answer in words (platform/analysis/answer.py): report.html opens with one verdict
line (the winner, its x baseline, how sure and what would make it surer, the training
command), the page carries summary.md's noise line, integer config values show as integers,
and the console's ranking explains its ``*``. Output roots by hand, no Ray."""

import html
import json
import re

import pytest

from platform.analysis.analyze import analyze, format_ranked
from platform.analysis.report.page import write_report
from platform.storage import results
from stage1_common.output_root import OutputRoot
from tests.test_stats import manifest, windows

# group -> (tail samples/s of each run, swept values); "c" is the baseline and sweeps no
# zero_stage (a DDP group beside ZeRO ones), so that column has a hole in it.
SWEPT = {
    "a": {"zero_stage": 0, "micro_batch": 16},
    "b": {"zero_stage": 1, "micro_batch": 16},
    "c": {"micro_batch": 8, "strategy": "ddp"},
}
CASES = {
    # a and b: b's interval against a reaches 1 (two runs each, 10 samples/s apart per run)
    "within noise": {"a": [200.0, 220.0], "b": [195.0, 215.0], "c": [100.0, 101.0]},
    # a and b: tight intervals far apart
    "clearly ahead": {"a": [300.0, 301.0], "b": [200.0, 201.0], "c": [100.0, 101.0]},
    # 2x H200, issue 56's sweep: 8 % apart, each group's repeats within 1 %. The t intervals
    # over 2 runs (1 degree of freedom) overlap; the resampled interval does not reach 1.
    "apart, t intervals overlap": {
        "a": [6515.2, 6546.4],
        "b": [6067.7, 6004.5],
        "c": [1628.6, 1541.3],
    },
    # one run per group: no interval
    "one run each": {"a": [210.0], "b": [200.0], "c": [100.0]},
}


def make_root(tmp_path, speeds, *, jittery=(), failed=False):
    """An output root of ok runs (every run ``failed`` instead when asked); a run of a group in
    ``jittery`` has tail iter p90/p50 2.0."""
    root = OutputRoot(tmp_path / "smoke_20261201-120000")
    rows, parts = [], []
    for group, sps in speeds.items():
        for i, s in enumerate(sps, start=1):
            run = f"{group}_r{i}"
            rows.append((run, group, i, "failed" if failed else "ok"))
            p90 = 20.0 if group in jittery else 11.0
            part = windows(run, [10, 10, 10], [p90] * 3, sps=[1.0, s, s])
            for row in part:
                row.update(group=group, repeat=i)
            parts.append((run, part))
            swept = SWEPT.get(group, {"micro_batch": 4})
            record = {"space": "smoke", "run": run, "swept": swept, "config": {**swept}}
            record["baseline"] = group == "c"
            results.write_json(root / "runs" / run / "config.json", record)
    m = manifest(*rows)
    m["failure_reason"] = "rank 0: RuntimeError: boom" if failed else ""
    results.write_tsv(root / results.MANIFEST, m.to_dict("records"), list(m.columns))
    for run, part in parts if not failed else []:
        results.write_part(root / results.TIMING_DIR, f"{run}-00000", part, results.TIMING_SCHEMA)
    return root


def page_of(root):
    analyze(root)
    return write_report(root).read_text()


def verdict_of(page: str) -> str:
    """The verdict paragraph as text; it opens the page, right under the title."""
    at = page.index('<p class="verdict">')
    assert at == page.index("</h1>") + len("</h1>")
    paragraph = page[at : page.index("</p>", at)]
    return html.unescape(re.sub(r"<[^>]+>", "", paragraph))


def text_of(page: str, section: str) -> str:
    body = page[page.index(f'<section id="{section}">') :]
    return html.unescape(re.sub(r"<[^>]+>", " ", body[: body.index("</section>")]))


@pytest.mark.parametrize("case", list(CASES))
def test_the_page_opens_with_the_verdict_and_carries_the_noise_line(tmp_path, case):
    root = make_root(tmp_path, CASES[case])
    page = page_of(root)
    line = verdict_of(page)
    train = f"python -m platform.train --config {root / 'best_config.json'}"
    retest = f"python -m platform.tune --space smoke --from-ranked {root} --top 2 --repeats"
    assert line.startswith("Verdict: a wins with ")
    assert line.rstrip(".").endswith(f"train it with {train}")
    mean_a, mean_c = (sum(CASES[case][g]) / len(CASES[case][g]) for g in "ac")
    assert f"{mean_a / mean_c:.2f}x the baseline (c)" in line
    sure = json.loads((root / "summary.json").read_text())["confidence"]
    within = (
        "The top two groups are within noise of each other (the runner-up's 95 % interval "
        "against the winner, runs and windows resampled, reaches 1)."
    )
    apart = (
        "The top two groups are apart beyond noise (the runner-up's 95 % interval against the "
        "winner, runs and windows resampled, stays below 1)."
    )
    if case == "within noise":
        assert re.search(
            r"within noise of b \(.*its 95 % interval against the winner "
            r"0\.\d{3}-1\.\d{3}x reaches 1\)",
            line,
        ), line
        assert "more repeats of the two, or more steps per run" in line and retest in line
        assert sure["within_noise"] == ["b"]  # the "How sure" line says the same
        noise = within
    elif case.startswith("apart") or case == "clearly ahead":
        gap = "49.9" if case == "clearly ahead" else "8.2"
        assert re.search(
            rf"clearly ahead of b \({gap} % faster; its 95 % interval against "
            r"the winner 0\.\d{3}-0\.\d{3}x, 2 and 2 ok runs\)",
            line,
        ), line
        assert retest not in line and sure["within_noise"] == []
        noise = apart
    else:
        assert "how sure cannot be told with one ok run per group" in line
        assert "(5.0 % faster than b)" in line
        assert "run 2 or more repeats of the top two" in line and f"{retest} 3" in line
        noise = "Noise between the top two cannot be told: run 2 or more repeats per group."
    # summary.md's own noise line, on the page under the ranking.
    assert noise in (root / "summary.md").read_text()
    assert noise in " ".join(text_of(page, "ranking").split())


def test_with_no_winner_the_verdict_says_so(tmp_path):
    root = make_root(tmp_path, {"a": [1.0], "b": [1.0]}, failed=True)
    line = verdict_of(page_of(root))
    assert line.startswith("Verdict: no winner: no run finished ok (failed 2)")
    assert "Failed runs" in line and "train it" not in line


def test_integer_config_values_show_as_integers(tmp_path):
    root = make_root(tmp_path, CASES["clearly ahead"])
    ranking = text_of(page_of(root), "ranking")
    header = ranking.split("rank")[1]
    assert "zero_stage" in header and "micro_batch" in header
    rows = {g: re.search(rf"\b\d\s+{g}\s+(.*)", ranking).group(1).split() for g in "abc"}
    assert rows["a"][:2] == ["0", "16"] and rows["b"][:2] == ["1", "16"]
    assert rows["c"][:2] == ["-", "8"]  # no zero_stage swept: a dash, not nan
    assert "0.00" not in ranking.split("ok runs")[0] and "1.00 16" not in ranking


def test_the_console_ranking_explains_its_star(tmp_path):
    # j is twice as fast as a but jittery: it ranks after a, and the legend says why.
    root = make_root(tmp_path, {"a": [200.0, 201.0], "j": [400.0, 401.0]}, jittery=("j",))
    summary = analyze(root)
    table = format_ranked(summary["ranking"], summary["unstable_ratio"]).splitlines()
    assert [line.split()[1] for line in table[2:4]] == ["a", "j"]
    assert table[3].rstrip().endswith("*") and not table[2].rstrip().endswith("*")
    legend = " ".join(table[4:])
    assert legend.startswith("* jittery: tail iter p90/p50 above 1.5 in most of its ok runs")
    assert "ranked after every steady group whatever its samples/s" in legend
    assert "rank 1 (best_config.json) is the fastest steady group" in legend
    assert "ahead of j only because j is jittery (99.8 % faster)" in verdict_of(page_of(root))
    # Without a jittery group there is no * and no legend.
    steady = format_ranked(analyze(make_root(tmp_path / "s", CASES["clearly ahead"]))["ranking"])
    assert "*" not in steady


def test_plots_are_drawn_for_the_full_page_width(tmp_path):
    """Plots were 720 px or less on a 1,100 px page, their legends 7 px high."""
    import base64
    import struct

    page = page_of(make_root(tmp_path, CASES["within noise"]))
    assert "img.plot{width:100%}" in page
    images = re.findall(r'<img class="plot" alt="[^"]*" src="data:image/png;base64,([^"]+)"', page)
    assert len(images) >= 4  # throughput, per swept key, iteration, data wait
    for data in images:
        width = struct.unpack(">I", base64.b64decode(data)[16:20])[0]  # the PNG's IHDR
        assert width >= 1300, width
