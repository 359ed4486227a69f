"""Where a run trains (``executor``): ``auto`` decided by the driver, the runs a resident group
may not run refused with one line, the resource shape that decides which runs share a group,
what a resident worker frees between runs, and the stall watchdog ending a stuck resident
worker's process (a real child process)."""

import json
import subprocess
import sys
import textwrap

import pytest

from platform.errors import UsageError
from platform.execution.resources import resolve_executors
from platform.spaces.expand import RunSpec, expand_runs
from trainables.config import ConfigError, TrialConfig
from trainables.resident.shape import GroupKey, GroupShape, group_cpus


def spec(name: str = "r", **values) -> RunSpec:
    return RunSpec(name=name, group="g", repeat=1, swept={}, config=TrialConfig(**values))


def test_auto_is_resident_for_a_sweep_and_fresh_where_a_run_needs_its_own_processes():
    runs = [
        spec("plain"),
        spec("leak", inject_leak_mb_per_step=1.0),
        spec("restarts", checkpoint_every=5, max_failures=1),
        spec("checkpoints_only", checkpoint_every=5),
        spec("asked_fresh", executor="fresh"),
    ]
    swept = {r.name: r.config.executor for r in resolve_executors(runs, training=False)}
    assert swept == {
        "plain": "resident",
        "leak": "fresh",
        "restarts": "fresh",
        "checkpoints_only": "fresh",  # registered with a Ray Train run of its own
        "asked_fresh": "fresh",
    }
    trained = resolve_executors([spec("final")], training=True)
    assert trained[0].config.executor == "fresh"  # platform.train: one TorchTrainer, as before


def test_training_with_a_resident_sweeps_winner_gets_processes_of_its_own(tmp_path):
    import json

    from platform.train import build_parser, plan

    best = tmp_path / "best_config.json"
    config = TrialConfig(executor="resident", use_gpu=False).to_dict()
    best.write_text(json.dumps({"space": "smoke", "group": "g", "config": config}))
    _, runs = plan(build_parser().parse_args(["--config", str(best)]))
    assert runs[0].config.executor == "auto" and runs[0].config.max_failures == 3
    assert resolve_executors(runs, training=True)[0].config.executor == "fresh"


def test_resident_where_it_cannot_work_is_one_line_naming_the_key_and_the_fix():
    with pytest.raises(ConfigError, match=r"^executor: resident cannot run this run: .*leak.*"):
        TrialConfig(executor="resident", inject_leak_mb_per_step=1.0)
    with pytest.raises(ConfigError, match=r"set executor=fresh \(or auto\)$"):
        TrialConfig(executor="resident", checkpoint_every=5, max_failures=2)
    with pytest.raises(ConfigError, match=r"saves checkpoints through Ray Train"):
        TrialConfig(executor="resident", checkpoint_every=5)
    with pytest.raises(UsageError, match=r"platform.train trains in processes of its own"):
        resolve_executors([spec("final", executor="resident")], training=True)
    with pytest.raises(ConfigError, match=r"executor"):
        TrialConfig(executor="warm")


def test_runs_share_a_group_only_when_their_workers_would_be_the_same():
    base = GroupShape.of(TrialConfig(use_gpu=False))
    assert base == GroupShape.of(TrialConfig(use_gpu=False, micro_batch=64, lr=1e-3))
    for other in (
        dict(train_workers=4),
        dict(use_gpu=True),
        dict(num_workers=3),  # cpus per worker: num_workers + 1
        dict(placement_strategy="SPREAD"),
        dict(stall_timeout_s=30.0),  # the process group's timeout follows it
    ):
        assert GroupShape.of(TrialConfig(**{"use_gpu": False, **other})) != base, other


def test_loader_keys_share_a_group_sized_for_the_sweeps_most_demanding_run():
    loaders = [
        TrialConfig(use_gpu=False, num_workers=n, prefetch_factor=p, micro_batch=mb)
        for n, p, mb in ((6, 4, 160), (8, 2, 192), (0, 2, 160))
    ]
    wider = TrialConfig(use_gpu=False, train_workers=4, num_workers=1)
    cpus = group_cpus([*loaders, wider])
    # One key for the three loader settings, sized for 8 loader workers + the trainer.
    assert cpus == {GroupKey.of(loaders[0]): 9, GroupKey.of(wider): 2}
    shapes = {GroupShape.of(c, cpus[GroupKey.of(c)]) for c in loaders}
    assert len(shapes) == 1 and next(iter(shapes)).cpus_per_worker == 9
    assert GroupShape.of(wider, cpus[GroupKey.of(wider)]) not in shapes
    # An explicit cpus_per_worker is a run's need too.
    assert group_cpus([TrialConfig(use_gpu=False, cpus_per_worker=12), loaders[0]]) == {
        GroupKey.of(loaders[0]): 12
    }


def test_a_group_shape_is_its_key_and_its_cpus_and_groups_json_keeps_its_keys_and_order():
    cfg = TrialConfig(use_gpu=False, train_workers=2, num_workers=1, stall_timeout_s=30.0)
    shape = GroupShape.of(cfg, 5)
    assert shape.key == GroupKey.of(cfg) and shape.cpus_per_worker == 5
    assert GroupShape.of(cfg).cpus_per_worker == 2  # the run's own: 1 loader worker + 1
    # groups.json's "shape", as the pool wrote it before the shape was a type.
    assert list(shape.to_dict().items()) == [
        ("train_workers", 2),
        ("use_gpu", False),
        ("cpus_per_worker", 5),
        ("placement_strategy", cfg.placement_strategy),
        ("nodes", cfg.nodes),
        ("pg_timeout_s", 35),
    ]


def test_runs_of_one_group_shape_run_next_to_each_other_and_repeats_stay_outside():
    from platform.spaces.load import load_space

    space = load_space("4090_mainline").with_overrides(["train_workers=[1, 2]", "repeats=2"])
    runs = expand_runs(space)
    workers = [(r.repeat, r.config.train_workers) for r in runs]
    # r1: every 1-worker group, then every 2-worker group; r2 starts with the shape r1 ended on.
    assert workers == [(1, 1)] * 4 + [(1, 2)] * 4 + [(2, 2)] * 4 + [(2, 1)] * 4
    assert [r.group for r in runs[:4]] == [r.group for r in runs[12:]]
    # A space whose runs all share a shape keeps the space's order.
    plain = expand_runs(load_space("4090_mainline"))
    assert [r.name for r in plain][:4] == [
        "sweep_z0_mb160_nw6_pf4_r1",
        "sweep_z0_mb160_nw8_pf4_r1",
        "sweep_z0_mb192_nw6_pf4_r1",
        "sweep_z0_mb192_nw8_pf4_r1",
    ]


def test_release_frees_the_planted_leak_and_keeps_the_process_usable():
    from trainables import faults
    from trainables.resident.serve import memory_now, release

    leak = faults.build_faults(TrialConfig(inject_leak_mb_per_step=1.0), rank=0)
    leak.after_step(1)
    assert len(faults._LEAKED) == 1
    release(TrialConfig())
    assert faults._LEAKED == []
    assert memory_now()["rss_mb"] > 0


def test_release_drops_compiled_code_after_a_compiled_run_only():
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    from trainables.resident.serve import release

    torch._dynamo.reset()
    double = torch.compile(lambda x: x * 2, backend="eager")
    double(torch.ones(2))
    graphs = counters["stats"]["unique_graphs"]
    release(TrialConfig())  # an eager run compiled nothing: no reset (its first costs 2-4 s)
    double(torch.ones(2))
    assert counters["stats"]["unique_graphs"] == graphs
    release(TrialConfig(torch_compile=True))  # the next run starts from nothing compiled
    double(torch.ones(2))
    assert counters["stats"]["unique_graphs"] == graphs + 1


def test_a_stuck_resident_worker_writes_its_stacks_then_ends_its_process(tmp_path):
    child = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from trainables.observe.watchdog import StallWatchdog
        StallWatchdog(0.5, Path({str(tmp_path)!r}), rank=0, end_after_s=1.0).start()
        time.sleep(60)  # a step that never ends
        """
    )
    done = subprocess.run([sys.executable, "-c", child], timeout=30, capture_output=True)
    assert done.returncode == 70, done.stderr.decode()[-2000:]
    stacks = (tmp_path / "stacks-rank0.txt").read_text()
    assert stacks.startswith("no progress for") and 'File "<string>"' in stacks, stacks


def test_a_fresh_worker_only_writes_its_stacks(tmp_path):
    child = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from trainables.observe.watchdog import StallWatchdog
        StallWatchdog(0.3, Path({str(tmp_path)!r}), rank=0).start()
        time.sleep(2.5)
        """
    )
    done = subprocess.run([sys.executable, "-c", child], timeout=30, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert (tmp_path / "stacks-rank0.txt").is_file()


def test_the_resident_states_are_the_strings_groups_json_held():
    from trainables.resident.messages import GroupState, JobState, Outcome

    assert [s.value for s in GroupState] == ["starting", "ready", "closing", "dead"]
    assert [s for s in GroupState if s.alive] == [GroupState.STARTING, GroupState.READY]
    assert [s.value for s in JobState if not s.ended] == ["queued", "running"]
    assert {o.value for o in Outcome} == {"ok", "stopped", "failed"}
    assert json.dumps([GroupState.DEAD, Outcome.OK]) == '["dead", "ok"]'
