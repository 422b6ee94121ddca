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

Weights are counted on meta copies of the models built from their config.json (vidgen.footprint: exact parameter
counts and dtypes, diffusers' own fp32 and fp8 rules applied); activations by running one forward
on meta tensors and counting live storages (vidgen.vae.memsim.LiveBytes), with attention modelled as
the memory-efficient kernels run it (output and log-sum-exp, never the N^2 score matrix); the decode
by the VAE planner (vidgen.vae.plan). The first candidate that fits wins: resident bf16, then expert
swapping, then fp8, then streaming (docs/memory.md). The model's JSON comes from model.path, or —
before a download — from the published folders' JSON shipped in vidgen/variants.

Other modules ask a MemoryPlan's properties (`streams`, `fp8`, `swaps`, ...) rather than compare its
fields with strings.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

import torch

from . import budgets
from .animate_memory import Segment, segment
from .budgets import Budget, format_bytes, format_bytes as gib
from .config import RenderConfig
from .families import FAMILIES
from .forcing import Layout, layout
from .parallel import per_rank_activations
from .footprint import (BudgetError, ModelSpec, WeightBytes, image_encoder_bytes, meta_vae, model_spec, nbytes,
                        text_encoder_activations, text_encoder_weights, transformer_activations, transformer_flops,
                        transformer_weights, vae_encode_activations)
from .loading import ModelInfo, resolve_device, resolve_dtype
from .memo import Memo
from .vae import canvas_bytes
from .vae.plan import BudgetTooSmall, choose_plan, host_bytes

Placement = Literal["resident", "swap_experts", "stream_blocks", "shard_blocks"]     # the experts while sampling
WeightDtype = Literal["bf16", "fp8"]        # storage: model.dtype, or float8_e4m3fn cast layer by layer
TextPlace = Literal["device", "cpu"]        # where the text encoder encodes
Idle = Literal["host", "file"]              # where an idle expert or text encoder waits

DEVICE_RESERVE = 768 << 20      # auto device budget: free memory less this (CUDA context, fragmentation)
HOST_RESERVE = 0.10             # auto host budget: available RAM less this fraction (at least 2 GiB)
# Nominal speeds for the expected-slowdown column only (a 24 GB-class card on PCIe 4.0 x16); the
# plan's choice depends on bytes, never on these.
PCIE_BYTES_PER_S = 25e9
DEVICE_FLOPS = 100e12
DEVICE_BYTES_PER_S = 1.0e12
CPU_FLOPS = 1.0e12
DISK_BYTES_PER_S = 2.0e9        # an NVMe drive: an idle expert read back from its files
SOLVER_COPIES = 6               # latent-sized float32 tensors a multistep solver keeps (state, history, noise)
TEXT_PLACES: tuple[TextPlace, ...] = ("device", "cpu")
ORDER: tuple[tuple[WeightDtype, Placement], ...] = (
    ("bf16", "resident"), ("bf16", "swap_experts"), ("fp8", "resident"), ("fp8", "swap_experts"),
    ("bf16", "stream_blocks"), ("fp8", "stream_blocks"))
"""(weights, placement) in the order tried: the cheapest in time first."""


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

    placement: Placement
    weights: WeightDtype
    text_encoder: TextPlace
    device_type: str
    device_budget: int
    host_budget: int
    stages: tuple[Stage, ...]
    decode_budget: int                  # what the decode may use (vae.memory_budget auto)
    decode_plan: str
    slowdown: float                     # the render's expected time over resident bf16
    dtype: str = "bfloat16"             # the compute dtype (model.dtype): what "bf16" weights are stored in
    idle_expert: Idle = "host"          # two experts, swapped or streamed: where the idle one waits, host memory or its files
    idle_text: Idle = "host"            # where the text encoder waits between encodes: host memory or its files
    experts: int = 1                    # the model's transformers (2: Wan2.2 A14B)
    ranks: int = 1                      # a parallel render's ranks: every figure is one device's (rank 0's)

    @property
    def swaps(self) -> bool:  # two experts, only the active one on the device
        return self.placement == "swap_experts" and self.experts > 1

    @property
    def shards(self) -> bool:  # a parallel render's experts, their blocks sharded over the ranks (FSDP2)
        return self.placement == "shard_blocks"

    @property
    def streams(self) -> bool:  # the active expert's blocks stream onto the device
        return self.placement == "stream_blocks"

    @property
    def fp8(self) -> bool:  # float8_e4m3fn storage, cast to model.dtype layer by layer
        return self.weights == "fp8"

    @property
    def text_on_cpu(self) -> bool:  # the text encoder encodes on the CPU
        return self.text_encoder == "cpu"

    @property
    def expert_in_files(self) -> bool:  # the idle expert waits in its files, read when it runs
        return self.idle_expert == "file"

    @property
    def text_in_files(self) -> bool:  # the text encoder waits in its files between encodes
        return self.idle_text == "file"

    @property
    def parks_vae(self) -> bool:  # the VAE in host memory until it encodes or decodes
        return self.placement not in ("resident", "shard_blocks") and self.device_type != "cpu"

    @property
    def policy(self) -> tuple[str, ...]:  # how the weights are held (a warm pipeline renders a plan of its policy)
        return (self.placement, self.weights, self.text_encoder, self.idle_expert, self.idle_text)

    @property
    def storage(self) -> str:
        return "fp8 (float8_e4m3fn)" if self.fp8 else self.dtype

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
                "placement": self.placement, "devices": self.ranks, "per_device": True,
                "text_encoder": self.text_encoder, "idle_expert": self.idle_expert, "idle_text_encoder": self.idle_text,
                "decode_budget": self.decode_budget,
                "decode_plan": self.decode_plan, "expected_slowdown": round(self.slowdown, 3),
                "stages": [{**asdict(s), "device_total": s.device_total} for s in self.stages]}

    @property
    def how(self) -> str:
        idle = ", the idle expert read from its files" if self.expert_in_files else ""
        return f"{self.placement}{idle}, {self.storage} weights"

    @property
    def text_how(self) -> str:
        return f"text encoder on the {self.text_encoder}" + (", read from its files to encode" if self.text_in_files
                                                               else "")

    def line(self) -> str:
        """The plan in one line (the render's log)."""
        return (f"memory plan: {self.how}, {self.text_how}; "
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
        return (f"{text}\n\nplacement {self.how}, {self.text_how}, "
                f"decode {self.decode_plan}\ndevice peak {gib(self.device_peak_bytes)} of "
                f"{gib(self.device_budget)}{f' on each of {self.ranks} devices' if self.ranks > 1 else ''}, host peak {gib(self.host_peak_bytes)} of {gib(self.host_budget)}: "
                f"{verdict}; expected {self.slowdown:.2f}x the time of resident bf16")


def _auto_device_budget(device: torch.device) -> int:
    return _auto_host_budget() if device.type == "cpu" else max(0, budgets.free_memory(device) - DEVICE_RESERVE)


def _auto_host_budget() -> int:
    avail = budgets.free_memory(torch.device("cpu"))
    return int(avail - max(2 << 30, HOST_RESERVE * avail))


def candidates(cfg: RenderConfig, experts: int, device_type: str) -> list[tuple[Placement, WeightDtype, TextPlace]]:
    """(placement, weights, text encoder place) in the order tried: resident bf16, expert swapping,
    fp8, then streaming; a fixed memory.placement / memory.weights narrows it. On the CPU nothing moves."""
    fixed = cfg.memory.placement
    if fixed == "auto":
        fixed = {"experts": "swap_experts", "none": "resident"}.get(cfg.model.offload, "auto")
    if device_type == "cpu":            # nothing to move: as asked, else resident in model.dtype
        return [("resident" if fixed == "auto" else fixed, cfg.memory.weights if cfg.memory.weights != "auto" else "bf16",
                 "device")]
    out, ranks = [], cfg.parallel.devices
    order = ORDER[:1] + ((("bf16", "shard_blocks"),) if ranks > 1 and cfg.parallel.shard_weights == "auto" else ()) + ORDER[1:]
    for weights, placement in order:
        if placement == "swap_experts" and experts == 1 and fixed != "swap_experts":
            continue                    # one expert: swapping is residency
        if fixed not in ("auto", placement) or cfg.memory.weights not in ("auto", weights):
            continue
        out += [(placement, weights, te) for te in TEXT_PLACES]
    return out


# --------------------------------------------------------------------------------------------
# One candidate's stage peaks


@dataclass(frozen=True, eq=False)
class _Render:
    """What every candidate of one render shares: the model, device, dtypes, budgets and clip."""

    cfg: RenderConfig
    spec: ModelSpec
    device_type: str
    dtype: torch.dtype
    vae_dtype: torch.dtype
    device_budget: int
    host_budget: int
    decode_asked: Budget            # vae.memory_budget: "auto" or bytes
    latent_shape: tuple[int, ...]
    text_len: int                   # model.max_sequence_length
    forwards: float                 # transformer forwards a step (2 with classifier-free guidance)
    per_token: bool                 # one timestep per latent token (TI2V-5B)
    memo: Memo
    take: Layout | None = None      # diffusion forcing: the take's windows (a forward sees one window)
    seg: Segment | None = None      # Animate: one segment (latent_shape its latents), encoded, sampled, decoded in turn
    flops: float = field(init=False)    # one forward's

    def __post_init__(self):
        object.__setattr__(self, "flops", transformer_flops(self.spec.transformer, self.sample_shape, self.text_len))

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The latents one forward sees: the clip's, or a diffusion-forcing take's longest window."""
        b, c, t, *hw = self.latent_shape
        return (b, c, max(w.frames for w in self.take.windows), *hw) if self.take else self.latent_shape

    @property
    def render_s(self) -> float:
        """The sampling's nominal time on the device, every step's (a take's every row's) forwards."""
        calls = self.take.steps if self.take else self.cfg.sampling.steps * (self.seg.count if self.seg else 1)
        return self.flops * calls * self.forwards / DEVICE_FLOPS


@dataclass(frozen=True)
class _Held:
    """Where one candidate holds the weights: bytes on the device and in host memory, outside each stage's own."""

    tw: WeightBytes             # one expert, as stored
    tw16: WeightBytes           # one expert in model.dtype (what is read from its files)
    ew: WeightBytes             # the text encoder, as stored
    vae: torch.nn.Module        # a meta copy
    vae_bytes: int
    clip: int                   # Wan2.1 I2V's CLIP image encoder
    from_file: bool             # the idle expert in its files
    sampling_w: int             # experts' bytes on the device while sampling
    idle_w: int                 # and while the other stages run
    host_experts: int           # experts' bytes in host memory outside sampling
    host_sampling: int          # and while sampling
    te_on_device: int
    vae_early: int              # the VAE's bytes on the device before the decode
    te_host: int                # the encoders in host memory (text encoding on the CPU)
    te_kept: int                # the encoders kept in host memory between renders


def _held(r: _Render, placement: Placement, fp8: bool, text_place: TextPlace, idle: Idle, idle_text: Idle) -> _Held:
    spec, memo = r.spec, r.memo
    tw, tw16 = (transformer_weights(spec.transformer, r.dtype, f, memo=memo) for f in (fp8, False))
    ew = text_encoder_weights(spec.text_encoder, r.dtype, fp8 and text_place == "device", memo=memo)
    vae, n = meta_vae(spec.vae, r.vae_dtype, memo=memo), spec.experts
    vae_bytes = nbytes(vae)
    # Transformer weights on the device while sampling, and while the other stages run.
    outside = tw.total - tw.blocks
    if placement in ("resident", "shard_blocks"):     # sharded: 1/N of the blocks, and one block gathered to run
        ranks = r.cfg.parallel.devices if placement == "shard_blocks" else 1
        sampling_w = idle_w = n * (outside + -(-tw.blocks // ranks)) + (tw.largest_block if ranks > 1 else 0)
    elif placement == "swap_experts":
        sampling_w, idle_w = tw.total, tw.total
    else:       # stream_blocks: what is outside the blocks, and two groups (the one running, the next in flight)
        sampling_w, idle_w = outside + 2 * tw.largest_block, outside
    host_experts = {"resident": 0, "shard_blocks": 0, "swap_experts": (n - 1) * tw.total, "stream_blocks": n * tw.total}[placement]
    from_file = idle == "file" and placement in ("swap_experts", "stream_blocks") and n > 1
    host_experts = 0 if from_file else host_experts     # none outside its turn; a streamed one in RAM as it runs
    # The VAE waits in host memory while sampling unless all is resident; Animate's stays (each segment uses it).
    vae_early = vae_bytes if placement in ("resident", "shard_blocks") or r.device_type == "cpu" or r.seg else 0
    # Wan2.1 I2V's CLIP waits in host memory, and is on the device only while it encodes the image.
    clip = image_encoder_bytes(spec.image_encoder, r.dtype, memo=memo) if spec.image_encoder else 0
    te_host = ew.total + clip   # encoding in host memory (the text encoder on the CPU)
    return _Held(tw, tw16, ew, vae, vae_bytes, clip, from_file, sampling_w, idle_w, host_experts,
                 tw.total if from_file and placement == "stream_blocks" else host_experts,
                 ew.total if text_place == "device" else 0, vae_early, te_host,
                 # kept in host memory between renders (model.offload_text_encoder), unless it waits in its files
                 clip if idle_text == "file" else te_host)


def _text_stage(r: _Render, h: _Held, text_place: TextPlace) -> Stage:
    """1. Text encoding: the experts as placed (load puts them there first), the VAE, the encoder."""
    on_device = text_place == "device"
    act = text_encoder_activations(r.spec.text_encoder, r.dtype, r.text_len, r.device_type if on_device else "cpu",
                                   memo=r.memo)
    slow = DEVICE_FLOPS / CPU_FLOPS if text_place == "cpu" else 1.0      # the same FLOPs at CPU speed
    return Stage("text encoding", h.idle_w + h.vae_early + h.te_on_device, act if on_device else 0,
                 h.host_experts + (h.te_host if text_place == "cpu" else 0) + h.vae_bytes - h.vae_early, slow)


def _image_stages(r: _Render, h: _Held, placement: Placement) -> list[Stage]:
    """1b. The conditioning image's VAE encode (I2V: the image and empty frames, the whole clip; TI2V: the
    image), the experts as placed and the VAE on the device for it."""
    spec, cfg = r.spec, r.cfg
    if r.seg:       # Animate: CLIP encodes the reference image, then each segment encodes its L-frame videos
        return [Stage(*stage) for stage in r.seg.encode_stages(r, h, placement in ("resident", "shard_blocks"))]
    needs = spec.transformer.get("in_channels", 16) == 2 * spec.z_dim + 4     # I2V: mask + image latents
    if not (needs or (cfg.image and spec.z_dim == 48)):
        return []
    frames = cfg.num_frames if needs else 1
    enc = vae_encode_activations(spec.vae, r.vae_dtype, frames, cfg.height, cfg.width, r.device_type, memo=r.memo)
    return [Stage("image encoding", h.idle_w + h.vae_bytes + h.clip + (h.te_on_device if placement in ("resident", "shard_blocks") else 0),
                  enc, h.host_experts + h.te_kept, 1.0)]


def _denoise_stages(r: _Render, h: _Held, placement: Placement, fp8: bool) -> list[Stage]:
    """2. Denoising, per expert: weights as placed, one forward's activations, the solver's latents."""
    spec, tw, n = r.spec, h.tw, r.spec.experts
    b, c, t, *hw = r.sample_shape       # VACE: each reference image one more leading latent frame while sampling
    shape = (b, c, t + len(r.cfg.control.reference_images), *hw)
    block = r.take.block if r.take else 0
    act = r.seg.forward(r, shape) if r.seg else transformer_activations(     # Animate: with pose, face and CLIP
        spec.transformer, r.dtype, shape, r.text_len, r.per_token, r.device_type, block, memo=r.memo)
    act = per_rank_activations(act, r.cfg.parallel, shape, spec.transformer, r.dtype)    # a parallel render's rank
    if fp8:
        act += tw.largest_layer                 # one layer's weight cast to the compute dtype at a time
    latent_bytes = math.prod(r.latent_shape if r.take else shape) * 4     # a take: the whole take's, and its history
    act += SOLVER_COPIES * latent_bytes + 2 * r.text_len * spec.transformer.get("text_dim", 4096) * r.dtype.itemsize
    forward_s = r.flops / DEVICE_FLOPS
    extra = 0.0
    if placement == "shard_blocks":     # each block gathered from the other ranks before it runs (not overlapped)
        extra += tw.blocks * (1 - 1 / r.cfg.parallel.devices) / PCIE_BYTES_PER_S
    if placement == "stream_blocks":    # each block's copy overlaps the previous block's compute
        per_block_s = forward_s / spec.transformer["num_layers"]
        extra += max(0.0, tw.largest_block / PCIE_BYTES_PER_S - per_block_s) * spec.transformer["num_layers"]
        extra += tw.largest_block / PCIE_BYTES_PER_S        # the first group is not overlapped
    if fp8:
        extra += 3 * tw.blocks / DEVICE_BYTES_PER_S / 2     # read fp8, write the cast copy
    slow = (forward_s + extra) / forward_s
    if h.from_file:             # each expert read from its files once a render
        slow += n * h.tw16.total / DISK_BYTES_PER_S / max(r.render_s, 1e-9)
    elif placement == "swap_experts" and n > 1:
        slow += 2 * h.tw16.total / PCIE_BYTES_PER_S / max(r.render_s, 1e-9)
    names = ["denoising (high-noise expert)", "denoising (low-noise expert)"] if n == 2 else ["denoising"]
    host = h.host_sampling + h.te_kept + h.vae_bytes - h.vae_early + (r.seg.host if r.seg else 0)
    return [Stage(name, h.sampling_w + h.vae_early, act, host, slow) for name in names]


def _decode_stage(r: _Render, h: _Held, placement: Placement) -> tuple[Stage, int, str]:
    """3. Decode: experts released (except resident ones; Animate's stay as placed between segments and keep a
    segment's conditioning: it decodes T frames), the VAE plan in what is left; with its budget and description."""
    n, tw, seg = r.spec.experts, h.tw, r.seg
    decode_w = (h.idle_w if placement in ("resident", "shard_blocks") or seg else 0) + h.vae_bytes
    shape, kept = (seg.decode_shape, seg.kept) if seg else (r.latent_shape, 0)
    canvas = seg.host if seg else canvas_bytes(h.vae.config, r.latent_shape, r.cfg.output.deep)
    budget = r.device_budget - decode_w - kept if r.decode_asked == "auto" else r.decode_asked
    host = (0 if placement in ("resident", "shard_blocks") or h.from_file else n * tw.total) + h.te_kept + canvas
    output = canvas if r.device_type == "cpu" else 0
    try:
        if budget <= 0:
            raise BudgetTooSmall("no device memory is left for the decode")
        est = choose_plan(h.vae, shape, memory_budget=budget, device=torch.device(r.device_type),
                          dtype=r.vae_dtype, output_bytes=output, memo=r.memo)
        act, described = est.peak_bytes, est.plan.describe()
        if est.plan.mid_on_host:
            host += host_bytes(h.vae, shape, r.vae_dtype, est.plan)
    except BudgetTooSmall:
        if r.decode_asked != "auto":    # an explicit vae.memory_budget below the decode's minimum: render refuses it
            raise                       # in preflight (the same planner, the same message), whatever the placement
        act, described = _decode_floor(r, h.vae, output, shape), "no plan fits"
    return Stage("decode", decode_w, act + kept, host, 1.0), budget, described


def plan_candidate(r: _Render, placement: Placement, weights: WeightDtype, text_place: TextPlace, idle: Idle = "host",
                   idle_text: Idle = "host") -> MemoryPlan:
    """The stage peaks of one candidate. idle="file" (two experts, swapped or streamed): the idle expert
    holds no memory and is read from its safetensors files when it runs — onto the device (swap_experts),
    or into host memory whence its blocks stream (stream_blocks)."""
    fp8 = weights == "fp8"
    h = _held(r, placement, fp8, text_place, idle, idle_text)
    text = _text_stage(r, h, text_place)
    denoise = _denoise_stages(r, h, placement, fp8)
    decode, decode_budget, decode_plan = _decode_stage(r, h, placement)
    stages = (text, *_image_stages(r, h, placement), *denoise, decode)
    te_flops = 2 * h.ew.params * r.text_len * (1 + (r.forwards > 1))
    te_share = te_flops / DEVICE_FLOPS / (r.render_s + te_flops / DEVICE_FLOPS)
    slowdown = (1 - te_share) * denoise[0].slowdown + te_share * text.slowdown
    if idle_text == "file":             # the text encoder read from its files for each render's encode
        slowdown += h.ew.total / DISK_BYTES_PER_S / max(r.render_s, 1e-9)
    if (ranks := r.cfg.parallel.devices) > 1 and r.device_type != "cpu":    # every rank its own host copies; sharded
        stages = tuple(replace(s, host=s.host * ranks) for s in stages)      # experts read one rank at a time
        if placement == "shard_blocks":
            stages = (Stage("loading (one rank at a time)", 0, 0, r.spec.experts * h.tw16.total
                            + ranks * (h.te_kept + h.vae_bytes), 1.0), *stages)
    if r.device_type == "cpu":          # the device is the host: one memory, every weight in it at once
        held = (1 if h.from_file else r.spec.experts) * h.tw.total + h.vae_bytes + h.ew.total
        stages = tuple(Stage(s.name, held - (h.ew.total if idle_text == "file" and s is not text else 0),
                             s.device_activations, 0, s.slowdown) for s in stages)
    return MemoryPlan(placement, weights, text_place, r.device_type, r.device_budget, r.host_budget, stages,
                      max(0, decode_budget), decode_plan, slowdown, str(r.dtype).removeprefix("torch."),
                      "file" if h.from_file else "host", idle_text, r.spec.experts, r.cfg.parallel.devices)


def _decode_floor(r: _Render, vae, output: int, shape: tuple[int, ...]) -> int:
    """The least the decode of `shape` needs (its finest plan's peak), for a refusal's minimum."""
    try:
        choose_plan(vae, shape, memory_budget=1, device=torch.device(r.device_type), dtype=r.vae_dtype,
                    output_bytes=output, memo=r.memo)
    except BudgetTooSmall as e:
        return e.minimum
    return 0


# --------------------------------------------------------------------------------------------
# The render's plan


@dataclass(frozen=True)
class Planned:
    """The chosen plan and every candidate tried (for `vidgen plan --all` and the refusal)."""

    chosen: MemoryPlan
    tried: tuple[MemoryPlan, ...]


def plan_render(cfg: RenderConfig, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                vae_dtype: torch.dtype | None = None, info: ModelInfo | None = None, spec: ModelSpec | None = None,
                memo: Memo | None = None, fewest: bool = True, every: bool = False) -> Planned:
    """The memory plan for `cfg` (no weights read): the first candidate that fits, or BudgetError
    naming the least any candidate needs and the settings that would reach it. `every`: try them all
    (the queue's scheduling facts: what each placement needs), chosen = the first that fits, else the first.

    `info`: the model as preflight read it (else model.path's JSON, or the shipped copy, is read);
    `memo`: where footprints and decode plans are kept (a Pipeline's; None: for this call only)."""
    device = torch.device(device) if device is not None else planning_device(cfg)
    dtype = dtype or resolve_dtype(cfg.model.dtype, device)
    vae_dtype = vae_dtype or resolve_dtype(cfg.vae.dtype, device)
    spec = spec or (ModelSpec.of(info) if info is not None else model_spec(cfg))
    memo = Memo() if memo is None else memo
    # The config's budgets are bytes or "auto" once loaded (config.canonical); the plan's, bytes.
    budget, host = cfg.memory.device_budget, cfg.memory.host_budget
    if budget == "auto":
        if device.type == "cuda" and not torch.cuda.is_available():
            raise BudgetError("memory.device_budget: auto needs the CUDA device present; on this machine give the "
                              "card's size, e.g. memory.device_budget=24GiB")
        budget = _auto_device_budget(device)
    host = _auto_host_budget() if host == "auto" else host
    guided = cfg.sampling.guidance_scale > 1 or (cfg.sampling.guidance_scale_2 or 0) > 1
    family, seg = FAMILIES.get(cfg.model.variant), segment(cfg, spec, dtype, vae_dtype, guided)    # Animate: a segment
    r = _Render(cfg, spec, device.type, dtype, vae_dtype, budget, host, cfg.vae.memory_budget, seg.latent_shape if seg
                else spec.info.latent_shape(cfg.width, cfg.height, cfg.num_frames), cfg.model.max_sequence_length,
                2.0 if guided else 1.0, bool(family is not None and family.per_token_timesteps or spec.z_dim == 48),
                memo, layout(cfg, spec.info, range(cfg.sampling.steps))[0], seg)
    tried = []
    for placement, weights, te in candidates(cfg, spec.experts, device.type):
        # The idle expert back to its files when memory cannot hold it (not with LoRAs or fp8 matmuls: they
        # change the loaded weights).
        ahead = cfg.loras or cfg.speed.fp8_matmul
        for idle in ("host", "file") if placement in ("swap_experts", "stream_blocks") and spec.experts > 1 and not ahead else ("host",):
            # The text encoder back to its files between encodes (read again for each render's): before an
            # expert, as it is the smaller read.
            for idle_text in ("host", "file"):
                p = plan_candidate(r, placement, weights, te, idle, idle_text)
                tried.append(p)
                if p.fits and not every:
                    return Planned(p, tuple(tried))
    if not tried:
        raise BudgetError("memory.placement / memory.weights leave no plan to try")
    if every:
        return Planned(next((p for p in tried if p.fits), tried[0]), tuple(tried))
    raise BudgetError(_refused(cfg, tried, device, dtype, vae_dtype, spec, memo, fewest))


def _refused(cfg: RenderConfig, tried: list[MemoryPlan], device: torch.device, dtype: torch.dtype,
             vae_dtype: torch.dtype, spec: ModelSpec, memo: Memo, fewest: bool = True) -> str:
    """The refusal when no candidate fits."""
    # The least device memory any plan needs; when some plan fits the device, the least host memory of those
    # (so the minimum a refusal names is a budget that is then accepted).
    on_device = [p for p in tried if p.device_peak_bytes <= p.device_budget]
    least = (min(on_device, key=lambda p: p.host_peak_bytes) if on_device else
             min(tried, key=lambda p: (p.device_peak_bytes, p.host_peak_bytes)))
    message = refusal(cfg, least, spec)
    if least.device_peak_bytes <= least.device_budget and cfg.loras and not cfg.speed.fp8_matmul and spec.experts > 1:
        message += _loras_why(cfg, device, dtype, vae_dtype, spec, memo)
    p, heads = cfg.parallel, spec.transformer.get("num_attention_heads", 1)
    for n in (k for k in (2, 4, 8, 16) if k > p.devices and heads % (k // p.cfg) == 0) if fewest and p.devices > 1 else ():
        more = replace(cfg, parallel=replace(p, devices=n, ulysses=n // p.cfg, ring=1))
        try:        # the fewest GPUs that fit it (a parallel render's refusal)
            plan_render(more, device=device, dtype=dtype, vae_dtype=vae_dtype, spec=spec, memo=memo, fewest=False)
        except BudgetError:
            continue
        return f"{message}; {n} GPUs fit it (parallel.devices={n} parallel.ulysses={n // p.cfg})"
    return message


def _loras_why(cfg: RenderConfig, device: torch.device, dtype: torch.dtype, vae_dtype: torch.dtype,
               spec: ModelSpec, memo: Memo) -> str:
    """When the LoRAs are why host memory is short (with them the idle expert cannot wait in its files,
    as they change the loaded weights): the files, their sizes, and the plan that fits without them."""
    try:
        bare = plan_render(replace(cfg, loras=[]), device=device, dtype=dtype, vae_dtype=vae_dtype, spec=spec,
                           memo=memo).chosen
    except BudgetError:
        return ""               # not fitting without them either: the LoRAs are not why
    files = []
    for lora in cfg.loras:
        path = Path(str(lora.path)).expanduser()
        try:
            files.append(f"{path.name} {gib(path.stat().st_size)}")
        except OSError:
            files.append(f"{path.name} (not here)")
    return (f", or render without the LoRAs ({', '.join(files)}): with LoRAs applied the idle expert cannot wait "
            f"in its files, and without them {bare.how}, {bare.text_how} fits in {gib_up(bare.host_peak_bytes)}")


def refusal(cfg: RenderConfig, least: MemoryPlan, spec: ModelSpec) -> str:
    """One line: which budget is short, the least this render needs, and what would reach it."""
    what = f"{Path(spec.source).name} at {cfg.width}x{cfg.height}x{cfg.num_frames}"
    if least.device_type == "cpu":      # every weight in one memory, in model.dtype: say which device was planned
        what += " on the CPU"
    how = f"{least.how}, {least.text_how}"
    hints = []
    if cfg.memory.weights == "bf16":
        hints.append("memory.weights=fp8")
    if cfg.memory.placement not in ("auto", "stream_blocks"):
        hints.append("memory.placement=stream_blocks")
    hints.append("a smaller size or fewer frames")
    if least.device_peak_bytes > least.device_budget:
        return (f"memory.device_budget {gib(least.device_budget)} is below the minimum for {what} "
                f"({gib_up(least.device_peak_bytes)} with {how}); raise it, or use {' or '.join(hints)}")
    # Host memory holds weights, which a smaller clip does not shrink: only float8 storage does.
    more = ", or use memory.weights=fp8" if cfg.memory.weights == "bf16" else ""
    return (f"memory.host_budget {gib(least.host_budget)} is below the minimum for {what} "
            f"({gib_up(least.host_peak_bytes)} of host memory with {how}); raise it{more}")


def gib_up(n: float) -> str:
    """n rounded up in the last digit shown: a budget written as the text is never below n."""
    return format_bytes(n, up=True)


def planning_device(cfg: RenderConfig) -> torch.device:
    """model.device for planning: cuda/mps as named even when absent here (plan for another machine;
    `vidgen plan` may plan a CUDA render on a machine without a GPU)."""
    if cfg.model.device in ("cuda", "mps"):
        return torch.device(cfg.model.device)
    return resolve_device(cfg.model.device)


def next_cheaper(cfg: RenderConfig, chosen: MemoryPlan | None = None) -> tuple[Placement, WeightDtype] | None:
    """(placement, weights) of the next candidate after `chosen`, the plan `cfg` renders with (planned
    here when not given; None: it is the leanest): what a retry after running out of memory should use."""
    if chosen is None:
        chosen = plan_render(cfg).chosen
    unfixed = replace(cfg, memory=replace(cfg.memory, placement="auto", weights="auto"))
    order = list(dict.fromkeys((p, w) for p, w, _ in candidates(unfixed, chosen.experts, chosen.device_type)))
    now = (chosen.placement, chosen.weights)
    return order[order.index(now) + 1] if now in order and order.index(now) + 1 < len(order) else None


def same_policy(a: MemoryPlan | None, b: MemoryPlan | None) -> bool:
    """Whether two plans hold the weights the same way (a warm pipeline can render the other's)."""
    return (a and a.policy) == (b and b.policy)


def wraps_weights(memory: MemoryPlan | None) -> bool:
    """fp8 storage or streamed blocks: hooks around the weights as the LoRAs left them (a change of
    LoRAs reloads the pipeline)."""
    return memory is not None and (memory.fp8 or memory.streams)
