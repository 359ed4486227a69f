"""The typed configuration of one trial: TrialConfig, every key with its doc.

Plain dicts cross the Ray boundary (Tune param space, ``train_loop_config``); on each side they
are turned back into a :class:`TrialConfig`, which validates every field in ``__post_init__`` so
that a bad value fails before any work starts, with one line naming the key and the fix (the
checks themselves are in ``trainables/config/checks.py``). The field docs below are the table of
every key users read: the workload's keys first (what a sweep measures), then how a run runs.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from trainables.config import choices
from trainables.config.checks import (
    MAX_TEXT_TOKENS,
    ConfigError,
    check_config,
    describe_type,
    is_union,
    match_type,
)

__all__ = [
    "ConfigError",
    "MAX_TEXT_TOKENS",
    "TrialConfig",
    "check_known_key",
    "coerce_value",
    "doc_field",
    "field_doc",
    "field_names",
    "global_batch",
]


def doc_field(text: str, **kwargs: Any) -> Any:
    """A configuration field with its user-facing doc (``--keys``)."""
    return field(metadata={"doc": text}, **kwargs)


_doc = doc_field


@dataclass(kw_only=True)
class TrialConfig:
    """Everything one trial needs: the workload (what a sweep measures: the distributed
    strategy, the batch and its loader, the model and its loss), then how the run runs
    (training features, schedule, measurement, faults, timeouts). Field docs are the reference
    for search-space keys; their order is the families' order (platform/spaces/keys.py)."""

    # --- distributed strategy ---
    strategy: choices.Strategy = _doc(
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
    ddp_comm_hook: choices.CommHook = _doc(
        "Compress DDP gradients to bf16 or fp16 for the all-reduce (GPU only).", default="none"
    )
    tf32: bool = _doc("Allow TF32 in CUDA matmuls and cuDNN convolutions.", default=False)
    matmul_precision: choices.MatmulPrecision = _doc(
        "torch.set_float32_matmul_precision for fp32 matmuls.", default="highest"
    )
    grad_accum_steps: int = _doc(
        "Micro-batches per optimizer step (gradient accumulation): DDP skips the all-reduce on "
        "all but the last (no_sync); DeepSpeed's gradient_accumulation_steps. A step is one "
        "optimizer step, so the global batch is micro_batch x workers x grad_accum_steps.",
        default=1,
    )
    precision: choices.Precision = _doc(
        "`auto`: bf16 on compute capability >= 8.0, fp16 below, fp32 on CPU. DDP uses autocast "
        "(with a GradScaler for fp16); DeepSpeed its bf16/fp16 modes (dynamic loss scaling).",
        default="auto",
    )
    optimizer: choices.Optimizer = _doc(
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
    placement_strategy: choices.PlacementStrategy = _doc(
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
    executor: choices.Executor = _doc(
        "Where a sweep's run trains: `resident` in a worker group kept alive across the runs of "
        "one resource shape (no process start-up per run), `fresh` in new Ray Train workers of "
        "its own; `auto`: resident, unless the run needs its own processes (a planted leak, "
        "checkpoints, the profiler) or is platform.train's.",
        default="auto",
    )
    # --- batch and loader ---
    micro_batch: int = _doc(
        "Samples per worker per step; with batching duration, validation's batches only.",
        default=8,
    )
    num_workers: int = _doc("DataLoader worker processes per train worker.", default=0)
    prefetch_factor: int = _doc(
        "Batches prefetched per DataLoader worker (used when num_workers > 0).", default=2
    )
    dataset: choices.Dataset = _doc(
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
    crop_policy: choices.CropPolicy = _doc(
        "`limit_longest`: a random window of min_audio_s-max_audio_s seconds (shorter "
        "utterances whole); `fixed_slice`: exactly fixed_slice_s (shorter ones zero-padded). "
        "batching duration crops nothing below max_audio_s (it needs limit_longest).",
        default="limit_longest",
    )
    min_audio_s: float = _doc(
        "Shortest crop window of limit_longest, seconds; with batching duration, the shortest "
        "duration bin (shorter utterances are padded to it).",
        default=1.0,
    )
    max_audio_s: float = _doc(
        "Longest crop window of limit_longest, seconds; with batching duration, the longest "
        "utterance kept whole (a longer one gives a random window this long, the same for a "
        "seed and item).",
        default=3.0,
    )
    fixed_slice_s: float = _doc("Crop length of fixed_slice, seconds.", default=2.0)
    audio_read: choices.AudioRead = _doc(
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
    batching: choices.Batching = _doc(
        "How a micro-batch is filled. `count`: micro_batch utterances per rank, cropped as "
        "crop_policy says. `duration`: whole utterances (up to max_audio_s), each rank's "
        "micro-batch filled with up to batch_audio_s seconds of padded audio from one duration "
        "bin (batch_max_pad), as Lhotse's and NeMo's dynamic bucketing and fairseq's max_tokens "
        "do: the number of utterances per step varies (short ones: more per step, so more "
        "negatives for the contrastive loss), every utterance is trained on once per epoch, "
        "ranks may hold different counts in a step (the loss gathers them as they are) and "
        "samples/s counts what each step held. Transcripts are padded to text_tokens. Needs "
        "dataset manifest with limit_longest; replaces crop_buckets_s and length_bucketing.",
        default="count",
    )
    batch_audio_s: float = _doc(
        "batching duration: the budget of one rank's micro-batch, seconds of padded audio "
        "(its rows x its bin's length, never more; fairseq's max_tokens, NeMo's batch_duration "
        "counted padded); at least max_audio_s. Match a count run by micro_batch x its mean "
        "crop (256 x 2 s: 512).",
        default=0.0,
    )
    batch_max_pad: float = _doc(
        "batching duration: the padding bound, which also sets how many shapes a compiled run "
        "sees. Duration bins are max_audio_s / (1 + batch_max_pad)^k seconds (k = 0, 1, ... "
        "until min_audio_s, in 20 ms frames); an utterance goes to the shortest bin that holds "
        "it and a batch is padded to its bin, so its padded audio is at most (1 + "
        "batch_max_pad) x its real audio (utterances shorter than min_audio_s, padded to the "
        "shortest bin, excepted). Larger: fewer bins, fewer shapes, more padding.",
        default=0.1,
    )
    audio_s: float = _doc("Length of each synthetic utterance, seconds at 16 kHz.", default=1.0)
    text_tokens: int = _doc(
        "Token ids per synthetic transcript; with a manifest, the most kept per transcript.",
        default=16,
    )
    # --- model and loss ---
    model_size: choices.ModelSize = _doc(
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
    model_load_dtype: choices.LoadDtype = _doc(
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
    compile_mode: choices.CompileMode = _doc(
        "torch.compile mode; `reduce-overhead` adds CUDA graphs (one per shape, recorded in the "
        "compile warm-up; GPU only: the CPU falls back to eager launches, recorded). The "
        "max-autotune modes time Inductor's Triton GEMM templates against cuBLAS per shape: on "
        "an H200 cuBLAS won 10 of a speech layer's 11 GEMM shapes, and timing them took over "
        "2 minutes for one layer at one shape (benchmarks/results/fuse_linears_1xh200/).",
        default="default",
    )
    compile_scope: choices.CompileScope = _doc(
        "What torch_compile compiles: `model` (the whole DDP-wrapped model, or DeepSpeed's "
        "engine.compile) or `layers` (regional compilation: each encoder layer and the wav2vec2 "
        "feature encoder on its own; the 12 identical layers of an encoder share one compiled "
        "code, so a shape compiles in a fraction of the time, and DDP's hooks stay eager).",
        default="model",
    )
    compile_fuse_linears: bool = _doc(
        "An Inductor pass (trainables/engine/linear_fusion.py): the linears of a compiled "
        "region that read one input (every attention's q, k and v) run as one GEMM on their "
        "weights concatenated, a wider shape the tensor cores run faster; same math and "
        "parameters. Needs torch_compile with the inductor backend. On an H200 at mb 256, 2 s: "
        "a layer's GEMMs 8 % (speech) and 12 % (text) faster, the compiled best's step 1.030x "
        "(benchmarks/results/fuse_linears_1xh200/).",
        default=False,
    )
    compile_pos_conv: bool = _doc(
        "With compile_scope layers, wav2vec2's positional convolution is a compiled region too "
        "(between the feature encoder and the first layer; otherwise it runs eagerly there). "
        "With `pos_conv: matmul` that fuses its input windows' copies and the sum of their "
        "gradients (eagerly torch's `unfold` backward, 7.1 ms of a 227 ms step on an H200 at "
        "mb 512, 2 s; benchmarks/results/folded_layer_1xh200/). Needs torch_compile with "
        "compile_scope layers.",
        default=False,
    )
    compile_warmup: bool = _doc(
        "With torch_compile and known shapes (crop_buckets_s, batching duration, or a synthetic "
        "dataset), compile every shape in a forward and backward pass before the first timed "
        "step (no optimizer step, gradients cleared), under DDP; its time is the run's "
        "compile_s, never part of a window. Other runs (and DeepSpeed) compile at the first "
        "step of each new shape (their compile_in_windows_s).",
        default=True,
    )
    compile_dynamic: bool | Literal["auto"] = _doc(
        "torch.compile dynamic: `auto` recompiles with dynamic shapes once a shape changes "
        "(crop lengths vary with limit_longest), and compiles each shape statically where they "
        "are known (crop_buckets_s, batching duration); true/false force it.",
        default="auto",
    )
    compile_backend: choices.CompileBackend = _doc(
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
    dropout: float | choices.ModelDefault = _doc(
        "Every dropout rate of both encoders (wav2vec2's hidden, attention, activation and "
        "feature-projection dropout; BERT's hidden and attention dropout); `model`: the "
        "encoders' own (transformers' 0.1, or a checkpoint's config). A regulariser: 0 takes "
        "4-5 % off a base step at mb 256 on an H200 and changes the math (judge it on the "
        "learnable corpus).",
        default="model",
    )
    padding_masks: choices.PaddingMasks = _doc(
        "How the encoders' padding masks are built: `sync_free` (on the device, the 4D mask "
        "the layers take built whether or not it pads anything, wav2vec2's padded frames "
        "zeroed by masked_fill; trainables/model/padding.py) or `transformers` (transformers' "
        "forward: it asks whether a mask pads anything and zeroes padded frames with a "
        "boolean index, each a host sync, one in every step since transcripts are padded to "
        "text_tokens). The same numbers; `transformers` is kept to measure the difference. "
        "Attention kinds that take the 2D mask (flash_attention_2) build it as transformers "
        "does either way.",
        default="sync_free",
    )
    residual_dtype: choices.ResidualDtype = _doc(
        "The encoders' residual stream under DDP at precision bf16: `fp32` (autocast's: every "
        "LayerNorm returns float32, so each residual add, norm and their backward move "
        "float32) or `bf16` (every LayerNorm's output cast to bf16, as FSDP2's and DeepSpeed's "
        "bf16 weights already compute, and Megatron-LM by default; trainables/model/"
        "residual.py). Changes the math: judge it on the learnable corpus. Other strategies "
        "and precisions compute as their weights do; the manifest's residual_dtype_effective "
        "says which ran.",
        default="fp32",
    )
    pos_conv: choices.PosConv = _doc(
        "wav2vec2's positional convolution (768 channels in 16 groups, kernel 128 at base): "
        "`conv` (torch's grouped convolution, cuDNN on a GPU: about 3 % of an H200's peak) or "
        "`matmul` (the same convolution as block-Toeplitz batched products, equal to float "
        "rounding, same parameters; FLOPs and MFU still counted as the convolution): on 2x H200 "
        "at the compiled best point 1.08x samples/s, the projection and positional convolution "
        "27.3 -> 8.1 ms a step. Not under DeepSpeed ZeRO-3.",
        default="conv",
    )
    extractor_layout: choices.ExtractorLayout = _doc(
        "How wav2vec2's convolutional feature encoder runs: `channels_first` (transformers' "
        "Conv1d on batch x channels x time), `channels_last` (the same convolutions as conv2d "
        "on channels-last activations; measured slower eager on an H200, 61.0 against 53.7 ms "
        "at mb 256, 2 s) or `matmul` (each convolution as GEMMs over batch x time x channels "
        "activations, reading them in place; the GroupNorm in float32 over each item's "
        "frames): on an H200 at mb 256, 2 s, compiled, the feature encoder 42.8 -> 29.8 ms and "
        "the whole one-GPU step 1.11x; eager it holds about twice the original's activation "
        "memory (its float32 GroupNorm): use it compiled. Same parameters, equal to float "
        "rounding; FLOPs counted on the convolutions. Not under DeepSpeed ZeRO-3.",
        default="channels_first",
    )
    extractor_norm: choices.ExtractorNorm = _doc(
        "How `extractor_layout: matmul` runs the feature encoder's first layer (convolution, "
        "GroupNorm per item and channel over time, GELU: its largest memory-bound part): "
        "`torch` (float32 torch ops, fused by torch.compile), `triton` (the norm and GELU as "
        "four Triton kernels, trainables/model/norm_gelu.py: two passes forward, two backward) "
        "or `folded` (the whole layer as one product a pass, the norm's statistics from each "
        "item's covariance of audio windows, trainables/model/folded_layer.py: one write "
        "forward, one read backward); each equal to float rounding, statistics in float32. "
        "`auto`: folded where it can run (Triton on a CUDA device of compute capability 8.0 "
        "or more), else triton where it can (Triton on a CUDA device), else torch; folded and "
        "triton fall back to torch. On an H200 at mb 256, 2 s, compiled, the layer's forward and "
        "backward: torch 12.7, triton 6.9, folded 4.0 ms; at the fastest point (mb 512) folded "
        "against triton 1.034x the step (2 pairs on each of two hosts; benchmarks/results/"
        "folded_layer_1xh200/). The manifest's extractor_norm_effective says which ran.",
        default="auto",
    )
    speech_attention: choices.Attention = _doc(
        "Attention kernel of the speech encoder: transformers' `eager`, `sdpa` (PyTorch picks "
        "the SDPA backend per call; cuDNN on an H100/H200 with torch 2.11) or "
        "`flash_attention_2` (the flash_attn package); `sdpa_cudnn`, `sdpa_flash`, "
        "`sdpa_efficient`, `sdpa_math`: SDPA on that backend alone (cuDNN attention, "
        "FlashAttention-2, memory-efficient, math; flash takes no padding mask on a GPU, so "
        "padded batches run sdpa there); `auto`: flash_attention_2 on compute capability >= "
        "8.0 with bf16/fp16 and flash_attn installed, else sdpa. A kind that cannot run here "
        "(no GPU, dtype, head size, attention dropout) falls back to sdpa, with the reason in "
        "the manifest's fallbacks.",
        default="auto",
    )
    text_attention: choices.Attention = _doc(
        "Attention kernel of the text encoder (as speech_attention).", default="auto"
    )
    contrastive_scope: choices.ContrastiveScope = _doc(
        "`global`: all-gather embeddings so each sample sees the global batch as negatives; "
        "`local`: negatives from the worker's own micro-batch only.",
        default="global",
    )
    lr: float = _doc("AdamW learning rate.", default=1e-4)
    weight_decay: float = _doc("AdamW weight decay.", default=0.01)
    seed: int = _doc("Seed of model init and data order.", default=0)
    # --- training (sweeps keep these off, as the runbooks do; platform.train turns them on) ---
    lr_schedule: choices.LrSchedule = _doc(
        "`constant` lr, or `cosine`: linear warm-up over warmup_steps, then cosine decay to "
        "min_lr_ratio x lr at max_steps.",
        default="constant",
    )
    warmup_steps: int = _doc("Linear warm-up steps of the learning rate (0: none).", default=0)
    min_lr_ratio: float = _doc("Floor of the cosine schedule, as a fraction of lr.", default=0.0)
    grad_clip: float = _doc(
        "Clip the global gradient norm to this before each optimizer step (0: off).", default=0.0
    )
    logit_scale_max: float = _doc(
        "CLIP temperature clamp: the learned logit scale (1/temperature) is kept at or below "
        "this after every step (CLIP: 100).",
        default=100.0,
    )
    epochs: int = _doc(
        "Train this many passes over the manifest instead of max_steps (0: use max_steps); the "
        "driver turns it into max_steps from the manifest's size.",
        default=0,
    )
    val_every: int = _doc(
        "Validate every this many steps (a multiple of log_every; 0: off): contrastive loss and "
        "speech-to-text / text-to-speech recall@1/@5 over the whole held-out split.",
        default=0,
    )
    val_manifest_path: str = _doc(
        "data_prep manifest of the held-out split (e.g. dev-clean); empty: val_speakers.",
        default="",
    )
    val_speakers: int = _doc(
        "Without val_manifest_path: hold out this many speakers of manifest_path (the last in "
        "sorted order) for validation; training never sees them.",
        default=0,
    )
    best_metric: choices.BestMetric = _doc(
        "Validation metric that picks the best checkpoint (val_loss: lowest; recalls: highest).",
        default="val_mean_r1",
    )
    checkpoint_every: int = _doc(
        "Save a checkpoint through Ray Train every this many steps (a multiple of log_every; "
        "0: off): model, optimizer, schedule, step, data position and RNG states.",
        default=0,
    )
    checkpoint_async: bool = _doc(
        "ddp and fsdp2: write checkpoints with torch.distributed.checkpoint's async_save (the "
        "step waits only for the copy to host memory); false: dcp.save. DeepSpeed: synchronous.",
        default=True,
    )
    checkpoint_pinned: bool = _doc(
        "GPU, checkpoint_async: stage in pinned host memory (fast copies; the buffers are made "
        "and pinned once, ahead of the first save); false: pageable shared memory.",
        default=True,
    )
    keep_checkpoints: int = _doc(
        "Checkpoints kept (Ray Train's num_to_keep; with validation the best by best_metric, "
        "and always the latest).",
        default=2,
    )
    max_failures: int = _doc(
        "Worker-group restarts from the latest checkpoint after a worker dies (Ray Train's "
        "FailureConfig; -1: no limit).",
        default=0,
    )
    export_model: choices.ExportModel = _doc(
        "At the end, write the final or the best checkpoint's model as save_pretrained folders "
        "(runs/<run>/export/speech, text, heads.pt), loadable with speech_pretrained_path and "
        "text_pretrained_path.",
        default="none",
    )
    # --- schedule and measurement ---
    max_steps: int = _doc("Optimizer steps per run.", default=30)
    log_every: int = _doc(
        "Steps per timing window; each window is one ray.train.report (a barrier).", default=5
    )
    tail_timing_points: int = _doc(
        "Windows at the end of a run averaged into its tail figures.", default=3
    )
    cuda_sync_timing: bool = _doc(
        "Synchronize the GPU after each step so step_ms is exact (otherwise launch time).",
        default=False,
    )
    profile_steps: int = _doc(
        "Rank 0 records this many steps with the torch profiler in the second timing window "
        "(one warm-up step before them; log_every must be larger), their forward, backward and "
        "optimizer marked, into runs/<run>/profile-rank0.json (a Chrome trace; python -m "
        "benchmarks.step_profile splits it into the phases' GPU time, communication and GPU "
        "idle time); 0: off. The run gets processes of its own, and the window must end before "
        "the tail windows.",
        default=0,
    )
    timing_ranks: choices.TimingRanks = _doc(
        "`rank0`: rank 0's windows only; `all`: every rank's windows, gathered to rank 0 at each "
        "report (one more collective per window), one timing row per rank.",
        default="rank0",
    )
    telemetry: bool = _doc(
        "Sample each GPU (NVML) and each node (memory, load, trainer RSS) in the workers, and "
        "print the driver's heartbeats and stall alerts for the run.",
        default=True,
    )
    gpu_telemetry_interval_s: float = _doc("Seconds between NVML samples of a GPU.", default=2.0)
    host_telemetry_interval_s: float = _doc("Seconds between host samples of a node.", default=5.0)
    heartbeat_every_s: float = _doc(
        "Seconds between the driver's heartbeat lines per running run; 0: none.", default=30.0
    )
    stall_alert_ratio: float = _doc(
        "Alert when a window's iter_ms_p50 exceeds this times the run's median so far.",
        default=2.0,
    )
    inject_sleep_s: float = _doc(
        "Fault injection for tests: sleep this long inside the step at inject_sleep_at_step.",
        default=0.0,
    )
    inject_sleep_at_step: int = _doc("First step of the injected sleep (0: none).", default=0)
    inject_sleep_steps: int = _doc("Consecutive steps that sleep from there.", default=1)
    inject_sleep_rank: int = _doc("Rank that sleeps; -1: every rank.", default=-1)
    inject_sleep_every: int = _doc(
        "Of those steps, every Nth sleeps (1: each); 3 gives one slow step in three, the "
        "irregular iteration times of an unstable configuration.",
        default=1,
    )
    inject_error_at_step: int = _doc(
        "Fault injection for tests: raise a RuntimeError inside this step (0: never).", default=0
    )
    inject_error_rank: int = _doc(
        "Rank that raises (or kills itself, inject_kill_at_step); -1: every rank.", default=-1
    )
    inject_kill_at_step: int = _doc(
        "Fault injection for tests: inject_error_rank kills itself with SIGKILL after this step "
        "(0: never).",
        default=0,
    )
    inject_every_attempt: bool = _doc(
        "Fault injection for tests: the inject_* faults act in a run's first attempt only (a "
        "worker group restarted from a checkpoint, or a training resumed with --resume, trains "
        "on without them, so a drill shows its recovery); true: in every attempt.",
        default=False,
    )
    inject_save_delay_s: float = _doc(
        "Fault injection for tests: an asynchronous checkpoint's writer waits this long before "
        "it writes (room to kill a rank while a save is in flight).",
        default=0.0,
    )
    inject_leak_mb_per_step: float = _doc(
        "Fault injection for tests: every rank keeps this many more MB of host memory after each "
        "step (a planted leak for the leak check; training itself is unchanged).",
        default=0.0,
    )
    pg_timeout_s: int = _doc(
        "Process-group (gloo/NCCL) collective timeout, seconds (lowered to just above "
        "stall_timeout_s when that is set).",
        default=1800,
    )
    stall_timeout_s: float = _doc(
        "A rank without progress this long dumps the stacks of its threads to "
        "runs/<run>/stacks-rank<r>.txt, and the collectives of the others time out soon "
        "after; 0: off. Covers the first step too (compilation included).",
        default=900.0,
    )
    run_timeout_s: float = _doc(
        "A run still going after this long (from its trial's start, checked at each window "
        "report) is stopped and recorded `timeout`; 0: no limit.",
        default=0.0,
    )
    fail_tail_lines: int = _doc(
        "Lines from the end of each worker's stdout and stderr that the driver saves to "
        "runs/<run>/fail_tail.txt when the run fails or stalls (the console names the file); "
        "0: none.",
        default=40,
    )
    max_missing_files_fraction: float = _doc(
        "Manifest rows whose audio file is missing are skipped and counted (missing_files in "
        "the run manifest); the run fails when more than this fraction of rows is missing.",
        default=0.01,
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, coerce_value(f.name, getattr(self, f.name), _hints()[f.name]))
        if self.strategy == "auto":  # resolved here: workers and records see ddp or deepspeed
            self.strategy = "ddp" if self.zero_stage == 0 else "deepspeed"
            if self.strategy == "deepspeed":
                self.ddp_comm_hook = "none"
        check_config(self)
        if self.crop_buckets_s:  # one spelling of the buckets: ascending, shortest form
            self.crop_buckets_s = ",".join(f"{b:g}" for b in sorted(self.crop_buckets))

    # --- conversions at the Ray boundary ---
    @classmethod
    def from_dict(cls, values: dict[str, Any], *, where: str = "config") -> TrialConfig:
        """Build from a plain dict; unknown keys fail with the closest known key as the fix."""
        for key in values:
            check_known_key(key, where=where)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def cpus_per_train_worker(self) -> int:
        """CPUs a train worker reserves: its own process plus one per DataLoader worker."""
        return self.cpus_per_worker or self.num_workers + 1

    @property
    def workers_per_node(self) -> int:
        """Train workers each node holds: train_workers / nodes, one under STRICT_SPREAD."""
        if self.placement_strategy == "STRICT_SPREAD":
            return 1
        return self.train_workers // self.nodes if self.nodes else self.train_workers

    @property
    def checkpoint_score_order(self) -> str:
        """How best_metric ranks checkpoints: lower loss or higher recall is better."""
        return "min" if self.best_metric == "val_loss" else "max"

    @property
    def crop_buckets(self) -> tuple[float, ...]:
        """crop_buckets_s as seconds, ascending (empty: off)."""
        return (
            tuple(float(b) for b in self.crop_buckets_s.split(",")) if self.crop_buckets_s else ()
        )

    @property
    def static_shapes(self) -> list[tuple[int, int]] | None:
        """(audio samples, text tokens) of every batch shape the run can see, when they are
        known before it starts (crop_buckets_s, synthetic data); None otherwise."""
        if self.crop_buckets:
            return [(int(round(b * 16_000)), self.text_tokens) for b in self.crop_buckets]
        if self.dataset == "synthetic":
            return [(self.audio_samples, self.text_tokens)]
        return None

    @property
    def dropout_rate(self) -> float | None:
        """``dropout`` as the model builder takes it: None keeps the encoders' own rates."""
        return None if self.dropout == "model" else float(self.dropout)

    @property
    def audio_samples(self) -> int:
        return int(round(self.audio_s * 16_000))


def global_batch(*, micro_batch: int, world_size: int, grad_accum_steps: int = 1) -> int:
    """Samples in one global batch: ``micro_batch`` on each of ``world_size`` ranks, for each of
    ``grad_accum_steps`` micro-batches. With a run's grad_accum_steps, an optimizer step's batch
    (throughput, steps per epoch); with 1, one micro-step of every rank: what a sampler cuts
    into the ranks' micro-batches."""
    return micro_batch * world_size * grad_accum_steps


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(TrialConfig)]


def field_doc(name: str) -> str:
    return {f.name: f.metadata.get("doc", "") for f in dataclasses.fields(TrialConfig)}[name]


def check_known_key(key: str, *, where: str) -> None:
    names = field_names()
    if key not in names:
        close = difflib.get_close_matches(key, names, n=1)
        hint = f"did you mean {close[0]!r}?" if close else "known keys: " + ", ".join(names)
        raise ConfigError(f"unknown key {key!r} in {where}; {hint}")


# str keys that hold a comma list; a YAML list is accepted and joined.
_LIST_KEYS = ("crop_buckets_s",)

_HINTS: dict[str, Any] | None = None


def _hints() -> dict[str, Any]:
    global _HINTS
    if _HINTS is None:
        _HINTS = typing.get_type_hints(TrialConfig)
    return _HINTS


def coerce_value(name: str, value: Any, hint: Any = None) -> Any:
    """Check ``value`` against the field's type; ints are accepted for floats, nothing else."""
    if hint is None:
        check_known_key(name, where="config")
        hint = _hints()[name]
    if name in _LIST_KEYS and isinstance(value, (list, tuple)):
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{name}: expected a list of numbers, got {value!r}")
        value = ",".join(f"{float(v):g}" for v in value)
    options = typing.get_args(hint) if is_union(hint) else (hint,)
    for option in options:
        ok, converted = match_type(value, option)
        if ok:
            return converted
    raise ConfigError(f"{name}: expected {describe_type(hint)}, got {value!r}")
