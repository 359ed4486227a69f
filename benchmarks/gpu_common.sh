# Sourced by the benchmarks/*_gpu.sh and benchmarks/probes/*_gpu.sh scripts: $OUT, the
# environment the GPU hosts need, and the 1,600-utterance corpus (2-8 s; CORPUS_SPEAKERS=N:
# N x 200 utterances), made once per machine under /tmp and reused while it is warm.
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
C=/tmp/corpus
M=$C/p/manifest_16k_trim.tsv
# The machine's GPUs, listed into $OUT/gpus.txt; their count in $GPUS.
list_gpus() {
  nvidia-smi -L | tee "$OUT/gpus.txt"
  GPUS=$(nvidia-smi -L | wc -l)
}
quiet() { grep -v -e PlacementGroupCleaner -e "Failed to query Ray Train Controller"; }
make_corpus() {
  [ -f "$M" ] && return 0
  python -m data_prep.synth --output-root $C/raw --speakers "${CORPUS_SPEAKERS:-8}" --chapters 4 --utts 50 \
    --min-s 2 --max-s 8 2>&1 | tail -2 | tee "$OUT/prep.log"
  python -m data_prep.librispeech --input-root $C/raw --output-root $C/p --trim \
    --manifest-path $M 2>&1 | tail -3 | tee -a "$OUT/prep.log"
}
