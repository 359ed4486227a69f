"""benchmarks/reference_compare.py: each strategy's platform figure against its reference's,
and each side against its own DDP; the references' launchers; a space of the asked cases."""

import argparse
from pathlib import Path

import yaml

from benchmarks import reference_compare as rc


def _args(**kw):
    base = dict(
        model_size="tiny", micro_batch=4, audio_s=1.0, text_tokens=8, warmup_steps=2,
        steps=4, window=2, tail=2, profile_steps=0, nproc=2, launcher="auto", set=[],
    )  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


def test_ratios_hold_each_side_against_its_reference_and_its_own_ddp():
    refs = {
        "ddp": {"tail_samples_per_s": 1000.0},
        "zero1": {"tail_samples_per_s": 700.0},
        "fsdp2": {},  # its reference failed
    }
    rows = {r["strategy"]: r for r in rc.compare(refs, {"ddp": 950.0, "zero1": 560.0})}
    assert rows["ddp"]["platform_over_reference"] == 0.95
    assert rows["zero1"]["platform_over_reference"] == 0.8
    assert rows["zero1"]["platform_vs_ddp"] == 560.0 / 950.0
    assert rows["zero1"]["reference_vs_ddp"] == 0.7
    assert rows["fsdp2"]["platform_over_reference"] is None
    text = rc.markdown(list(rows.values()))
    assert "| zero1 | 560.0 | 700.0 | 0.800 | 0.589 | 0.700 |" in text
    assert "| fsdp2 | - | - | - | - | - |" in text


def test_references_run_under_their_launchers_and_the_platform_at_the_same_point(
    monkeypatch, tmp_path
):
    monkeypatch.setattr(rc.shutil, "which", lambda name: "/opt/bin/deepspeed")
    zero = rc.reference_cmd(_args(), "zero2", tmp_path)
    assert zero[:5] == [
        "/opt/bin/deepspeed",
        "--num_gpus",
        "2",
        "--module",
        rc.__name__.replace("reference_compare", "strategy_reference"),
    ]
    ddp = rc.reference_cmd(_args(profile_steps=3), "ddp", tmp_path)
    assert ddp[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert ddp[ddp.index("--profile") + 1] == str(tmp_path / "ddp.trace.json")
    torchrun = rc.reference_cmd(_args(launcher="torchrun"), "zero1", tmp_path)
    assert "torch.distributed.run" in torchrun
    sets = rc.platform_sets(_args(profile_steps=3, set=["num_workers=0"]))
    # 2 + 4 steps would put the profiler's steps 3-6 into the tail (from step 3): 10 steps.
    assert "max_steps=10" in sets and "log_every=2" in sets and "tail_timing_points=2" in sets
    assert "max_steps=6" in rc.platform_sets(_args())
    assert sets[-2:] == ["profile_steps=3", "num_workers=0"]
    space = yaml.safe_load(Path(rc._space_of(["fsdp2", "zero2"], tmp_path / "s.yaml")).read_text())
    assert [c["strategy"] for c in space["cases"]] == ["fsdp2", "deepspeed"]
    assert "baseline" not in space  # its baseline (ddp) is not among the cases
