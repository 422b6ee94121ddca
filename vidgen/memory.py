"""The whole render in a memory budget: a plan made before any weight is read.

For a config and a device, every stage's peak device and host bytes — text encoding, each expert's
denoising at this size and frame count, the decode — under each way of holding the weights:

- **placement**: `resident` (every expert on the device), `swap_experts` (only the active one; the
  other waits in host memory), `stream_blocks` (the active expert's transformer blocks move onto the
  device one group at a time, diffusers' block-level group offload, on a CUDA stream);
- **weights**: `bf16` (stored in model.dtype) or `fp8` (float8_e4m3fn storage, cast to model.dtype
  layer by layer: diffusers' layerwise casting, which keeps norms, embeddings and the patch
  embedding in model.dtype);
- **text encoder**: on the device while it encodes (in the weights' storage dtype), or on the CPU.

Weights are counted on meta copies of the models built from their config.json (exact parameter
counts and dtypes, diffusers' own fp32 and fp8 rules applied); activations by running one forward
on meta tensors and counting live storages (vidgen.vae.memsim.LiveBytes), with attention modelled as
the memory-efficient kernels run it (output and log-sum-exp, never the N^2 score matrix); the decode
by the VAE planner (vidgen.vae.plan). The first candidate that fits wins: resident bf16, then expert
swapping, then fp8, then streaming (docs/memory.md). The model's JSON comes from model.path, or —
before a download — from the published folders' JSON shipped in vidgen/variants.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import torch

from .config import RenderConfig, parse_budget
from .errors import VidgenError
from .loading import TEXT_FP8_SKIP
from .memo import Memo

VARIANTS_DIR = Path(__file__).parent / "variants"
SHIPPED = {"wan2.2-t2v-a14b": "wan2.2-t2v-a14b", "wan2.2-i2v-a14b": "wan2.2-i2v-a14b",
           "wan2.2-ti2v-5b": "wan2.2-ti2v-5b"}
"""model.variant -> the shipped JSON folder; wan2.1-t2v has two sizes, told apart by model.path's name."""
DEVICE_RESERVE = 768 << 20      # auto device budget: free memory less this (CUDA context, fragmentation)
HOST_RESERVE = 0.10             # auto host budget: available RAM less this fraction (at least 2 GiB)
# Nominal speeds for the expected-slowdown column only (a 24 GB-class card on PCIe 4.0 x16); the
# plan's choice depends on bytes, never on these.
PCIE_BYTES_PER_S = 25e9
DEVICE_FLOPS = 100e12
DEVICE_BYTES_PER_S = 1.0e12
CPU_FLOPS = 1.0e12
SOLVER_COPIES = 6               # latent-sized float32 tensors a multistep solver keeps (state, history, noise)


DECODE_PLANS = Memo(256)
"""Decode plans of the memory plans made in this process (pure functions of their key)."""
TEXT_PLACES = ("device", "cpu")


class BudgetError(VidgenError):
    """No plan fits the memory budget (or the model's JSON cannot be read)."""


# --------------------------------------------------------------------------------------------
# The model's JSON


@dataclass(frozen=True)
class ModelSpec:
    """What the planner reads of a model: each component's config.json (no weights)."""

    source: str                           # the folder the JSON came from
    transformer: dict
    experts: int
    text_encoder: dict
    vae: dict
    z_dim: int = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "z_dim", int(self.vae.get("z_dim", 16)))

    def latent_shape(self, width: int, height: int, num_frames: int) -> tuple[int, int, int, int, int]:
        """[1, z, frames, height, width] of a clip's latents (as loading.ModelInfo.latent_shape), with
        AutoencoderKLWan's defaults for what the VAE's config.json leaves out."""
        conf = _meta_vae(json.dumps(_config_only(self.vae), sort_keys=True), torch.float32).config
        s, st = int(conf["scale_factor_spatial"]), int(conf["scale_factor_temporal"])
        return (1, self.z_dim, (num_frames - 1) // st + 1, height // s, width // s)


def _json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise BudgetError(f"cannot read {what} ({path}): {e.__class__.__name__}; vidgen plan needs the model "
                          "folder's JSON files") from None
    if not isinstance(data, dict):
        raise BudgetError(f"{what} ({path}) is not a JSON object")
    return data


def shipped_folder(cfg: RenderConfig) -> Path | None:
    """The shipped JSON folder for cfg.model.variant (None: the variant cannot be told)."""
    v = cfg.model.variant
    if v == "wan2.1-t2v":
        name = Path(str(cfg.model.path)).name.lower()
        size = "1.3b" if "1.3b" in name else "14b" if "14b" in name else None
        return VARIANTS_DIR / f"wan2.1-t2v-{size}" if size else None
    return VARIANTS_DIR / SHIPPED[v] if v in SHIPPED else None


def model_spec(cfg: RenderConfig) -> ModelSpec:
    """The model's JSON from model.path (only its JSON files are read; the weights may be absent), or
    from the shipped copy of the published folder for model.variant when model.path does not exist."""
    root = Path(str(cfg.model.path)).expanduser()
    if not (root / "model_index.json").is_file():
        shipped = shipped_folder(cfg)
        if shipped is None or not (shipped / "model_index.json").is_file():
            hint = ("; name the size in model.path (…1.3B… or …14B…)" if cfg.model.variant == "wan2.1-t2v"
                    else "; or set model.variant to one of " + ", ".join(["wan2.1-t2v", *SHIPPED]))
            raise BudgetError(f"model.path {str(root)!r} holds no model_index.json{hint}")
        root = shipped
    index = _json(root / "model_index.json", "model_index.json")
    experts = 2 if isinstance(index.get("transformer_2"), list) and index["transformer_2"][1] else 1
    return ModelSpec(str(root), _json(root / "transformer" / "config.json", "transformer/config.json"), experts,
                     _json(root / "text_encoder" / "config.json", "text_encoder/config.json"),
                     _json(root / "vae" / "config.json", "vae/config.json"))


def _config_only(conf: dict) -> dict:
    return {k: v for k, v in conf.items() if not k.startswith("_")}


# --------------------------------------------------------------------------------------------
# Weights, counted on meta copies


@dataclass(frozen=True)
class WeightBytes:
    total: int              # every parameter and buffer, as stored
    blocks: int             # the transformer blocks' share (what streaming moves)
    largest_block: int      # one block (a streamed group)
    largest_layer: int      # the largest single layer in the compute dtype (fp8's cast copy)
    params: int             # parameter count


def _nbytes(module: torch.nn.Module, prefix: str = "") -> int:
    return sum(t.numel() * t.element_size() for n, t in [*module.named_parameters(), *module.named_buffers()]
               if n.startswith(prefix))


def _fp8_layers(module: torch.nn.Module, dtype: torch.dtype, skip: tuple[str, ...]) -> None:
    """diffusers' layerwise casting on `module` (meta): fp8 storage for the layers it casts."""
    from diffusers.hooks import apply_layerwise_casting

    apply_layerwise_casting(module, storage_dtype=torch.float8_e4m3fn, compute_dtype=dtype,
                            skip_modules_pattern=skip)


def _default_dtype(dtype):
    from .vae.memsim import default_dtype

    return default_dtype(dtype)


def _keep_fp32(model: torch.nn.Module, patterns) -> None:
    """diffusers' _keep_in_fp32_modules: those modules stay float32 when loaded in a half dtype."""
    for name, module in model.named_modules():
        if any(p in name.split(".") for p in patterns or ()):
            module.float()


@lru_cache(maxsize=16)
def transformer_weights(config_json: str, dtype: torch.dtype, fp8: bool) -> WeightBytes:
    from diffusers import WanTransformer3DModel

    with torch.device("meta"), _default_dtype(dtype):
        model = WanTransformer3DModel.from_config(json.loads(config_json))
    if dtype != torch.float32:
        _keep_fp32(model, WanTransformer3DModel._keep_in_fp32_modules)
    params = sum(p.numel() for p in model.parameters())
    layer = max(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)) * dtype.itemsize
    if fp8:
        _fp8_layers(model, dtype, tuple(WanTransformer3DModel._skip_layerwise_casting_patterns))
    blocks = [_nbytes(b) for b in model.blocks]
    return WeightBytes(_nbytes(model), sum(blocks), max(blocks), layer, params)


@lru_cache(maxsize=8)
def text_encoder_weights(config_json: str, dtype: torch.dtype, fp8: bool) -> WeightBytes:
    from transformers import UMT5Config, UMT5EncoderModel

    with torch.device("meta"):
        model = UMT5EncoderModel(UMT5Config(**json.loads(config_json)))
    model.to(dtype)
    params = sum(p.numel() for p in model.parameters())
    layer = max(m.weight.numel() for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)))
    if fp8:
        _fp8_layers(model, dtype, TEXT_FP8_SKIP)
    return WeightBytes(_nbytes(model), 0, 0, layer * dtype.itemsize, params)


@lru_cache(maxsize=8)
def _meta_vae(config_json: str, dtype: torch.dtype):
    from diffusers import AutoencoderKLWan

    from .vae.memsim import default_dtype

    with torch.device("meta"), default_dtype(dtype):
        return AutoencoderKLWan.from_config(json.loads(config_json)).eval().requires_grad_(False)


# --------------------------------------------------------------------------------------------
# Activations, counted on meta tensors


@contextlib.contextmanager
def _efficient_attention(tracker):
    """F.scaled_dot_product_attention as the memory-efficient kernels allocate: the output, and the
    float32 log-sum-exp per query row as a transient; never the [N, N] scores."""
    real = torch.nn.functional.scaled_dot_product_attention

    def sdpa(query, key, value, *args, **kwargs):
        b, h, n = query.shape[0], query.shape[1], query.shape[2]
        tracker.transient(b * h * n * 4)
        return query.new_empty((*query.shape[:-1], value.shape[-1]))

    torch.nn.functional.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = real


@lru_cache(maxsize=64)
def transformer_activations(config_json: str, dtype: torch.dtype, latent_shape: tuple[int, ...],
                            text_len: int, per_token_t: bool, device_type: str) -> int:
    """Peak bytes one forward (batch 1) allocates: a one-block copy of the model on meta tensors. Under
    no_grad a block's intermediates are freed before the next block runs, so one block shows the
    peak of any number."""
    from diffusers import WanTransformer3DModel

    from .vae.memsim import LiveBytes

    conf = json.loads(config_json)
    conf["num_layers"] = 1
    meta = torch.device("meta")
    with meta, _default_dtype(dtype):
        model = WanTransformer3DModel.from_config(conf).eval()
    if dtype != torch.float32:
        _keep_fp32(model, WanTransformer3DModel._keep_in_fp32_modules)
    b, _, t, h, w = latent_shape
    x = torch.empty(b, conf.get("in_channels", 16), t, h, w, device=meta, dtype=dtype)
    p = conf.get("patch_size", (1, 2, 2))
    tokens = (t // p[0]) * (h // p[1]) * (w // p[2])
    timestep = torch.empty(b, tokens, device=meta) if per_token_t else torch.empty(b, device=meta)
    text = torch.empty(b, text_len, conf.get("text_dim", 4096), device=meta, dtype=dtype)
    tracker = LiveBytes(device_type)
    with tracker, torch.no_grad(), _efficient_attention(tracker):
        model(hidden_states=x, timestep=timestep, encoder_hidden_states=text, return_dict=False)
    return tracker.peak


@lru_cache(maxsize=8)
def text_encoder_activations(config_json: str, dtype: torch.dtype, text_len: int, device_type: str) -> int:
    from transformers import UMT5Config, UMT5EncoderModel

    from .vae.memsim import LiveBytes

    conf = json.loads(config_json)
    conf["num_layers"] = 1
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


# --------------------------------------------------------------------------------------------
# Plans


@dataclass(frozen=True)
class Stage:
    name: str
    device_weights: int
    device_activations: int
    host: int
    slowdown: float         # this stage's expected time over resident bf16 (nominal speeds)

    @property
    def device_total(self) -> int:
        return self.device_weights + self.device_activations


@dataclass(frozen=True)
class MemoryPlan:
    """One candidate (placement, weights, text encoder place) and its stage peaks."""

    placement: str
    weights: str
    text_encoder: str
    device_type: str
    device_budget: int
    host_budget: int
    stages: tuple[Stage, ...]
    decode_budget: int                  # what the decode may use (vae.memory_budget auto)
    decode_plan: str
    slowdown: float                     # the render's expected time over resident bf16
    dtype: str = "bfloat16"             # the compute dtype (model.dtype): what "bf16" weights are stored in

    @property
    def storage(self) -> str:
        return "fp8 (float8_e4m3fn)" if self.weights == "fp8" else self.dtype

    @property
    def device_peak_bytes(self) -> int:
        return max(s.device_total for s in self.stages)

    @property
    def host_peak_bytes(self) -> int:
        return max(s.host for s in self.stages)

    @property
    def fits(self) -> bool:
        return self.device_peak_bytes <= self.device_budget and self.host_peak_bytes <= self.host_budget

    def to_json(self) -> dict:
        return {"fits": self.fits, "device_type": self.device_type, "device_budget": self.device_budget,
                "host_budget": self.host_budget, "device_peak_bytes": self.device_peak_bytes,
                "host_peak_bytes": self.host_peak_bytes, "weights": self.weights, "compute_dtype": self.dtype,
                "placement": self.placement,
                "text_encoder": self.text_encoder, "decode_budget": self.decode_budget,
                "decode_plan": self.decode_plan, "expected_slowdown": round(self.slowdown, 3),
                "stages": [{**asdict(s), "device_total": s.device_total} for s in self.stages]}

    def line(self) -> str:
        """The plan in one line (the render's log)."""
        return (f"memory plan: {self.placement}, {self.storage} weights, text encoder on the {self.text_encoder}; "
                f"device peak {gib(self.device_peak_bytes)} of {gib(self.device_budget)}, host peak "
                f"{gib(self.host_peak_bytes)} of {gib(self.host_budget)}; expected {self.slowdown:.2f}x the time "
                f"of resident bf16")

    def table(self) -> str:
        rows = [("stage", "weights on device", "activations", "device total", "host", "slowdown")]
        rows += [(s.name, gib(s.device_weights), gib(s.device_activations), gib(s.device_total), gib(s.host),
                  f"{s.slowdown:.2f}x") for s in self.stages]
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
        verdict = "fits" if self.fits else "does NOT fit"
        return (f"{text}\n\nplacement {self.placement}, weights {self.storage}, text encoder on the "
                f"{self.text_encoder}, decode {self.decode_plan}\ndevice peak {gib(self.device_peak_bytes)} of "
                f"{gib(self.device_budget)}, host peak {gib(self.host_peak_bytes)} of {gib(self.host_budget)}: "
                f"{verdict}; expected {self.slowdown:.2f}x the time of resident bf16")


def gib(n: float) -> str:
    from .vae.plan import format_bytes

    return format_bytes(n)


def _auto_device_budget(device: torch.device) -> int:
    from .vae.plan import free_memory

    if device.type == "cpu":
        return _auto_host_budget()
    return max(0, free_memory(device) - DEVICE_RESERVE)


def _auto_host_budget() -> int:
    from .vae.plan import free_memory

    avail = free_memory(torch.device("cpu"))
    return int(avail - max(2 << 30, HOST_RESERVE * avail))


def candidates(cfg: RenderConfig, experts: int, device_type: str) -> list[tuple[str, str, str]]:
    """(placement, weights, text encoder place) in the order tried: resident bf16, expert swapping,
    fp8, then streaming; a fixed memory.placement / memory.weights narrows it. On the CPU nothing moves."""
    fixed = cfg.memory.placement
    if fixed == "auto":
        fixed = {"experts": "swap_experts", "none": "resident"}.get(cfg.model.offload, "auto")
    if device_type == "cpu":            # nothing to move: as asked, else resident in model.dtype
        return [("resident" if fixed == "auto" else fixed, cfg.memory.weights if cfg.memory.weights != "auto" else "bf16",
                 "device")]
    out = []
    for weights, placement in [("bf16", "resident"), ("bf16", "swap_experts"), ("fp8", "resident"),
                               ("fp8", "swap_experts"), ("bf16", "stream_blocks"), ("fp8", "stream_blocks")]:
        if placement == "swap_experts" and experts == 1 and fixed != "swap_experts":
            continue                    # one expert: swapping is residency
        if fixed not in ("auto", placement) or cfg.memory.weights not in ("auto", weights):
            continue
        out += [(placement, weights, te) for te in TEXT_PLACES]
    return out


def plan_candidate(cfg: RenderConfig, spec: ModelSpec, device_type: str, dtype: torch.dtype, vae_dtype: torch.dtype,
                   placement: str, weights: str, text_place: str, device_budget: int, host_budget: int,
                   latent_shape: tuple[int, ...], steps: int, cfg_forwards: float) -> MemoryPlan:
    """The stage peaks of one candidate."""
    from .vae import canvas_bytes
    from .vae.plan import BudgetTooSmall, choose_plan, host_bytes

    fp8 = weights == "fp8"
    tconf = json.dumps(_config_only(spec.transformer), sort_keys=True)
    econf = json.dumps(_config_only(spec.text_encoder), sort_keys=True)
    vconf = json.dumps(_config_only(spec.vae), sort_keys=True)
    tw = transformer_weights(tconf, dtype, fp8)
    tw16 = transformer_weights(tconf, dtype, False)
    text_len = cfg.model.max_sequence_length
    te_fp8 = fp8 and text_place == "device"
    ew = text_encoder_weights(econf, dtype, te_fp8)
    vae = _meta_vae(vconf, vae_dtype)
    vae_bytes = _nbytes(vae)
    n = spec.experts

    # Transformer weights on the device while sampling, and while the other stages run.
    outside = tw.total - tw.blocks
    if placement == "resident":
        sampling_w, idle_w = n * tw.total, n * tw.total
    elif placement == "swap_experts":
        sampling_w, idle_w = tw.total, tw.total
    else:       # stream_blocks: what is outside the blocks, and two groups (the one running, the next in flight)
        sampling_w, idle_w = outside + 2 * tw.largest_block, outside
    host_experts = {"resident": 0, "swap_experts": (n - 1) * tw.total, "stream_blocks": n * tw.total}[placement]
    te_on_device = ew.total if text_place == "device" else 0
    # The VAE waits in host memory while the transformer samples, unless everything is resident.
    vae_early = vae_bytes if placement == "resident" or device_type == "cpu" else 0
    te_host = ew.total      # kept in host memory between renders (model.offload_text_encoder), or encoding there

    # 1. Text encoding: the experts as placed (load puts them there first), the VAE, the encoder.
    te_act = text_encoder_activations(econf, dtype, text_len, device_type if text_place == "device" else "cpu")
    te_flops = 2 * ew.params * text_len * (1 + (cfg_forwards > 1))
    render_flops = transformer_flops(spec.transformer, latent_shape, text_len) * steps * cfg_forwards
    render_s = render_flops / DEVICE_FLOPS
    te_slow = (te_flops / CPU_FLOPS) / (te_flops / DEVICE_FLOPS) if text_place == "cpu" else 1.0
    text = Stage("text encoding", idle_w + vae_early + te_on_device, te_act if text_place == "device" else 0,
                 host_experts + (te_host if text_place == "cpu" else 0) + vae_bytes - vae_early, te_slow)

    # 2. Denoising, per expert: weights as placed, one forward's activations, the solver's latents.
    per_token = bool(cfg.model.variant == "wan2.2-ti2v-5b" or spec.z_dim == 48)
    act = transformer_activations(tconf, dtype, tuple(latent_shape), text_len, per_token, device_type)
    if fp8:
        act += tw.largest_layer                 # one layer's weight cast to the compute dtype at a time
    latent_bytes = math.prod(latent_shape) * 4
    act += SOLVER_COPIES * latent_bytes + 2 * text_len * spec.transformer.get("text_dim", 4096) * dtype.itemsize
    forward_s = transformer_flops(spec.transformer, latent_shape, text_len) / DEVICE_FLOPS
    extra = 0.0
    if placement == "stream_blocks":    # each block's copy overlaps the previous block's compute
        per_block_s = forward_s / spec.transformer["num_layers"]
        extra += max(0.0, tw.largest_block / PCIE_BYTES_PER_S - per_block_s) * spec.transformer["num_layers"]
        extra += tw.largest_block / PCIE_BYTES_PER_S        # the first group is not overlapped
    if fp8:
        extra += 3 * (tw.total - outside) / DEVICE_BYTES_PER_S / 2     # read fp8, write the cast copy
    denoise_slow = (forward_s + extra) / forward_s
    if placement == "swap_experts" and n > 1:
        denoise_slow += 2 * tw16.total / PCIE_BYTES_PER_S / max(render_s, 1e-9)
    names = ["denoising (high-noise expert)", "denoising (low-noise expert)"] if n == 2 else ["denoising"]
    vae_host = vae_bytes - vae_early
    denoise = [Stage(name, sampling_w + vae_early, act, host_experts + te_host + vae_host, denoise_slow) for name in names]

    # 3. Decode: experts released (except resident ones), the VAE plan in what is left.
    decode_w = (n * tw.total if placement == "resident" else 0) + vae_bytes
    canvas = canvas_bytes(vae.config, latent_shape)
    requested = cfg.vae.memory_budget
    decode_budget = device_budget - decode_w if requested == "auto" else int(parse_budget(requested))
    decode_host = (0 if placement == "resident" else n * tw.total) + te_host + canvas
    try:
        if decode_budget <= 0:
            raise BudgetTooSmall("no device memory is left for the decode")
        est = choose_plan(vae, latent_shape, memory_budget=decode_budget, device=torch.device(device_type),
                          dtype=vae_dtype, output_bytes=canvas if device_type == "cpu" else 0, memo=DECODE_PLANS)
        decode_act, decode_plan = est.peak_bytes, (f"{est.plan.ny}x{est.plan.nx} tiles from up block "
                                                   f"{est.plan.tile_from}, {est.plan.frames_per_step} frames/step")
        if est.plan.mid_on_host:
            decode_host += host_bytes(vae, latent_shape, vae_dtype, est.plan)
    except BudgetTooSmall:
        decode_act, decode_plan = _decode_floor(vae, latent_shape, vae_dtype, device_type, canvas), "no plan fits"
    decode = Stage("decode", decode_w, decode_act, decode_host, 1.0)

    stages = (text, *denoise, decode)
    te_share = te_flops / DEVICE_FLOPS / (render_s + te_flops / DEVICE_FLOPS)
    slowdown = (1 - te_share) * denoise_slow + te_share * te_slow
    if device_type == "cpu":            # the device is the host: one memory, every weight in it at once
        held = n * tw.total + vae_bytes + ew.total
        stages = tuple(Stage(s.name, held, s.device_activations, 0, s.slowdown) for s in stages)
    return MemoryPlan(placement, weights, text_place, device_type, device_budget, host_budget, stages,
                      max(0, decode_budget), decode_plan, slowdown, str(dtype).removeprefix("torch."))


def _decode_floor(vae, latent_shape, dtype, device_type, canvas) -> int:
    """The least the decode needs (its finest plan's peak), for a refusal's minimum."""
    from .vae.plan import BudgetTooSmall, choose_plan

    try:
        choose_plan(vae, latent_shape, memory_budget=1, device=torch.device(device_type), dtype=dtype,
                    output_bytes=canvas if device_type == "cpu" else 0)
    except BudgetTooSmall as e:
        return e.minimum
    return 0


@dataclass(frozen=True)
class Planned:
    """The chosen plan and every candidate tried (for `vidgen plan --all` and the refusal)."""

    chosen: MemoryPlan
    tried: tuple[MemoryPlan, ...]


def plan_render(cfg: RenderConfig, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                vae_dtype: torch.dtype | None = None, spec: ModelSpec | None = None) -> Planned:
    """The memory plan for `cfg` (no weights read): the first candidate that fits, or BudgetError
    naming the least any candidate needs and the settings that would reach it."""
    from .loading import resolve_dtype

    device = torch.device(device) if device is not None else _device_for(cfg)
    dtype = dtype or resolve_dtype(cfg.model.dtype, device)
    vae_dtype = vae_dtype or resolve_dtype(cfg.vae.dtype, device)
    spec = spec or model_spec(cfg)
    budget = parse_budget(cfg.memory.device_budget, "memory.device_budget")
    host = parse_budget(cfg.memory.host_budget, "memory.host_budget")
    if budget == "auto":
        if device.type == "cuda" and not torch.cuda.is_available():
            raise BudgetError("memory.device_budget: auto needs the CUDA device present; on this machine give the "
                              "card's size, e.g. memory.device_budget=24GiB")
        budget = _auto_device_budget(device)
    host = _auto_host_budget() if host == "auto" else host
    shape = spec.latent_shape(cfg.width, cfg.height, cfg.num_frames)
    guided = cfg.sampling.guidance_scale > 1 or (cfg.sampling.guidance_scale_2 or 0) > 1
    forwards = 2.0 if guided else 1.0
    tried = []
    for placement, weights, te in candidates(cfg, spec.experts, device.type):
        p = plan_candidate(cfg, spec, device.type, dtype, vae_dtype, placement, weights, te, budget, host, shape,
                           cfg.sampling.steps, forwards)
        tried.append(p)
        if p.fits:
            return Planned(p, tuple(tried))
    if not tried:
        raise BudgetError("memory.placement / memory.weights leave no plan to try")
    least = min(tried, key=lambda p: (p.device_peak_bytes, p.host_peak_bytes))
    raise BudgetError(refusal(cfg, least, spec))


def refusal(cfg: RenderConfig, least: MemoryPlan, spec: ModelSpec) -> str:
    """One line: which budget is short, the least this render needs, and what would reach it."""
    what = f"{Path(spec.source).name} at {cfg.width}x{cfg.height}x{cfg.num_frames}"
    how = f"{least.placement}, {least.storage} weights, text encoder on the {least.text_encoder}"
    hints = []
    if cfg.memory.weights == "bf16":
        hints.append("memory.weights=fp8")
    if cfg.memory.placement not in ("auto", "stream_blocks"):
        hints.append("memory.placement=stream_blocks")
    hints.append("a smaller size or fewer frames")
    if least.device_peak_bytes > least.device_budget:
        return (f"memory.device_budget {gib(least.device_budget)} is below the minimum for {what} "
                f"({gib_up(least.device_peak_bytes)} with {how}); raise it, or use {' or '.join(hints)}")
    return (f"memory.host_budget {gib(least.host_budget)} is below the minimum for {what} "
            f"({gib_up(least.host_peak_bytes)} of host memory with {how}); raise it, or use {' or '.join(hints)}")


def gib_up(n: float) -> str:
    """n rounded up in the last digit shown: a budget written as the text is never below n."""
    from .vae.plan import format_bytes

    return format_bytes(n, up=True)


def _device_for(cfg: RenderConfig) -> torch.device:
    """model.device for planning: cuda/mps as named even when absent here (plan for another machine)."""
    from .loading import resolve_device

    if cfg.model.device in ("cuda", "mps"):
        return torch.device(cfg.model.device)
    return resolve_device(cfg.model.device)



def decode_budget(cfg: RenderConfig, memory: MemoryPlan | None):
    """vae.memory_budget, or with auto under an explicit memory.device_budget on a GPU, what the
    memory plan leaves the decode (free memory may be more than the budget allows)."""
    if (cfg.vae.memory_budget == "auto" and memory is not None and cfg.memory.device_budget != "auto"
            and memory.device_type != "cpu"):
        return memory.decode_budget
    return cfg.vae.memory_budget
