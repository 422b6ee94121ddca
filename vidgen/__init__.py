"""vidgen: render video with Wan2.1/Wan2.2-style diffusion pipelines.

    import vidgen
    result = vidgen.render("configs/tiny.yaml", prompt="a red circle moving right")
    pipe = vidgen.Pipeline.from_config("configs/tiny.yaml")     # keeps the models loaded
    pipe.generate(prompt="a blue square moving up", seed=3)
"""

__version__ = "0.1.0"

from .config import RenderConfig, load_config  # noqa: E402
from .errors import ConfigError, GuardrailBlocked, InputError, ModelLoadError, OutputError, VidgenError  # noqa: E402
from .pipeline import Pipeline, Progress, RenderResult, decode_latents, render  # noqa: E402

__all__ = ["Pipeline", "Progress", "RenderConfig", "RenderResult", "render", "decode_latents", "load_config",
           "VidgenError", "ConfigError", "ModelLoadError", "InputError", "OutputError", "GuardrailBlocked",
           "__version__"]
