"""Quantisation error of the quantised layouts: one tiny Wan2.1 render from each, against the same
render from the unquantised folder (docs/models.md). Files are written by tests/layouts.py.

    python bench/quant_error.py
"""

import logging
import sys
from pathlib import Path

from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

import layouts  # noqa: E402

from vidgen.pipeline import render  # noqa: E402
from vidgen.tiny import build_tiny_pipeline  # noqa: E402

logging.disable(logging.WARNING)
folder = Path('/tmp/vidgen-quant-error/tiny')
if not folder.exists(): build_tiny_pipeline(folder, 'wan2.1-t2v')
def lat(model, out):
    cfg = {"model": {"device": "cpu", **model}, "prompt": "a red circle moving right on a black background", "negative_prompt": "blurry",
           "size": "64x64", "num_frames": 5, "fps": 8, "seed": 7, "sampling": {"steps": 3, "guidance_scale": 4.0},
           "output": {"path": out, "save_latents": True, "overwrite": True}}
    return load_file(render(cfg).latents_path)["latents"]
ref = lat({"path": str(folder)}, "/tmp/vidgen-quant-error/ref.mp4")
rows = []
layouts.write_fp8_scaled(folder / "transformer", "/tmp/vidgen-quant-error/fp8.safetensors")
files = {"fp8_scaled": "/tmp/vidgen-quant-error/fp8.safetensors"}
for q in ("Q8_0", "Q5_1", "Q4_0"):
    files[f"GGUF {q}"] = str(layouts.write_gguf(folder / "transformer", f"/tmp/vidgen-quant-error/t-{q}.gguf", q))
for name, f in files.items():
    got = lat({"path": str(folder), "transformer": f}, f"/tmp/vidgen-quant-error/{name.replace(' ', '')}.mp4")
    print(f"{name}: max abs {(got-ref).abs().max():.4f}, relative L2 {((got-ref).norm()/ref.norm()):.4f}, latents max {ref.abs().max():.2f}")
