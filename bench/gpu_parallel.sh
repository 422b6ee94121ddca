#!/usr/bin/env bash
# Prepared script for a lent NVIDIA machine: one transformer forward split over 1, 2, 4 and 8 GPUs with
# diffusers' context parallelism (Ulysses), as vidgen.parallel applies it, at a real size with random
# weights (bench/parallel.py): seconds a forward and the speed-up over one GPU. With one GPU it runs the
# correctness checks instead: the tiny parallel renders over gloo on the CPU (tests/test_parallel.py)
# and a 2-rank CPU forward of the real 1.3B width. The counted prediction: python bench/parallel_scaling.py.
set -uo pipefail
if ls .whl/*.whl >/dev/null 2>&1; then   # wheels for the GPU machine's Python
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
N=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
echo "gpus: $N"
if [ "$N" -ge 2 ]; then
  for r in 1 2 4 8; do
    [ "$r" -le "$N" ] || break
    timeout 300 python3 bench/parallel.py --ranks "$r" 2>&1 | grep -E "^parallel|Error" | cut -c1-300
  done
  timeout 300 python3 bench/parallel.py --ranks 2 --ring 2 2>&1 | grep -E "^parallel|Error" | cut -c1-300
  [ "$N" -ge 8 ] && timeout 300 python3 bench/parallel.py --ranks 8 --ring 2 2>&1 | grep -E "^parallel|Error" | cut -c1-300
else
  timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_parallel.py -k "t2v-ulysses2 or t2v-ring2 or t2v-cfg2 and not cfg2-ulysses2 and not ulysses2-ring2" 2>&1 | tail -2
  for ring in 1 2; do
    timeout 240 python3 bench/parallel.py --ranks 2 --ring $ring --cpu --folder wan2.1-t2v-1.3b --size 64x64 --frames 9 \
      --forwards 1 2>&1 | grep -E "^parallel|Error" | cut -c1-300
  done
fi
python3 bench/parallel_scaling.py 2>&1 | grep -E "^\||tokens"
