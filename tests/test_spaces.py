"""Search spaces: loading, overrides, expansion into named runs, and their errors."""

import textwrap

import pytest

from platform.errors import UsageError
from platform.spaces.describe import baseline_notes
from platform.spaces.expand import expand_runs
from platform.spaces.load import SPACES_DIR, list_spaces, load_space
from platform.spaces.names import group_name
from trainables.config import ConfigError, TrialConfig


def write_space(tmp_path, name, text):
    (tmp_path / f"{name}.yaml").write_text(textwrap.dedent(text))
    return tmp_path


BASIC = """
    description: test space
    repeats: 2
    resources: {train_workers: 2, use_gpu: false, cpus_per_worker: 1}
    grid:
      micro_batch: [4, 8]
    fixed:
      max_steps: 10
      log_every: 5
"""


def test_smoke_space_expands_to_the_documented_runs():
    runs = expand_runs(load_space("smoke"))
    assert [r.name for r in runs] == ["sweep_z0_mb4_nw0_pf2_r1", "sweep_z0_mb8_nw0_pf2_r1"]
    assert {r.config.train_workers for r in runs} == {2}
    assert runs[0].group == "sweep_z0_mb4_nw0_pf2"


def test_only_optuna_plans_its_runs_late_and_keeps_every_group_a_candidate():
    from platform.spaces.plans import SEARCHES, SearchPlan

    assert [n for n in SEARCHES if SearchPlan(name=n, num_samples=1).plans_late] == ["optuna"]
    space = load_space("smoke")
    late = space.with_overrides(["search={name: optuna, num_samples: 1}"])
    assert late.search.plans_late and not space.search.plans_late
    assert [r.name for r in expand_runs(late)] == [r.name for r in expand_runs(space)]
    drawn = space.with_overrides(["search={name: random, num_samples: 1}"])
    assert len(expand_runs(drawn)) == 1  # random draws its groups up front


def test_every_shipped_space_is_valid():
    spaces = list_spaces()
    assert "smoke" in spaces
    assert not [name for name, desc in spaces.items() if desc.startswith("(invalid")]
    for name in spaces:
        assert expand_runs(load_space(name, SPACES_DIR))


def test_repeats_are_the_outer_loop(tmp_path):
    runs = expand_runs(load_space("s", write_space(tmp_path, "s", BASIC)))
    assert [r.name for r in runs] == [
        "sweep_z0_mb4_nw0_pf2_r1",
        "sweep_z0_mb8_nw0_pf2_r1",
        "sweep_z0_mb4_nw0_pf2_r2",
        "sweep_z0_mb8_nw0_pf2_r2",
    ]
    assert [r.repeat for r in runs] == [1, 1, 2, 2]
    assert runs[0].swept == {"micro_batch": 4}


def test_set_overrides_pin_a_swept_key_or_sweep_a_fixed_one(tmp_path):
    space = load_space("s", write_space(tmp_path, "s", BASIC))
    pinned = space.with_overrides(["micro_batch=16", "repeats=1"])
    assert [r.name for r in expand_runs(pinned)] == ["sweep_z0_mb16_nw0_pf2_r1"]
    swept = space.with_overrides(["bucket_mb=[25, 50]", "repeats=1"])
    names = [r.name for r in expand_runs(swept)]
    assert names == [
        "sweep_z0_mb4_nw0_pf2_bk25_r1",
        "sweep_z0_mb4_nw0_pf2_bk50_r1",
        "sweep_z0_mb8_nw0_pf2_bk25_r1",
        "sweep_z0_mb8_nw0_pf2_bk50_r1",
    ]
    assert space.grid == {"micro_batch": [4, 8]}  # the original is untouched


def test_group_name_adds_tokens_only_for_swept_keys():
    cfg = TrialConfig(micro_batch=160, num_workers=8, prefetch_factor=4, audio_s=1.5, use_gpu=False)
    assert group_name("sweep", cfg, []) == "sweep_z0_mb160_nw8_pf4"
    assert (
        group_name("sweep", cfg, ["audio_s", "use_gpu"]) == "sweep_z0_mb160_nw8_pf4_a1p5_usegpuoff"
    )


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("grid: {micro_batch: [4, 8]\n", "YAML syntax error"),
        ("grid: {micro_bach: [4]}\n", "did you mean 'micro_batch'"),
        ("grids: {}\n", "unknown top-level key 'grids'"),
        ("grid: {micro_batch: 4}\n", "grid.micro_batch must be a list"),
        ("grid: {micro_batch: []}\n", "empty list"),
        ("grid: {micro_batch: [4, 4]}\n", "lists a value twice"),
        ("resources: {gpus: 2}\n", "unknown key 'gpus' in resources"),
        ("repeats: 0\n", "repeats must be an integer >= 1"),
        ("grid: {micro_batch: [4]}\nfixed: {micro_batch: 8}\n", "set twice"),
        ("- a\n- b\n", "expected a mapping"),
    ],
)
def test_bad_space_files_raise_usage_errors(tmp_path, text, fragment):
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(UsageError, match=fragment):
        expand_runs(load_space("bad", tmp_path))


def test_yaml_error_names_file_and_line(tmp_path):
    (tmp_path / "bad.yaml").write_text("repeats: 1\ngrid:\n  micro_batch: [4, 8\nfixed: {}\n")
    with pytest.raises(UsageError) as info:
        load_space("bad", tmp_path)
    assert f"{tmp_path / 'bad.yaml'}:" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("grid: {micro_batch: [0, 4]}\n", "micro_batch: must be >= 1, got 0"),
        ("fixed: {zero_stage: 4}\n", "zero_stage: must be 0, 1, 2 or 3"),
        ("fixed: {zero_stage: 1, strategy: ddp}\n", "needs strategy deepspeed"),
        ("fixed: {log_every: 100, max_steps: 30}\n", "larger than max_steps"),
        ("grid: {micro_batch: ['x']}\n", "expected int"),
    ],
)
def test_bad_values_raise_config_errors_naming_the_file(tmp_path, text, fragment):
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError) as info:
        expand_runs(load_space("bad", tmp_path))
    assert fragment in str(info.value)
    assert str(tmp_path / "bad.yaml") in str(info.value)


def test_unknown_space_lists_the_known_ones(tmp_path):
    write_space(tmp_path, "alpha", BASIC)
    with pytest.raises(UsageError, match="unknown space 'nope'; known spaces: alpha"):
        load_space("nope", tmp_path)


@pytest.mark.parametrize(
    "item, error, fragment",
    [
        ("micro_batch", UsageError, "expected key=value"),
        ("micro_bach=4", UsageError, "did you mean 'micro_batch'"),
        ("repeats=0", UsageError, "repeats must be an integer >= 1"),
    ],
)
def test_bad_overrides(tmp_path, item, error, fragment):
    space = load_space("s", write_space(tmp_path, "s", BASIC))
    with pytest.raises(error, match=fragment):
        expand_runs(space.with_overrides([item]))


def test_bad_override_value_names_the_set_flag(tmp_path):
    space = load_space("s", write_space(tmp_path, "s", BASIC)).with_overrides(["micro_batch=0"])
    with pytest.raises(ConfigError, match=r"--set micro_batch=0.*micro_batch: must be >= 1"):
        expand_runs(space)


def test_resources_resolve_auto_gpu_and_refuse_what_the_cluster_cannot_hold():
    from platform.execution.resources import resolve_resources

    space = load_space("smoke").with_overrides(["use_gpu=auto"])
    runs = expand_runs(space)
    assert {r.config.use_gpu for r in resolve_resources(runs, {"CPU": 2.0})} == {False}
    assert {r.config.use_gpu for r in resolve_resources(runs, {"CPU": 2.0, "GPU": 2.0})} == {True}
    assert {r.config.use_gpu for r in resolve_resources(runs, {"CPU": 2.0, "GPU": 1.0})} == {False}
    greedy = expand_runs(space.with_overrides(["num_workers=2", "cpus_per_worker=0"]))
    with pytest.raises(UsageError, match=r"needs 6 CPUs and 0 GPUs .* the cluster has 2 CPUs"):
        resolve_resources(greedy, {"CPU": 2.0})
    forced = expand_runs(space.with_overrides(["use_gpu=true"]))
    with pytest.raises(
        UsageError,
        match=r"^use_gpu true: run sweep_z0_mb4_nw0_pf2_r1 needs 2 GPU\(s\), the cluster has 0; "
        "set use_gpu=auto",
    ):
        resolve_resources(forced, {"CPU": 8.0})


def test_smoke_space_prepares_a_synthetic_corpus():
    plan = load_space("smoke").data
    assert plan is not None and plan.synth["utts"] >= 1 and plan.target_sr == 16000 and plan.trim
    assert "synthetic corpus (2 speakers x 2 chapters x 8 utterances)" in plan.describe()


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("data: {synth: 3}\n", "'data' must be a mapping with a 'synth' mapping"),
        ("data: {synth: {utts: 2}, sr: 8000}\n", "unknown key 'sr' in data"),
        ("data: {synth: {files: 2}}\n", "unknown key 'files' in data.synth"),
        ("data: {synth: {utts: 0}}\n", "data.synth.utts must be a positive integer"),
        ("data: {synth: {utts: 2}, target_sr: 16k}\n", "data.target_sr must be an integer"),
        ("data: {synth: {utts: 2}, trim: maybe}\n", "data.trim must be true or false"),
    ],
)
def test_bad_data_sections(tmp_path, text, fragment):
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(UsageError, match=fragment):
        load_space("bad", tmp_path)


def test_runbook_mainline_spaces():
    from platform.spaces.preflight import check_inputs

    space = load_space("4090_mainline")
    runs = expand_runs(space)
    assert [r.name for r in runs[:4]] == [
        "sweep_z0_mb160_nw6_pf4_r1",
        "sweep_z0_mb160_nw8_pf4_r1",
        "sweep_z0_mb192_nw6_pf4_r1",
        "sweep_z0_mb192_nw8_pf4_r1",
    ]
    assert len(runs) == 8 and {r.config.train_workers for r in runs} == {2}
    assert {r.config.cpus_per_train_worker for r in runs} == {7, 9}  # loader workers + 1
    c = runs[0].config
    assert (c.max_steps, c.log_every, c.tail_timing_points, c.model_size) == (1200, 50, 10, "base")
    assert {r.config.train_workers for r in expand_runs(load_space("4x4090_mainline"))} == {4}
    fast = expand_runs(load_space("fast_smoke"))
    assert [r.name for r in fast] == ["sweep_z0_mb160_nw8_pf4_r1"] and fast[
        0
    ].config.max_steps == 300
    h100 = expand_runs(load_space("h100_mainline"))
    assert {(r.config.strategy, r.config.zero_stage) for r in h100} == {
        ("ddp", 0),
        ("deepspeed", 1),
    }
    with pytest.raises(UsageError, match="dataset manifest needs manifest_path"):
        check_inputs(space, runs)


def test_runbook_leak_phaseb_and_straggler_spaces():
    leak = {
        name: expand_runs(load_space(name))
        for name in ("leak_4090_z0", "leak_4090_z1", "leak_4090_z0_flash")
    }
    for name, (run,) in leak.items():
        c = run.config
        assert (c.max_steps, c.micro_batch, c.num_workers, c.prefetch_factor) == (
            10000,
            128,
            6,
            4,
        ), name
        assert c.telemetry and c.host_telemetry_interval_s == 10.0
    assert leak["leak_4090_z1"][0].config.strategy == "deepspeed"
    assert leak["leak_4090_z1"][0].config.zero_stage == 1
    assert leak["leak_4090_z0_flash"][0].config.speech_attention == "flash_attention_2"
    phaseb = expand_runs(load_space("4090_phaseb"))
    assert [r.name for r in phaseb[:2]] == [
        "sweep_ddp_z0_mb128_nw6_pf4_r1",
        "sweep_ds_z1_mb160_nw6_pf2_r1",
    ]
    assert len(phaseb) == 6 and {r.repeat for r in phaseb} == {1, 2, 3}
    assert {(r.config.max_steps, r.config.timing_ranks) for r in phaseb} == {(1000, "all")}
    diag = expand_runs(load_space("rank_straggler_diag"))
    assert {(r.config.zero_stage, r.config.micro_batch, r.config.num_workers) for r in diag} == {
        (0, 160, 6),
        (1, 160, 6),
    }
    assert all(r.config.cuda_sync_timing and r.config.timing_ranks == "all" for r in diag)


def test_a_baseline_picks_exactly_one_group(tmp_path):
    (tmp_path / "b.yaml").write_text(
        "resources: {train_workers: 1, use_gpu: false}\n"
        "baseline: {micro_batch: 160, crop_buckets_s: ''}\n"
        "cases:\n"
        "  - {micro_batch: 160, crop_buckets_s: ''}\n"
        "  - {micro_batch: 160, crop_buckets_s: [1, 2]}\n"
        "  - {micro_batch: 256, crop_buckets_s: '1,1.5'}\n"
        "fixed: {dataset: manifest, max_steps: 10, log_every: 5}\n"
    )
    space = load_space("b", tmp_path)
    runs = expand_runs(space)
    assert [r.baseline for r in runs] == [True, False, False]
    assert runs[1].config.crop_buckets_s == "1,2" and "cb1x2" in runs[1].name
    # Every key of the cases set: the cases collapse into one group, and no baseline is left.
    one = expand_runs(space.with_overrides(["micro_batch=8", "crop_buckets_s=1,2"]))
    assert len(one) == 1 and not one[0].baseline
    # The baseline's value is gone from the swept list: it takes the list's first.
    first = expand_runs(space.with_overrides(["micro_batch=[8, 16]"]))
    assert [(r.config.micro_batch, r.config.crop_buckets_s) for r in first if r.baseline] == [
        (8, "")
    ]
    # A swept list that still holds the baseline's value keeps it.
    smoke = load_space("smoke")
    kept = expand_runs(smoke.with_overrides(["micro_batch=[2, 4, 8]"]))
    assert [r.group for r in kept if r.baseline] == ["sweep_z0_mb4_nw0_pf2"]


@pytest.mark.parametrize(
    "sets, baseline, group",
    [
        # A fixed key swept: the baseline keeps the value the space had fixed (num_workers 0) ...
        (["num_workers=[1, 0]"], {"micro_batch": 4, "num_workers": 0}, "sweep_z0_mb4_nw0_pf2"),
        # ... or the list's first when that value is not among the new ones.
        (["num_workers=[2, 1]"], {"micro_batch": 4, "num_workers": 2}, "sweep_z0_mb4_nw2_pf2"),
        # A key the space leaves at its default (ddp_static_graph false) keeps the default.
        (["ddp_static_graph=[true, false]"], None, "sweep_z0_mb4_nw0_pf2_ddpstaticgraphoff"),
        # zero_stage swept with strategy auto: z0 (ddp) stays the baseline, z2 runs deepspeed.
        (["strategy=auto", "zero_stage=[0, 2]"], None, "sweep_z0_mb4_nw0_pf2"),
        # Set twice: the later list decides, from the value the first left in the baseline.
        (["num_workers=[1, 0]", "num_workers=[0, 2]"], None, "sweep_z0_mb4_nw0_pf2"),
    ],
)
def test_a_set_that_sweeps_a_key_keeps_the_baseline_one_group(sets, baseline, group):
    space = load_space("smoke").with_overrides(sets)
    if baseline is not None:
        assert space.baseline == baseline
    runs = expand_runs(space)
    assert len({r.group for r in runs}) > 2
    assert [r.group for r in runs if r.baseline] == [group]


def test_a_set_that_pins_a_swept_key_drops_it_from_the_baseline_and_a_space_without_one_gets_none():
    pinned = load_space("smoke").with_overrides(["micro_batch=8"])
    assert pinned.baseline == {}
    assert not any(r.baseline for r in expand_runs(pinned))
    plain = load_space("cpu_strategies").with_overrides(["num_workers=[0, 1]"])
    assert plain.baseline == {}


@pytest.mark.parametrize(
    "sets",
    [["micro_batch=8", "num_workers=[0, 1]"], ["num_workers=[0, 1]", "micro_batch=8"]],
    ids=["pin-first", "list-first"],
)
def test_the_baseline_does_not_depend_on_the_order_of_the_sets(sets):
    # The space had a baseline: pinning its key first must not make the list forget it.
    space = load_space("smoke").with_overrides(sets)
    assert space.baseline == {"num_workers": 0}
    assert [r.group for r in expand_runs(space) if r.baseline] == ["sweep_z0_mb8_nw0_pf2"]


def test_a_set_list_without_the_baselines_value_moves_the_baseline_and_says_so():
    smoke = load_space("smoke")  # baseline micro_batch 4
    moved = smoke.with_overrides(["micro_batch=[8, 16]"])
    assert moved.baseline == {"micro_batch": 8} and moved.baseline_moved == {"micro_batch": 4}
    assert baseline_notes(moved, expand_runs(moved)) == [
        "baseline: micro_batch 4 is not in --set micro_batch=[8, 16]; the baseline is now "
        "sweep_z0_mb8_nw0_pf2 (micro_batch 8, the list's first value)"
    ]
    # A fixed key swept without the value the space fixed: named with that value.
    fixed = smoke.with_overrides(["num_workers=[2, 1]"])
    assert baseline_notes(fixed, expand_runs(fixed)) == [
        "baseline: num_workers 0 is not in --set num_workers=[2, 1]; the baseline is now "
        "sweep_z0_mb4_nw2_pf2 (num_workers 2, the list's first value)"
    ]
    # Moved twice: still measured from the space's value, and the note is not doubled.
    twice = smoke.with_overrides(["micro_batch=[8, 16]", "micro_batch=[16, 32]"])
    assert twice.baseline_moved == {"micro_batch": 4} and twice.baseline == {"micro_batch": 16}
    # A list holding the value, a later list that brings it back, a pinned key: no note.
    for sets in (
        ["micro_batch=[2, 4]"],
        ["micro_batch=[8, 16]", "micro_batch=[16, 4]"],
        ["micro_batch=[8, 16]", "micro_batch=8"],
    ):
        space = smoke.with_overrides(sets)
        assert space.baseline_moved == {}, sets
        assert baseline_notes(space, expand_runs(space)) == [], sets
    # A space without a baseline gets none to move.
    plain = load_space("cpu_strategies").with_overrides(["num_workers=[2, 1]"])
    assert plain.baseline_moved == {} and baseline_notes(plain, expand_runs(plain)) == []
