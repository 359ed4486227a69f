"""The resident group pool and its first host, made by the driver before it prepares anything
else (platform/execution/tuner.py: ``open_pool``, issue 40): real actors on a real local Ray
cluster, none when no run is resident, and both stopped when no resident run is left to run
after all (``start_pool``)."""

import time

from platform.execution.tuner import open_pool, start_pool
from platform.spaces.expand import RunSpec
from stage1_common.output_root import OutputRoot
from trainables.config import TrialConfig


def _run(name: str, executor: str) -> RunSpec:
    config = TrialConfig(use_gpu=False, executor=executor, max_steps=10, log_every=5)
    return RunSpec(name=name, group=name, repeat=1, config=config, swept={})


class _Space:
    max_concurrent_trials = 1


def test_the_pool_opens_for_resident_runs_and_stops_when_none_is_left(tmp_path):
    import ray

    root = OutputRoot(tmp_path / "root")
    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
    try:
        assert open_pool(root, _Space(), [_run("a", "fresh")]) is None
        opened = open_pool(root, _Space(), [_run("a", "fresh"), _run("b", "resident")])
        assert opened is not None
        # Both started: the host's imports (Ray Train, no torch) and the pool's are done; the
        # pool is found by its name, as the trials and the group's ranks find it.
        ray.get([a.__ray_ready__.remote() for a in (opened.host, opened.actor)], timeout=120)
        assert ray.get_actor(opened.name) is not None
        # The runs left are fresh (say before_trials made them so): no pool, and the pool and
        # its host are stopped instead of holding processes for the whole sweep.
        assert start_pool(root, _Space(), [_run("a", "fresh")], opened) is None
        assert all(_dies_within(ray, actor, 60) for actor in (opened.host, opened.actor))
    finally:
        ray.shutdown()


def _dies_within(ray, actor, seconds: float) -> bool:
    """Whether ``actor`` is gone within ``seconds`` (ray.kill lands asynchronously)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=seconds)
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            continue
        time.sleep(0.2)
    return False
