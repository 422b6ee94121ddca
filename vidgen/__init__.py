"""vidgen: render video with Wan2.1/Wan2.2-style diffusion pipelines.

    import vidgen
    result = vidgen.render("configs/tiny.yaml", prompt="a red circle moving right")
    pipe = vidgen.Pipeline.from_config("configs/tiny.yaml")     # keeps the models loaded
    pipe.generate(prompt="a blue square moving up", seed=3)

Names are imported on first use, so `import vidgen.vae` alone does not load the whole pipeline. `Pipeline`
comes through vidgen.launch, which gives `Pipeline.from_config` its parallel form (ParallelPipeline).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "Pipeline": "launch", "ParallelPipeline": "launch", "Progress": "pipeline", "RenderResult": "pipeline", "render": "launch",
    "decode_latents": "pipeline", "RenderConfig": "config", "load_config": "presets",
    "VidgenError": "errors", "ConfigError": "errors", "ModelLoadError": "errors", "InputError": "errors",
    "OutputError": "errors", "GuardrailBlocked": "errors",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'vidgen' has no attribute {name!r}")
