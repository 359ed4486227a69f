"""The analysis notebooks run headless: on a sweep-shaped output root with every input (their
leak verdicts as platform.leak's), and through notebooks/README.md's command on a copy of the
committed result their saved outputs come from."""

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from platform.analysis.verdicts.leak import MIN_SAMPLES, LeakLimits, leak_figures

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ("sweep_analysis.ipynb", "stability_and_leak.ipynb")

# run -> (world size, samples/s, host RSS growth in MiB per step, host samples per second)
RUNS = {
    "sweep_ws2_r1": (2, 200.0, 0.2, 2.0),  # +200 MB per 1,000 steps: a leak
    "sweep_ws2_r2": (2, 220.0, 0.0, 2.0),  # flat: OK
    "sweep_ws4_r1": (4, 400.0, 0.0, 0.05),  # one sample in 20 s: not judged
}
STEPS = range(10, 130, 10)  # 12 windows of 10 steps, 1 s each


def write_parquet(df: pd.DataFrame, folder: Path) -> None:
    folder.mkdir()
    df.to_parquet(folder / "part-0.parquet")


def sweep_root(root: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """An output root as a sweep writes it: manifest, timing of two ranks with rank skew, GPU
    and host telemetry."""
    root.mkdir()
    manifest, timing, host, gpu = [], [], [], []
    for i, (run, (world, samples_per_s, growth, rate)) in enumerate(RUNS.items()):
        group, t0 = run.rsplit("_", 1)[0], 1000.0 * (i + 1)
        manifest.append({"run": run, "group": group, "status": "ok", "tail_timing_points": 3})
        for window, step in enumerate(STEPS):
            for rank in (0, 1):
                timing.append(
                    {"run": run, "group": group, "rank": rank, "window": window, "step": step}
                    | {"world_size": world, "samples_per_s": samples_per_s, "rank_skew": 1.1}
                    | {"iter_ms_p50": 100.0, "iter_ms_p90": 120.0, "window_end_ts": t0 + step / 10}
                )
        for ts in np.arange(t0, t0 + 13, 1 / rate):
            step = (ts - t0) * 10
            host.append(
                {"run": run, "node": "n1", "ts": ts, "trainer_rss_mib": 900 + growth * step}
            )
            gpu.append({"run": run, "rank": 0, "ts": ts, "util_gpu_pct": 90.0, "power_w": 300.0})
    pd.DataFrame(manifest).to_csv(root / "run_manifest.tsv", sep="\t", index=False)
    timing, host = pd.DataFrame(timing), pd.DataFrame(host)
    write_parquet(timing, root / "timing.parquet")
    write_parquet(host, root / "host_telemetry.parquet")
    write_parquet(pd.DataFrame(gpu), root / "gpu_telemetry.parquet")
    return timing, host


def execute(name: str, output_root: Path) -> str:
    """Runs notebooks/NAME on OUTPUT_ROOT; the text of its outputs."""
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    (params,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    params.source = f"OUTPUT_ROOT = {str(output_root)!r}"
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    return outputs_text(nb)


def outputs_text(nb) -> str:
    """The text a reader sees. A cell's printing may reach the notebook as one stream output or
    as several (the kernel flushes stdout on a timer, so a slow machine splits it): consecutive
    stream outputs of one name are one text, as Jupyter shows them."""
    parts, last_stream = [], None
    for cell in nb.cells:
        last_stream = None
        for out in cell.get("outputs", []):
            assert out["output_type"] != "error", out
            if out["output_type"] == "stream" and out["name"] == last_stream:
                parts[-1] += out["text"]
                continue
            last_stream = out["name"] if out["output_type"] == "stream" else None
            parts.append(out.get("text", "") + out.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def printed(*cells: list[tuple[str, str]]):
    """A notebook whose code cells printed these (stream, text) outputs, in order."""
    out, cell = nbformat.v4.new_output, nbformat.v4.new_code_cell
    return nbformat.v4.new_notebook(
        cells=[cell(outputs=[out("stream", name=n, text=t) for n, t in c]) for c in cells]
    )


def test_a_print_split_by_the_kernel_reads_as_one_text():
    err, next_cell = ("stderr", "warn\n"), [("stdout", "next\n")]
    split = printed(
        [("stdout", "limits\n"), ("stdout", "OK\n"), err, ("stdout", "LEAK\n")], next_cell
    )
    whole = printed([("stdout", "limits\nOK\n"), err, ("stdout", "LEAK\n")], next_cell)
    assert outputs_text(split) == outputs_text(whole) == "limits\nOK\n\nwarn\n\nLEAK\n\nnext\n"


def test_the_notebooks_draw_every_plot_and_judge_leaks_as_the_leak_check(tmp_path):
    timing, host = sweep_root(tmp_path / "sweep")
    sweep = execute("sweep_analysis.ipynb", tmp_path / "sweep")
    stability = execute("stability_and_leak.ipynb", tmp_path / "sweep")

    plots = {p.name for p in (tmp_path / "sweep" / "plots").iterdir()}
    assert plots == {
        "throughput_per_group.png",
        "iter_ms_over_steps.png",
        "iter_p90_over_p50.png",
        "gpu_util_power.png",
        "scaling.png",
        "rank_skew.png",
        "host_rss_over_steps.png",
    }
    # Best tail samples/s per GPU: 220 / 2 against 400 / 4.
    assert "scaling efficiency: {2: 1.0, 4: 0.909}" in sweep
    assert "skipped" not in sweep
    assert "rank skew in 36 windows of 3 runs" in stability
    # The host half of platform.leak's verdict, from its own figures of the same rows.
    limits, no_gpu = LeakLimits(), pd.DataFrame(columns=["node", "gpu_index", "ts", "mem_used_mib"])
    for run in RUNS:
        f = leak_figures(timing[timing["run"] == run], host[host["run"] == run], no_gpu)
        if f["host_samples"] < MIN_SAMPLES:
            assert math.isnan(f["host_mb_per_1k_steps"])
            line = f"NOT JUDGED {run}: host RSS not judged (too few samples: {f['host_samples']} "
        else:
            slope = round(f["host_mb_per_1k_steps"], 1) + 0.0
            word = "LEAK" if slope > limits.max_host_mb_per_1k_steps else "OK"
            line = f"{word} {run}: host RSS {slope:+.1f} MB per 1,000 steps ({f['host_samples']} "
        assert line in stability
    assert "LEAK sweep_ws2_r1: host RSS +200.0 MB per 1,000 steps" in stability
    assert "OK sweep_ws2_r2: host RSS +0.0 MB per 1,000 steps" in stability
    assert "NOT JUDGED sweep_ws4_r1" in stability


def images(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def readme_command() -> str:
    text = (ROOT / "notebooks" / "README.md").read_text()
    (block,) = [b.split("```", 1)[0] for b in text.split("```bash\n")[1:]]
    return block.strip()


def committed_output_root(name: str) -> str:
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    (params,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    scope: dict = {}
    exec(params.source, scope)
    return scope["OUTPUT_ROOT"]


def test_the_readme_command_reproduces_the_committed_outputs(tmp_path):
    """The documented headless command, as written, in a copy of the repository's notebooks and
    the committed result they name: it runs, draws that result's plots, and prints what the
    committed notebooks hold."""
    result = committed_output_root(NOTEBOOKS[0])
    assert result == committed_output_root(NOTEBOOKS[1])
    assert not Path(result).is_absolute() and (ROOT / result / "run_manifest.tsv").is_file()
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    shutil.copytree(ROOT / result, tmp_path / result, ignore=shutil.ignore_patterns("plots"))

    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(
        ["bash", "-c", readme_command()], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    # The figures go outside the committed result (issue 43 item 11: it rewrote a committed PNG).
    assert not (tmp_path / result / "plots").exists()
    drawn = {p.name for p in (tmp_path / "outputs" / "notebooks" / "plots").iterdir()}
    assert drawn == {p.name for p in (ROOT / result / "plots").iterdir()}
    assert {"throughput_per_group.png", "iter_ms_over_steps.png"} <= drawn
    for name in NOTEBOOKS:
        executed = nbformat.read(tmp_path / "outputs" / "notebooks" / name, as_version=4)
        committed = nbformat.read(ROOT / "notebooks" / name, as_version=4)
        assert all(c.execution_count for c in committed.cells if c.cell_type == "code")
        assert outputs_text(executed) == outputs_text(committed)
        assert images(executed) == images(committed)


def test_a_wrong_output_root_is_one_clear_error(tmp_path):
    setups = [
        nbformat.read(ROOT / "notebooks" / n, as_version=4).cells[2].source for n in NOTEBOOKS
    ]
    assert setups[0] == setups[1] and "OUTPUT_ROOT" in setups[0]  # one check serves both
    with pytest.raises(CellExecutionError, match="has no run_manifest.tsv: set OUTPUT_ROOT"):
        execute(NOTEBOOKS[0], tmp_path / "nothing")
