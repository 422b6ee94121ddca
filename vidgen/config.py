"""Render configuration: the typed schema, its checks, and every registered name.

The dataclasses below are what a render is configured with; each section's `problems()` lists
what is wrong with it (range, consistency, registered names). The names a config, a queued job or
an HTTP request may pick (devices, dtypes, variants, solvers, schedules, codecs, kernels, step
caches, guard backends) are defined here and nowhere else. Reading YAML presets and overrides into
a checked RenderConfig is `vidgen.presets.load_config`. This module imports nothing of vidgen but
the leaves `errors`, `budgets`, `codecs` (the output codecs), `output_config` (output, audio, provenance),
`animate_config` (Wan2.2-Animate's driving videos), `fields` (file marks, name checks), `families`
and `text`, so every stage can depend on it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Optional, Union

from omegaconf import MISSING

from .animate_config import ANIMATE_MODES, AnimateConfig  # noqa: F401  (re-exported)
from .budgets import parse_budget
from .codecs import CODECS, MASTERS, PIX_FMTS, CodecSpec  # noqa: F401  (registered names: re-exported)
from .errors import ConfigError
from .families import FAMILIES
from .fields import REPO_ID, FileKind, FileMark, _choices, _file, is_repo_id  # noqa: F401  (re-exported)
from .output_config import (AUDIO_FITS, EXR_LIGHT, MAX_FPS, RETIME_METHODS, AudioConfig,  # noqa: F401
                            OutputConfig, ProvenanceConfig, RetimeConfig)
from .text import text_problems

# Registered names, defined here only (a queued job picks components by these, never by import path).
DEVICES = ("auto", "cuda", "mps", "cpu")
DTYPES = ("auto", "float32", "bfloat16", "float16")
SOLVERS = ("unipc", "dpmpp", "euler")
SCHEDULES = ("wan", "diffusers")


IMAGE_FITS = ("wan", "crop")
OFFLOADS = ("auto", "none", "experts")
WEIGHT_STORAGES = ("auto", "bf16", "fp8")
PLACEMENTS = ("auto", "resident", "swap_experts", "stream_blocks", "shard_blocks")
LORA_EXPERTS = ("both", "high", "low")
LORA_MODES = ("auto", "fuse", "adapter")
GUARD_ACTIONS = ("block", "blur", "flag")
GUARD_BACKENDS = ("auto", "tensorrt", "onnxruntime", "torch")
GUARD_PRECISIONS = ("fp16", "fp32")
PREPROCESSORS = ("none", "canny", "grey")
"""control.preprocess: built-in extractors that need no weights (vidgen.control)."""
MAX_FRAMES = 16385
"""Longest clip a config may ask for (4k+1); a model's rotary table usually allows fewer (preflight says)."""


def frames_for_seconds(seconds: float, fps: int) -> tuple[int, str | None]:
    """`seconds` at `fps` as the nearest 4k+1 frames (the VAE's 4x time compression), and the rounding said, or None."""
    frames = 4 * max(0, round((seconds * fps - 1) / 4)) + 1
    return frames, None if frames == seconds * fps else (
        f"{seconds:g} s at {fps} fps is {seconds * fps:g} frames; rendering {frames} (the nearest 4k+1 the VAE "
        f"allows), {frames / fps:g} s")


@dataclass
class ModelConfig:
    CHOICES = {"device": DEVICES, "dtype": DTYPES, "variant": ("auto", *FAMILIES), "offload": OFFLOADS}
    path: Optional[str] = _file("folder", repo_ids=True)
    """The model: a diffusers-format Wan folder, Wan's own checkpoint folder, or a Hugging Face repo id
    already in the local cache (never downloaded). null: the components below name every part."""
    transformer: Optional[str] = _file("read")
    """A transformer file or folder replacing model.path's (safetensors in Wan's or diffusers' names,
    ComfyUI fp8_scaled, GGUF); the high-noise expert of a two-expert model."""
    transformer_2: Optional[str] = _file("read")
    """The low-noise expert's file or folder (Wan2.2 A14B)."""
    text_encoder: Optional[str] = _file("read")
    """The UMT5 text encoder's file or folder (ComfyUI umt5_xxl_*.safetensors, Wan's models_t5_*.pth)."""
    vae: Optional[str] = _file("read")
    """The VAE's file or folder (ComfyUI wan_2.1_vae.safetensors, Wan's Wan2.x_VAE.pth)."""
    image_encoder: Optional[str] = _file("read")
    """The CLIP image encoder's file or folder (Wan2.2-Animate from single files: a transformers
    CLIPVisionModel in safetensors, e.g. ComfyUI's clip_vision_h.safetensors); null = model.path's."""
    tokenizer: Optional[str] = _file("read")
    """The UMT5 tokenizer folder; null = beside the weights, else found in the Hugging Face cache."""
    variant: str = "auto"
    """auto (read from the folder) or a vidgen.families.FAMILIES name; a mismatch with the folder is an error."""
    dtype: str = "auto"
    """Transformer and text-encoder dtype; auto = bfloat16 on cuda/mps, float32 on cpu."""
    device: str = "auto"
    """auto = cuda if available, else mps, else cpu."""
    max_sequence_length: int = 512
    """Prompt tokens; the text embedding is padded to this length (Wan uses 512)."""
    offload: str = "auto"
    """Kept as an alias of memory.placement: experts = swap_experts, none = resident, auto = auto."""
    offload_text_encoder: bool = True
    """Move the text encoder to CPU memory after encoding (GPU/MPS), freeing device memory for sampling."""

    def problems(self) -> list[str]:
        out = _choices(self, "model")
        if self.path is not None and not str(self.path).strip():
            out.append("model.path: is empty; give a model folder or a Hugging Face repo id (or null with model.transformer)")
        if self.path is None and not self.transformer:
            out.append("model.path: is not set; give a model folder or a Hugging Face repo id, or name the parts "
                       "(model.transformer, model.text_encoder, model.vae)")
        for key in ("transformer", "transformer_2", "text_encoder", "vae", "image_encoder", "tokenizer"):
            if getattr(self, key) is not None and not str(getattr(self, key)).strip():
                out.append(f"model.{key}: is empty; give a file or folder, or null")
        if self.transformer_2 and not self.transformer:
            out.append("model.transformer_2: is set without model.transformer (the high-noise expert)")
        if not 1 <= self.max_sequence_length <= 4096:
            out.append(f"model.max_sequence_length: {self.max_sequence_length} is out of range; use 1..4096 (Wan: 512)")
        return out


@dataclass
class SamplingConfig:
    CHOICES = {"solver": SOLVERS, "schedule": SCHEDULES}
    solver: str = "unipc"
    """unipc (Wan's default), dpmpp (Wan's 'dpm++') or euler."""
    schedule: str = "wan"
    """wan: Wan's own timestep grid (the same video as Wan's generate.py); diffusers: the grid
    diffusers' UniPC scheduler builds from the model folder's config (the same as WanPipeline)."""
    steps: int = 50
    """Number of denoising steps."""
    shift: Optional[float] = None
    """Flow shift; null = the model folder's scheduler value (presets set Wan's)."""
    guidance_scale: float = 5.0
    """Classifier-free guidance scale (the high-noise expert's, for two-expert models). <= 1 disables CFG."""
    guidance_scale_2: Optional[float] = None
    """Guidance of the low-noise expert (two-expert models); null = guidance_scale."""
    boundary: Optional[float] = None
    """Expert switch: high-noise expert while t >= boundary*1000; null = the model's boundary_ratio."""
    checkpoint_every: int = 5
    """Save the sampler state every N steps beside the output (resume with --resume); 0 = never."""

    def problems(self) -> list[str]:
        out = _choices(self, "sampling")
        if self.checkpoint_every < 0:
            out.append(f"sampling.checkpoint_every: {self.checkpoint_every} must be >= 0 (0 = no checkpoints)")
        if not 1 <= self.steps <= 1000:
            out.append(f"sampling.steps: {self.steps} is out of range; use 1..1000")
        if self.shift is not None and not 0 < self.shift <= 100:
            out.append(f"sampling.shift: {self.shift} is out of range; use a number in (0, 100] or null")
        for key in ("guidance_scale", "guidance_scale_2"):
            value = getattr(self, key)
            if value is not None and not 0 <= value <= 50:
                out.append(f"sampling.{key}: {value} is out of range; use 0..50")
        if self.boundary is not None and not 0 <= self.boundary <= 1:
            out.append(f"sampling.boundary: {self.boundary} is out of range; use 0..1 or null")
        return out


COMPILE_MODES = ("none", "blocks", "full")
KERNELS = ("auto", "torch", "reference", "triton", "metal")
"""Backends of the decoder's fused ops (vidgen.ops); reference is the bit-exact oracle of the kernels' tests."""
ATTENTION_BACKENDS = ("auto", "sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn", "sage")
STEP_CACHES = {"none": None, "first_block": "FirstBlockCacheConfig", "sea": "SeaCacheConfig", "mag": None}
"""speed.step_cache's names -> the diffusers hook config each uses (mag: none in diffusers for Wan)."""


@dataclass
class SpeedConfig:
    CHOICES = {"compile": COMPILE_MODES, "attention_backend": ATTENTION_BACKENDS, "step_cache": tuple(STEP_CACHES)}
    compile: str = "none"
    """none; blocks = torch.compile each repeated transformer block (regional, fast cold start); full."""
    attention_backend: str = "auto"
    """auto (PyTorch's choice), one SDPA backend (sdpa_math, sdpa_efficient, sdpa_flash, sdpa_cudnn), or sage
    (SageAttention through diffusers' attention dispatcher: NVIDIA GPUs, the sageattention package)."""
    step_cache: str = "none"
    """Skip transformer work on steps where it changes little (changes the output): none; first_block
    (diffusers' FirstBlockCache); sea (diffusers' SeaCache, a TeaCache-style gate: diffusers 0.42.1 has
    no TeaCache); mag (MagCache) is refused: it needs per-model magnitude ratios diffusers ships only for Flux."""
    cache_threshold: float = 0.05
    """How much change a cached step may ignore (higher = faster, further from the uncached render)."""
    fp8_matmul: bool = False
    """The transformer blocks' linears as float8 matmuls (torchao's dynamic float8 activations and
    weights, per row): Hopper or Ada GPUs (compute capability 8.9+); changes the output slightly."""

    def problems(self) -> list[str]:
        out = _choices(self, "speed")
        if not 0 < self.cache_threshold < 10:
            out.append(f"speed.cache_threshold: {self.cache_threshold} is out of range; use a number in (0, 10)")
        return out

    def engaged(self) -> bool:
        return (self.compile, self.attention_backend, self.step_cache, self.fp8_matmul) != ("none", "auto", "none", False)


@dataclass
class VaeConfig:
    CHOICES = {"dtype": DTYPES, "kernels": KERNELS}
    dtype: str = "float32"
    """VAE dtype (decode and image encode); float32 is the reference."""
    memory_budget: Union[int, float, str] = "auto"
    """Peak activation memory of the decode: bytes, "1.5GiB", "800MB", or auto (70% of free memory); read
    into bytes (an integer) or "auto" when the config loads."""
    kernels: str = "auto"
    """Backend of the decode's fused memory-bound ops: auto (triton on CUDA when Triton imports, metal
    on Apple GPUs, torch elsewhere), torch (fast vectorised PyTorch), triton, metal, or reference (the
    bit-exact PyTorch twin of the kernels: their tests' oracle, several times slower)."""

    def problems(self) -> list[str]:
        out = _choices(self, "vae")
        try:
            parse_budget(self.memory_budget)
        except ConfigError as e:
            out.append(e.problems[0])
        return out


@dataclass
class MemoryConfig:
    CHOICES = {"weights": WEIGHT_STORAGES, "placement": PLACEMENTS}
    device_budget: Union[int, float, str] = "auto"
    """Device memory the whole render may use (weights, activations, decode): bytes, "24GiB", or auto
    (the device's free memory less a reserve). Planned before any weight is read (`vidgen plan`)."""
    host_budget: Union[int, float, str] = "auto"
    """Host RAM the render may use: bytes, "32GiB", or auto (available RAM less a reserve)."""
    weights: str = "auto"
    """Storage dtype of the transformer (and of the text encoder on the device): bf16 = model.dtype as
    loaded, fp8 = float8_e4m3fn storage cast to model.dtype layer by layer, auto = the first that fits."""
    placement: str = "auto"
    """resident (every expert on the device), swap_experts (only the active expert on the device),
    stream_blocks (the active expert's transformer blocks streamed onto the device one group at a
    time), shard_blocks (a parallel render: each expert's blocks sharded over the ranks, FSDP2), or auto =
    the first of these that fits."""

    def problems(self) -> list[str]:
        out = _choices(self, "memory")
        for key in ("device_budget", "host_budget"):
            try:
                parse_budget(getattr(self, key), f"memory.{key}")
            except ConfigError as e:
                out.append(e.problems[0])
        return out


@dataclass
class GuardConfig:
    CHOICES = {"action": GUARD_ACTIONS, "backend": GUARD_BACKENDS, "precision": GUARD_PRECISIONS}
    enabled: bool = False
    """Run the guardrail on this render: the prompt filter before any model loads, then the frame
    checks on the frames as they leave the VAE. It fails closed: a check that cannot run publishes nothing."""
    prompt_filter: bool = True
    """Refuse prompts that match a blocklist rule (exit code 3, naming the rule, never the terms)."""
    blocklists: list[str] = _file("read", ["default"], names=("default",))
    """Blocklist files (lines `rule-name: term` or `rule-name: re:REGEX`); `default` is vidgen's own list."""
    frames: bool = True
    """Score sampled frames with the frame-safety classifier."""
    classifier: str = _file("read", "open_nsfw", suffix=".onnx")
    """A registered classifier name (open_nsfw: Yahoo's open_nsfw weights), or an .onnx file with the same
    input/output contract (docs/guard.md)."""
    threshold: float = 0.8
    """A sampled frame whose unsafe score reaches this flags the clip."""
    sample_fps: float = 2.0
    """Frames scored per second of video, plus the first and the last frame."""
    batch_size: int = 8
    """Sampled frames scored together."""
    backend: str = "auto"
    """Classifier backend: auto (TensorRT engine -> onnxruntime -> torch, the first that runs), or one of those."""
    precision: str = "fp16"
    """TensorRT engine precision (fp16 builds from an fp16 ONNX graph)."""
    engine_cache: str = _file("read", "")
    """Folder of built TensorRT engines; empty = $VIDGEN_CACHE/engines or ~/.cache/vidgen/engines."""
    photosensitivity: bool = True
    """Check flashes and red flashes (WCAG 2.3.1, and the extended-failure rule of broadcast checkers)."""
    action: str = "block"
    """block: no file at the output path, exit code 3 with the scores; blur: flagged frames pixelated
    (a photosensitivity failure still blocks); flag: the file is written and the report goes to its sidecar."""

    def problems(self) -> list[str]:
        out = _choices(self, "guard")
        if not 0.0 < self.threshold <= 1.0:
            out.append(f"guard.threshold: {self.threshold} is out of range; use a score in (0, 1], e.g. 0.8")
        if not 0.0 < self.sample_fps <= 240:
            out.append(f"guard.sample_fps: {self.sample_fps} is out of range; use (0, 240], e.g. 2")
        if not 1 <= self.batch_size <= 256:
            out.append(f"guard.batch_size: {self.batch_size} is out of range; use 1..256")
        if self.enabled and self.prompt_filter and not self.blocklists:
            out.append("guard.blocklists: is empty while guard.prompt_filter is on; list files or `default`")
        return out


@dataclass
class LoraConfig:
    CHOICES = {"expert": LORA_EXPERTS}
    path: str = _file("read", MISSING)
    """A LoRA .safetensors file (diffusers/PEFT, ComfyUI, Kijai/Lightning, LightX2V or musubi/kohya keys)."""
    strength: float = 1.0
    """How much of it to apply (0 = none; Lightning LoRAs: 1.0)."""
    expert: str = "both"
    """Two-expert models: high (the high-noise expert), low, or both; one-expert models: both."""
    sha256: Optional[str] = None
    """The file's SHA-256; null = filled in when the render starts (a set value must match the file)."""

    def problems(self, where: str) -> list[str]:
        out = _choices(self, where)
        if not str(self.path).strip():
            out.append(f"{where}.path: is empty; give a LoRA .safetensors file")
        if not (isinstance(self.strength, (int, float)) and math.isfinite(self.strength) and 0 <= self.strength <= 100):
            out.append(f"{where}.strength: {self.strength} must be a number in 0..100 (1.0 = as trained)")
        if self.sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", str(self.sha256)):
            out.append(f"{where}.sha256: {self.sha256!r} is not a SHA-256 (64 lowercase hex digits) or null")
        return out


@dataclass
class ControlConfig:
    CHOICES = {"preprocess": PREPROCESSORS}
    video: Optional[str] = _file("video")
    """Control frames for a VACE model (pose, depth, edges, a grey blocking pass): a video file or a folder of
    PNG frames, fitted to the render's fps, length and size (docs/control.md); null = none."""
    mask: Optional[str] = _file("video")
    """Which pixels to generate (white) and which to keep from control.video (black): a video file or PNG
    folder fitted as control.video is; null = generate every pixel."""
    frames: list[str] = _file("image", [])
    """Control frames as PNG files, one a frame, in order: instead of control.video (a workflow's extend
    and repaint fill it with an earlier shot's frames, kept losslessly)."""
    reference_images: list[str] = _file("image", [])
    """Images of what must appear (a character, an object), each placed on a white frame before the clip."""
    scale: float = 1.0
    """How strongly the control steers (diffusers' conditioning_scale: the VACE blocks' hints x scale)."""
    preprocess: str = "none"
    """none (control.video as given), canny (its edges) or grey (its luminance): built in, no weights."""
    start: int = 0
    """The first frame of control.video used (negative: counted from its end, -8 = its last 8 frames)."""
    keep_first: int = 0
    """Keep the first N control frames as given and generate the rest (a mask made for it; frames past
    control.video's end grey): how a shot is extended from its last frames."""
    last_frame: Optional[str] = _file("image")
    """An image the clip ends on, kept as given (a key frame: a long take's continuity.keyframes on VACE)."""
    composite: bool = True
    """Kept pixels (black in the mask, the keep_first frames, last_frame) are written as given."""

    @property
    def engaged(self) -> bool:
        return bool(self.video or self.frames or self.mask or self.reference_images or self.last_frame)

    def problems(self) -> list[str]:
        out = _choices(self, "control")
        if not (isinstance(self.scale, (int, float)) and math.isfinite(self.scale) and 0 <= self.scale <= 10):
            out.append(f"control.scale: {self.scale} is out of range; use 0..10 (1.0 = as trained)")
        if self.mask and not (self.video or self.frames):
            out.append("control.mask: is set without control.video; a mask says which of the video's pixels to keep")
        if (self.start or self.keep_first) and not (self.video or self.frames):
            out.append("control.start / control.keep_first: need control.video to take the frames from")
        if self.keep_first < 0:
            out.append(f"control.keep_first: {self.keep_first} must be >= 0 (0 = keep none)")
        if self.keep_first and self.mask:
            out.append("control.keep_first: makes its own mask; remove control.mask or set keep_first: 0")
        if self.preprocess != "none" and not (self.video or self.frames):
            out.append(f"control.preprocess: {self.preprocess!r} needs control.video to extract from")
        out += [f"control.{key}[{i}]: is empty; give a {kind} file"
                for key, kind in (("frames", "PNG"), ("reference_images", "PNG or JPEG"))
                for i, path in enumerate(getattr(self, key)) if not str(path).strip()]
        return out


@dataclass
class Video2VideoConfig:
    video: Optional[str] = _file("video")
    """A source clip to restyle (a video file or PNG folder, fitted as control.video is); null = none."""
    strength: float = 0.8
    """How far the source is noised before denoising (diffusers' strength): 1.0 = from pure noise; the
    render runs the last int(steps x strength) steps of its schedule."""

    def problems(self) -> list[str]:
        if not (isinstance(self.strength, (int, float)) and 0 < self.strength <= 1):
            return [f"video2video.strength: {self.strength} is out of range; use a number in (0, 1] (0.8 = diffusers')"]
        return []


@dataclass
class ForcingConfig:
    ar_step: int = 0
    """0: every latent frame at one noise level (synchronous); N: each causal block N steps behind the one before."""
    causal_block_size: Optional[int] = None
    """Latent frames denoised as one block (null: the model's num_frame_per_block; 5 with ar_step 5)."""
    overlap_history: Optional[int] = None
    """Frames (4k+1: 17, 37) each window starts on from the one before, as latents, when num_frames passes the window."""
    base_num_frames: Optional[int] = None
    """Frames one window renders (4k+1); null: the model's clip length (97 at 540P, 121 at 720P)."""
    addnoise_condition: float = 0.0
    """The noise level (0..60 of 1000) the shared frames are shown at to the next window (20 recommended)."""

    def problems(self) -> list[str]:
        out = [f"forcing.{k}: {v!r}; use an integer >= {lo}" for k, v, lo in (
            ("ar_step", self.ar_step, 0), ("causal_block_size", self.causal_block_size, 1),
            ("overlap_history", self.overlap_history, 1), ("base_num_frames", self.base_num_frames, 5)) if v is not None
            and not (isinstance(v, int) and v >= lo)]
        out += [f"forcing.{k}: {v} is not 4k+1 (whole latent frames: 17, 37, 97)" for k, v in (("overlap_history",
                self.overlap_history), ("base_num_frames", self.base_num_frames)) if isinstance(v, int) and (v - 1) % 4]
        if not (isinstance(self.addnoise_condition, (int, float)) and 0 <= self.addnoise_condition <= 60):
            out.append(f"forcing.addnoise_condition: {self.addnoise_condition} is out of range; use 0..60 (20 recommended)")
        return out


@dataclass
class ParallelConfig:
    devices: int = 1
    """Ranks, one a device, that render this one clip together (cuda: GPUs 0..N-1 of those visible; cpu: N
    processes over gloo, for tests, not a speed-up); 1 = this process alone."""
    ulysses: int = 1
    """Sequence-parallel degree (Ulysses: an all-to-all before and after attention; divides the heads)."""
    ring: int = 1
    """Sequence-parallel degree by ring attention (keys and values passed round; flash attention, bf16/fp16 on CUDA)."""
    cfg: int = 1
    """2: the guided and unguided branches on two groups of ranks at once (needs guidance_scale > 1)."""
    shard_weights: str = "auto"
    """auto: the memory plan may shard each expert's blocks over the ranks (memory.placement shard_blocks,
    FSDP2) when whole weights do not fit one device; none: whole weights on every rank."""
    timeout: float = 600.0
    """Seconds a rank may wait on the others (a collective) before every rank stops."""

    def problems(self) -> list[str]:
        out = [f"parallel.{k}: {v!r}; use an integer >= 1" for k, v in (("devices", self.devices), ("ulysses", self.ulysses),
               ("ring", self.ring), ("cfg", self.cfg)) if not (isinstance(v, int) and v >= 1)]
        if not out and self.ulysses * self.ring * self.cfg != self.devices:
            out.append(f"parallel: ulysses x ring x cfg = {self.ulysses * self.ring * self.cfg} must equal devices "
                       f"({self.devices}), one rank a device")
        if self.cfg not in (1, 2) and isinstance(self.cfg, int):
            out.append(f"parallel.cfg: {self.cfg}; use 1 or 2 (the guided and the unguided branch)")
        if self.shard_weights not in ("auto", "none"):
            out.append(f"parallel.shard_weights: {self.shard_weights!r}; use auto or none")
        if not (isinstance(self.timeout, (int, float)) and 1 <= self.timeout <= 86400):
            out.append(f"parallel.timeout: {self.timeout} is out of range; use 1..86400 seconds")
        return out


@dataclass
class RenderConfig:
    CHOICES = {"image_fit": IMAGE_FITS, "lora_mode": LORA_MODES}
    model: ModelConfig = field(default_factory=ModelConfig)
    prompt: str = MISSING
    """What to render."""
    negative_prompt: str = ""
    """What to steer away from (used when guidance_scale > 1)."""
    image: Optional[str] = _file("image")
    """Conditioning image for image-to-video models (I2V-A14B, TI2V-5B)."""
    image_frames: list[str] = _file("image", [])
    """The frames that follow `image`, given too (PNG files, in order): a long take's window starts on
    the last continuity.overlap_frames frames of the one before. TI2V-5B: 4k of them (whole latent
    frames, kept clean); I2V: any number (its mask marks each)."""
    last_image: Optional[str] = _file("image")
    """The clip's last frame, with `image` its first (first-last-frame; Wan2.2 I2V-A14B), fitted as `image` is."""
    image_fit: str = "wan"
    """With an image: wan = `size` gives the pixel area and the output takes the image's aspect
    ratio, resized/cropped as Wan's own code does (logged); crop = keep `size`, centre-crop the image."""
    size: str = "832x480"
    """Output WIDTHxHEIGHT, e.g. 1280x720 (Wan's 1280*720 also accepted)."""
    num_frames: int = 81
    """Frames to render; 4k+1 (the VAE's causal 4x time compression), e.g. 17, 49, 81, 121."""
    fps: int = 16
    """Frames per second of the written video (Wan2.2 A14B: 16, TI2V-5B: 24)."""
    seed: Optional[int] = None
    """Noise seed; null = a random seed, reported in the result and the sidecar."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    vae: VaeConfig = field(default_factory=VaeConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    speed: SpeedConfig = field(default_factory=SpeedConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    audio: AudioConfig = field(default_factory=AudioConfig)
    """A soundtrack muxed under the video (docs/delivery.md)."""
    provenance: ProvenanceConfig = field(default_factory=ProvenanceConfig)
    """Signed C2PA content credentials and an invisible watermark (docs/delivery.md)."""
    loras: list[LoraConfig] = field(default_factory=list)
    """LoRA files applied to the transformer(s), in order: [{path, strength, expert}, ...]."""
    control: ControlConfig = field(default_factory=ControlConfig)
    """VACE models: what steers the motion, which pixels to keep, what must appear (docs/control.md)."""
    video2video: Video2VideoConfig = field(default_factory=Video2VideoConfig)
    """Restyle a source clip: noise it to `strength` and denoise from there."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """One clip on several devices: sequence parallel (Ulysses, ring) and CFG-parallel (docs/parallel.md)."""
    forcing: ForcingConfig = field(default_factory=ForcingConfig)
    """Diffusion-forcing models (SkyReels-V2 DF): per-frame noise levels, and a long take in one render."""
    animate: AnimateConfig = field(default_factory=AnimateConfig)
    """Wan2.2-Animate: the pose and face videos that drive the character reference, in segments (docs/animate.md)."""
    lora_mode: str = "auto"
    """fuse (added into the weights: no cost per step), adapter (PEFT adapters: switched between renders
    without touching the weights), or auto: fuse for a single render, adapter in a warm Pipeline or queue worker."""

    @property
    def width(self) -> int:
        return parse_size(self.size)[0]

    @property
    def height(self) -> int:
        return parse_size(self.size)[1]

    def problems(self) -> list[str]:
        out: list[str] = []
        if self.image_frames and not self.image:
            out.append("image_frames: is set without image; they are the frames after it")
        if self.image_frames and len(self.image_frames) + 1 + bool(self.last_image) >= self.num_frames:
            out.append(f"image_frames: {len(self.image_frames)} frames after image leave no frame of the "
                       f"{self.num_frames} to generate")
        if self.last_image and not self.image:
            out.append("last_image: is set without image; first-last-frame needs both (image is the first frame)")
        for section in (self.model, self.sampling, self.vae, self.memory, self.speed, self.output, self.guard,
                        self.control, self.video2video, self.forcing, self.parallel, self.audio, self.provenance,
                        self.animate):
            out += section.problems()
        if (tc := self.output.timecode_problem(self.output.fps or self.fps)) is not None:
            out.append(tc)
        if self.parallel.devices != 1 and self.model.device == "mps":
            out.append("parallel: runs on CUDA GPUs (or CPU processes, for tests), not on mps; remove parallel")
        if self.output.decode == "preview" and self.guard.enabled and self.guard.frames:
            out.append("output.decode: preview writes frames the guard's classifier has not judged; use full with guard.enabled")
        alias = {"experts": "swap_experts", "none": "resident"}.get(self.model.offload)
        if alias and self.memory.placement not in ("auto", alias):
            out.append(f"model.offload: {self.model.offload!r} (an alias of memory.placement: {alias}) contradicts "
                       f"memory.placement: {self.memory.placement!r}; set only memory.placement")
        out += _choices(self, "")
        for i, lora in enumerate(self.loras):
            out += lora.problems(f"loras[{i}]")
        if not str(self.prompt).strip():
            out.append("prompt: is empty; say what to render, e.g. prompt=\"a fox running in snow\"")
        try:
            w, h = parse_size(self.size)
            if not (16 <= w <= 8192 and 16 <= h <= 8192):
                out.append(f"size: {self.size!r} is out of range; width and height must be 16..8192")
            elif w % 16 or h % 16:
                out.append(f"size: {self.size!r} is not a multiple of 16 (the VAE's 8x and the transformer's 2x "
                           f"patch); nearest valid: {max(16, round(w / 16) * 16)}x{max(16, round(h / 16) * 16)}")
        except ValueError:
            out.append(f"size: {self.size!r} is not WIDTHxHEIGHT; write it like 832x480")
        if self.num_frames < 1 or (self.num_frames - 1) % 4:
            near = max(1, round((self.num_frames - 1) / 4) * 4 + 1)
            out.append(f"num_frames: {self.num_frames} is not 4k+1 (1, 5, ..., 81, 121); nearest valid: {near}")
        if self.num_frames > MAX_FRAMES:
            out.append(f"num_frames: {self.num_frames} is out of range; use at most {MAX_FRAMES} (the model's own limit "
                       "may be lower)")
        if not 1 <= self.fps <= MAX_FPS:
            out.append(f"fps: {self.fps} is out of range; use 1..{MAX_FPS}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            out.append(f"seed: {self.seed} is out of range; use 0..2^63-1 or null for a random seed")
        return out + text_problems(self)


def canonical(cfg: RenderConfig) -> RenderConfig:
    """`cfg` (checked) with one spelling per value, in place, so equal settings have one digest: size
    as WxH (1280*720 is 1280x720), budgets as bytes or "auto" (budgets.Budget: 1GiB is 1073741824)."""
    w, h = parse_size(cfg.size)
    cfg.size, cfg.vae.memory_budget = f"{w}x{h}", parse_budget(cfg.vae.memory_budget)
    cfg.memory.device_budget = parse_budget(cfg.memory.device_budget, "memory.device_budget")
    cfg.memory.host_budget = parse_budget(cfg.memory.host_budget, "memory.host_budget")
    return cfg


def random_seed() -> int:
    """A seed for `seed: null` (31 bits, so every framework's generator takes it)."""
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


def parse_size(size: str) -> tuple[int, int]:
    """'832x480' or '832*480' -> (832, 480)."""
    m = re.fullmatch(r"\s*(\d+)\s*[x*X]\s*(\d+)\s*", str(size))
    if not m:
        raise ValueError(size)
    return int(m.group(1)), int(m.group(2))


def to_dict(cfg: RenderConfig) -> dict:
    return dataclasses.asdict(cfg)


def digest(cfg: RenderConfig) -> str:
    """Short SHA-256 of the canonical config (sorted JSON): the same settings give the same digest."""
    blob = json.dumps(to_dict(cfg), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
