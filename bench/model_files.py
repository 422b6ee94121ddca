"""Real-size Wan weight files as ComfyUI distributes them, as sparse files: true headers (names,
dtypes, shapes, offsets of the published models), data all zeros and taking no disk space.

They let `vidgen info`, `vidgen models` and `vidgen plan` be shown and tested on the real layouts
and sizes without downloading 60 GB: everything those commands do is read headers.

    python bench/model_files.py /tmp/comfy      # writes /tmp/comfy/models/{diffusion_models,text_encoders,vae}/
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

import layouts  # noqa: E402  (the tests' layout writers: the key mappings, checked against diffusers)

if __name__ == "__main__":
    torch.set_grad_enabled(False)
    for key, path in layouts.write_comfy_tree(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/comfy")).items():
        print(f"{key}: {path} ({path.stat().st_size / 1e9:.2f} GB apparent)")
