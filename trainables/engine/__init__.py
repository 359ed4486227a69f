"""The training engine behind one small interface, whatever the strategy (DDP or a DeepSpeed
ZeRO engine): the loop only calls ``engine(batch) -> (speech, text, scale)``,
``engine.backward(loss)`` and ``engine.step(last)``.

One module per concern: ``precision`` (the precision policy and autocast), ``optim`` (the
optimizer and learning-rate schedule), ``compile`` (torch.compile of the model or its regions,
and the warm-up), ``mfu`` (FLOPs per sample, the peak table, the FLOPs cache), ``shapes`` (made-up
batches of a shape), ``core`` (the Engine, and ``assemble_engine``, which every strategy calls),
``ddp``, ``fsdp2`` and ``deepspeed_engine`` (the wrapping), and ``build`` (build_engine, which
puts them together).
"""

from trainables.engine.build import build_engine
from trainables.engine.compile import compile_regions
from trainables.engine.core import Engine
from trainables.engine.deepspeed_engine import deepspeed_config
from trainables.engine.optim import lr_factor
from trainables.engine.precision import resolve_load_dtype, resolve_precision
from trainables.engine.shapes import probe_batch

__all__ = [
    "Engine",
    "build_engine",
    "compile_regions",
    "deepspeed_config",
    "lr_factor",
    "probe_batch",
    "resolve_load_dtype",
    "resolve_precision",
]
