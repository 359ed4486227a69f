"""What checkpoints cost the final training, per strategy, side by side in one command, with a
rank killed mid-run in each (issue 25's GPU acceptance):

    python -m benchmarks.checkpoint_overhead --space h200_train_z1 --manifest M.tsv \
        --output-root OUT [--strategies ddp,fsdp2,deepspeed] [--kill-at-step 300] \
        [--kill-rank 0] [--set KEY=VALUE ...]

For each strategy, ``platform.train`` runs the space's configuration (``strategy`` set, ZeRO
stage 0 for ddp and fsdp2, the space's for deepspeed); when the driver prints the window of
``--kill-at-step``, rank ``--kill-rank``'s process is killed with SIGKILL and Ray Train restarts
the group from the latest complete checkpoint. From each run's output root:

- the time training was held per save (``checkpoint_block_s``, median and max), the save time
  (start to files whole) and size, the run's end waiting for its last save;
- ``ckpt_overhead_share`` and ``val_overhead_share`` (the manifest's: held seconds over seconds
  in steps), and the share of wall time as benchmarks/train_recovery.py counted it before;
- tail samples/s, peak GPU memory, the checkpoint mode;
- the redone steps: the windows both attempts ran (after the checkpoint the restart resumed
  from, up to the kill), their losses and the largest difference.

Writes OUT/checkpoint_overhead.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from benchmarks.train_recovery import _run

ZERO = {"ddp": 0, "fsdp2": 0}


def measure(root: Path, kill_ts: float | None) -> dict:
    """One strategy's figures from its output root."""
    manifest = pd.read_csv(root / "run_manifest.tsv", sep="\t", keep_default_na=False).iloc[0]
    timing = pd.read_parquet(root / "timing.parquet")
    rank0 = timing[timing["rank"] == 0].sort_values(["attempt", "step"])
    ckpt = pd.read_parquet(root / "checkpoints.parquet").sort_values(["attempt", "step"])
    num = lambda k: float(manifest[k]) if str(manifest.get(k, "")) not in ("", "nan") else None  # noqa: E731
    out = {
        "status": manifest["status"],
        "checkpoint_mode": manifest.get("checkpoint_mode", ""),
        "attempts": int(rank0["attempt"].max()) + 1,
        "resumed_from_step": int(manifest["resumed_from_step"] or 0),
        "ckpt_overhead_share": num("ckpt_overhead_share"),
        "val_overhead_share": num("val_overhead_share"),
        "ckpt_end_wait_s": num("ckpt_end_wait_s"),
        "checkpoints": len(ckpt),
        "ckpt_block_s_median": float(ckpt["checkpoint_block_s"].median()),
        "ckpt_block_s_max": float(ckpt["checkpoint_block_s"].max()),
        "ckpt_block_s": [round(float(v), 4) for v in ckpt["checkpoint_block_s"]],
        "ckpt_save_s_median": float(ckpt["checkpoint_save_s"].median()),
        "ckpt_size_gb": float(ckpt["checkpoint_size_bytes"].median() / 1e9),
        "tail_samples_per_s": float(manifest["tail_samples_per_sec_mean"]),
        "peak_mem_gib": float(timing["peak_mem_gib"].max()),
        "wall_s": float(manifest["duration_sec"] or "nan"),
    }
    val = pd.read_parquet(root / "validation.parquet")
    spent = ckpt["checkpoint_save_s"].sum() + val["val_s"].sum()
    out["val_and_save_share_of_wall"] = float(spent / out["wall_s"])  # train_recovery's count
    out["redone"] = redone(rank0)
    out |= window_excess(rank0, ckpt, val, manifest)
    out["ckpt_call_s"] = [
        round(json.loads(f.read_text()).get("call_s", float("nan")), 4)
        for f in sorted(root.glob("runs/*/checkpoint_step*/done-rank0.json"))
    ]
    if kill_ts is not None and out["attempts"] > 1:
        first = rank0[rank0["attempt"] == 1].iloc[0]
        window_s = first["steps_in_window"] * first["iter_ms_mean"] / 1000
        out["kill_to_first_step_s"] = float(first["window_end_ts"] - window_s - kill_ts)
    return out


def window_excess(rank0, ckpt, val, manifest) -> dict:
    """What a save cost the steps after it, however it cost it (the staging copy, the GIL, a
    driver lock): the window right after each save against the median window of its attempt,
    in seconds; the same after validations that had no save, as a control."""
    every = int(manifest["log_every"])
    last = int(manifest["max_steps"])

    def excess(attempt: int, step: int) -> float | None:
        windows = rank0[(rank0["attempt"] == attempt) & (rank0["step"] > 2 * every)]
        after = windows[windows["step"] == step + every]
        if after.empty or step >= last:
            return None
        base = windows["iter_ms_mean"].median()
        return float(
            (after["iter_ms_mean"].iloc[0] - base) * after["steps_in_window"].iloc[0] / 1e3
        )

    saves = [(int(a), int(s)) for a, s in zip(ckpt["attempt"], ckpt["step"], strict=True)]
    vals = [
        (int(a), int(s))
        for a, s in zip(val["attempt"], val["step"], strict=True)
        if (int(a), int(s)) not in saves
    ]
    after_save = [e for e in (excess(a, s) for a, s in saves) if e is not None]
    after_val = [e for e in (excess(a, s) for a, s in vals) if e is not None]
    rnd = lambda xs: [round(x, 3) for x in xs]  # noqa: E731
    return {"post_save_excess_s": rnd(after_save), "post_val_excess_s": rnd(after_val)}


def redone(rank0: pd.DataFrame) -> dict:
    """The windows that the first and the second attempt both ran, and their losses."""
    a = rank0[rank0["attempt"] == 0].set_index("step")["loss"]
    b = rank0[rank0["attempt"] == 1].set_index("step")["loss"]
    steps = sorted(set(a.index) & set(b.index))
    if not steps:
        return {"steps": []}
    diff = [abs(float(a[s]) - float(b[s])) for s in steps]
    return {
        "steps": [int(s) for s in steps],
        "loss_first": [float(a[s]) for s in steps],
        "loss_redone": [float(b[s]) for s in steps],
        "max_abs_diff": max(diff),
        "max_rel_diff": max(d / abs(float(a[s])) for d, s in zip(diff, steps, strict=True)),
    }


def markdown(results: dict[str, dict]) -> str:
    f = lambda v, fmt=".3f": "" if v is None else format(v, fmt)  # noqa: E731
    lines = [
        "| strategy | mode | ckpt overhead share | block s median / max | window after a save, "
        "excess s (after validation only) | end wait s | save s | size GB | val share "
        "| samples/s | peak GiB | resumed from | redone max rel diff |",
        "|" + " --- |" * 13,
    ]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | {r['error']} |" + " |" * 11)
            continue
        lines.append(
            f"| {name} | {r['checkpoint_mode']} | {f(r['ckpt_overhead_share'], '.4f')} | "
            f"{f(r['ckpt_block_s_median'])} / {f(r['ckpt_block_s_max'])} | "
            f"{r['post_save_excess_s']} ({r['post_val_excess_s']}) | "
            f"{f(r['ckpt_end_wait_s'], '.2f')} | {f(r['ckpt_save_s_median'], '.2f')} | "
            f"{f(r['ckpt_size_gb'], '.2f')} | {f(r['val_overhead_share'], '.4f')} | "
            f"{f(r['tail_samples_per_s'], '.1f')} | {f(r['peak_mem_gib'], '.1f')} | "
            f"{r['resumed_from_step']} | {f(r['redone'].get('max_rel_diff'), '.2e')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.checkpoint_overhead")
    p.add_argument("--space", required=True)
    p.add_argument("--manifest", required=True, type=Path)
    p.add_argument("--output-root", required=True, type=Path)
    p.add_argument("--strategies", default="ddp,fsdp2,deepspeed")
    p.add_argument("--kill-at-step", type=int, default=300, help="0: no kill")
    p.add_argument("--kill-rank", type=int, default=0)
    p.add_argument("--set", action="append", default=[])
    args = p.parse_args(argv)
    results: dict[str, dict] = {}
    for strategy in args.strategies.split(","):
        root = args.output_root / strategy
        sets = [f"manifest_path={args.manifest}", f"strategy={strategy}", *args.set]
        if strategy in ZERO:
            sets.append(f"zero_stage={ZERO[strategy]}")
        run_dir = root / "runs"

        class _RankRecord:  # the run's name is known only once it started
            def read_text(self, run_dir=run_dir) -> str:
                return next(run_dir.glob(f"*/workers/rank{args.kill_rank}.json")).read_text()

        code, kill_ts = _run(
            "platform.train", "--space", args.space, "--output-root", str(root),
            *[a for s in sets for a in ("--set", s)],
            kill_at=args.kill_at_step or None, pid_file=_RankRecord(),
        )  # fmt: skip
        try:
            results[strategy] = measure(root, kill_ts) | {"exit_code": code}
        except (OSError, KeyError, ValueError) as exc:  # a run that left no results
            results[strategy] = {"error": f"{type(exc).__name__}: {exc}", "exit_code": code}
        print(json.dumps({strategy: results[strategy]}, indent=1), flush=True)
    summary = {"space": args.space, "kill_at_step": args.kill_at_step, "runs": results}
    (args.output_root / "checkpoint_overhead.json").write_text(json.dumps(summary, indent=1))
    table = markdown(results)
    (args.output_root / "checkpoint_overhead.md").write_text(table)
    print(table)
    return 0 if all(r.get("exit_code") == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
