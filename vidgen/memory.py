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
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from . import budgets
from .budgets import format_bytes, parse_budget
from .config import RenderConfig
from .errors import VidgenError
from .footprint import (BudgetError, ModelSpec, config_only, image_encoder_bytes, meta_vae, model_spec, nbytes,
                        text_encoder_activations, text_encoder_weights, transformer_activations, transformer_flops,
                        transformer_weights, vae_encode_activations)
from .memo import Memo

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


DECODE_PLANS = Memo(256)
"""Decode plans of the memory plans made in this process (pure functions of their key)."""
TEXT_PLACES = ("device", "cpu")


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
    idle_expert: str = "host"           # two experts, swapped or streamed: where the idle one waits, host memory or its files
    idle_text: str = "host"             # where the text encoder waits between encodes: host memory or its files

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
                "text_encoder": self.text_encoder, "idle_expert": self.idle_expert, "idle_text_encoder": self.idle_text,
                "decode_budget": self.decode_budget,
                "decode_plan": self.decode_plan, "expected_slowdown": round(self.slowdown, 3),
                "stages": [{**asdict(s), "device_total": s.device_total} for s in self.stages]}

    @property
    def how(self) -> str:
        idle = ", the idle expert read from its files" if self.idle_expert == "file" else ""
        return f"{self.placement}{idle}, {self.storage} weights"

    @property
    def text_how(self) -> str:
        return f"text encoder on the {self.text_encoder}" + (", read from its files to encode" if self.idle_text == "file"
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
                f"{gib(self.device_budget)}, host peak {gib(self.host_peak_bytes)} of {gib(self.host_budget)}: "
                f"{verdict}; expected {self.slowdown:.2f}x the time of resident bf16")


def gib(n: float) -> str:
    return format_bytes(n)


def _auto_device_budget(device: torch.device) -> int:
    if device.type == "cpu":
        return _auto_host_budget()
    return max(0, budgets.free_memory(device) - DEVICE_RESERVE)


def _auto_host_budget() -> int:
    avail = budgets.free_memory(torch.device("cpu"))
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
                   latent_shape: tuple[int, ...], steps: int, cfg_forwards: float, idle: str = "host",
                   idle_text: str = "host") -> MemoryPlan:
    """The stage peaks of one candidate. idle="file" (two experts, swapped or streamed): the idle expert
    holds no memory and is read from its safetensors files when it runs — onto the device (swap_experts),
    or into host memory whence its blocks stream (stream_blocks)."""
    from .vae import canvas_bytes
    from .vae.plan import BudgetTooSmall, choose_plan, host_bytes

    fp8 = weights == "fp8"
    tconf = json.dumps(config_only(spec.transformer), sort_keys=True)
    econf = json.dumps(config_only(spec.text_encoder), sort_keys=True)
    vconf = json.dumps(config_only(spec.vae), sort_keys=True)
    tw = transformer_weights(tconf, dtype, fp8)
    tw16 = transformer_weights(tconf, dtype, False)
    text_len = cfg.model.max_sequence_length
    te_fp8 = fp8 and text_place == "device"
    ew = text_encoder_weights(econf, dtype, te_fp8)
    vae = meta_vae(vconf, vae_dtype)
    vae_bytes = nbytes(vae)
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
    from_file = idle == "file" and placement in ("swap_experts", "stream_blocks") and n > 1
    if from_file:               # none outside its turn; a streamed one is in host memory while it runs
        host_experts = 0
    host_sampling = tw.total if from_file and placement == "stream_blocks" else host_experts
    te_on_device = ew.total if text_place == "device" else 0
    # The VAE waits in host memory while the transformer samples, unless everything is resident.
    vae_early = vae_bytes if placement == "resident" or device_type == "cpu" else 0
    # Wan2.1 I2V's CLIP waits in host memory, and is on the device only while it encodes the image.
    clip = image_encoder_bytes(json.dumps(config_only(spec.image_encoder), sort_keys=True), dtype) if spec.image_encoder else 0
    te_host = ew.total + clip   # encoding in host memory (the text encoder on the CPU)
    # kept in host memory between renders (model.offload_text_encoder), unless it waits in its files
    te_kept = clip if idle_text == "file" else te_host

    # 1. Text encoding: the experts as placed (load puts them there first), the VAE, the encoder.
    te_act = text_encoder_activations(econf, dtype, text_len, device_type if text_place == "device" else "cpu")
    te_flops = 2 * ew.params * text_len * (1 + (cfg_forwards > 1))
    render_flops = transformer_flops(spec.transformer, latent_shape, text_len) * steps * cfg_forwards
    render_s = render_flops / DEVICE_FLOPS
    te_slow = DEVICE_FLOPS / CPU_FLOPS if text_place == "cpu" else 1.0      # the same FLOPs at CPU speed
    text = Stage("text encoding", idle_w + vae_early + te_on_device, te_act if text_place == "device" else 0,
                 host_experts + (te_host if text_place == "cpu" else 0) + vae_bytes - vae_early, te_slow)

    # 1b. The conditioning image's VAE encode (I2V: the image and empty frames, the whole clip; TI2V: the
    # image), the experts as placed and the VAE on the device for it.
    image = []
    needs = spec.transformer.get("in_channels", 16) == 2 * spec.z_dim + 4     # I2V: mask + image latents
    if needs or (cfg.image and spec.z_dim == 48):
        frames = cfg.num_frames if needs else 1
        enc = vae_encode_activations(vconf, vae_dtype, frames, cfg.height, cfg.width, device_type)
        image = [Stage("image encoding", idle_w + vae_bytes + clip + (te_on_device if placement == "resident" else 0), enc,
                       host_experts + te_kept, 1.0)]

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
    if from_file:               # each expert read from its files once a render
        denoise_slow += n * tw16.total / DISK_BYTES_PER_S / max(render_s, 1e-9)
    elif placement == "swap_experts" and n > 1:
        denoise_slow += 2 * tw16.total / PCIE_BYTES_PER_S / max(render_s, 1e-9)
    names = ["denoising (high-noise expert)", "denoising (low-noise expert)"] if n == 2 else ["denoising"]
    vae_host = vae_bytes - vae_early
    denoise = [Stage(name, sampling_w + vae_early, act, host_sampling + te_kept + vae_host, denoise_slow) for name in names]

    # 3. Decode: experts released (except resident ones), the VAE plan in what is left.
    decode_w = (n * tw.total if placement == "resident" else 0) + vae_bytes
    canvas = canvas_bytes(vae.config, latent_shape)
    requested = cfg.vae.memory_budget
    decode_budget = device_budget - decode_w if requested == "auto" else int(parse_budget(requested))
    decode_host = (0 if placement == "resident" or from_file else n * tw.total) + te_kept + canvas
    try:
        if decode_budget <= 0:
            raise BudgetTooSmall("no device memory is left for the decode")
        est = choose_plan(vae, latent_shape, memory_budget=decode_budget, device=torch.device(device_type),
                          dtype=vae_dtype, output_bytes=canvas if device_type == "cpu" else 0, memo=DECODE_PLANS)
        decode_act, decode_plan = est.peak_bytes, est.plan.describe()
        if est.plan.mid_on_host:
            decode_host += host_bytes(vae, latent_shape, vae_dtype, est.plan)
    except BudgetTooSmall:
        if requested != "auto":     # an explicit vae.memory_budget below the decode's minimum: render refuses it
            raise                   # in preflight (the same planner, the same message), whatever the placement
        decode_act, decode_plan = _decode_floor(vae, latent_shape, vae_dtype, device_type, canvas), "no plan fits"
    decode = Stage("decode", decode_w, decode_act, decode_host, 1.0)

    stages = (text, *image, *denoise, decode)
    te_share = te_flops / DEVICE_FLOPS / (render_s + te_flops / DEVICE_FLOPS)
    slowdown = (1 - te_share) * denoise_slow + te_share * te_slow
    if idle_text == "file":             # the text encoder read from its files for each render's encode
        slowdown += ew.total / DISK_BYTES_PER_S / max(render_s, 1e-9)
    if device_type == "cpu":            # the device is the host: one memory, every weight in it at once
        held = (1 if from_file else n) * tw.total + vae_bytes + ew.total
        stages = tuple(Stage(s.name, held - (ew.total if idle_text == "file" and s is not text else 0),
                             s.device_activations, 0, s.slowdown) for s in stages)
    return MemoryPlan(placement, weights, text_place, device_type, device_budget, host_budget, stages,
                      max(0, decode_budget), decode_plan, slowdown, str(dtype).removeprefix("torch."),
                      "file" if from_file else "host", idle_text)


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
        # The idle expert back to its files when memory cannot hold it (not with LoRAs or fp8 matmuls: they
        # change the loaded weights).
        ahead = cfg.loras or cfg.speed.fp8_matmul
        for idle in ("host", "file") if placement != "resident" and spec.experts > 1 and not ahead else ("host",):
            # The text encoder back to its files between encodes (read again for each render's): before an
            # expert, as it is the smaller read.
            for idle_text in ("host", "file"):
                p = plan_candidate(cfg, spec, device.type, dtype, vae_dtype, placement, weights, te, budget, host,
                                   shape, cfg.sampling.steps, forwards, idle, idle_text)
                tried.append(p)
                if p.fits:
                    return Planned(p, tuple(tried))
    if not tried:
        raise BudgetError("memory.placement / memory.weights leave no plan to try")
    # The least device memory any plan needs; when some plan fits the device, the least host memory of those
    # (so the minimum a refusal names is a budget that is then accepted).
    on_device = [p for p in tried if p.device_peak_bytes <= p.device_budget]
    least = (min(on_device, key=lambda p: p.host_peak_bytes) if on_device else
             min(tried, key=lambda p: (p.device_peak_bytes, p.host_peak_bytes)))
    message = refusal(cfg, least, spec)
    if least.device_peak_bytes <= least.device_budget and cfg.loras and not cfg.speed.fp8_matmul and spec.experts > 1:
        message += _loras_why(cfg, device, dtype, vae_dtype, spec)
    raise BudgetError(message)


def _loras_why(cfg: RenderConfig, device: torch.device, dtype: torch.dtype, vae_dtype: torch.dtype,
               spec: ModelSpec) -> str:
    """When the LoRAs are why host memory is short (with them the idle expert cannot wait in its files,
    as they change the loaded weights): the files, their sizes, and the plan that fits without them."""
    try:
        bare = plan_render(replace(cfg, loras=[]), device=device, dtype=dtype, vae_dtype=vae_dtype, spec=spec).chosen
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


def plan_device(cfg: RenderConfig) -> tuple[torch.device, str]:
    """The device `vidgen plan` plans for, and a one-line note when it is not the one a render here would
    use: with model.device auto, an explicit memory.device_budget and no GPU on this machine, the budget
    means a GPU's, so the plan is a CUDA render's (model.dtype auto: bfloat16), as on that GPU."""
    device = _device_for(cfg)
    if device.type != "cpu" or cfg.model.device != "auto" or cfg.memory.device_budget == "auto":
        return device, ""
    from .loading import resolve_dtype

    cuda = torch.device("cuda")
    host = ("" if cfg.memory.host_budget != "auto" else
            "; memory.host_budget auto is this machine's available RAM: set it to the GPU machine's")
    dtype = str(resolve_dtype(cfg.model.dtype, cuda)).removeprefix("torch.")
    return cuda, (f"no GPU here, so planning for a CUDA GPU ({dtype}) with memory.device_budget "
                  f"{gib(parse_budget(cfg.memory.device_budget))}; model.device=cpu plans a render on this CPU{host}")


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


def next_cheaper(cfg: RenderConfig) -> tuple[str, str] | None:
    """(placement, weights) of the next candidate after the one `cfg` plans to (None: it is the
    leanest): what a retry after running out of memory should use."""
    device = _device_for(cfg)
    spec = model_spec(cfg)
    chosen = plan_render(cfg, device=device, spec=spec).chosen
    unfixed = replace(cfg, memory=replace(cfg.memory, placement="auto", weights="auto"))
    order = list(dict.fromkeys((p, w) for p, w, _ in candidates(unfixed, spec.experts, device.type)))
    now = (chosen.placement, chosen.weights)
    return order[order.index(now) + 1] if now in order and order.index(now) + 1 < len(order) else None


def same_policy(a: MemoryPlan | None, b: MemoryPlan | None) -> bool:
    """Whether two plans hold the weights the same way (a warm pipeline can render the other's)."""
    key = lambda m: None if m is None else (m.placement, m.weights, m.text_encoder, m.idle_expert, m.idle_text)  # noqa: E731
    return key(a) == key(b)


def wraps_weights(memory: MemoryPlan | None) -> bool:
    """fp8 storage or streamed blocks: hooks around the weights as the LoRAs left them (a change of
    LoRAs reloads the pipeline)."""
    return memory is not None and (memory.weights == "fp8" or memory.placement == "stream_blocks")


class SamplingOutOfMemory(VidgenError, torch.OutOfMemoryError):
    """The device ran out of memory while sampling: the newest step is kept for --resume, and the
    message names the next cheaper plan. Still a torch.OutOfMemoryError, so the queue retries it."""


def out_of_memory(cfg: RenderConfig, memory: MemoryPlan | None, resume_file: Path, last: list,
                  error: Exception) -> SamplingOutOfMemory:
    """The one-line error for an out-of-memory during sampling, after saving the newest step."""
    from . import resume

    kept = ""
    if last and last[0].step < last[0].steps:
        try:
            resume.save(resume_file, last[0], cfg)
            kept = f"; step {last[0].step} of {last[0].steps} is kept: add --resume to continue"
        except (OSError, RuntimeError):        # no memory left even for the copy: the last periodic checkpoint stands
            kept = "; the last checkpoint (sampling.checkpoint_every) is kept: add --resume to continue"
    try:
        cheaper = next_cheaper(cfg)
    except VidgenError:
        cheaper = None
    hint = (f"set memory.placement={cheaper[0]} memory.weights={cheaper[1]}" if cheaper else
            "use a smaller size or fewer frames")
    plan = f" under the memory plan {memory.placement}, {memory.storage} weights" if memory is not None else ""
    first = str(error).strip().splitlines()[0] if str(error).strip() else "CUDA out of memory"
    return SamplingOutOfMemory(f"out of memory while sampling{plan} ({first}){kept}; to fit, {hint}, or set "
                               "memory.device_budget lower so the plan leaves more headroom")
