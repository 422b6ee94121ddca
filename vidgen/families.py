"""The Wan model families vidgen runs: one record each, holding every rule that differs between them.

A family is what `model.variant` names (wan2.1-t2v, wan2.2-ti2v-5b, ...): how many experts it has,
whether it takes an image, how an image sizes the clip, the clip length it was trained on, whether
its timesteps are per token, whether it needs the CLIP image encoder, the published sizes whose JSON
ships in `VARIANTS_DIR`, and how it is told from a folder's JSON (`by_config`) or a file's tensor
shapes (`by_shapes`). Below the records, the one Wan <-> diffusers name adapter per role
(`diffusers_name`, `wan_name`, `diffusers_names`), which weight loading and LoRA keys share. Every
other module asks this one; none compares variant names itself. Adding a family is one record here
plus its JSON folder.

This module imports nothing of vidgen (config.py takes the registered names from it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ImageRule = Literal["none", "optional", "required"]
LastFrame = Literal["none", "channels", "image_pairs"]
VaeVersion = Literal["2.1", "2.2"]
VAE_Z = {"2.1": 16, "2.2": 48}
"""Latent channels of Wan's VAEs: 2.1 (8x) and 2.2 (TI2V-5B's: residual, patch 2, 16x)."""

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
    frames: int = 0                     # the clip length this size was trained on, where it is not its family's


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
    image_latents: bool = False              # the image's latents and mask on the transformer's input (2z + 4 channels)
    vae: VaeVersion = "2.1"                  # the Wan VAE its latents are made with
    control: bool = False                    # VACE context blocks: takes `control` (video, mask, reference images)
    forcing: bool = False                    # diffusion forcing: a noise level per latent frame (vidgen.forcing)
    animate: bool = False                    # Wan2.2-Animate: a pose and a face video drive the image (vidgen.animate)

    @property
    def transformer_class(self) -> str:
        """The diffusers class of its experts (model_index.json's, and what a single file is built into)."""
        return ("WanVACETransformer3DModel" if self.control else "WanAnimateTransformer3DModel" if self.animate else
                "SkyReelsV2Transformer3DModel" if self.forcing else "WanTransformer3DModel")

    @property
    def z_dim(self) -> int:
        return VAE_Z[self.vae]

    def in_channels(self, z_dim: int) -> int:
        """The transformer's input channels over a z_dim-channel VAE: the noisy latents, and the image's
        latents and mask when they ride on the channels."""
        return 2 * z_dim + 4 if self.image_latents else z_dim

    @property
    def needs_image(self) -> bool:
        return self.image == "required"

    @property
    def accepts_image(self) -> bool:
        return self.image != "none"

    def takes_last_frame(self, image_pairs: bool = False) -> bool:
        """Whether a model of this family takes last_image (`image_pairs`: its CLIP embedder takes two)."""
        return self.last_frame == "channels" or (self.last_frame == "image_pairs" and image_pairs)

    def size(self, path_text: str = "") -> Size | None:
        """The published size a model of this family is: its only one, or the one whose path_hint the
        last part of `path_text` (model.path) names; None when several fit and the path names none."""
        if len(self.sizes) == 1:
            return self.sizes[0]
        name = Path(str(path_text)).name.lower()
        return next((s for s in self.sizes if s.path_hint and s.path_hint in name), None)

    def window(self, path_text: str = "") -> int:
        """The clip length (pixel frames) a model of this family renders at once: its size's, else the family's."""
        size = self.size(path_text)
        return size.frames if size is not None and size.frames else self.frames


_T2V_1_3B = Size("wan2.1-t2v-1.3b", "Wan2.1 T2V-1.3B", ("Wan-AI/Wan2.1-T2V-1.3B-Diffusers",), "1.3b")
_T2V_14B = Size("wan2.1-t2v-14b", "Wan2.1 T2V-14B or one expert of Wan2.2 T2V-A14B (the same shapes)",
                ("Wan-AI/Wan2.1-T2V-14B-Diffusers",), "14b")
_I2V_14B = Size("wan2.1-i2v-14b", "Wan2.1 I2V-14B", ("Wan-AI/Wan2.1-I2V-14B-480P-Diffusers",
                "Wan-AI/Wan2.1-I2V-14B-720P-Diffusers", "Wan-AI/Wan2.1-FLF2V-14B-720P-diffusers"))

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("wan2.1-t2v", "Wan2.1 T2V", 1, "none", "cover", "patch", (_T2V_1_3B, _T2V_14B)),
    Family("wan2.1-i2v", "Wan2.1 I2V", 1, "required", "bicubic", "patch", (_I2V_14B,), last_frame="image_pairs",
           image_encoder=True, pipeline_class="WanImageToVideoPipeline", image_latents=True),
    Family("wan2.2-t2v-a14b", "Wan2.2 T2V-A14B", 2, "none", "cover", "patch",
           (Size("wan2.2-t2v-a14b", "Wan2.2 T2V-A14B", ("Wan-AI/Wan2.2-T2V-A14B-Diffusers",)),),
           boundary_ratio=0.875, flow_shift=12.0),
    Family("wan2.2-i2v-a14b", "Wan2.2 I2V-A14B", 2, "required", "bicubic", "patch",
           (Size("wan2.2-i2v-a14b", "Wan2.2 I2V-A14B", ("Wan-AI/Wan2.2-I2V-A14B-Diffusers",)),),
           last_frame="channels", boundary_ratio=0.9, pipeline_class="WanImageToVideoPipeline", image_latents=True),
    Family("wan2.2-ti2v-5b", "Wan2.2 TI2V-5B", 1, "optional", "cover", "best",
           (Size("wan2.2-ti2v-5b", "Wan2.2 TI2V-5B", ("Wan-AI/Wan2.2-TI2V-5B-Diffusers",)),), frames=121,
           per_token_timesteps=True, vae="2.2"),
    # VACE (all-in-one video creation and editing): Wan2.1 T2V's blocks plus context blocks that read
    # the control video, its mask and reference images (diffusers' WanVACETransformer3DModel).
    Family("wan2.1-vace", "Wan2.1 VACE", 1, "none", "cover", "patch",
           (Size("wan2.1-vace-1.3b", "Wan2.1 VACE-1.3B", ("Wan-AI/Wan2.1-VACE-1.3B-diffusers",), "1.3b"),
            Size("wan2.1-vace-14b", "Wan2.1 VACE-14B", ("Wan-AI/Wan2.1-VACE-14B-diffusers",), "14b")),
           pipeline_class="WanVACEPipeline", control=True),
    Family("wan2.2-vace-a14b", "Wan2.2 VACE-Fun A14B", 2, "none", "cover", "patch",
           (Size("wan2.2-vace-a14b", "Wan2.2 VACE-Fun A14B (alibaba-pai, on Wan2.2 T2V-A14B)",
                 ("linoyts/Wan2.2-VACE-Fun-14B-diffusers",)),),     # diffusers' own conversion (HF staff)
           boundary_ratio=0.875, flow_shift=12.0, pipeline_class="WanVACEPipeline", control=True),
    # SkyReels-V2 diffusion forcing (Skywork): Wan2.1 T2V's blocks trained with a noise level per latent
    # frame, plus an fps embedding; a long take is one render, its windows overlapping in latent space.
    Family("skyreels-v2-df", "SkyReels-V2 DF", 1, "none", "cover", "patch",
           (Size("skyreels-v2-df-1.3b-540p", "SkyReels-V2 DF-1.3B-540P",
                 ("Skywork/SkyReels-V2-DF-1.3B-540P-Diffusers",), "1.3b"),
            Size("skyreels-v2-df-14b-540p", "SkyReels-V2 DF-14B-540P",
                 ("Skywork/SkyReels-V2-DF-14B-540P-Diffusers",), "14b-540p"),
            Size("skyreels-v2-df-14b-720p", "SkyReels-V2 DF-14B-720P",
                 ("Skywork/SkyReels-V2-DF-14B-720P-Diffusers",), "14b-720p", frames=121)),
           frames=97, flow_shift=8.0, pipeline_class="SkyReelsV2DiffusionForcingPipeline", forcing=True),
    # Wan2.2-Animate: Wan2.1 I2V-14B's blocks (CLIP image tokens, the reference's latents and a mask on the
    # input channels) plus a pose patch embedding and a face motion encoder whose tokens enter every 5th block.
    # It renders in segments of 77 frames (diffusers' segment_frame_length) over the Wan2.1 VAE.
    Family("wan2.2-animate-14b", "Wan2.2 Animate-14B", 1, "required", "cover", "patch",
           (Size("wan2.2-animate-14b", "Wan2.2 Animate-14B", ("Wan-AI/Wan2.2-Animate-14B-Diffusers",)),), frames=77,
           image_encoder=True, pipeline_class="WanAnimatePipeline", image_latents=True, animate=True),
)}
"""Every family vidgen runs, by model.variant name."""
TEXT_ENCODER_FOLDER = "wan2.2-t2v-a14b"
"""A shipped folder whose text_encoder/config.json is Wan's UMT5-XXL (every family's text encoder)."""


def by_config(experts: int, in_channels: int, z_dim: int, per_token: bool, image_encoder: bool,
              control: bool = False, forcing: bool = False, animate: bool = False) -> Family | None:
    """The family a diffusers folder holds, from its JSON: the number of transformers, the first one's
    input channels, the VAE's latent channels, model_index.json's expand_timesteps, whether it
    declares an image encoder, whether its transformer has VACE context blocks (`vace_layers`) and
    whether it is a diffusion-forcing transformer (`num_frame_per_block`, SkyReels-V2's) and whether it is
    Wan2.2-Animate's (`motion_encoder_size`).
    A per-token family (TI2V-5B) is told by its timesteps or its VAE; the others by their input
    channels (and the CLIP image encoder where they need one, the context blocks where they have them)."""
    fits = [f for f in FAMILIES.values() if f.experts == experts and f.control == control and f.forcing == forcing
            and f.animate == animate and (
        (f.per_token_timesteps and (per_token or z_dim == f.z_dim))
        or (not f.per_token_timesteps and in_channels == f.in_channels(z_dim)
            and (image_encoder or not f.image_encoder)))]
    return min(fits, key=lambda f: not f.per_token_timesteps, default=None)


def by_shapes(in_channels: int, z_dim: int, experts: int, control: bool = False,
              forcing: bool = False, animate: bool = False) -> Family | None:
    """The family a single transformer file is, from its input and output (latent) channels, whether
    it holds VACE context blocks (`vace_patch_embedding`) or an fps embedding (`fps_embedding`, diffusion
    forcing), a pose patch embedding and face motion encoder (`pose_patch_embedding`, Animate) and how many
    experts were given: the family whose input fits, its VAE's channels and then its experts closest.
    Wan2.1 I2V (a CLIP image encoder, no Animate modules) runs from a diffusers folder only."""
    fits = [f for f in FAMILIES.values() if (not f.image_encoder or f.animate) and f.control == control
            and f.forcing == forcing and f.animate == animate and in_channels == f.in_channels(z_dim)]
    return min(fits, key=lambda f: (f.z_dim != z_dim, f.experts != experts), default=None)


def transformer_class(conf: dict) -> str:
    """The diffusers class an expert's config.json describes: with VACE context blocks (`vace_layers`)
    WanVACETransformer3DModel, with Animate's motion encoder (`motion_encoder_size`)
    WanAnimateTransformer3DModel, with diffusion forcing's causal blocks (`num_frame_per_block`)
    SkyReelsV2Transformer3DModel, else WanTransformer3DModel."""
    return ("WanVACETransformer3DModel" if "vace_layers" in conf else
            "WanAnimateTransformer3DModel" if "motion_encoder_size" in conf else
            "SkyReelsV2Transformer3DModel" if "num_frame_per_block" in conf else "WanTransformer3DModel")


def size_named(folder: str) -> tuple[Family, Size] | None:
    """(family, size) of a shipped folder's name (wan2.1-t2v-14b, ...), or None."""
    return next(((f, s) for f in FAMILIES.values() for s in f.sizes if s.folder == folder), None)


PUBLISHED = tuple(repo for f in FAMILIES.values() for s in f.sizes for repo in s.published)
"""The diffusers-format repos Wan-AI publishes on the Hugging Face Hub (the only ids a hint suggests)."""


def shipped_folder(variant: str, path_text: str = "") -> Path | None:
    """The shipped JSON folder (in VARIANTS_DIR) of model.variant `variant`, the size told from
    `path_text` (model.path) where the family has several; None when it cannot be told."""
    size = FAMILIES[variant].size(path_text) if variant in FAMILIES else None
    return VARIANTS_DIR / size.folder if size else None


# --------------------------------------------------------------------------------------------
# Names: Wan's original checkpoints <-> diffusers' classes, one adapter per role, shared by every
# family above (all are Wan's modules). Pure string rules: weights.open_weights names a file's
# tensors with them, vae.convert renames a Wan VAE, and lora matches LoRA module paths.

ROLE_NAMES = {"transformer": "transformer", "transformer_2": "transformer", "text_encoder": "text_encoder",
              "vae": "vae", "image_encoder": "image_encoder"}
"""Which adapter names each role's tensors (the low-noise expert is a transformer too)."""

TRANSFORMER_NAMES = (
    # (Wan's module, diffusers' WanTransformer3DModel module, where): whole dotted parts, inside a
    # block (`blocks.N.`) or at the top; "any": either (LoRA module paths have always matched so).
    ("self_attn.q", "attn1.to_q", "any"), ("self_attn.k", "attn1.to_k", "any"), ("self_attn.v", "attn1.to_v", "any"),
    ("self_attn.o", "attn1.to_out.0", "any"), ("self_attn.norm_q", "attn1.norm_q", "any"),
    ("self_attn.norm_k", "attn1.norm_k", "any"),
    ("cross_attn.q", "attn2.to_q", "any"), ("cross_attn.k", "attn2.to_k", "any"), ("cross_attn.v", "attn2.to_v", "any"),
    ("cross_attn.o", "attn2.to_out.0", "any"), ("cross_attn.norm_q", "attn2.norm_q", "any"),
    ("cross_attn.norm_k", "attn2.norm_k", "any"),
    ("cross_attn.k_img", "attn2.add_k_proj", "any"), ("cross_attn.v_img", "attn2.add_v_proj", "any"),
    ("cross_attn.norm_k_img", "attn2.norm_added_k", "any"),
    ("ffn.0", "ffn.net.0.proj", "any"), ("ffn.2", "ffn.net.2", "any"), ("norm3", "norm2", "any"),
    ("time_embedding.0", "condition_embedder.time_embedder.linear_1", "any"),
    ("time_embedding.2", "condition_embedder.time_embedder.linear_2", "any"),
    ("text_embedding.0", "condition_embedder.text_embedder.linear_1", "any"),
    ("text_embedding.2", "condition_embedder.text_embedder.linear_2", "any"),
    ("time_projection.1", "condition_embedder.time_proj", "any"), ("head.head", "proj_out", "top"),
    ("before_proj", "proj_in", "block"), ("after_proj", "proj_out", "block"),     # VACE context blocks
    ("img_emb.proj.0", "condition_embedder.image_embedder.norm1", "any"),
    ("img_emb.proj.1", "condition_embedder.image_embedder.ff.net.0.proj", "any"),
    ("img_emb.proj.3", "condition_embedder.image_embedder.ff.net.2", "any"),
    ("img_emb.proj.4", "condition_embedder.image_embedder.norm2", "any"),
    ("modulation", "scale_shift_table", "block"), ("head.modulation", "scale_shift_table", "top"),
    ("fps_projection.0", "fps_projection.net.0.proj", "top"), ("fps_projection.2", "fps_projection.net.2", "top"),
)
"""Wan's transformer (wan/modules/model.py) in diffusers' names: the names diffusers' own converter
(convert_wan_transformer_to_diffusers) gives every tensor of the published checkpoints, and the
module paths LoRA files name. Wan's norm2 (the feed-forward's, no weights) is diffusers' norm3. A
VACE context block (`vace_blocks.N.`) is a block with an input (block 0) and an output projection.
SkyReels-V2 (diffusion forcing) adds `fps_embedding` (same name) and `fps_projection` (Linear, SiLU,
Linear: diffusers' FeedForward with linear-silu)."""

_CONVS = "motion_encoder.enc.net_app.convs."
ANIMATE_PAIRS = (
    # (Wan's name, diffusers' WanAnimateTransformer3DModel name) of Animate's own modules, whole dotted
    # parts from the start of a top-level name. {r}: a residual block of the motion encoder, one less in
    # diffusers (Wan's convs.0 is the input conv); {n}: the same index on both sides.
    (_CONVS + "0.0", "motion_encoder.conv_in"),
    (_CONVS + "0.1", "motion_encoder.conv_in.act_fn"),
    (_CONVS + "{r}.conv1.0", "motion_encoder.res_blocks.{r}.conv1"),
    (_CONVS + "{r}.conv1.1", "motion_encoder.res_blocks.{r}.conv1.act_fn"),
    (_CONVS + "{r}.conv2.0.kernel", "motion_encoder.res_blocks.{r}.conv2.blur_kernel"),
    (_CONVS + "{r}.conv2.1", "motion_encoder.res_blocks.{r}.conv2"),
    (_CONVS + "{r}.conv2.2", "motion_encoder.res_blocks.{r}.conv2.act_fn"),
    (_CONVS + "{r}.skip.0.kernel", "motion_encoder.res_blocks.{r}.conv_skip.blur_kernel"),
    (_CONVS + "{r}.skip.1", "motion_encoder.res_blocks.{r}.conv_skip"),
    (_CONVS + "{n}.weight", "motion_encoder.conv_out.weight"),      # the last conv: Wan -> diffusers only
    ("motion_encoder.enc.fc", "motion_encoder.motion_network"),
    ("motion_encoder.dec.direction.weight", "motion_encoder.motion_synthesis_weight"),
    ("face_encoder.conv1_local.conv", "face_encoder.conv1_local"),
    ("face_encoder.conv2.conv", "face_encoder.conv2"), ("face_encoder.conv3.conv", "face_encoder.conv3"),
    ("face_adapter.fuser_blocks.{n}.linear1_q", "face_adapter.{n}.to_q"),
    ("face_adapter.fuser_blocks.{n}.linear2", "face_adapter.{n}.to_out"),
    ("face_adapter.fuser_blocks.{n}.q_norm", "face_adapter.{n}.norm_q"),
    ("face_adapter.fuser_blocks.{n}.k_norm", "face_adapter.{n}.norm_k"),
    ("face_adapter.fuser_blocks.{n}", "face_adapter.{n}"),          # linear1_kv: FUSED below
)
"""Wan2.2-Animate's motion encoder, face encoder and face adapter (Wan2.2 wan/modules/animate: LIA's
Generator `enc.net_app.convs` / `enc.fc` / `dec.direction`, CausalConv1d's `.conv`, FaceAdapter's
`fuser_blocks`) in diffusers' names: the names diffusers' own converters give them
(convert_animate_motion_encoder_weights, convert_animate_face_adapter_weights). Its Wan blocks, image
embedder and pose_patch_embedding are TRANSFORMER_NAMES' (or keep their name). Three things are more
than a name, done as weights.open_weights reads the file: the fused key/value projection (FUSED), the
fused leaky ReLU biases Wan keeps as [1, C, 1, 1] (diffusers: [C]) and the blur kernels (`blur_kernel`
here: buffers diffusers builds itself, not read)."""
FUSED = {"linear1_kv": ("to_k", "to_v")}
"""Wan layers that are two diffusers modules, their weights halves along dim 0: the face adapter's
key/value projection (its output is split K=2 first in FaceBlock; diffusers' converter chunks it so)."""


def _index_rules(pairs, back: bool) -> tuple[tuple[re.Pattern, str, int], ...]:
    """(pattern, replacement, shift of {r}) rules from (Wan, diffusers) pairs, one way or the other, the
    longest first. A pair whose Wan index the diffusers name lacks (the motion encoder's last conv) is
    Wan -> diffusers only."""
    rules = []
    for wan, other in pairs:
        if back and wan.count("{n}") != other.count("{n}"):
            continue
        src, dst = (other, wan) if back else (wan, other)
        block = r"(\d+)" if back else r"([1-9]\d*)"        # Wan's residual blocks are convs.1 on
        pattern = re.escape(src).replace(r"\{r\}", block).replace(r"\{n\}", r"(\d+)")
        rules.append((re.compile(rf"^{pattern}(?=\.|$)"), dst, (1 if back else -1) if "{r}" in src else 0))
    return tuple(sorted(rules, key=lambda rule: -len(rule[0].pattern)))     # a longer name before its prefix


ANIMATE_NAMES = _index_rules(ANIMATE_PAIRS, back=False)
ANIMATE_NAMES_BACK = _index_rules(ANIMATE_PAIRS, back=True)
ANIMATE_MODULES = ("motion_encoder.", "face_encoder.", "face_adapter.")


def _animate(name: str, to_wan: bool) -> str | None:
    """The other side's name of a name inside Animate's own modules, or None when no rule knows it."""
    for pattern, dst, shift in (ANIMATE_NAMES_BACK if to_wan else ANIMATE_NAMES):
        if m := pattern.match(name):
            index = m.group(1) if m.groups() else ""
            target = dst.replace("{r}", str(int(index) + shift) if index else "").replace("{n}", index)
            return target + name[m.end():]
    return None


T5_PAIRS = (("token_embedding.", "shared."),
            ("blocks.{i}.norm1.", "encoder.block.{i}.layer.0.layer_norm."),
            ("blocks.{i}.attn.{x}.", "encoder.block.{i}.layer.0.SelfAttention.{x}."),
            ("blocks.{i}.pos_embedding.embedding.", "encoder.block.{i}.layer.0.SelfAttention.relative_attention_bias."),
            ("blocks.{i}.norm2.", "encoder.block.{i}.layer.1.layer_norm."),
            ("blocks.{i}.ffn.gate.0.", "encoder.block.{i}.layer.1.DenseReluDense.wi_0."),
            ("blocks.{i}.ffn.fc1.", "encoder.block.{i}.layer.1.DenseReluDense.wi_1."),
            ("blocks.{i}.ffn.fc2.", "encoder.block.{i}.layer.1.DenseReluDense.wo."),
            ("norm.", "encoder.final_layer_norm."))
"""(Wan name, transformers' UMT5 name) prefixes of Wan's T5 encoder (wan/modules/t5.py,
shared_pos=False: a relative bias in every block). Its feed-forward is fc2(fc1(x) * gelu(gate(x)));
transformers' gated FFN is wo(wi_1(x) * gelu(wi_0(x)))."""


CLIP_TOWER = "vision_model."
"""The CLIP image encoder (transformers' CLIPVisionModel; Wan2.1 I2V's and Animate's) is named by its
vision tower's own names: files saved by transformers 4 (diffusers' image_encoder folders, ComfyUI's
clip_vision_h.safetensors) put them under `vision_model.`, transformers 5 saves them bare."""


def _prefix_rules(pairs, back: bool) -> tuple[tuple[str, str], ...]:
    """(pattern, replacement) rules from name prefix pairs ({i}: a block index, {x}: q, k, v or o), one
    way or the other; the patterns of one table never match the same name."""
    rules = []
    for wan, other in pairs:
        src, dst = (other, wan) if back else (wan, other)
        pattern = "^" + re.escape(src).replace(r"\{i\}", r"(\d+)").replace(r"\{x\}", "([qkvo])")
        rules.append((pattern, dst.replace("{i}", r"\1").replace("{x}", r"\2")))
    return tuple(rules)


T5_NAMES = _prefix_rules(T5_PAIRS, back=False)
T5_NAMES_BACK = _prefix_rules(T5_PAIRS, back=True)

# Wan's VAE: a prefix rule for the block, then the parts inside residual blocks. Wan2.2's stages are
# nested (`decoder.upsamples.S.upsamples.R`); Wan2.1's decoder is one flat list cut into stages at
# its resamplers. (diffusers ships a converter for the published Wan2.1 layout only.)
VAE_RESNET_PARTS = {"residual.0.": "norm1.", "residual.2.": "conv1.", "residual.3.": "norm2.",
                    "residual.6.": "conv2.", "shortcut.": "conv_shortcut."}
VAE_PREFIXES = (  # (original, diffusers), first match wins
    (r"^conv1\.", "quant_conv."), (r"^conv2\.", "post_quant_conv."),
    (r"^(encoder|decoder)\.conv1\.", r"\1.conv_in."),
    (r"^(encoder|decoder)\.middle\.0\.", r"\1.mid_block.resnets.0."),
    (r"^(encoder|decoder)\.middle\.1\.", r"\1.mid_block.attentions.0."),
    (r"^(encoder|decoder)\.middle\.2\.", r"\1.mid_block.resnets.1."),
    (r"^(encoder|decoder)\.head\.0\.", r"\1.norm_out."), (r"^(encoder|decoder)\.head\.2\.", r"\1.conv_out."),
    # In Wan's Sequential the resampler follows the residual blocks; diffusers keeps it apart.
    (r"^encoder\.downsamples\.(\d+)\.downsamples\.\d+\.(resample|time_conv)\.",
     r"encoder.down_blocks.\1.downsampler.\2."),
    (r"^encoder\.downsamples\.(\d+)\.downsamples\.", r"encoder.down_blocks.\1.resnets."),
    (r"^decoder\.upsamples\.(\d+)\.upsamples\.\d+\.(resample|time_conv)\.",
     r"decoder.up_blocks.\1.upsampler.\2."),
    (r"^decoder\.upsamples\.(\d+)\.upsamples\.", r"decoder.up_blocks.\1.resnets."),
)
WAN21_DECODER = {j: (j // 4, None if j % 4 == 3 else j % 4) for j in range(15)}
"""Flat decoder index -> (stage, residual block or None for the resampler) of the published Wan2.1
VAE (3 residual blocks and a resampler a stage); a file's own key list places any depth."""
_BLOCK = re.compile(r"((?:vace_)?blocks\.\d+\.)?(.*)", re.S)


def _swap(name: str, to_wan: bool) -> str:
    block, rest = _BLOCK.match(name).groups(default="")
    if not block and rest.startswith(ANIMATE_MODULES) and (other := _animate(rest, to_wan)) is not None:
        return other
    for wan, diff, where in TRANSFORMER_NAMES:
        src, dst = (diff, wan) if to_wan else (wan, diff)
        if where != ("top" if block else "block") and (rest == src or rest.startswith(src + ".")):
            return block + dst + rest[len(src):]
    return name


def _rules(name: str, rules) -> str:
    for pattern, repl in rules:
        new, n = re.subn(pattern, repl, name)
        if n:
            return new
    return name


def wan_vae_version(keys) -> str:
    """"2.2" if a Wan VAE's up/down stages are nested residual blocks (`decoder.upsamples.0.upsamples.0...`),
    else "2.1". Raises ValueError for keys of no original Wan VAE."""
    keys = list(keys)
    if any(k.startswith(("decoder.up_blocks.", "encoder.down_blocks.")) for k in keys):
        raise ValueError("this VAE state dict is already in diffusers format; load it with "
                         "AutoencoderKLWan.from_pretrained or load_state_dict, not as an original Wan checkpoint")
    if any(k.startswith("decoder.upsamples.0.upsamples.") for k in keys):
        return "2.2"
    if any(k.startswith("decoder.upsamples.0.residual.") for k in keys):
        return "2.1"
    raise ValueError(f"not an original Wan VAE checkpoint: no 'decoder.upsamples.*' keys among {len(keys)} keys")


def wan22_vae_name(key: str) -> str | None:
    """Diffusers' name for one Wan2.2 VAE key, or None when no rule knows it."""
    for pattern, repl in VAE_PREFIXES:
        new, n = re.subn(pattern, repl, key)
        if n:
            break
    else:
        return None
    for old, part in VAE_RESNET_PARTS.items():   # inside residual blocks (mid block and resnets)
        new = re.sub(rf"(resnets\.\d+\.){re.escape(old)}", rf"\g<1>{part}", new)
    return new


def _wan21_vae_name(key: str, place: dict[int, tuple[int, int | None]]) -> str:
    m = re.match(r"^decoder\.upsamples\.(\d+)\.(.*)$", key)
    if m and int(m.group(1)) in place:
        s_, r_ = place[int(m.group(1))]
        new = (f"decoder.up_blocks.{s_}.upsamplers.0.{m.group(2)}" if r_ is None
               else f"decoder.up_blocks.{s_}.resnets.{r_}.{m.group(2)}")
    else:
        new = _rules(re.sub(r"^encoder\.downsamples\.", "encoder.down_blocks.", key), VAE_PREFIXES[:8])
    for old, part in VAE_RESNET_PARTS.items():
        new = re.sub(rf"((?:resnets|down_blocks)\.\d+\.){re.escape(old)}", rf"\g<1>{part}", new)
    return new


def wan21_vae_names(keys) -> dict[str, str]:
    """Diffusers' name of each key of a Wan2.1-layout VAE, for any depth and number of residual blocks
    (diffusers' own converter hard-codes the published model's block indices). The encoder's flat
    list keeps its indices; the decoder's flat list is split into stages at each resampler. Keys no
    rule knows keep their names (and are then reported as unexpected)."""
    keys = list(keys)
    flat = sorted({int(k.split(".")[2]) for k in keys if k.startswith("decoder.upsamples.")})
    resamplers = {int(k.split(".")[2]) for k in keys
                  if k.startswith("decoder.upsamples.") and k.split(".")[3] in ("resample", "time_conv")}
    place, stage, r = {}, 0, 0
    for j in flat:
        place[j] = (stage, None if j in resamplers else r)
        stage, r = (stage + 1, 0) if j in resamplers else (stage, r + 1)
    return {key: _wan21_vae_name(key, place) for key in keys}


def diffusers_name(role: str, wan_name: str) -> str:
    """The diffusers (transformers, for the text encoder) name of one Wan tensor or module path of
    `role`; a name no rule knows comes back as it is. A Wan2.1 VAE decoder key alone is placed by the
    published layout (WAN21_DECODER); diffusers_names places a file's keys by their own."""
    kind = ROLE_NAMES[role]
    if kind == "transformer":
        return _swap(wan_name, to_wan=False)
    if kind == "text_encoder":
        return _rules(wan_name, T5_NAMES)
    if kind == "image_encoder":
        return wan_name.removeprefix(CLIP_TOWER)
    if re.match(r"^(decoder\.upsamples|encoder\.downsamples)\.\d+\.(upsamples|downsamples)\.", wan_name):
        return wan22_vae_name(wan_name) or wan_name
    return _wan21_vae_name(wan_name, WAN21_DECODER)


def wan_name(role: str, diffusers_name: str) -> str:
    """Wan's name of one diffusers (transformers) tensor or module path of the transformer or the text
    encoder; a name no rule knows comes back as it is. (Wan's VAE names are read, never written: a
    diffusers VAE name does not say which Wan layout, 2.1's flat or 2.2's nested, it would go to.)"""
    kind = ROLE_NAMES[role]
    if kind == "transformer":
        return _swap(diffusers_name, to_wan=True)
    if kind == "text_encoder":
        return _rules(diffusers_name, T5_NAMES_BACK)
    raise ValueError(f"wan_name: no Wan names for the {role} (Wan's VAE checkpoints are read only)")


def diffusers_names(role: str, keys: list[str]) -> tuple[str, dict[str, str]]:
    """(layout, file key -> model name) of one component's tensor names (any `model.` prefix already
    stripped): layout "wan" for Wan's original names, renamed; "diffusers" for the model's own.
    Raises ValueError for a VAE whose keys mix both layouts or are no Wan VAE's."""
    kind = ROLE_NAMES[role]
    if kind == "transformer":
        if any(k.startswith(("condition_embedder.", "scale_shift_table", "proj_out.")) for k in keys):
            return "diffusers", {k: k for k in keys}
        renamed = {_swap(k.replace("model.diffusion_model.", ""), to_wan=False): k for k in keys}
        return "wan", {old: new for new, old in renamed.items()}
    if kind == "image_encoder":
        return "diffusers", {k: k.removeprefix(CLIP_TOWER) for k in keys}
    if kind == "text_encoder":
        if "token_embedding.weight" in keys:
            return "wan", {k: _rules(k, T5_NAMES) for k in keys}   # unknown names: reported as unexpected
        names = {k: k for k in keys}
        if "encoder.embed_tokens.weight" in keys:        # tied to shared.weight in transformers' UMT5
            if "shared.weight" in keys:
                del names["encoder.embed_tokens.weight"]
            else:
                names["encoder.embed_tokens.weight"] = "shared.weight"
        return "diffusers", names
    if not any(k.startswith(("decoder.upsamples.", "encoder.downsamples.")) for k in keys):
        return "diffusers", {k: k for k in keys}
    if wan_vae_version(keys) == "2.2":
        return "wan", {k: wan22_vae_name(k) or k for k in keys}
    return "wan", wan21_vae_names(keys)


DEFAULT_PRESET = "wan2.2-ti2v-5b-720p"
"""The shipped preset (configs/<name>.yaml) an OpenAI-style `/v1/videos` request renders when it names no
model (vidgen.queue.videos): one 5B model for text and image to video."""
