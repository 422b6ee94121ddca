#!/usr/bin/env bash
# Prepared script for a lent NVIDIA GPU (about 5 minutes): issue 4's device checks — a tiny A14B
# render with only the active expert on the device, the speed knobs engaging on CUDA, and
# bench/sampling.py (our loop vs diffusers' WanPipeline, compile cold start, knobs) in bf16.
set -uo pipefail
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
python3 -m vidgen.tiny /tmp/a14b --variant wan2.2-t2v-a14b >/dev/null
python3 - <<'PY'
import torch, vidgen
cfg = {"model": {"path": "/tmp/a14b", "device": "cuda", "offload": "experts"}, "prompt": "a red circle moving right",
       "size": "128x128", "num_frames": 17, "seed": 3, "output": {"path": "/tmp/a14b.mp4", "overwrite": True},
       "sampling": {"steps": 8, "shift": 12.0, "schedule": "wan"}}
pipe = vidgen.Pipeline.from_config(cfg)
on = lambda m: next(m.parameters()).device.type
print("experts after load:", [on(m) for m in pipe.components.experts], "text encoder:", on(pipe.components.text_encoder))
r = pipe.generate()
print("experts after render:", [on(m) for m in pipe.components.experts], "text encoder:", on(pipe.components.text_encoder),
      "frames", r.num_frames, "peak", r.peak_memory_bytes)
for speed in ({"compile": "blocks"}, {"attention_backend": "sdpa_cudnn"}, {"attention_backend": "sdpa_flash"},
              {"step_cache": "first_block", "cache_threshold": 0.2}):
    r = vidgen.render({**cfg, "model": {"path": "/tmp/a14b", "device": "cuda"}, "speed": speed})
    print("speed", speed, "ok:", r.num_frames, "frames, denoise %.2fs" % r.timings["denoise"])
PY
timeout 240 python3 bench/sampling.py all --device cuda --steps 12 --repeats 3 2>&1 | grep -v "should be kept" | tail -40
