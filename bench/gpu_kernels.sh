#!/usr/bin/env bash
# Prepared script for a lent NVIDIA GPU (at most 5 minutes on an H200; every stage has its own time
# limit inside one deadline, so a slow stage cannot eat the others'). Run once from the repo root:
#   1. bench/fused_ops.py at Wan2.2 720p sites, bf16 (NDHWC and NCDHW) and fp32: the fused Triton ops vs
#      diffusers' unfused sequences and the reference twins, achieved GB/s as a % of a plain device copy
#      (measured in the same process), and --check against the reference twins;
#   2. bench/gpu_kernels.py decode: a real-width Wan2.2 VAE (random weights) at 1280x704, 7 latent
#      frames, bf16: kernels=triton vs torch, time and peak memory, at the auto and a 900 MiB budget;
#   3. bench/gpu_kernels.py profile: the top CUDA kernels of one decode per backend, and whether every
#      convolution ran on cuDNN.
# Wheels for packages the image lacks (diffusers, omegaconf, ...) travel in .whl/ (bench/wheels.sh).
# Logs and JSON go to $OUT (bench/results/gpu_kernels when unset; /tmp with SMOKE): log.txt, kernels-bf16.json,
# kernels-fp32.json, decode.json, profile.json, summary.md. The summary is printed last.
# SMOKE=1 runs the same stages on the CPU at tiny sizes (checks this script without a GPU).
# From the device tool: run(command="bash bench/gpu_kernels.sh", carry=[".whl"], timeout_s=330).
set -uo pipefail
DEADLINE=$((SECONDS + ${DEADLINE_S:-270}))   # the stages end by then; the summary takes a few seconds more
OUT=${OUT:-$([ -n "${SMOKE:-}" ] && echo /tmp/vidgen-gpu_kernels-smoke || echo bench/results/gpu_kernels)}
mkdir -p "$OUT"
LOG=$OUT/log.txt
: >"$LOG"
HIDE='^{'   # JSON row lines stay out of the console
source bench/stages.sh

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 || true
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', \
torch.backends.cudnn.version(), 'triton', triton.__version__, 'gpu', torch.cuda.is_available())" 2>&1
} | tee -a "$LOG"

if [ -n "${SMOKE:-}" ]; then
  K=(env TRITON_INTERPRET=1 python3 bench/fused_ops.py --shape tiny --kernels triton --warmup 0 --reps 1)
  stage kernels-bf16 60 "${K[@]}" --dtype bfloat16 --layout both --check --json "$OUT/kernels-bf16.json"
  stage kernels-fp32 60 "${K[@]}" --dtype float32 --check --json "$OUT/kernels-fp32.json"
  stage decode 90 python3 bench/gpu_kernels.py decode --smoke --json "$OUT/decode.json"
  stage profile 60 python3 bench/gpu_kernels.py profile --smoke --json "$OUT/profile.json"
else
  K=(python3 bench/fused_ops.py --device cuda --shape wan22-720p --kernels triton)
  stage kernels-bf16 85 "${K[@]}" --dtype bfloat16 --layout ndhwc,ncdhw --check --json "$OUT/kernels-bf16.json"
  stage kernels-fp32 55 "${K[@]}" --dtype float32 --check --json "$OUT/kernels-fp32.json"
  stage decode 90 python3 bench/gpu_kernels.py decode --latent 7x44x80 --budgets auto,900MiB --json "$OUT/decode.json"
  stage profile 45 python3 bench/gpu_kernels.py profile --latent 2x44x80 --json "$OUT/profile.json"
fi

{
  echo
  echo "## Summary ($((SECONDS)) s)"
  printf '%s\n' "${STATUS[@]}"
  echo
  for f in "$OUT"/kernels-bf16.json "$OUT"/kernels-fp32.json; do
    [ -s "$f" ] && python3 bench/fused_ops.py --summarize "$f"
  done
  for f in "$OUT"/decode.json "$OUT"/profile.json; do
    [ -s "$f" ] && python3 bench/gpu_kernels.py summarize "$f" --top 6
  done
} 2>&1 | tee "$OUT/summary.md"
