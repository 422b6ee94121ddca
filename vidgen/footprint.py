"""What a model costs in memory, counted without its weights: parameters and buffers on meta copies
built from the folder's config.json files (diffusers' own fp32 and fp8 rules applied), and one
forward's live activations on meta tensors (memory-efficient attention: never the N^2 scores).
vidgen.memory plans the render from these; vidgen plan reads the JSON from model.path or, before a
download, from the published folders' JSON shipped in vidgen/variants.

Each count is a pure function of frozen specs (memo.Frozen configs, dtypes, sizes): given `memo=`
(the pipeline's memo.Memo, or a `vidgen plan` run's), it is kept in its "footprint" part."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import weights
from .config import RenderConfig
from .errors import ModelLoadError, VidgenError
from .families import FAMILIES, shipped_folder
from .loading import ModelInfo, inspect_model
from .residency import TEXT_FP8_SKIP
from .memo import Frozen, Memo
from .sources import resolve
from .vae.memsim import LiveBytes
from .weights import meta_text_encoder, meta_transformer


class BudgetError(VidgenError):
    """No plan fits the memory budget (or the model's JSON cannot be read)."""


# --------------------------------------------------------------------------------------------
# The model's JSON


@dataclass(frozen=True)
class ModelSpec:
    """What the planner reads of a model: a view of its loading.ModelInfo, each component's config.json
    frozen (hashable: the footprints are kept under it)."""

    info: ModelInfo = field(compare=False, repr=False)
    transformer: Frozen
    text_encoder: Frozen
    vae: Frozen
    image_encoder: Frozen | None = None   # Wan2.1 I2V's CLIP vision model

    @classmethod
    def of(cls, info: ModelInfo) -> ModelSpec:
        clip = info.config("image_encoder")
        return cls(info, Frozen(info.config("transformer")), Frozen(info.config("text_encoder")),
                   Frozen(info.config("vae")), Frozen(clip) if clip else None)

    @property
    def source(self) -> str:
        """The folder the JSON came from."""
        return str(self.info.path)

    @property
    def experts(self) -> int:
        return len(self.info.experts)

    @property
    def z_dim(self) -> int:
        return self.info.z_dim


def model_spec(cfg: RenderConfig) -> ModelSpec:
    """The model `vidgen plan` plans, from model.path's JSON (only its JSON files are read; the weights
    may be absent), or from the shipped copy of the published folder for model.variant when model.path
    does not exist."""
    root = Path(str(cfg.model.path or "")).expanduser()
    shipped = shipped_folder(cfg.model.variant, str(cfg.model.path))
    if cfg.model.path and not (root / "model_index.json").is_file() or cfg.model.transformer:
        try:        # a repo id in the cache, a Wan checkpoint folder, single files: their variant's JSON
            root = resolve(cfg.model, need_tokenizer=False).root
        except ModelLoadError as e:
            if not shipped:
                raise BudgetError(str(e)) from None
    if not (root / "model_index.json").is_file():
        if shipped is None or not (shipped / "model_index.json").is_file():
            family = FAMILIES.get(cfg.model.variant)
            hint = ("; name the size in model.path (" + " or ".join(f"…{s.path_hint.upper()}…" for s in family.sizes)
                    + ")" if family is not None and len(family.sizes) > 1
                    else "; or set model.variant to one of " + ", ".join(FAMILIES))
            raise BudgetError(f"model.path {str(root)!r} holds no model_index.json{hint}")
        root = shipped
    return ModelSpec.of(inspect_model(root, json_only=True))


def _memoised(fn):
    """`fn(*args)`, with `memo=`: kept in the memo's "footprint" part under fn's name and its arguments."""
    @functools.wraps(fn)
    def counted(*args, memo: Memo | None = None):
        if memo is None:
            return fn(*args)
        return memo.part("footprint", 256).cached((fn.__name__, *args), lambda: fn(*args))
    return counted


# --------------------------------------------------------------------------------------------
# Weights, counted on meta copies


@dataclass(frozen=True)
class WeightBytes:
    total: int              # every parameter and buffer, as stored
    blocks: int             # the transformer blocks' share (what streaming moves)
    largest_block: int      # one block (a streamed group)
    largest_layer: int      # the largest single layer in the compute dtype (fp8's cast copy)
    params: int             # parameter count


def nbytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and buffers, as stored."""
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


def _fp8_layers(module: torch.nn.Module, dtype: torch.dtype, skip: tuple[str, ...]) -> None:
    """diffusers' layerwise casting on `module` (meta): fp8 storage for the layers it casts."""
    from diffusers.hooks import apply_layerwise_casting

    apply_layerwise_casting(module, storage_dtype=torch.float8_e4m3fn, compute_dtype=dtype,
                            skip_modules_pattern=skip)


@_memoised
def transformer_weights(conf: Frozen, dtype: torch.dtype, fp8: bool) -> WeightBytes:
    from diffusers import WanTransformer3DModel

    model = meta_transformer(conf.thaw(), dtype)
    params = sum(p.numel() for p in model.parameters())
    layer = max(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)) * dtype.itemsize
    if fp8:
        _fp8_layers(model, dtype, tuple(WanTransformer3DModel._skip_layerwise_casting_patterns))
    blocks = [nbytes(b) for b in model.blocks]
    return WeightBytes(nbytes(model), sum(blocks), max(blocks), layer, params)


@_memoised
def text_encoder_weights(conf: Frozen, dtype: torch.dtype, fp8: bool) -> WeightBytes:
    model = meta_text_encoder(conf.thaw(), dtype)
    params = sum(p.numel() for p in model.parameters())
    layer = max(m.weight.numel() for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)))
    if fp8:
        _fp8_layers(model, dtype, TEXT_FP8_SKIP)
    return WeightBytes(nbytes(model), 0, 0, layer * dtype.itemsize, params)


def _meta_clip(conf: Frozen, dtype: torch.dtype) -> torch.nn.Module:
    """The CLIP vision model of an image_encoder/config.json on the meta device, in `dtype`."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    with torch.device("meta"):
        return CLIPVisionModel(CLIPVisionConfig(**conf.thaw())).to(dtype).eval()


@_memoised
def image_encoder_bytes(conf: Frozen, dtype: torch.dtype) -> int:
    """Bytes of the CLIP vision model (Wan2.1 I2V, Animate) in `dtype` (counted on a meta copy)."""
    return nbytes(_meta_clip(conf, dtype))


@_memoised
def meta_vae(conf: Frozen, dtype: torch.dtype):
    return weights.meta_vae(conf.thaw(), dtype)


# --------------------------------------------------------------------------------------------
# Activations, counted on meta tensors


@contextlib.contextmanager
def _efficient_attention(tracker):
    """F.scaled_dot_product_attention as the memory-efficient kernels allocate: the output, and the
    float32 log-sum-exp per query row as a transient; never the [N, N] scores."""
    real = torch.nn.functional.scaled_dot_product_attention

    def sdpa(query, key, value, *args, **kwargs):
        b, h, n = query.shape[0], query.shape[1], query.shape[2]
        mask = kwargs.get("attn_mask", args[0] if args else None)
        if mask is not None and mask.dtype == torch.bool:    # turned into an additive mask in the query's dtype
            tracker.transient(mask.numel() * query.element_size())
        tracker.transient(b * h * n * 4)
        return query.new_empty((*query.shape[:-1], value.shape[-1]))

    torch.nn.functional.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = real


@_memoised
def transformer_activations(conf: Frozen, dtype: torch.dtype, latent_shape: tuple[int, ...],
                            text_len: int, per_token_t: bool, device_type: str, block: int = 0) -> int:
    """Peak bytes one forward (batch 1) allocates: a one-block copy of the model on meta tensors. Under
    no_grad a block's intermediates are freed before the next block runs, so one block shows the
    peak of any number. `block`: a diffusion-forcing model's causal block size (latent frames), whose
    [tokens, tokens] attention mask the forward builds (0: no diffusion forcing)."""
    conf = conf.thaw()
    conf["num_layers"] = 1
    if block:
        conf["num_frame_per_block"] = block
    hints = len(conf.get("vace_layers", ()))      # VACE: one context block here; every block's hint kept until used
    if hints:
        conf["vace_layers"] = [0]
    meta = torch.device("meta")
    model = meta_transformer(conf, dtype)
    b, _, t, h, w = latent_shape
    x = torch.empty(b, conf.get("in_channels", 16), t, h, w, device=meta, dtype=dtype)
    p = conf.get("patch_size", (1, 2, 2))
    tokens = (t // p[0]) * (h // p[1]) * (w // p[2])
    timestep = torch.empty(b, tokens, device=meta) if per_token_t else torch.empty(b, device=meta)
    if block:           # one timestep per latent frame, and the fps embedding's index
        timestep, extra = torch.empty(b, t, device=meta), {"enable_diffusion_forcing": True, "fps": [1] * b}
    text = torch.empty(b, text_len, conf.get("text_dim", 4096), device=meta, dtype=dtype)
    extra = extra if block else {}
    if hints:
        extra = {"control_hidden_states": torch.empty(b, conf.get("vace_in_channels", 96), t, h, w, device=meta,
                                                      dtype=dtype),
                 "control_hidden_states_scale": torch.ones(1, device=meta, dtype=dtype)}
    tracker = LiveBytes(device_type)
    with tracker, torch.no_grad(), _efficient_attention(tracker):
        model(hidden_states=x, timestep=timestep, encoder_hidden_states=text, return_dict=False, **extra)
    width = conf.get("num_attention_heads", 40) * conf.get("attention_head_dim", 128)
    return tracker.peak + max(0, hints - 1) * b * tokens * width * torch.empty((), dtype=dtype).element_size()


@_memoised
def animate_activations(conf: Frozen, dtype: torch.dtype, latent_shape: tuple[int, ...], text_len: int,
                        image_tokens: tuple[int, int], face_frames: int, device_type: str) -> int:
    """Peak bytes one Wan2.2-Animate forward (batch 1) allocates over one segment: `latent_shape` [1, z, 1 + T,
    h, w] (the first latent frame the reference's), its pose latents [1, z, T, h, w], `face_frames` face crops
    at motion_encoder_size through the motion encoder (motion_encoder_batch_size at a time) and the face
    encoder, and the CLIP image tokens (`image_tokens`: count, width). Counted as transformer_activations
    does, on a one-block copy with one face adapter after it (inject_face_latents_blocks 1): the real model's
    face adapters (after every inject_face_latents_blocks-th block) see the same live tensors as its blocks,
    so one of each shows the peak of all. The motion and face encoders' outputs stay live through the blocks
    and are counted with them."""
    conf = {**conf.thaw(), "num_layers": 1, "inject_face_latents_blocks": 1}
    meta = torch.device("meta")
    model = meta_transformer(conf, dtype)
    b, z, t, h, w = latent_shape
    size = conf.get("motion_encoder_size", 512)
    x = torch.empty(b, conf.get("in_channels", 2 * z + 4), t, h, w, device=meta, dtype=dtype)
    pose = torch.empty(b, z, t - 1, h, w, device=meta, dtype=dtype)
    face = torch.empty(b, 3, face_frames, size, size, device=meta, dtype=dtype)
    clip = torch.empty(b, *image_tokens, device=meta, dtype=dtype)
    text = torch.empty(b, text_len, conf.get("text_dim", 4096), device=meta, dtype=dtype)
    tracker = LiveBytes(device_type)
    with tracker, torch.no_grad(), _efficient_attention(tracker):
        model(hidden_states=x, timestep=torch.empty(b, device=meta), encoder_hidden_states=text,
              encoder_hidden_states_image=clip, pose_hidden_states=pose, face_pixel_values=face, return_dict=False)
    return tracker.peak


@_memoised
def image_encoder_activations(conf: Frozen, dtype: torch.dtype, device_type: str) -> int:
    """Peak bytes of the CLIP vision model encoding one image with every hidden state kept (Wan reads the
    penultimate), on a meta copy."""
    model, meta = _meta_clip(conf, dtype), torch.device("meta")
    size = conf.get("image_size", 224)
    pixels = torch.empty(1, conf.get("num_channels", 3), size, size, device=meta, dtype=dtype)
    tracker = LiveBytes(device_type)
    with tracker, torch.no_grad(), _efficient_attention(tracker):
        model(pixel_values=pixels, output_hidden_states=True)
    return tracker.peak


@_memoised
def vae_encode_activations(conf: Frozen, dtype: torch.dtype, frames: int, height: int, width: int,
                           device_type: str) -> int:
    """Peak bytes of the VAE encoding a conditioning clip [1, 3, frames, height, width] (diffusers'
    own chunked encode, on meta tensors): I2V encodes the image followed by empty frames, TI2V the image."""
    vae = meta_vae(conf, dtype)
    clip = torch.empty(1, 3, frames, height, width, dtype=dtype, device="meta")
    tracker = LiveBytes(device_type)
    with tracker, torch.no_grad():
        vae.encode(clip)
    return tracker.peak


@_memoised
def text_encoder_activations(conf: Frozen, dtype: torch.dtype, text_len: int, device_type: str) -> int:
    from transformers import UMT5Config, UMT5EncoderModel

    conf = {**conf.thaw(), "num_layers": 1}
    meta = torch.device("meta")
    with meta:
        model = UMT5EncoderModel(UMT5Config(**conf)).eval()
    model.to(dtype)
    ids = torch.zeros(1, text_len, dtype=torch.long, device=meta)
    tracker = LiveBytes(device_type)
    with tracker, torch.no_grad():
        model(input_ids=ids)        # the mask's values cannot be read on meta; its bytes are negligible
    return tracker.peak


def transformer_flops(conf: dict, latent_shape: tuple[int, ...], text_len: int) -> float:
    """Multiply-add FLOPs (x2) of one forward: the linears of every block, self- and cross-attention."""
    d = conf["num_attention_heads"] * conf["attention_head_dim"]
    p = conf.get("patch_size", (1, 2, 2))
    _, _, t, h, w = latent_shape
    n = (t // p[0]) * (h // p[1]) * (w // p[2])
    per_block = 2 * (n * (6 * d * d + 2 * d * conf["ffn_dim"]) + text_len * 2 * d * d) + 4 * n * d * (n + text_len)
    return per_block * conf["num_layers"]
