"""A worker's big imports with Python's collector running and paused
(trainables/observe/gc_control.py: ``collector_paused``), side by side: each variant in a new
process, alternating, ``--repeats`` times. A process imports torch, Ray Train and the model code
(trainables/observe/startup.py: ``import_model_code``) as a train worker does, then one full
collection (what a pause put off is counted); prints the medians and their ratio.

    python -m benchmarks.probes.import_collector --repeats 5 \\
        --json benchmarks/results/import_collector_cpu2.json
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from stage1_common.fileio import write_json

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import time
t0 = time.perf_counter()
if {paused}:
    from trainables.observe.gc_control import collector_paused
else:
    from contextlib import nullcontext as collector_paused
with collector_paused():
    import torch
    import ray.train
from trainables.observe.startup import import_model_code
if {paused}:
    import_model_code()
else:
    import transformers.models.bert.modeling_bert
    import transformers.models.wav2vec2.modeling_wav2vec2
import gc
gc.collect()  # the collections the pause put off count too
print(time.perf_counter() - t0)
"""


def one(paused: bool) -> float:
    """Seconds one new process took for the imports."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(paused=paused)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    one(True)  # the first import of a checkout writes bytecode: not timed
    runs: dict[str, list[float]] = {"running": [], "paused": []}
    for i in range(args.repeats):
        for variant in ("running", "paused"):
            runs[variant].append(round(one(variant == "paused"), 3))
            print(f"repeat {i + 1} {variant:8s} {runs[variant][-1]:.2f} s", flush=True)
    medians = {k: statistics.median(v) for k, v in runs.items()}
    ratio = medians["paused"] / medians["running"]
    print(
        f"imports: collector running {medians['running']:.2f} s, paused "
        f"{medians['paused']:.2f} s, paused/running {ratio:.3f}"
    )
    if args.json:
        command = "python -m benchmarks.probes.import_collector " + " ".join(sys.argv[1:])
        write_json(
            args.json, {"command": command, "runs": runs, "medians": medians, "ratio": ratio}
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
