"""Ray Train's torch backend, without torch where the group is only orchestrated (issue 40).

``TorchTrainer`` carries a ``TorchConfig``, whose module imports torch. Every process that builds
or unpickles it therefore imports torch first: the resident ``GroupHost`` (``ray.train.torch``:
3.0 s on a GPU host) and Ray Train's ``TrainController`` (1.7 s), both on the way from a sweep's
first trial to its train workers. Neither process touches a tensor.

``TorchBackendConfig`` is the same configuration (nccl with GPUs, else gloo; ``env://``
rendezvous on rank 0's address; ``timeout_s``), in a module that imports no torch. Its
``Backend`` orchestrates from the controller as ``ray.train.torch.config._TorchBackend`` does, and
what runs on the workers is Ray's own code (``_setup_torch_process_group``,
``_set_torch_distributed_env_vars``, ``_shutdown_torch``, ``TorchConfigContextManager``), imported
there, where torch is imported anyway. ``torch_trainer`` builds the V2 ``DataParallelTrainer``
with it, which is what ``TorchTrainer`` is apart from its config. Those worker functions are
Ray's private names (Ray 2.60): tests/test_torch_backend.py fails when a Ray release renames
one, before any group would.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray.train.backend import Backend, BackendConfig

from trainables.observe.gc_control import collector_paused
from trainables.resident.shape import GroupShape

__all__ = ["TorchBackendConfig", "torch_trainer"]

logger = logging.getLogger(__name__)


@dataclass
class TorchBackendConfig(BackendConfig):
    """``ray.train.torch.TorchConfig``'s fields, torch-free where it is built and passed on."""

    backend: str = "gloo"
    timeout_s: int = 1800

    @property
    def backend_cls(self):
        return _TorchBackend

    @property
    def train_func_context(self):
        return _DeviceContext

    @property
    def framework(self):
        from ray.train.v2._internal.util import TrainingFramework

        return TrainingFramework.TORCH

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "init_method": "env", "timeout_s": self.timeout_s}


def torch_trainer(
    train_loop_per_worker: Callable[[dict[str, Any]], Any],
    train_loop_config: dict[str, Any],
    shape: GroupShape,
    run_config: Any,
):
    """A worker group of ``shape`` training ``train_loop_per_worker``: what
    ``TorchTrainer(..., torch_config=TorchConfig(timeout_s=shape.pg_timeout_s))`` builds, a V2
    ``DataParallelTrainer`` with nccl when the shape has GPUs, else gloo."""
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    backend = "nccl" if shape.use_gpu else "gloo"
    return DataParallelTrainer(
        train_loop_per_worker,
        train_loop_config=train_loop_config,
        backend_config=TorchBackendConfig(backend=backend, timeout_s=int(shape.pg_timeout_s)),
        scaling_config=shape.scaling_config(),
        run_config=run_config,
    )


class _DeviceContext:
    """Around the train function on each worker: Ray's own (sets the worker's CUDA device)."""

    def __enter__(self):
        from ray.train.torch.config import TorchConfigContextManager

        return TorchConfigContextManager().__enter__()

    def __exit__(self, kind, value, traceback):
        return False


class _TorchBackend(Backend):
    """``_TorchBackend.on_start``/``on_shutdown`` for the ``env://`` rendezvous, driven from a
    torch-free process; each call on the workers is Ray's function (``_on_worker``)."""

    share_cuda_visible_devices: bool = True

    def on_start(self, worker_group, backend_config: TorchBackendConfig) -> None:
        from ray.train._internal.utils import get_address_and_port

        addr, port = worker_group.execute_single(0, get_address_and_port)
        worker_group.execute(_rendezvous_env, addr=addr, port=port)
        ray.get(
            [
                worker_group.execute_single_async(
                    rank,
                    _on_worker,
                    "_setup_torch_process_group",
                    backend=backend_config.backend,
                    world_rank=rank,
                    world_size=len(worker_group),
                    init_method="env://",
                    timeout_s=backend_config.timeout_s,
                )
                for rank in range(len(worker_group))
            ]
        )

    def on_shutdown(self, worker_group, backend_config: TorchBackendConfig) -> None:
        from ray._private import ray_constants
        from ray.exceptions import GetTimeoutError
        from ray.train.constants import (
            DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
            TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
        )

        futures = worker_group.execute_async(
            _on_worker, "_shutdown_torch", destroy_process_group=len(worker_group) > 1
        )
        timeout_s = ray_constants.env_integer(
            TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S, DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S
        )
        try:
            ray.get(futures, timeout=timeout_s)
        except GetTimeoutError:
            logger.warning("Torch process group shutdown timed out after %s seconds", timeout_s)


def _rendezvous_env(addr: str, port: int) -> None:
    """On each worker: rank 0's address for ``env://``, then torchrun's variables (RANK,
    LOCAL_RANK, WORLD_SIZE, ...) as Ray sets them."""
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)
    _on_worker("_set_torch_distributed_env_vars")


def _on_worker(name: str, **kwargs: Any) -> Any:
    """Ray's function ``name`` of ``ray.train.torch.config``, imported on the worker (torch
    first: the collector paused, trainables/observe/gc_control.py)."""
    with collector_paused():
        from ray.train.torch import config

    return getattr(config, name)(**kwargs)
