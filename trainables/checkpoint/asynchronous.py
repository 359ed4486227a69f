"""What makes a checkpoint asynchronous here: which save a strategy gets (``checkpoint_mode``),
and the stager that copies the state to host memory for ``dcp.async_save`` (``make_stager``,
``CachedStager``, ``kept_open``). Used by trainables/checkpoint/state.py."""

from __future__ import annotations

import torch

__all__ = ["checkpoint_mode", "kept_open", "make_stager"]


def checkpoint_mode(strategy: str, wants_async: bool) -> tuple[str, str]:
    """(mode, what the manifest says): mode ``process``, ``thread`` (async_save's writer) or
    ``sync``."""
    if strategy == "deepspeed":
        return "sync", "deepspeed sync: " + _deepspeed_async_reason()
    if not wants_async:
        return "sync", "dcp sync (checkpoint_async false)"
    try:
        from torch.distributed._state_dict_utils import _copy_state_dict  # noqa: F401
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
    except ImportError:
        return "sync", f"dcp sync: torch {torch.__version__} lacks what async_save needs here"
    if hasattr(AsyncCheckpointerType, "PROCESS"):
        return "process", "dcp async (writer process)"
    return "thread", "dcp async (writer thread: this torch has no process-based writer)"


def _deepspeed_async_reason() -> str:
    """Why DeepSpeed saves synchronously here: its asynchronous path (the decoupled checkpoint
    engine, on FastPersist) needs the async_io op, which needs libaio."""
    try:
        from deepspeed.ops.op_builder import AsyncIOBuilder

        if not AsyncIOBuilder().is_compatible(verbose=False):
            return "its decoupled checkpoint engine needs the async_io op (libaio), not built here"
    except Exception as exc:  # an op builder that cannot even be asked
        return f"its decoupled checkpoint engine is unavailable ({type(exc).__name__})"
    return "its decoupled checkpoint engine (async_io) is not wired in yet"


def make_stager(device: torch.device, *, pinned: bool, shared: bool):
    """The run's stager (:class:`CachedStager`), handed to async_save through
    :func:`kept_open`."""
    return CachedStager(device, pinned=pinned, shared=shared)


class CachedStager:
    """Copies the state into host buffers made once per run and kept (pinned on a GPU,
    ``shared`` with the writer process), the pattern torchtitan's pinned-memory async mode
    uses: a save holds the step only for the device-to-host copy.

    The buffers are made before the first step (:meth:`prepare`, called by
    ``CheckpointWriter.prepare``; start-up's ``checkpoint_buffers`` part). Made at the first
    save they held that save 2.0-3.5 s on an H100 (share and pin every tensor; FSDP2's shards
    are also copied once to find their layout); a save into them held it 0.11-0.18 s, and
    runs with and without checkpoints showed no other cost in the steps
    (benchmarks/results/checkpoint_overhead_1xh100/). A save without them makes them.

    Not torch's DefaultStager: on torch 2.11 a DefaultStager stages once (its second stage()
    fails with ``KeyError: <class 'type'>``, measured on an H100), so every save would make
    and pin its buffers again, and doing that in the background stalled the steps after a
    save by 2.0-2.5 s."""

    _synchronize_after_execute = False  # stage() returns once the copy is done

    def __init__(self, device: torch.device, *, pinned: bool, shared: bool):
        self.gpu = device.type == "cuda"
        self.pinned, self.shared = pinned and self.gpu, shared
        self._buffers = None

    @property
    def should_synchronize_after_execute(self) -> bool:
        return False

    @property
    def ready(self) -> bool:
        """Whether the buffers are made."""
        return self._buffers is not None

    def prepare(self, state_dict) -> None:
        """Make the buffers for ``state_dict``'s layout now (once; its tensors' values are not
        read, except FSDP2's shards once). A failure (host memory) is left to the first save,
        which makes them itself and records its own failure."""
        if self.ready:
            return
        try:
            self._buffers = self._new_buffers(state_dict)
        except Exception:  # noqa: BLE001 - see above
            self._buffers = None

    def _new_buffers(self, state_dict):
        from torch.distributed._state_dict_utils import _create_cpu_state_dict

        return _create_cpu_state_dict(state_dict, pin_memory=self.pinned, share_memory=self.shared)

    def stage(self, state_dict, **_):
        from torch.distributed._state_dict_utils import _copy_state_dict

        if self._buffers is None:
            self._buffers = self._new_buffers(state_dict)
        staged = _copy_state_dict(state_dict, self._buffers, non_blocking=self.pinned)
        if self.pinned:
            torch.cuda.current_stream().synchronize()  # the copies are done before the step
        return staged

    def synchronize_staging(self) -> None:
        """Nothing: stage() returns once the copy is done."""

    def close(self) -> None:
        self._buffers = None


def kept_open(stager):
    """``stager`` behind an AsyncStager whose close() is left to its owner: its buffers outlive
    each save (an async_save may close the stager it is given when its upload is done); the run
    closes it at its end."""
    from torch.distributed.checkpoint.staging import AsyncStager

    class KeptOpen(AsyncStager):
        @property
        def should_synchronize_after_execute(self) -> bool:
            return stager.should_synchronize_after_execute

        def stage(self, state_dict, **kwargs):
            return stager.stage(state_dict, **kwargs)

        def synchronize_staging(self) -> None:
            stager.synchronize_staging()

        def close(self) -> None:
            """Nothing: the run closes the stager at its end."""

    return KeptOpen()
