#!/usr/bin/env bash
# Prepared script for a lent NVIDIA GPU (about 5 minutes on an H200): vidgen's VAE decoder vs
# diffusers on Wan2.2 TI2V-5B 1280x704x121 in bf16, plus fp32 exactness on the GPU and a tiny
# end-to-end render on CUDA, and the masters' 16-bit decode against the 8-bit one. Run from the repo root; wheels for packages the GPU image lacks
# (diffusers, omegaconf, av, ...) travel in .whl/, made by bench/wheels.sh.
# SMOKE=1 runs the same code on the CPU at tiny widths and sizes (checks the script without a GPU).
set -uo pipefail
if [ -z "${SMOKE:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
DEVICE=cuda; LATENT=${1:-31x44x80}; SMOKE_ARG=""
[ -n "${SMOKE:-}" ] && { DEVICE=cpu; LATENT=${1:-3x8x8}; SMOKE_ARG=--smoke; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
python3 -m vidgen render configs/tiny.yaml model.device=$DEVICE output.path=/tmp/tiny-$DEVICE.mp4 output.overwrite=true -q \
  || echo "tiny render on $DEVICE FAILED"
python3 bench/vae.py gpu --latent "$LATENT" --fp32-reference $SMOKE_ARG 2>&1 | grep -v "should be kept in float32"
status=${PIPESTATUS[0]}
# a master's 16-bit decode (output.codec prores/dnxhr/exr) against the uint8 one, same latents (docs/delivery.md)
python3 bench/delivery.py decode --device $DEVICE $SMOKE_ARG 2>&1 | grep -v "should be kept in float32" \
  || echo "delivery decode row FAILED"
exit "$status"
