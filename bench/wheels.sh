#!/usr/bin/env bash
# Fill .whl/ with the wheels the lent GPU machine's image lacks, for its Python 3.12 on x86-64 (the
# image has torch, triton, transformers, accelerate, peft, safetensors, onnx; nothing can be fetched
# there). bench/stages.sh installs them into /tmp/site there. Run here, before asking for a device:
#   bash bench/wheels.sh            # diffusers, omegaconf, av, ftfy, gguf, torchao, sageattention
#   bash bench/wheels.sh --no-av    # leave PyAV out (34 MB) when no script writes video (gpu_vae.sh does)
# Then run(command="bash bench/gpu_kernels.sh", carry=[".whl"], ...). The tree that travels is capped
# at 64 MiB: the wheels are about 45 MB with av, 11 MB without.
set -euo pipefail
cd "$(dirname "$0")/.."
# the versions installed here, which the tests pass with (torchao 0.18 needs torch >= 2.11, the image's)
v() { python3 -c "import importlib.metadata as m; print(m.version('$1'))"; }
PKGS=("diffusers==$(v diffusers)" "omegaconf==$(v omegaconf)" "ftfy==$(v ftfy)" wcwidth "gguf==$(v gguf)" torchao==0.18.0
      sageattention)
[ "${1:-}" = "--no-av" ] || PKGS+=("av==$(v av)")
rm -rf .whl && mkdir -p .whl
for p in "${PKGS[@]}"; do
  pip download -q --no-deps -d .whl --python-version 3.12 --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any "$p"
done
ls -la .whl
du -sh .whl
