"""The values each enumerated key of :class:`trainables.config.TrialConfig` accepts (the
``Literal`` types of its fields): one set of choices per key, checked by ``checks.match_type``
and listed by the key table and ``--keys``."""

from __future__ import annotations

from typing import Literal

__all__ = [
    "Strategy",
    "Precision",
    "Optimizer",
    "Attention",
    "CommHook",
    "MatmulPrecision",
    "ModelSize",
    "Dataset",
    "CropPolicy",
    "Batching",
    "AudioRead",
    "ContrastiveScope",
    "LoadDtype",
    "CompileMode",
    "CompileBackend",
    "CompileScope",
    "TimingRanks",
    "LrSchedule",
    "BestMetric",
    "ExportModel",
    "PlacementStrategy",
    "Executor",
    "PosConv",
    "ExtractorLayout",
    "ExtractorNorm",
    "PaddingMasks",
    "ResidualDtype",
]

Strategy = Literal["ddp", "fsdp2", "deepspeed", "auto"]
Precision = Literal["auto", "fp32", "bf16", "fp16"]
Optimizer = Literal["adamw_torch", "adamw_torch_foreach", "deepspeed_fused_adam"]
Attention = Literal[
    "auto",
    "eager",
    "sdpa",
    "sdpa_cudnn",
    "sdpa_flash",
    "sdpa_efficient",
    "sdpa_math",
    "flash_attention_2",
]
CommHook = Literal["none", "bf16", "fp16"]
MatmulPrecision = Literal["highest", "high", "medium"]
ModelSize = Literal["tiny", "base"]
ModelDefault = Literal["model"]
Dataset = Literal["synthetic", "manifest"]
CropPolicy = Literal["limit_longest", "fixed_slice"]
Batching = Literal["count", "duration"]
AudioRead = Literal["seek", "full"]
ContrastiveScope = Literal["global", "local"]
LoadDtype = Literal["auto", "fp32", "bf16", "fp16"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
CompileBackend = Literal["inductor", "aot_eager"]
CompileScope = Literal["model", "layers"]
TimingRanks = Literal["rank0", "all"]
LrSchedule = Literal["constant", "cosine"]
BestMetric = Literal[
    "val_mean_r1", "val_s2t_r1", "val_t2s_r1", "val_s2t_r5", "val_t2s_r5", "val_loss"
]
ExportModel = Literal["none", "final", "best"]
PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
Executor = Literal["auto", "resident", "fresh"]
PosConv = Literal["conv", "matmul"]
ExtractorLayout = Literal["channels_first", "channels_last", "matmul"]
ExtractorNorm = Literal["torch", "triton", "folded", "auto"]
PaddingMasks = Literal["sync_free", "transformers"]
ResidualDtype = Literal["fp32", "bf16"]
