"""model.image_encoder: the CLIP image encoder of Wan2.1 I2V and Wan2.2-Animate, given as a file.

A diffusers folder holds it (image_encoder/, transformers' CLIPVisionModel). Wan's own checkpoint folder
holds instead open_clip's whole XLM-RoBERTa CLIP in one .pth (WAN_CLIP: the text tower too, in
open_clip's names), and ComfyUI users have the vision tower alone as transformers'
CLIPVisionModel(WithProjection) in safetensors (clip_vision_h.safetensors). vidgen reads the last kind,
named by model.image_encoder: with model.path null it is the only source of the encoder, beside a
diffusers folder it replaces the folder's. The open_clip .pth is refused by name: its vision tower
would need a conversion (fused attention projections, other norms) that no reference vidgen can test
against pins down, and a wrong one would run, not fail. The checks here are header-only (vidgen.weights),
so they join every other problem of the model before anything loads.
"""

from __future__ import annotations

from pathlib import Path

from .families import FAMILIES, Family
from .weights import Weights

WAN_CLIP = "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"
"""The CLIP file of Wan's own I2V and Animate checkpoint folders (open_clip, XLM-RoBERTa text tower)."""
HINT = ("give model.image_encoder a transformers CLIPVisionModel in safetensors: ComfyUI's "
        "clip_vision_h.safetensors, or the image_encoder/ folder of a Wan I2V or Animate diffusers download")
OPEN_CLIP = ("visual.", "textual.", "log_scale", "logit_scale")
"""Key prefixes of open_clip's CLIP checkpoints (Wan's .pth among them): not transformers' names."""


def _takers() -> str:
    return " and ".join(f.display for f in FAMILIES.values() if f.image_encoder)


def file_problems(w: Weights) -> list[str]:
    """What makes the file of model.image_encoder unreadable as a CLIPVisionModel, headers only."""
    if w.kind != "safetensors":
        return [f"model.image_encoder: {w.describe()} is not safetensors; vidgen reads the CLIP image encoder "
                f"from transformers' safetensors only: {HINT}"]
    if any(name.startswith(OPEN_CLIP) for name in w.shapes):
        return [f"model.image_encoder: {w.source} holds open_clip's names (visual.*), not transformers' "
                f"CLIPVisionModel's; {HINT}"]
    return []


def single_file_problems(family: Family | None, weights: dict[str, Weights], root: Path | None,
                         layout: str) -> list[str]:
    """model.image_encoder's problems for a model made of files (single files, or a Wan checkpoint folder
    at `root`) whose transformer is `family` (None: refused already): the family's encoder missing, or
    one given to a family that takes none."""
    w = weights.get("image_encoder")
    if family is None:
        return []
    if not family.image_encoder:
        return [f"model.image_encoder: {family.display} takes no CLIP image encoder (only {_takers()} do); "
                f"remove model.image_encoder"] if w is not None else []
    if w is not None:
        return file_problems(w)
    if root is not None and (root / WAN_CLIP).is_file():
        return [f"model.image_encoder: {root / WAN_CLIP} is open_clip's XLM-RoBERTa CLIP, whose vision tower "
                f"vidgen does not convert; {HINT}"]
    return [f"model.image_encoder: not set; {family.display} from {layout} needs its CLIP image encoder: {HINT}"]


def folder_problems(w: Weights, root: Path) -> list[str]:
    """model.image_encoder's problems beside the diffusers folder `root` (its shapes are checked against
    root/image_encoder/config.json as every component's)."""
    if not (root / "image_encoder" / "config.json").is_file():
        return [f"model.image_encoder: {root} is a model without a CLIP image encoder (no image_encoder/config.json); "
                f"remove model.image_encoder (only {_takers()} take one)"]
    return file_problems(w)
