"""The workload's part of a trial's configuration: the distributed strategy, the batch and its
loader, the model and its loss (what a sweep measures). :class:`trainables.config.TrialConfig`
adds how a run runs (training features, schedule, measurement) and validates the whole; the
field docs here are part of the table of every key users read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from trainables.config import choices as vocab

__all__ = ["WorkloadConfig", "doc_field"]


def doc_field(text: str, **kwargs: Any) -> Any:
    """A configuration field with its user-facing doc (``--keys``)."""
    return field(metadata={"doc": text}, **kwargs)


_doc = doc_field


@dataclass(kw_only=True)
class WorkloadConfig:
    """The fields of a trial's workload (TrialConfig's first part: its fields come first)."""

    # --- distributed strategy ---
    strategy: vocab.Strategy = _doc(
        "`ddp` (torch DistributedDataParallel), `fsdp2` (torch's fully_shard, per layer) or "
        "`deepspeed`; `auto`: ddp for zero_stage 0 and deepspeed for 1-3 (the runbooks' z0/z1), "
        "the ddp_* keys applying to the ddp runs only.",
        default="ddp",
    )
    fsdp_reshard_after_forward: bool = _doc(
        "fsdp2: free each layer's gathered parameters after its forward and gather them again "
        "for the backward (true, like ZeRO-3), or keep them until the backward (false, like "
        "ZeRO-2: more memory, less communication).",
        default=True,
    )
    zero_stage: int = _doc("DeepSpeed ZeRO stage 0-3; must be 0 with ddp.", default=0)
    bucket_mb: int = _doc(
        "Gradient bucket size, MB: DDP's bucket_cap_mb; DeepSpeed's reduce and all-gather buckets.",
        default=25,
    )
    ddp_static_graph: bool = _doc(
        "DDP static_graph (needs the same parameters used every step).", default=False
    )
    ddp_find_unused_parameters: bool = _doc("DDP find_unused_parameters.", default=False)
    ddp_gradient_as_bucket_view: bool = _doc(
        "DDP gradient_as_bucket_view (gradients alias the buckets: less memory, fewer copies).",
        default=False,
    )
    ddp_comm_hook: vocab.CommHook = _doc(
        "Compress DDP gradients to bf16 or fp16 for the all-reduce (GPU only).", default="none"
    )
    tf32: bool = _doc("Allow TF32 in CUDA matmuls and cuDNN convolutions.", default=False)
    matmul_precision: vocab.MatmulPrecision = _doc(
        "torch.set_float32_matmul_precision for fp32 matmuls.", default="highest"
    )
    grad_accum_steps: int = _doc(
        "Micro-batches per optimizer step (gradient accumulation): DDP skips the all-reduce on "
        "all but the last (no_sync); DeepSpeed's gradient_accumulation_steps. A step is one "
        "optimizer step, so the global batch is micro_batch x workers x grad_accum_steps.",
        default=1,
    )
    precision: vocab.Precision = _doc(
        "`auto`: bf16 on compute capability >= 8.0, fp16 below, fp32 on CPU. DDP uses autocast "
        "(with a GradScaler for fp16); DeepSpeed its bf16/fp16 modes (dynamic loss scaling).",
        default="auto",
    )
    optimizer: vocab.Optimizer = _doc(
        "`adamw_torch`: torch AdamW (fused on GPU, nothing compiled); `adamw_torch_foreach`: "
        "torch AdamW's multi-tensor (foreach) path; `deepspeed_fused_adam`: DeepSpeed's "
        "FusedAdam (compiles a CUDA extension; needs ninja).",
        default="adamw_torch",
    )
    train_workers: int = _doc("Ray Train workers per trial (one per GPU).", default=2)
    use_gpu: bool | Literal["auto"] = _doc(
        "Train on GPUs; `auto` uses them when the cluster has enough.", default="auto"
    )
    cpus_per_worker: int = _doc(
        "CPUs reserved per Ray Train worker; 0 means num_workers + 1.", default=0
    )
    intra_op_threads: int = _doc(
        "torch's intra-op (OpenMP) threads in each train worker; 0: the platform's choice, 1 on "
        "a GPU (as torchrun gives each rank: Ray gives a worker one per reserved CPU) and the "
        "run's reserved CPUs on a CPU, at most OMP_NUM_THREADS (trainables/host_settings.py "
        "says why).",
        default=0,
    )
    placement_strategy: vocab.PlacementStrategy = _doc(
        "How Ray places the train workers (ScalingConfig.placement_strategy): `PACK` fills as "
        "few nodes as it can, `SPREAD` spreads them where it can, `STRICT_SPREAD` puts every "
        "worker on a node of its own, `STRICT_PACK` all on one node.",
        default="PACK",
    )
    nodes: int = _doc(
        "Nodes the train workers must span (train_workers / nodes on each); 0: any. The driver "
        "refuses a cluster without that many nodes able to hold their share, and the manifest "
        "says where each rank ran.",
        default=0,
    )
    executor: vocab.Executor = _doc(
        "Where a sweep's run trains: `resident` in a worker group kept alive across the runs of "
        "one resource shape (no process start-up per run), `fresh` in new Ray Train workers of "
        "its own; `auto`: resident, unless the run needs its own processes (injected leaks or "
        "kills, checkpoints with restarts) or is platform.train's.",
        default="auto",
    )
    # --- batch and loader ---
    micro_batch: int = _doc("Samples per worker per step.", default=8)
    num_workers: int = _doc("DataLoader worker processes per train worker.", default=0)
    prefetch_factor: int = _doc(
        "Batches prefetched per DataLoader worker (used when num_workers > 0).", default=2
    )
    dataset: vocab.Dataset = _doc(
        "`manifest`: utterances of a data_prep manifest (`manifest_path`); `synthetic`: "
        "generated audio and token ids, no files (pure compute).",
        default="synthetic",
    )
    manifest_path: str = _doc(
        "data_prep manifest (.tsv; its .parquet copy is read when present). Spaces with a `data` "
        "section get it filled by the driver.",
        default="",
    )
    tokenizer_path: str = _doc(
        "The manifest's WordPiece tokenizer (tokenizers JSON). The driver builds it once and "
        "sets this to a copy under the output root, so every node of a cluster loads the same "
        "file; empty: built from the transcripts and cached beside the manifest.",
        default="",
    )
    audio_root: str = _doc(
        "Folder the manifest's `path` column is relative to; empty: the manifest's folder.",
        default="",
    )
    crop_policy: vocab.CropPolicy = _doc(
        "`limit_longest`: a random window of min_audio_s-max_audio_s seconds (shorter "
        "utterances whole); `fixed_slice`: exactly fixed_slice_s (shorter ones zero-padded).",
        default="limit_longest",
    )
    min_audio_s: float = _doc("Shortest crop window of limit_longest, seconds.", default=1.0)
    max_audio_s: float = _doc("Longest crop window of limit_longest, seconds.", default=3.0)
    fixed_slice_s: float = _doc("Crop length of fixed_slice, seconds.", default=2.0)
    audio_read: vocab.AudioRead = _doc(
        "`seek`: read only the crop; `full`: decode the whole file, then crop (for comparison).",
        default="seek",
    )
    length_bucketing: bool = _doc(
        "Group utterances of similar crop length into the same step (less padding): each epoch's "
        "shuffled order is cut into pools of length_bucketing_pool global batches, each pool "
        "sorted by crop length, and the batches shuffled again. Needs limit_longest crops.",
        default=False,
    )
    length_bucketing_pool: int = _doc(
        "Global batches per pool sorted by length (larger: less padding, less randomness).",
        default=50,
    )
    crop_buckets_s: str = _doc(
        "Shape policy for compiled steps: crop lengths in seconds, a comma list (`1.0,1.5,2.0,"
        "2.5,3.0`; a YAML list works too), each within min_audio_s-max_audio_s. A limit_longest "
        "window length is drawn as usual and rounded to the nearest bucket (shorter utterances "
        "take the longest bucket they fill; one shorter than every bucket is zero-padded to the "
        "shortest), every global batch holds crops of one bucket, and transcripts are padded to "
        "text_tokens: one static shape per bucket, compiled before the timed windows. Needs "
        "dataset manifest with limit_longest; replaces length_bucketing. Empty: off.",
        default="",
    )
    audio_s: float = _doc("Length of each synthetic utterance, seconds at 16 kHz.", default=1.0)
    text_tokens: int = _doc(
        "Token ids per synthetic transcript; with a manifest, the most kept per transcript.",
        default=16,
    )
    # --- model and loss ---
    model_size: vocab.ModelSize = _doc(
        "`base` (wav2vec2-base + bert-base-uncased shapes, random init) or `tiny` (CPU tests).",
        default="tiny",
    )
    speech_pretrained_path: str = _doc(
        "Local folder of a wav2vec2 checkpoint (save_pretrained: config.json and weights), loaded "
        "offline with from_pretrained; replaces model_size for the speech encoder.",
        default="",
    )
    text_pretrained_path: str = _doc(
        "Local folder of a BERT checkpoint, loaded like speech_pretrained_path. Its tokenizer is "
        "used when the folder has one; otherwise one is built from the manifest's transcripts.",
        default="",
    )
    model_load_dtype: vocab.LoadDtype = _doc(
        "Dtype the weights are built or loaded in. `auto`: the precision's dtype under DeepSpeed "
        "(which casts the weights to it anyway and keeps fp32 master copies), fp32 under DDP "
        "(autocast keeps fp32 master weights); bf16 under DDP trains bf16 weights.",
        default="auto",
    )
    torch_compile: bool = _doc(
        "Compile with torch.compile: DDP's wrapped module (DDPOptimizer splits the graph at "
        "bucket boundaries, so communication still overlaps) or DeepSpeed's engine.compile. A "
        "compile error falls back to eager, recorded in the run manifest.",
        default=False,
    )
    compile_mode: vocab.CompileMode = _doc(
        "torch.compile mode; `reduce-overhead` adds CUDA graphs (one per shape, recorded in the "
        "compile warm-up; GPU only: the CPU falls back to eager launches, recorded).",
        default="default",
    )
    compile_scope: vocab.CompileScope = _doc(
        "What torch_compile compiles: `model` (the whole DDP-wrapped model, or DeepSpeed's "
        "engine.compile) or `layers` (regional compilation: each encoder layer and the wav2vec2 "
        "feature encoder on its own; the 12 identical layers of an encoder share one compiled "
        "code, so a shape compiles in a fraction of the time, and DDP's hooks stay eager).",
        default="model",
    )
    compile_warmup: bool = _doc(
        "With torch_compile and known shapes (crop_buckets_s, or a synthetic dataset), compile "
        "every shape in a forward and backward pass before the first timed step (no optimizer "
        "step, gradients cleared), under DDP; its time is the run's compile_s, never part of a "
        "window. Other runs (and DeepSpeed) compile at the first step of each new shape.",
        default=True,
    )
    compile_dynamic: bool | Literal["auto"] = _doc(
        "torch.compile dynamic: `auto` recompiles with dynamic shapes once a shape changes "
        "(crop lengths vary with limit_longest); true/false force it.",
        default="auto",
    )
    compile_backend: vocab.CompileBackend = _doc(
        "torch.compile backend: `inductor` (generated kernels) or `aot_eager` (tracing only, "
        "for debugging).",
        default="inductor",
    )
    compile_cache_dir: str = _doc(
        "Where compiled code (inductor's FX-graph and AOTAutograd caches, Triton kernels) and "
        "FLOPs counts are kept, per machine: every sweep, race and platform.train on it reuses "
        "them (the manifest's compile_cache says hit or miss). Empty: $STAGE1_CACHE_DIR, else "
        "the user's cache folder ($XDG_CACHE_HOME/stage1 or ~/.cache/stage1) on each node. An "
        "absolute path (~ allowed).",
        default="",
    )
    proj_dim: int = _doc("Size of the shared embedding space.", default=256)
    speech_attention: vocab.Attention = _doc(
        "Attention kernel of the speech encoder; `auto`: flash_attention_2 on compute capability "
        ">= 8.0 with bf16/fp16 and flash_attn installed, else sdpa. An unavailable kind falls "
        "back to sdpa, recorded in the run manifest.",
        default="auto",
    )
    text_attention: vocab.Attention = _doc(
        "Attention kernel of the text encoder (as speech_attention).", default="auto"
    )
    contrastive_scope: vocab.ContrastiveScope = _doc(
        "`global`: all-gather embeddings so each sample sees the global batch as negatives; "
        "`local`: negatives from the worker's own micro-batch only.",
        default="global",
    )
    lr: float = _doc("AdamW learning rate.", default=1e-4)
    weight_decay: float = _doc("AdamW weight decay.", default=0.01)
    seed: int = _doc("Seed of model init and data order.", default=0)
