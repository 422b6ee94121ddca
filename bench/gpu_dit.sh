#!/usr/bin/env bash
# Prepared script for a lent NVIDIA GPU (at most 5 minutes on an H200; each stage has its own limit
# inside one deadline): bench/gpu_dit.py, one transformer forward of the real-config Wan transformers
# (random weights, bf16) per attention backend, with regional compile and fp8 matmuls, against the
# plain diffusers call on the same weights, with MFU against the stated dense bf16 peak:
#   1. TI2V-5B at 1280x704x121 (27,280 tokens): every backend, compile=blocks, fp8 matmul;
#   2. A14B at 832x480x81 (32,760 tokens): every backend;
#   3. A14B at 1280x720x81 (75,600 tokens): one forward, SDPA auto and the vidgen call.
# Wheels for packages the image lacks (diffusers, sageattention, torchao, ...) travel in .whl/.
# Output goes to $OUT (bench/results/gpu_dit when unset): log.txt and one JSON per stage.
# SMOKE=1 runs the script on the CPU at tiny sizes (checks it without a GPU).
# From the device tool: run(command="bash bench/gpu_dit.sh", carry=[".whl"], timeout_s=330).
set -uo pipefail
DEADLINE=$((SECONDS + ${DEADLINE_S:-290}))
OUT=${OUT:-bench/results/gpu_dit}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -z "${SMOKE:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
LOG=$OUT/log.txt
: >"$LOG"
STATUS=()

stage() {   # stage NAME LIMIT_S COMMAND...: run with its own limit, cut to what the deadline leaves
  local name=$1 limit=$2 left t0 rc
  shift 2
  left=$((DEADLINE - SECONDS))
  ((left < limit)) && limit=$left
  if ((limit < 15)); then
    STATUS+=("$name: SKIPPED, the deadline is near")
    return
  fi
  echo "=== $name (limit ${limit} s): $*" | tee -a "$LOG"
  t0=$SECONDS
  timeout -k 5 "$limit" "$@" 2>&1 | grep --line-buffered -v "should be kept in float32" | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) STATUS+=("$name: ok, $((SECONDS - t0)) s") ;;
    124 | 137) STATUS+=("$name: TIMED OUT after $((SECONDS - t0)) s (limit $limit s)") ;;
    *) STATUS+=("$name: FAILED (exit $rc), $((SECONDS - t0)) s") ;;
  esac
}

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
