"""Ray Train's torch backend without torch where the worker group is only orchestrated
(trainables/torch_backend.py, issue 40): a fresh run's trial and a resident group's host build
their trainers without importing torch, and Ray Train's controller, which unpickles the run's
context and the backend, does not import it either; the backend is the one ``TorchTrainer``
would choose. The real process groups are made by every Ray test that trains (the smoke sweep's
resident group, test_checkpoint_resume's fresh runs, test_profiling's)."""

import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Builds both trainers the way the trial and the group host do, then says which heavy modules
# the process imported; the controller's side unpickles what it is sent in a new process.
BUILD = """
import sys
from ray import cloudpickle
from ray.train import RunConfig
from stage1_common.output_root import OutputRoot
from trainables.config import TrialConfig
from trainables.ray_worker import train_loop_per_worker
from trainables.resident.group_trainer import build_group_trainer
from trainables.resident.shape import GroupShape
from trainables.ticket import GroupTicket, RunsInFolder, RunTicket
from trainables.torch_backend import torch_trainer
import trainables.trial

config = TrialConfig(use_gpu={use_gpu}, train_workers=2, micro_batch=4, dataset="manifest",
                     manifest_path="/data/m.tsv", stall_timeout_s=300)
root = OutputRoot({root!r})
storage = RunsInFolder(runs=str(root.runs), groups=str(root.group_runs))
shape = GroupShape.of(config, 3)
ticket = RunTicket(name="r1", group="g", repeat=1, storage=storage, config=config)
# A fresh run's trainer as trainables/trial.py builds it (less Tune's report callback, which
# needs a Tune session), and a resident group's as its host does.
fresh = torch_trainer(train_loop_per_worker, ticket.encode(), GroupShape.of(config),
                      RunConfig(name="r1", storage_path=storage.runs))
group = build_group_trainer(shape, GroupTicket(pool="p", group="g1", cpus=3), storage.groups)
sent = [t.train_run_context for t in (fresh, group)]
with open({out!r}, "wb") as f:
    cloudpickle.dump(sent, f)
print(shape.pg_timeout_s, [t.backend_config.to_dict() for t in (fresh, group)])
print(sorted(m for m in ("torch", "transformers", "trainables.loop") if m in sys.modules))
"""

CONTROLLER = """
import sys
from ray import cloudpickle
with open({out!r}, "rb") as f:
    contexts = cloudpickle.load(f)
for context in contexts:
    backend = context.backend_config.backend_cls()
    assert backend.share_cuda_visible_devices
print(sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""


def _run(code: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()


def test_trainers_are_built_and_their_context_unpickled_without_torch(tmp_path):
    out = tmp_path / "contexts.pkl"
    lines = _run(BUILD.format(use_gpu=False, root=str(tmp_path / "root"), out=str(out)))
    assert lines[-1] == "[]"  # the trial and the group host: no torch, no model code
    timeout, configs = lines[0].split(" ", 1)
    assert (
        int(timeout) > 300
    )  # the run's stall timeout and a margin (trainables/observe/watchdog.py)
    assert configs == str(
        [{"backend": "gloo", "init_method": "env", "timeout_s": int(timeout)}] * 2
    )
    assert _run(CONTROLLER.format(out=str(out))) == ["[]"]  # Ray Train's controller


def test_gpu_runs_get_nccl_and_the_runs_process_group_timeout(tmp_path):
    out = tmp_path / "contexts.pkl"
    lines = _run(BUILD.format(use_gpu=True, root=str(tmp_path / "root"), out=str(out)))
    timeout, configs = lines[0].split(" ", 1)
    assert configs == str(
        [{"backend": "nccl", "init_method": "env", "timeout_s": int(timeout)}] * 2
    )
    assert lines[-1] == "[]"


def test_the_ray_functions_the_workers_call_exist_in_this_ray():
    from ray.train.torch import config

    from trainables import torch_backend

    # Each takes the arguments the backend passes (a renamed one fails here, not in a group).
    inspect.signature(config._setup_torch_process_group).bind(
        backend="gloo", world_rank=0, world_size=2, init_method="env://", timeout_s=60
    )
    inspect.signature(config._set_torch_distributed_env_vars).bind()
    inspect.signature(config._shutdown_torch).bind(destroy_process_group=True)
    assert callable(config.TorchConfigContextManager().__enter__)
    assert torch_backend._TorchBackend.share_cuda_visible_devices  # as Ray's _TorchBackend
    assert config._TorchBackend.share_cuda_visible_devices
