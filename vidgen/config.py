"""Render configuration: typed dataclasses, YAML presets with inheritance, dotlist overrides.

Loading order: the `defaults:` files of a preset (recursively, in order), the preset itself, then
overrides (`sampling.steps=20` from the CLI, or keyword arguments in the API). Every problem in the
merged config is reported at once — unknown keys, wrong types, values out of range — with the key
path, the bad value and what is allowed, before any weights are read.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, Optional, Union, get_args, get_origin, get_type_hints

import yaml
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .errors import ConfigError

# Registered names (a queued job picks components by these, never by import path).
DEVICES = ("auto", "cuda", "mps", "cpu")
DTYPES = ("auto", "float32", "bfloat16", "float16")
VARIANTS = ("auto", "wan2.1-t2v", "wan2.2-t2v-a14b", "wan2.2-i2v-a14b", "wan2.2-ti2v-5b")
SOLVERS = ("unipc", "dpmpp", "euler")
SCHEDULES = ("wan", "diffusers")
CODECS = ("auto", "h264", "h265", "vp9", "gif", "png")
PIX_FMTS = ("yuv420p", "yuv444p")
IMAGE_FITS = ("wan", "crop")
OFFLOADS = ("auto", "none", "experts")
GUARD_ACTIONS = ("block", "blur", "flag")
GUARD_BACKENDS = ("auto", "tensorrt", "onnxruntime", "torch")
GUARD_PRECISIONS = ("fp16", "fp32")
MAX_FRAMES = 16385
"""Longest clip a config may ask for (4k+1); a model's rotary table usually allows fewer (preflight says)."""
PRESETS = Path(__file__).resolve().parent.parent / "configs"
"""The shipped presets: a config's `defaults:` may name one of these, or a file beside the config."""
_CONFIG_SUFFIXES = (".yaml", ".yml")
# A resolver call `${name:...}` (not escaped with a backslash): oc.env, oc.decode and any registered one.
_RESOLVER = re.compile(r"(?<!\\)\$\{\s*[\w.\-]+\s*:")


@dataclass
class ModelConfig:
    path: str = MISSING
    """Local diffusers-format Wan pipeline folder (holds model_index.json). Never downloaded."""
    variant: str = "auto"
    """auto (read from the folder) or one of VARIANTS; a mismatch with the folder is an error."""
    dtype: str = "auto"
    """Transformer and text-encoder dtype; auto = bfloat16 on cuda/mps, float32 on cpu."""
    device: str = "auto"
    """auto = cuda if available, else mps, else cpu."""
    max_sequence_length: int = 512
    """Prompt tokens; the text embedding is padded to this length (Wan uses 512)."""
    offload: str = "auto"
    """Two-expert models: experts = keep only the active expert on the device (the other in CPU
    memory, swapped once per render); none = both on the device; auto = experts when both do not fit."""
    offload_text_encoder: bool = True
    """Move the text encoder to CPU memory after encoding (GPU/MPS), freeing device memory for sampling."""

    def problems(self) -> list[str]:
        out = [_choice("model.device", self.device, DEVICES), _choice("model.dtype", self.dtype, DTYPES),
               _choice("model.variant", self.variant, VARIANTS), _choice("model.offload", self.offload, OFFLOADS)]
        if not str(self.path).strip():
            out.append("model.path: is empty; give the local folder of a diffusers-format Wan pipeline")
        if not 1 <= self.max_sequence_length <= 4096:
            out.append(f"model.max_sequence_length: {self.max_sequence_length} is out of range; use 1..4096 (Wan: 512)")
        return [p for p in out if p]


@dataclass
class SamplingConfig:
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
        out = [_choice("sampling.solver", self.solver, SOLVERS), _choice("sampling.schedule", self.schedule, SCHEDULES)]
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
        return [p for p in out if p]


COMPILE_MODES = ("none", "blocks", "full")
KERNELS = ("auto", "torch", "triton", "metal")
"""Backends of the decoder's fused ops (vidgen.ops)."""
ATTENTION_BACKENDS = ("auto", "sdpa_math", "sdpa_efficient", "sdpa_flash", "sdpa_cudnn")
STEP_CACHES = ("none", "first_block", "sea", "mag")


@dataclass
class SpeedConfig:
    compile: str = "none"
    """none; blocks = torch.compile each repeated transformer block (regional, fast cold start); full."""
    attention_backend: str = "auto"
    """auto (PyTorch's choice) or one SDPA backend: sdpa_math, sdpa_efficient, sdpa_flash, sdpa_cudnn."""
    step_cache: str = "none"
    """Skip transformer work on steps where it changes little (changes the output): none; first_block
    (diffusers' FirstBlockCache); sea (diffusers' SeaCache, a TeaCache-style gate: diffusers 0.42.1 has
    no TeaCache); mag (MagCache) is refused: it needs per-model magnitude ratios diffusers ships only for Flux."""
    cache_threshold: float = 0.05
    """How much change a cached step may ignore (higher = faster, further from the uncached render)."""

    def problems(self) -> list[str]:
        out = [_choice("speed.compile", self.compile, COMPILE_MODES),
               _choice("speed.attention_backend", self.attention_backend, ATTENTION_BACKENDS),
               _choice("speed.step_cache", self.step_cache, STEP_CACHES)]
        if not 0 < self.cache_threshold < 10:
            out.append(f"speed.cache_threshold: {self.cache_threshold} is out of range; use a number in (0, 10)")
        return [p for p in out if p]

    def engaged(self) -> bool:
        return (self.compile, self.attention_backend, self.step_cache) != ("none", "auto", "none")


@dataclass
class VaeConfig:
    dtype: str = "float32"
    """VAE dtype (decode and image encode); float32 is the reference."""
    memory_budget: str = "auto"
    """Peak activation memory of the decode: bytes, "1.5GiB", "800MB", or auto (70% of free memory)."""
    kernels: str = "auto"
    """Backend of the decode's fused memory-bound ops: auto (triton on CUDA when Triton imports, metal
    on Apple GPUs, torch elsewhere), torch, triton or metal."""

    def problems(self) -> list[str]:
        out = [_choice("vae.dtype", self.dtype, DTYPES), _choice("vae.kernels", self.kernels, KERNELS)]
        try:
            parse_budget(self.memory_budget)
        except ConfigError as e:
            out.append(e.problems[0])
        return [p for p in out if p]


@dataclass
class OutputConfig:
    path: str = "outputs/{time}-{seed}.mp4"
    """Output file; {seed}, {time} (YYYYmmdd-HHMMSS) and {prompt} (a short slug) are filled in."""
    codec: str = "auto"
    """auto (from the extension: .mp4 h264, .webm vp9, .gif gif, no extension png frames) or a codec."""
    crf: int = 18
    """Constant rate factor for h264/h265/vp9 (lower = better; 18 is visually lossless for x264)."""
    pix_fmt: str = "yuv420p"
    """yuv420p (plays everywhere; needs even width and height) or yuv444p."""
    save_latents: bool = True
    """Keep <output>.latents.safetensors after a successful render (always written before decode)."""
    overwrite: bool = False
    """Replace an earlier render at the output path: its video, latents and sidecar (otherwise any of them
    existing is an error). A folder of PNG frames is replaced only if it holds nothing but frames."""
    root: Optional[str] = None
    """Keep every file of this render inside this folder, symbolic links resolved at each write (a workflow
    sets its output_dir); null = no such rule."""

    def problems(self) -> list[str]:
        out = [_choice("output.codec", self.codec, CODECS), _choice("output.pix_fmt", self.pix_fmt, PIX_FMTS)]
        if not 0 <= self.crf <= 63:
            out.append(f"output.crf: {self.crf} is out of range; use 0..63 (x264: 0..51)")
        if not str(self.path).strip():
            out.append("output.path: is empty; give a file path such as outputs/clip.mp4")
        try:
            str(self.path).format(seed=0, time="t", prompt="p")
        except (KeyError, IndexError, ValueError) as e:
            out.append(f"output.path: {self.path!r} has a bad placeholder ({e}); allowed: {{seed}}, {{time}}, {{prompt}}")
        return [p for p in out if p]


@dataclass
class GuardConfig:
    enabled: bool = False
    """Run the guardrail on this render: the prompt filter before any model loads, then the frame
    checks on the frames as they leave the VAE. It fails closed: a check that cannot run publishes nothing."""
    prompt_filter: bool = True
    """Refuse prompts that match a blocklist rule (exit code 3, naming the rule, never the terms)."""
    blocklists: list[str] = field(default_factory=lambda: ["default"])
    """Blocklist files (lines `rule-name: term` or `rule-name: re:REGEX`); `default` is vidgen's own list."""
    frames: bool = True
    """Score sampled frames with the frame-safety classifier."""
    classifier: str = "open_nsfw"
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
    engine_cache: str = ""
    """Folder of built TensorRT engines; empty = $VIDGEN_CACHE/engines or ~/.cache/vidgen/engines."""
    photosensitivity: bool = True
    """Check flashes and red flashes (WCAG 2.3.1, and the extended-failure rule of broadcast checkers)."""
    action: str = "block"
    """block: no file at the output path, exit code 3 with the scores; blur: flagged frames pixelated
    (a photosensitivity failure still blocks); flag: the file is written and the report goes to its sidecar."""

    def problems(self) -> list[str]:
        out = [_choice("guard.action", self.action, GUARD_ACTIONS), _choice("guard.backend", self.backend, GUARD_BACKENDS),
               _choice("guard.precision", self.precision, GUARD_PRECISIONS)]
        if not 0.0 < self.threshold <= 1.0:
            out.append(f"guard.threshold: {self.threshold} is out of range; use a score in (0, 1], e.g. 0.8")
        if not 0.0 < self.sample_fps <= 240:
            out.append(f"guard.sample_fps: {self.sample_fps} is out of range; use (0, 240], e.g. 2")
        if not 1 <= self.batch_size <= 256:
            out.append(f"guard.batch_size: {self.batch_size} is out of range; use 1..256")
        if self.enabled and self.prompt_filter and not self.blocklists:
            out.append("guard.blocklists: is empty while guard.prompt_filter is on; list files or `default`")
        return [p for p in out if p]


@dataclass
class RenderConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    prompt: str = MISSING
    """What to render."""
    negative_prompt: str = ""
    """What to steer away from (used when guidance_scale > 1)."""
    image: Optional[str] = None
    """Conditioning image for image-to-video models (I2V-A14B, TI2V-5B)."""
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
    speed: SpeedConfig = field(default_factory=SpeedConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)

    @property
    def width(self) -> int:
        return parse_size(self.size)[0]

    @property
    def height(self) -> int:
        return parse_size(self.size)[1]

    def problems(self) -> list[str]:
        out: list[str] = []
        for section in (self.model, self.sampling, self.vae, self.speed, self.output, self.guard):
            out += section.problems()
        out += [p for p in [_choice("image_fit", self.image_fit, IMAGE_FITS)] if p]
        if not str(self.prompt).strip():
            out.append("prompt: is empty; say what to render, e.g. prompt=\"a fox running in snow\"")
        try:
            w, h = parse_size(self.size)
            if not (16 <= w <= 8192 and 16 <= h <= 8192):
                out.append(f"size: {self.size!r} is out of range; width and height must be 16..8192")
            elif w % 16 or h % 16:
                out.append(f"size: {self.size!r} is not a multiple of 16 (the VAE's 8x and the transformer's 2x "
                           f"patch); nearest valid: {_round16(w)}x{_round16(h)}")
        except ValueError:
            out.append(f"size: {self.size!r} is not WIDTHxHEIGHT; write it like 832x480")
        if self.num_frames < 1 or (self.num_frames - 1) % 4:
            near = max(1, round((self.num_frames - 1) / 4) * 4 + 1)
            out.append(f"num_frames: {self.num_frames} is not 4k+1 (1, 5, ..., 81, 121); nearest valid: {near}")
        if self.num_frames > MAX_FRAMES:
            out.append(f"num_frames: {self.num_frames} is out of range; use at most {MAX_FRAMES} (the model's own limit "
                       "may be lower)")
        if not 1 <= self.fps <= 240:
            out.append(f"fps: {self.fps} is out of range; use 1..240")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            out.append(f"seed: {self.seed} is out of range; use 0..2^63-1 or null for a random seed")
        return out


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_budget(value) -> int | str | None:
    """vae.memory_budget's value: None | "auto" | bytes (int) | "1.5GiB" / "800MB" / "2e9" -> None, "auto" or bytes."""
    if value is None or value == "auto":
        return value
    if isinstance(value, bool):
        raise ConfigError(f"vae.memory_budget: {value!r} is not a size; use bytes, '1.5GiB' or 'auto'")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ConfigError(f"vae.memory_budget: {value!r} must be positive")
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]i?b?|b)?\s*", str(value).lower())
    if not m:
        raise ConfigError(f"vae.memory_budget: {value!r} is not a size; write e.g. 1.5GiB, 800MB, 2000000000 or auto")
    unit = m.group(2) or ""
    if unit and not unit.endswith("b"):
        unit += "b"
    return parse_budget(float(m.group(1)) * _UNITS[unit])


def random_seed() -> int:
    """A seed for `seed: null` (31 bits, so every framework's generator takes it)."""
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


def parse_size(size: str) -> tuple[int, int]:
    """'832x480' or '832*480' -> (832, 480)."""
    m = re.fullmatch(r"\s*(\d+)\s*[x*X]\s*(\d+)\s*", str(size))
    if not m:
        raise ValueError(size)
    return int(m.group(1)), int(m.group(2))


def _round16(v: int) -> int:
    return max(16, round(v / 16) * 16)


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> str | None:
    if value in allowed:
        return None
    close = difflib.get_close_matches(str(value), allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{key}: {value!r} is not allowed{hint}; choose one of {', '.join(allowed)}"


# ---------------------------------------------------------------------------------------------
# Loading and merging


def _yaml_error(name: str, e: Exception) -> ConfigError:
    """A YAML error as one line naming the position, never the file's text (it may not be a config)."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    what = getattr(e, "problem", None) or type(e).__name__
    return ConfigError(f"{name} is not valid YAML{where}: {what}")


def _default_file(name: Any, path: Path) -> Path:
    """Where a `defaults:` entry of `path` points: a file beside it (its folder or below), else a
    shipped preset. Anything else (absolute, ~, '..', not .yaml, leaving the folder by a link) is
    refused, so a config never reads files outside its own folder and the presets."""
    allowed = f"name a .yaml file beside {path.name} or a shipped preset (e.g. base.yaml)"
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"defaults: in {path.name} must list file names; {allowed}")
    parts = PurePath(name).parts
    if PurePath(name).is_absolute() or name.startswith("~") or ".." in parts or not name.endswith(_CONFIG_SUFFIXES):
        raise ConfigError(f"defaults: {name!r} in {path.name} is refused; {allowed} "
                          "(no absolute paths, ~ or '..')")
    for folder in (path.parent, PRESETS):
        candidate = (folder / name).resolve()
        if candidate.is_relative_to(folder.resolve()) and candidate.is_file():
            return candidate
    raise ConfigError(f"defaults: {name!r} (named in {path.name}) does not exist beside it or among the shipped "
                      f"presets; {allowed}")


def _read_yaml(path: Path, chain: tuple[Path, ...] = ()) -> DictConfig:
    """Read one preset and, first, the files in its `defaults:` list (beside it, or shipped presets),
    merged in order."""
    path = path.resolve()
    if path in chain:
        raise ConfigError(f"defaults: {path.name} includes itself ({' -> '.join(p.name for p in chain + (path,))})")
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        raw = OmegaConf.load(path)
    except UnicodeDecodeError:
        raise ConfigError(f"{path.name} is not a text file; give a YAML config") from None
    except OSError as e:
        raise ConfigError(f"cannot read {path.name} ({e.strerror or type(e).__name__})") from None
    except Exception as e:  # YAML syntax errors come in several classes
        raise _yaml_error(path.name, e) from None
    if raw is None or isinstance(raw, ListConfig):
        raise ConfigError(f"{path.name} must be a mapping of keys (model:, prompt:, ...)")
    defaults = raw.pop("defaults", None) if "defaults" in raw else None
    if defaults is None:
        return raw
    if isinstance(defaults, str):
        defaults = [defaults]
    if not isinstance(defaults, (list, ListConfig)):
        raise ConfigError(f"defaults: in {path.name} must be a file name or a list of them")
    merged = OmegaConf.create()
    for name in defaults:
        merged = OmegaConf.merge(merged, _read_yaml(_default_file(name, path), chain + (path,)))
    return OmegaConf.merge(merged, raw)


def resolver_problems(tree: Any, prefix: str = "") -> list[str]:
    """Every string in `tree` that calls an OmegaConf resolver (`${oc.env:HOME}` and the like).

    Configs take no resolvers: one could read the environment (secrets) into a prompt, a ledger
    payload or a video's metadata. Plain `${key}` references to other keys stay allowed.
    """
    if isinstance(tree, dict):
        return [p for k, v in tree.items() for p in resolver_problems(v, f"{prefix}{k}.")]
    if isinstance(tree, list):
        return [p for i, v in enumerate(tree) for p in resolver_problems(v, f"{prefix.rstrip('.')}[{i}].")]
    if isinstance(tree, str) and _RESOLVER.search(tree):
        return [f"{prefix.rstrip('.')}: {tree!r} calls a resolver; vidgen configs take no resolvers (they could "
                "read the environment); write the value itself (a plain ${key} reference is allowed)"]
    return []


def resolve(conf: DictConfig, label: str | None = None) -> dict:
    """`conf` as a plain dict with its `${key}` references filled in; ConfigError for a resolver,
    a reference to a missing key, a reference loop or one of the wrong kind."""
    plain = OmegaConf.to_container(conf, resolve=False)
    if problems := resolver_problems(plain):
        raise ConfigError(problems, label)
    try:
        return OmegaConf.to_container(conf, resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "config"
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{key}: cannot fill in its ${{...}} reference ({text})", label) from None
    except RecursionError:
        raise ConfigError("a ${...} reference refers back to itself; remove the loop", label) from None


def _overrides_to_conf(overrides: list[str] | tuple[str, ...] | dict | None) -> DictConfig:
    if overrides is None or (isinstance(overrides, (list, tuple, dict)) and not overrides):
        return OmegaConf.create()
    if isinstance(overrides, (str, bytes)):
        raise ConfigError(f"overrides: {overrides!r} is a string; give a list of KEY=VALUE strings "
                          f"(overrides=[{overrides!r}]) or a dict")
    if isinstance(overrides, dict):
        conf = OmegaConf.create()
        try:
            for key, value in overrides.items():
                if not isinstance(key, str):
                    raise ConfigError(f"overrides: key {key!r} is not a string; use dotted names like 'sampling.steps'")
                if "." in key:  # API keyword with a dotted path, e.g. {"sampling.steps": 20}
                    OmegaConf.update(conf, key, value, merge=True)
                else:
                    conf = OmegaConf.merge(conf, {key: value})
        except OmegaConfBaseException as e:
            raise ConfigError(f"overrides: {str(e).strip().splitlines()[0]}") from None
        return conf
    if not isinstance(overrides, (list, tuple)):
        raise ConfigError(f"overrides: expected a list of KEY=VALUE strings or a dict, got {type(overrides).__name__}")
    problems, parts = [], []
    for o in overrides:
        if not isinstance(o, str) or "=" not in o or o.startswith("="):
            problems.append(f"override {o!r} is not KEY=VALUE (e.g. sampling.steps=20)")
            continue
        try:
            parts.append(OmegaConf.from_dotlist([o]))
        except OmegaConfBaseException as e:
            problems.append(f"override {o!r}: {str(e).strip().splitlines()[0]}")
        except yaml.YAMLError as e:     # the value is parsed as YAML: `loras=[{a: 1` is not
            what = getattr(e, "problem", None) or type(e).__name__
            problems.append(f"override {o!r}: the value is not valid YAML ({what}); quote it or close its brackets")
    if problems:
        raise ConfigError(problems)
    return OmegaConf.merge(OmegaConf.create(), *parts) if parts else OmegaConf.create()


def _describe(tp: Any) -> str:
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    if get_origin(tp) is Union:
        inner = [a for a in get_args(tp) if a is not type(None)]
        return " or ".join(_describe(a) for a in inner) + " or null"
    if get_origin(tp) is list:
        return f"a list of {_describe(get_args(tp)[0]).removeprefix('a ').removeprefix('an ')}s, e.g. [a, b]"
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _check_tree(schema: type, raw: Any, prefix: str, problems: list[str]) -> None:
    """Report unknown keys and values of the wrong type, walking the user's (unstructured) config.

    Bad entries are removed from `raw` (a plain dict), so the remaining keys can still be checked
    for range and consistency and every problem is reported in one go.
    """
    hints = get_type_hints(schema)
    names = [f.name for f in dataclasses.fields(schema)]
    blank = None                        # the schema as an OmegaConf node, built once (it is slow to build)
    for key in list(raw):
        value, path = raw[key], f"{prefix}{key}"
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"did you mean {prefix}{close[0]}? " if close else ""
            if len(path) > 60 or not path.isprintable():     # not a typo: don't echo what the file holds
                path = f"{path[:40].splitlines()[0]!r}..."
            problems.append(f"{path}: unknown key; {hint}allowed under {prefix.rstrip('.') or 'the top level'}: "
                            f"{', '.join(names)}")
            del raw[key]
            continue
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            if isinstance(value, dict):
                _check_tree(tp, value, path + ".", problems)
            else:
                problems.append(f"{path}: expected a mapping of keys ({', '.join(f.name for f in dataclasses.fields(tp))}), "
                                f"got {value!r}")
                del raw[key]
            continue
        if isinstance(value, str) and value == "???":
            continue  # still missing: reported after the merge
        try:
            blank = blank if blank is not None else OmegaConf.structured(schema)
            OmegaConf.merge(blank, {key: value})
        except OmegaConfBaseException:
            problems.append(f"{path}: {value!r} is not {_describe(tp)}")
            del raw[key]


def load_config(source: str | Path | dict | RenderConfig | None = None,
                overrides: list[str] | dict | None = None) -> RenderConfig:
    """Build a validated RenderConfig from a YAML preset (or dict, or config) and overrides.

    Args:
        source: path of a YAML preset, a dict, an existing RenderConfig, or None (schema defaults).
        overrides: OmegaConf dotlist (["sampling.steps=20", "prompt=a fox"]) or a dict (nested or
            with dotted keys).
    Returns:
        RenderConfig with every check passed.
    Raises:
        ConfigError listing every problem.
    """
    label = None
    try:
        if source is None:
            base = OmegaConf.create()
        elif isinstance(source, RenderConfig):
            base = OmegaConf.structured(source)
        elif isinstance(source, dict):
            base = OmegaConf.create(source)
        elif isinstance(source, (str, os.PathLike)):
            label = str(source)
            base = _read_yaml(Path(source).expanduser())
        else:
            raise ConfigError(f"config: expected a YAML file path, a dict or a RenderConfig, got {type(source).__name__}")
        merged = OmegaConf.merge(base, _overrides_to_conf(overrides))
    except OmegaConfBaseException as e:    # e.g. a value of a type no config can hold
        raise ConfigError(str(e).strip().splitlines()[0], label) from None
    plain = resolve(merged, label)

    if not isinstance(plain, dict):
        raise ConfigError("expected a mapping of keys", label)
    problems: list[str] = []
    _check_tree(RenderConfig, plain, "", problems)
    try:
        structured = OmegaConf.merge(OmegaConf.structured(RenderConfig), plain)
        missing = sorted(OmegaConf.missing_keys(structured))
        for key in missing:  # fill in so the other checks still run
            OmegaConf.update(structured, key, "x")
        cfg: RenderConfig = OmegaConf.to_object(structured)
    except OmegaConfBaseException as e:    # a value that reads as a ${...} reference only after filling in
        key = getattr(e, "full_key", None) or "config"
        raise ConfigError(f"{key}: {str(e).strip().splitlines()[0]}", label) from None
    problems += [f"{k}: is required and not set" for k in missing]
    problems += [p for p in cfg.problems()
                 if not any(p.startswith(k + ":") for k in missing)]
    if problems:
        raise ConfigError(problems, label)
    w, h = parse_size(cfg.size)
    cfg.size = f"{w}x{h}"       # one spelling: 1280*720 and 1280x720 are one config, with one digest
    return cfg


def to_yaml(cfg: RenderConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def to_dict(cfg: RenderConfig) -> dict:
    return dataclasses.asdict(cfg)


def digest(cfg: RenderConfig) -> str:
    """Short SHA-256 of the canonical config (sorted JSON): the same settings give the same digest."""
    blob = json.dumps(to_dict(cfg), sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
