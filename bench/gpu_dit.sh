#!/usr/bin/env bash
# Prepared script for a lent NVIDIA GPU (at most 5 minutes on an H200; each stage has its own limit
# inside one deadline): bench/gpu_dit.py, one transformer forward of the real-config Wan transformers
# (random weights, bf16) per attention backend, with regional compile and fp8 matmuls, against the
# plain diffusers call on the same weights, with MFU against the stated dense bf16 peak:
#   1. TI2V-5B at 1280x704x121 (27,280 tokens): every backend, compile=blocks, fp8 matmul;
#   2. A14B at 832x480x81 (32,760 tokens): every backend;
#   3. A14B at 1280x720x81 (75,600 tokens): one forward, SDPA auto and the vidgen call.
# Wheels for packages the image lacks (diffusers, sageattention, torchao, ...) travel in .whl/ (bench/wheels.sh).
# Output goes to $OUT (bench/results/gpu_dit when unset; with SMOKE, /tmp/vidgen-gpu_dit-smoke): log.txt and one JSON per stage.
# SMOKE=1 runs the script on the CPU at tiny sizes (checks it without a GPU).
# From the device tool: run(command="bash bench/gpu_dit.sh", carry=[".whl"], timeout_s=330).
set -uo pipefail
DEADLINE=$((SECONDS + ${DEADLINE_S:-290}))
OUT=${OUT:-$([ -n "${SMOKE:-}" ] && echo /tmp/vidgen-gpu_dit-smoke || echo bench/results/gpu_dit)}
mkdir -p "$OUT"
LOG=$OUT/log.txt
: >"$LOG"
source bench/stages.sh

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader 2>&1 || true
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', \
torch.backends.cudnn.version(), 'gpu', torch.cuda.is_available())" 2>&1
  python3 -c "import sageattention; print('sageattention', getattr(sageattention, '__version__', 'present'))" 2>&1 | tail -1
  python3 -c "import torchao; print('torchao', torchao.__version__)" 2>&1 | tail -1
} | tee -a "$LOG"

if [ -n "${SMOKE:-}" ]; then
  stage smoke 120 python3 bench/gpu_dit.py --smoke --json "$OUT/smoke.json"
else
  stage ti2v-5b 130 python3 bench/gpu_dit.py --models ti2v-5b --json "$OUT/ti2v-5b.json"
  stage a14b-480p 90 python3 bench/gpu_dit.py --models a14b-480p --no-compile --no-fp8 --json "$OUT/a14b-480p.json"
  stage a14b-720p 60 python3 bench/gpu_dit.py --models a14b-720p --json "$OUT/a14b-720p.json"
fi

echo
echo "## Summary ($((SECONDS)) s)"
printf '%s\n' "${STATUS[@]}"
