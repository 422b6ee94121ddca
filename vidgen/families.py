"""The Wan model families vidgen runs: one record each, holding every rule that differs between them.

A family is what `model.variant` names (wan2.1-t2v, wan2.2-ti2v-5b, ...): how many experts it has,
whether it takes an image, how an image sizes the clip, the clip length it was trained on, whether
its timesteps are per token, whether it needs the CLIP image encoder, the published sizes whose JSON
ships in `VARIANTS_DIR`, and how it is told from a folder's JSON or a file's tensor shapes. Every
other module asks this one; none compares variant names itself. Adding a family is one record here
plus its JSON folder.

This module imports nothing of vidgen (config.py takes the registered names from it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ImageRule = Literal["none", "optional", "required"]
LastFrame = Literal["none", "channels", "image_pairs"]

VARIANTS_DIR = Path(__file__).parent / "variants"
"""The published folders' JSON, one folder per shipped model size (`vidgen plan` without weights; the
shapes single files are told from)."""


@dataclass(frozen=True)
class Size:
    """One published model of a family: its shipped JSON folder (in VARIANTS_DIR) and display name."""

    folder: str
    display: str
    published: tuple[str, ...] = ()     # the diffusers-format repos Wan-AI publishes for it on the Hub
    path_hint: str = ""                 # a model.path naming this text tells the size apart (wan2.1-t2v's 1.3B, 14B)


@dataclass(frozen=True)
class Family:
    """A Wan model family (model.variant) and the rules that differ between them."""

    name: str
    display: str
    experts: int                # transformers: 2 = Wan2.2 A14B's high- and low-noise experts
    image: ImageRule            # the conditioning image
    image_fit: Literal["bicubic", "cover"]   # image_fit=wan resizes it: the whole image (I2V-A14B) | LANCZOS + crop
    size_rule: Literal["patch", "best"]      # image_fit=wan output size: image2video.py | TI2V-5B's best_output_size
    sizes: tuple[Size, ...]
    frames: int = 81            # the clip length it was trained on (Wan's frame_num): a longer take renders in windows
    per_token_timesteps: bool = False        # one timestep per latent token (TI2V-5B's expand_timesteps)
    last_frame: LastFrame = "none"           # last_image: on the input channels (I2V-A14B), or two CLIP images (FLF2V)
    image_encoder: bool = False              # a CLIP image encoder in the folder (Wan2.1 I2V)
    boundary_ratio: float | None = None      # the two experts' switch in model_index.json (Wan's published value)
    flow_shift: float = 5.0                  # the published scheduler's flow shift
    pipeline_class: str = "WanPipeline"      # the diffusers pipeline class model_index.json names

    @property
    def needs_image(self) -> bool:
        return self.image == "required"

    @property
    def accepts_image(self) -> bool:
        return self.image != "none"

    def takes_last_frame(self, image_pairs: bool = False) -> bool:
        """Whether a model of this family takes last_image (`image_pairs`: its CLIP embedder takes two)."""
        return self.last_frame == "channels" or (self.last_frame == "image_pairs" and image_pairs)


_T2V_1_3B = Size("wan2.1-t2v-1.3b", "Wan2.1 T2V-1.3B", ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers",), "1.3b")
_T2V_14B = Size("wan2.1-t2v-14b", "Wan2.1 T2V-14B or one expert of Wan2.2 T2V-A14B (the same shapes)",
                ("Wan-AI/Wan2.1-T2V-14B-Diffusers",), "14b")
_I2V_14B = Size("wan2.1-i2v-14b", "Wan2.1 I2V-14B", ("Wan-AI/Wan2.1-I2V-14B-480P-Diffusers",
                "Wan-AI/Wan2.1-I2V-14B-720P-Diffusers", "Wan-AI/Wan2.1-FLF2V-14B-720P-diffusers"))

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("wan2.1-t2v", "Wan2.1 T2V", 1, "none", "cover", "patch", (_T2V_1_3B, _T2V_14B)),
    Family("wan2.1-i2v", "Wan2.1 I2V", 1, "required", "bicubic", "patch", (_I2V_14B,), last_frame="image_pairs",
           image_encoder=True, pipeline_class="WanImageToVideoPipeline"),
    Family("wan2.2-t2v-a14b", "Wan2.2 T2V-A14B", 2, "none", "cover", "patch",
           (Size("wan2.2-t2v-a14b", "Wan2.2 T2V-A14B", ("Wan-AI/Wan2.2-T2V-A14B-Diffusers",)),),
           boundary_ratio=0.875, flow_shift=12.0),
    Family("wan2.2-i2v-a14b", "Wan2.2 I2V-A14B", 2, "required", "bicubic", "patch",
           (Size("wan2.2-i2v-a14b", "Wan2.2 I2V-A14B", ("Wan-AI/Wan2.2-I2V-A14B-Diffusers",)),),
           last_frame="channels", boundary_ratio=0.9, pipeline_class="WanImageToVideoPipeline"),
    Family("wan2.2-ti2v-5b", "Wan2.2 TI2V-5B", 1, "optional", "cover", "best",
           (Size("wan2.2-ti2v-5b", "Wan2.2 TI2V-5B", ("Wan-AI/Wan2.2-TI2V-5B-Diffusers",)),), frames=121,
           per_token_timesteps=True),
)}
"""Every family vidgen runs, by model.variant name."""
