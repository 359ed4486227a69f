"""Where a warm compile's seconds go, variant by variant, outside Ray (issue 40):

    python -m benchmarks.probes.compile_warm --json OUT.json \
        [--variants layers_ro,layers_default,...]

Each variant runs in fresh processes on one device: first cold (an empty cache folder of its
own family of graphs, unless a variant of the same family ran cold before), then warm (the same
folder, a new process: what a new sweep, a race or platform.train pays for a shape compiled
before). A process builds the platform's own engine (trainables.engine.build_engine: DDP on a
world of one, the 4090_mainline compiled point: base model, crop buckets 1-3 s, mb 128) and
times its compile warm-up (engine.compile.warm_up: compile_s, compile_parts and the seconds of
each pass), then two real steps per shape (anything left uncompiled or unrecorded shows there).
A variant named ..._profiled adds a cProfile of its warm-up: the functions with the most time.
On a machine without a GPU it runs the tiny model (a smoke check of the script).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# name -> (family of graphs (a cache folder of its own), config keys, inductor/dynamo knobs,
# warm-up passes per shape with CUDA graphs, cProfile of its warm-up)
_RO_KNOBS = {"skip": {"inductor.triton.skip_cudagraph_warmup": True}}
VARIANTS: dict[str, tuple[str, dict, dict, int, bool]] = {
    "layers_ro": ("layers_ro", {}, {}, 3, False),
    "layers_ro_2passes": ("layers_ro", {}, {}, 2, False),
    "layers_ro_skip_warmup": ("layers_ro", {}, _RO_KNOBS["skip"], 2, False),
    "layers_ro_no_asserts": (
        "layers_ro",
        {},
        {"inductor.triton.slow_path_cudagraph_asserts": False},
        3,
        False,
    ),
    "layers_ro_profiled": ("layers_ro", {}, {}, 3, True),
    # cudagraph trees' alias lookup by an index per recording (one pass over the path instead
    # of one per output): how much of the recording that quadratic walk is
    "layers_ro_index": ("layers_ro", {}, {"patch.alias_index": True}, 3, False),
    "layers_ro_fast": (  # the three above together (their knobs are in the graphs' cache key)
        "layers_ro_fast",
        {},
        {
            "patch.alias_index": True,
            "inductor.triton.slow_path_cudagraph_asserts": False,
            "inductor.triton.skip_cudagraph_warmup": True,
        },
        2,
        False,
    ),
    "layers_ro_split": ("layers_ro_split", {}, {"dynamo.optimize_ddp": True}, 3, False),
    "layers_ro_notrees": (  # CUDA graphs without cudagraph trees: one pool per graph
        "layers_ro_notrees",
        {},
        {"inductor.triton.cudagraph_trees": False},
        3,
        False,
    ),
    "layers_default": ("layers_default", {"compile_mode": "default"}, {}, 3, False),
    "model_ro": ("model_ro", {"compile_scope": "model"}, {}, 3, False),
    "model_default": (
        "model_default",
        {"compile_scope": "model", "compile_mode": "default"},
        {},
        3,
        False,
    ),
}
DEFAULT = (
    "layers_ro,layers_ro_2passes,layers_ro_skip_warmup,layers_ro_profiled,layers_default,model_ro"
)


def _config(overrides: dict, on_gpu: bool) -> dict:
    cfg = {
        "strategy": "ddp",
        "dataset": "manifest",  # no batch is read: the shapes' batches are made up
        "manifest_path": "unused.tsv",
        "crop_policy": "limit_longest",
        "model_size": "base" if on_gpu else "tiny",
        "micro_batch": 128 if on_gpu else 4,
        "crop_buckets_s": "1.0,1.5,2.0,2.5,3.0" if on_gpu else "1.0,1.5",
        "text_tokens": 64 if on_gpu else 8,
        "torch_compile": True,
        "compile_scope": "layers",
        "compile_mode": "reduce-overhead",
        "compile_backend": "inductor",
        "use_gpu": on_gpu,
    }
    return {**cfg, **overrides}


def _index_alias_lookup() -> None:
    """An experiment, not the platform's: cudagraph trees' ``_is_alias_of_live_recorded_tensor``
    walks every live output of the path for each output of a graph being recorded; here one
    index of the path's live storages per recording answers each output (the same first match
    in the same order: nothing on the path dies while a recording's outputs are added)."""
    from torch._inductor import cudagraph_trees as trees

    node = trees.CUDAGraphNode
    linear, add_first = node._is_alias_of_live_recorded_tensor, node._add_first_outputs

    def indexed(self, t):
        index = getattr(self, "_alias_index", None)
        if index is None:
            return linear(self, t)
        return index.get(t.untyped_storage().data_ptr())

    def add_first_outputs(self, outputs, static_ptrs):
        index: dict = {}
        for depth, refs in enumerate(self.path_weakrefs):
            for i, ref in enumerate(refs):
                if (live := trees.maybe_deref(ref)) is not None:
                    index.setdefault(live[1], (depth, i))
        self._alias_index = index
        try:
            return add_first(self, outputs, static_ptrs)
        finally:
            self._alias_index = None

    node._is_alias_of_live_recorded_tensor = indexed
    node._add_first_outputs = add_first_outputs


def _set_knobs(knobs: dict) -> None:
    import torch._dynamo.config
    import torch._inductor.config

    for path, value in knobs.items():  # "dynamo.NAME", "inductor.[GROUP.]NAME" or a patch
        if path == "patch.alias_index":
            _index_alias_lookup()
            continue
        family, _, name = path.partition(".")
        target = torch._dynamo.config if family == "dynamo" else torch._inductor.config
        for part in name.split(".")[:-1]:
            target = getattr(target, part)
        setattr(target, name.split(".")[-1], value)


def _timed_steps(engine, cfg, device) -> list[float]:
    """Seconds of the first two real steps of each shape after the warm-up (optimizer steps)."""
    import torch

    from trainables.engine.shapes import shape_batch
    from trainables.model.stage1 import contrastive_loss

    seconds = []
    for audio_n, text_n in cfg.static_shapes:
        for _ in range(2):
            t0 = time.perf_counter()
            speech, text, scale = engine(shape_batch(cfg.micro_batch, audio_n, text_n, device))
            engine.backward(contrastive_loss(speech.float(), text.float(), scale.float()))
            engine.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds.append(round(time.perf_counter() - t0, 3))
    return seconds


def _profile_top(profile, lines: int = 20) -> list[str]:
    """The functions with the most own time, then those of CUDA graphs and of the compile
    with the most time including their callees."""
    import io
    import pstats

    out = []
    for order, restrict in (("tottime", ()), ("cumulative", ("cudagraph|cuda/graphs|_inductor",))):
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats(order).print_stats(*restrict, lines)
        table = [ln for ln in text.getvalue().splitlines() if ln.strip()]
        start = next((i for i, ln in enumerate(table) if "ncalls" in ln), 0)
        out += [f"by {order}:"] + table[start:]
    return out


def child(variant: str, cache: str, profile: bool) -> dict:
    t_start = time.perf_counter()
    import torch
    import torch.distributed as dist

    from trainables.config import TrialConfig
    from trainables.engine import compile as compiling
    from trainables.engine.build import build_engine
    from trainables.observe.startup import import_model_code

    import_model_code()
    imports_s = time.perf_counter() - t_start
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    family, overrides, knobs, passes, _ = VARIANTS[variant]
    cfg = TrialConfig.from_dict(_config(overrides, on_gpu))
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    dist.init_process_group("nccl" if on_gpu else "gloo", store=store, rank=0, world_size=1)
    compiling.use_compile_cache(Path(cache), explicit=True)
    compiling.CUDAGRAPH_PASSES = passes
    t_build = time.perf_counter()
    engine = build_engine(cfg, device)
    _set_knobs(knobs)  # after the engine: compile_ddp sets optimize_ddp per run
    build_s = time.perf_counter() - t_build
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    took = engine.warm_up(cfg)
    if profiler is not None:
        profiler.disable()
    steps = _timed_steps(engine, cfg, device)
    dist.destroy_process_group()
    return {
        "variant": variant,
        "family": family,
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
        "imports_s": round(imports_s, 2),
        "build_s": round(build_s, 2),
        "compile_s": round(took.seconds, 2),
        "compile_parts": took.parts,
        "pass_s": list(took.passes),
        "compile_cache": compiling.cache_counts(),
        "fallbacks": engine.effective.get("fallbacks", ""),
        "first_steps_s": steps,
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2) if on_gpu else 0,
        "profile": _profile_top(profiler) if profiler is not None else [],
    }


def _run_child(variant: str, cache: Path, temperature: str, profile: bool, timeout: float) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.probes.compile_warm",
        "--child",
        variant,
        "--cache",
        str(cache),
    ]
    cmd += ["--profile"] if profile else []
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"variant": variant, "run": temperature, "error": f"timed out after {timeout:.0f} s"}
    wall = round(time.perf_counter() - t0, 1)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        # Enough of the end to show an error's cause (the record; the table shows its start).
        tail = (done.stderr or done.stdout).strip().splitlines()[-25:]
        return {"variant": variant, "run": temperature, "error": " | ".join(tail), "wall_s": wall}
    return {**json.loads(lines[-1]), "run": temperature, "wall_s": wall}


def _row(r: dict) -> str:
    if "error" in r:
        return f"| {r['variant']} | {r['run']} | error: {r['error'][:200]} |"
    steps = r["first_steps_s"]
    return (
        f"| {r['variant']} | {r['run']} | {r['compile_s']:.1f} | {r['compile_parts']} | "
        f"{' / '.join(f'{p:.1f}' for p in r['pass_s'])} | {max(steps):.2f} | "
        f"{r['compile_cache']} | {r.get('peak_reserved_gib', 0):.1f} | {r['wall_s']:.0f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=DEFAULT, help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--json", type=Path, help="write every run's record here")
    parser.add_argument("--cache-root", type=Path, help="the families' cache folders (a new one)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per process")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.cache, args.profile)), flush=True)
        return 0
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        print(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
        return 2
    root = args.cache_root or Path(tempfile.mkdtemp(prefix="compile_warm-"))
    records, cold = [], set()
    print(
        "| variant | run | compile_s | compile_parts | pass s | slowest first step s | cache | "
        "peak reserved GiB | wall s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in names:
        family = VARIANTS[name][0]
        runs = ["warm"] if family in cold else ["cold", "warm"]
        cold.add(family)
        for temperature in runs:
            profile = VARIANTS[name][4] and temperature == "warm"
            record = _run_child(name, root / family, temperature, profile, args.timeout)
            records.append(record)
            print(_row(record), flush=True)
            if args.json:  # after every run: nothing measured is lost to a timeout
                args.json.write_text(json.dumps({"command": sys.argv, "runs": records}, indent=1))
    for r in records:
        if r.get("profile"):
            print(f"\n## {r['variant']} ({r['run']}): the warm-up's functions by own time")
            print("\n".join(r["profile"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
