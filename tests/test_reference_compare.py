"""benchmarks/reference_compare.py: each strategy's platform figure against its reference's,
and each side against its own DDP; the references' launchers; a space of the asked cases."""

import argparse
from pathlib import Path

import pytest
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
    bases = {"ddp": "ddp", "zero1": "zero1", "fsdp2": "fsdp2"}
    rows = {r["strategy"]: r for r in rc.compare([(refs, {"ddp": 950.0, "zero1": 560.0})], bases)}
    assert rows["ddp"]["platform_over_reference"] == 0.95
    assert rows["zero1"]["platform_over_reference"] == 0.8
    assert rows["zero1"]["platform_vs_ddp"] == 560.0 / 950.0
    assert rows["zero1"]["reference_vs_ddp"] == 0.7
    assert rows["fsdp2"]["platform_over_reference"] is None
    text = rc.markdown(list(rows.values()))
    assert "| zero1 | 1 | 560.0 | 700.0 | 0.800 | 0.800 - 0.800 | 0.589 | 0.700 |" in text
    assert "| fsdp2 | 0 | - | - | - | - - - | - | - |" in text


def test_pairs_give_the_median_of_each_turns_ratio_and_variants_their_bases_reference():
    """Each turn's platform is held against the same turn's reference (a host that slows for
    a turn slows both), then the median over turns with its lowest and highest."""
    turns = [
        ({"ddp": {"tail_samples_per_s": 1000.0}}, {"ddp": 900.0, "ddp_t5": 850.0}),
        ({"ddp": {"tail_samples_per_s": 800.0}}, {"ddp": 790.0, "ddp_t5": 700.0}),
        ({"ddp": {"tail_samples_per_s": 1100.0}}, {"ddp": 1067.0}),  # the variant failed
    ]
    rows = {r["strategy"]: r for r in rc.compare(turns, {"ddp": "ddp", "ddp_t5": "ddp"})}
    assert rows["ddp"]["pairs"] == 3
    assert rows["ddp"]["platform_over_reference"] == 0.97  # of 0.9, 0.9875, 0.97
    assert (rows["ddp"]["ratio_low"], rows["ddp"]["ratio_high"]) == (0.9, 0.9875)
    assert rows["ddp"]["platform_samples_per_s"] == 900.0  # medians of each side
    assert rows["ddp_t5"]["pairs"] == 2
    assert rows["ddp_t5"]["platform_over_reference"] == (0.85 + 0.875) / 2
    assert "| ddp_t5 (vs ddp) | 2 |" in rc.markdown(list(rows.values()))
    name, base, case = rc.parse_variant("ddp_t5=ddp:intra_op_threads=5,bucket_mb=50")
    assert (name, base) == ("ddp_t5", "ddp")
    assert case == {"strategy": "ddp", "zero_stage": 0, "intra_op_threads": 5, "bucket_mb": 50}
    with pytest.raises(ValueError, match="BASE one of"):
        rc.parse_variant("x=nope:a=1")


def test_a_platform_case_is_found_by_every_value_it_sets(tmp_path, monkeypatch):
    """The sweep's rows are matched to the cases by the manifest's values, defaults filling the
    keys a case leaves out (the eager ddp case is not the compiled one)."""
    import pandas as pd

    cases = {k: rc.CASES[k][1] for k in ("ddp", "ddp_compiled", "zero2")}
    cases["ddp_t5"] = rc.parse_variant("ddp_t5=ddp:intra_op_threads=5")[2]
    manifest = pd.DataFrame(
        [
            dict(run="a", strategy="ddp", zero_stage=0, torch_compile=False, compile_scope="model",
                 compile_mode="default", intra_op_threads=0, status="ok"),
            dict(run="b", strategy="ddp", zero_stage=0, torch_compile=True, compile_scope="layers",
                 compile_mode="default", intra_op_threads=0, status="ok"),
            dict(run="c", strategy="deepspeed", zero_stage=2, torch_compile=False,
                 compile_scope="model", compile_mode="default", intra_op_threads=0, status="ok"),
            dict(run="d", strategy="ddp", zero_stage=0, torch_compile=False, compile_scope="model",
                 compile_mode="default", intra_op_threads=5, status="ok"),
        ]
    )  # fmt: skip
    tails = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    import benchmarks.strategy_sweep as sweep

    (tmp_path / "run_manifest.tsv").write_text(manifest.to_csv(sep="\t", index=False))
    rows = [{"run": r, "status": "ok", "tail_samples_per_s": v} for r, v in tails.items()]
    monkeypatch.setattr(sweep, "table", lambda root: rows)
    found = rc._platform_tails(tmp_path, cases)
    assert found == {"ddp": 1.0, "ddp_compiled": 2.0, "zero2": 3.0, "ddp_t5": 4.0}


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
    cases = {k: rc.CASES[k][1] for k in ("fsdp2", "zero2")}
    space = yaml.safe_load(Path(rc._space_of(cases, tmp_path / "s.yaml")).read_text())
    assert [c["strategy"] for c in space["cases"]] == ["fsdp2", "deepspeed"]
    assert "baseline" not in space  # its baseline (ddp) is not among the cases


def test_turns_of_several_commands_combine_into_one_table(tmp_path, capsys):
    """A 3-turn comparison split over machines of 10 minutes a call: the turns of each
    command's result in one table, the median over all of them."""
    import json

    def result(name, ref, plat):
        turns = [[{"ddp": {"tail_samples_per_s": ref}}, {"ddp": plat}]]
        rows = rc.compare([tuple(t) for t in turns], {"ddp": "ddp"})
        (tmp_path / name).mkdir()
        (tmp_path / name / "reference_compare.json").write_text(
            json.dumps({"rows": rows, "turns": turns})
        )
        return tmp_path / name

    parts = [result("a", 1000.0, 900.0), result("b", 1000.0, 980.0), result("c", 1000.0, 960.0)]
    out = tmp_path / "all"
    assert rc.main(["--combine", *map(str, parts), "--output-root", str(out)]) == 0
    combined = json.loads((out / "reference_compare.json").read_text())
    (row,) = combined["rows"]
    assert row["pairs"] == 3 and row["platform_over_reference"] == 0.96
    assert (row["ratio_low"], row["ratio_high"]) == (0.9, 0.98)
    assert "| ddp | 3 |" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        rc.main(["--combine", str(tmp_path / "nope")])
    assert exc.value.code == 2
