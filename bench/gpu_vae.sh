#!/usr/bin/env bash
# Prepared script for a lent NVIDIA GPU (about 5 minutes on an H200): vidgen's VAE decoder vs
# diffusers on Wan2.2 TI2V-5B 1280x704x121 in bf16, plus fp32 exactness on the GPU and a tiny
# end-to-end render on CUDA. Run from the repo root; wheels for packages the GPU image lacks
# (diffusers, omegaconf, av, ...) travel in .whl/, made by bench/wheels.sh.
set -uo pipefail
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -m vidgen render configs/tiny.yaml model.device=cuda output.path=/tmp/tiny-cuda.mp4 -q || echo "tiny render on CUDA FAILED"
python3 bench/vae.py gpu --latent "${1:-31x44x80}" --fp32-reference 2>&1 | grep -v "should be kept in float32"
