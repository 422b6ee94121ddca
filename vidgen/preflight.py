"""Preflight: every check a render can make without weights, and every fact it runs on, worked out
once before any weight is read.

The config against the model folder's JSON (variant, size rules, rotary limits, image input), the
conditioning image, every file the render will write (vidgen.paths), the device and dtypes, the
kernels backend, the schedule, a checkpoint to resume, the memory plan (vidgen.memory) and the decode
plan within its budget (on a meta copy of the VAE). `check` returns them as one immutable Plan,
reading no weights (a queue's submit stops there); `prepare` loads what the render needs beyond it
(the guard's frame classifier); `preflight` is both, for a render. The load, sample, decode and
write stages read the Plan and re-derive nothing. Bad input costs nothing.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from . import animate_render, guard
from .budgets import Budget
from .control import read_control, read_source
from .config import CODECS, RenderConfig, random_seed
from .config_files import file_fields
from .retime import retimed_count
from .errors import ConfigError, InputError, OutputError
from .families import FAMILIES
from .footprint import ModelSpec, meta_vae
from .forcing import Layout, check_state as check_take, layout, window_frames
from .io import check_output, codec_for_path, encoder_problem, literal, output_path
from .loading import ModelInfo, resolve_device, resolve_dtype
from .lora import plan_lora, refuse_repeats
from .memo import Memo
from .memory import MemoryPlan, plan_render
from .ops import resolve_backend
from .parallel import problems as parallel_problems
from .paths import check_render_files, has_placeholders, latents_path, numbered
from .records import path_problem
from .sampling import SamplerState, Schedule, check_state, restyle_schedule, schedule
from .sources import inspect
from .speed import unsupported
from .vae import canvas_bytes
from .vae.plan import PlanEstimate, choose_plan

log = logging.getLogger("vidgen")
MAX_IMAGE_PIXELS = 89_478_485
"""Largest conditioning image read (Pillow's own decompression-bomb threshold, 0.25 GiB of RGBA)."""


@dataclass(frozen=True)
class Target:
    """Where and how the model loads (what Pipeline.load needs), worked out once."""

    info: ModelInfo
    device: torch.device
    dtype: torch.dtype              # transformer and text encoder
    vae_dtype: torch.dtype
    kernels: str                    # the decode's fused-op backend on this device (vae.kernels resolved)


@dataclass(frozen=True)
class Plan:
    """A validated render, ready to run: the config with seed and output path filled in, and
    every fact the stages need."""

    config: RenderConfig
    target: Target
    seed: int
    output: Path
    codec: str
    latents_path: Path              # where this render writes its latents
    schedule: Schedule              # built once; the sampler walks it
    boundary_t: float | None        # the two-expert switch timestep (None: one expert)
    guidance: tuple[float, ...]     # each expert's guidance scale
    memory: MemoryPlan              # this render's memory plan: where the weights live, storage, budgets
    decode: PlanEstimate            # the decode's tile plan within its budget (vae.memory_budget, or auto's)
    classifier: Any = None          # the guard's loaded frame classifier, when frame scoring is on (prepare)
    image: Any = None               # PIL image for I2V/TI2V
    image_frames: tuple = ()        # PIL images of the frames after `image`, given too (image_frames)
    last_image: Any = None          # PIL image of the last frame (first-last-frame, I2V-A14B)
    colour_reference: Any = None    # PIL image every frame's colour is matched to (output.colour_reference)
    control: Any = None             # control.Control: a VACE render's fitted control clip, mask, reference images
    source: Any = None              # video2video: the fitted source clip, uint8 [F, H, W, 3]
    resume_state: SamplerState | None = None   # continue an interrupted render from here
    forcing: Layout | None = None   # a diffusion-forcing take's windows and timestep matrices (vidgen.forcing)
    animate: Any = None             # animate_render.AnimatePlan: an Animate render's segments (num_frames: the pose video's)
    job: dict | None = None         # the queue job rendering this (its sidecar says so: a retry knows its own file)
    loras: tuple = ()               # per expert, the lora.LoraPlan list applied to it (headers checked)
    own: tuple[Path, ...] = ()      # files at the output's names that belong to this render (see _check_files)
    numbered: bool = False          # the output path came from a template: a taken name moves to the next number

    @property
    def info(self) -> ModelInfo:
        return self.target.info

    @property
    def reference_frames(self) -> int:
        """Latent frames VACE's reference images add before the clip (sampled, then dropped)."""
        return len(self.control.references) if self.control is not None else 0


def target(cfg: RenderConfig, info: ModelInfo | None = None) -> Target:
    """The device, dtypes and kernels backend `cfg` loads with (no weights read; the memory plan is
    the render's own, made by `check`)."""
    info = info or inspect(cfg.model)
    device = resolve_device(cfg.model.device)
    return Target(info, device, resolve_dtype(cfg.model.dtype, device), resolve_dtype(cfg.vae.dtype, device),
                  resolve_backend(cfg.vae.kernels, device))


def _check_files(cfg: RenderConfig, output: Path, codec: str, own: tuple[Path, ...], problems: list[str]) -> None:
    """Every file the render writes — video, latents, resume checkpoint, sidecar, kept frames — checked
    as one (vidgen.paths.check_render_files): none may exist unless output.overwrite; all names must fit; all
    stay inside output.root. `own` are files among them that belong to this render (the checkpoint
    it resumes, the latents it decodes, what an earlier attempt of the same queue job left): they
    are not in the way."""
    problems += [f"output.keep_frames: {k} is not a frame of a {cfg.num_frames}-frame clip"
                 for k in cfg.output.keep_frames if not -cfg.num_frames <= k < cfg.num_frames]
    problems += check_render_files(output, keep_frames=_kept(cfg), overwrite=cfg.output.overwrite,
                                   root=cfg.output.root, folder=CODECS[codec].sequence, own=own)


def _kept(cfg: RenderConfig) -> list[int]:
    """output.keep_frames as frame indices (-1: the last)."""
    return [k % cfg.num_frames for k in cfg.output.keep_frames if -cfg.num_frames <= k < cfg.num_frames]


def _load_image(path: str, key: str = "image"):
    from PIL import Image, UnidentifiedImageError

    if problem := path_problem(path, "file"):        # a FIFO or device is never opened
        raise InputError(f"{key}: {path!r} {problem}; give a PNG or JPEG file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:        # reads the header only: the size is known before decoding
                if im.width * im.height > MAX_IMAGE_PIXELS:
                    raise InputError(f"{key}: {path!r} is {im.width}x{im.height}, more than the {MAX_IMAGE_PIXELS:,} "
                                     "pixels vidgen reads (a decompression bomb, or far larger than any video frame); "
                                     "downscale it")
                return im.convert("RGB")
    except FileNotFoundError:
        raise InputError(f"{key}: {path!r} does not exist") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InputError(f"{key}: {path!r} has more pixels than Pillow will decode (a decompression bomb, or far "
                         "larger than any video frame); downscale it") from None
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise InputError(f"{key}: cannot read {path!r} as an image ({e.__class__.__name__}); use a PNG or JPEG") from None


def check(cfg: RenderConfig, info: ModelInfo | None = None, *, target: Target | None = None,
          own: tuple[Path, ...] = (), resume_state: SamplerState | None = None, job: dict | None = None,
          memo: Memo | None = None, pending: dict | None = None) -> Plan:
    """Check `cfg` against the model folder, the image and every file it will write, and plan its memory
    and decode; raise with every problem. Nothing is created and no weight is read (the guard's frame
    classifier is `prepare`'s). With the guard on, the prompt filter runs first (before the model folder
    is even read).

    Args:
        info / target: what is already known of the model folder / the loaded pipeline's target.
        own: files among those the render writes that belong to it (see _check_files).
        resume_state: a checkpoint's sampler state to continue (checked against the schedule here).
        job: the queue job's identity (recorded in the sidecar and the latents file).
        memo: the pipeline's cache (footprints, decode plans, LoRA files' SHA-256).
        pending: frames an earlier queued job will write (path -> its size): read as a stand-in.
    """
    guard.check_prompt(cfg.guard, cfg.prompt)
    info = target.info if target is not None else info or inspect(cfg.model)
    problems = _model_problems(cfg, info)
    animated = None
    if not problems:            # the driving videos scanned: every problem with them, and the clip's length
        try:
            cfg, animated = animate_render.check(cfg, info, pending)
        except ConfigError as e:
            problems += e.problems
    sched, boundary_t, guidance = _sampling(cfg, info)     # of cfg.sampling and video2video alone: built once
    forcing, more = layout(cfg, info, sched.timesteps.tolist())
    problems += more
    seed = cfg.seed if cfg.seed is not None else random_seed()
    output, codec, numbering = _output(cfg, seed, own, problems)
    device = resolve_device(cfg.model.device)     # a probe of this install and device
    problems += unsupported(cfg.speed, device, resolve_dtype(cfg.model.dtype, device))
    problems += parallel_problems(cfg, info, device)
    if len(info.experts) == 1:
        problems += [f"loras[{i}].expert: {lora.expert!r} needs a two-expert (A14B) model; {info.variant} has one "
                     "transformer: use expert: both" for i, lora in enumerate(cfg.loras) if lora.expert != "both"]
    if cfg.loras and cfg.lora_mode == "fuse" and any(info.weights_of(n).kind == "gguf" for n in info.experts):
        problems.append("lora_mode: fuse cannot change GGUF weights; use lora_mode: adapter (or auto)")
    if problems:
        raise ConfigError(problems)
    cfg, loras = _loras(cfg, info, memo)
    images = {key: value for key, value, kind in file_fields(cfg) if kind == "image"}     # the schema's marks
    image, last_image, reference = (_read(images.get(k), k, pending) for k in ("image", "last_image",
                                                                               "output.colour_reference"))
    image_frames = tuple(_read(p, f"image_frames[{i}]", pending) for i, p in enumerate(cfg.image_frames))
    if image is not None and cfg.image_fit == "wan" and animated is None:     # Animate fits its reference itself
        cfg = _wan_image_size(cfg, info, image)
        if problems := info.limit_problems(cfg.width, cfg.height, cfg.num_frames):
            raise ConfigError(problems)
    control = read_control(cfg, lambda path, key: _read(path, key, pending))
    source = read_source(cfg)
    if resume_state is not None:        # resume.resume_from checked its settings and shape; this, its grid
        check_take(resume_state, forcing, sched) if forcing else check_state(resume_state, sched)
    target, memory, decode = _placed(cfg, info, target, memo, animated)
    cfg = replace(cfg, seed=seed, output=replace(cfg.output, path=literal(str(output))))
    return Plan(config=cfg, target=target, seed=seed, output=output, codec=codec, latents_path=latents_path(output),
                schedule=sched, boundary_t=boundary_t, guidance=guidance, memory=memory, decode=decode,
                image=image, image_frames=image_frames, last_image=last_image, colour_reference=reference, control=control, source=source,
                resume_state=resume_state, job=job, forcing=forcing, animate=animated,
                loras=loras, own=tuple(Path(os.path.abspath(p)) for p in own), numbered=numbering)


def prepare(plan: Plan, memo: Memo | None = None) -> Plan:
    """`plan` with what its render loads before any weight: the guard's frame classifier when the guard
    scores frames (so a guard that cannot run fails before sampling); `memo` keeps its chosen backend."""
    cfg = plan.config
    if not (cfg.guard.enabled and cfg.guard.frames):
        return plan
    return replace(plan, classifier=guard.load_classifier(cfg.guard, plan.target.device, chosen=memo))


def preflight(cfg: RenderConfig, info: ModelInfo | None = None, *, target: Target | None = None,
              own: tuple[Path, ...] = (), resume_state: SamplerState | None = None, job: dict | None = None,
              memo: Memo | None = None, pending: dict | None = None) -> Plan:
    """A render's preflight: `check` (with `target`, a loaded pipeline's), then `prepare`."""
    return prepare(check(cfg, info, target=target, own=own, resume_state=resume_state, job=job, memo=memo,
                         pending=pending), memo)


def _model_problems(cfg: RenderConfig, info: ModelInfo) -> list[str]:
    """What in `cfg` the model cannot render: variant, size multiple, image input, last frame, expert settings,
    rotary limits."""
    problems: list[str] = []
    if cfg.model.variant not in ("auto", info.variant):
        problems.append(f"model.variant: {cfg.model.variant!r} does not match the folder, which holds {info.variant!r}")
    m = info.size_multiple
    if cfg.width % m or cfg.height % m:
        near = f"{max(m, round(cfg.width / m) * m)}x{max(m, round(cfg.height / m) * m)}"
        problems.append(f"size: {cfg.size!r} must be a multiple of {m} for {info.variant} (VAE {info.vae_scale_spatial}x "
                        f"x patch {info.patch_size[1]}); nearest valid: {near}")
    if cfg.image and not info.accepts_image:
        problems.append(f"image: is set but {info.variant} is a text-to-video model; remove image or use an I2V/TI2V model")
    if info.needs_image and not cfg.image:
        problems.append(f"image: {info.variant} is image-to-video and needs image=PATH")
    if cfg.image_frames and info.expand_timesteps and len(cfg.image_frames) % info.vae_scale_temporal:
        t = info.vae_scale_temporal
        problems.append(f"image_frames: {info.variant} keeps whole latent frames clean ({t} video frames each): give "
                        f"a multiple of {t} frames after image, not {len(cfg.image_frames)}")
    if cfg.last_image and not info.first_last:
        problems.append(f"last_image: {info.variant} has no last-frame conditioning; first-last-frame needs "
                        "Wan2.2 I2V-A14B or Wan2.1 FLF2V; remove last_image")
    if cfg.control.engaged and not info.family.control:
        takes = ", ".join(f.name for f in FAMILIES.values() if f.control)
        problems.append(f"control: {info.variant} has no VACE context blocks to read a control video, mask or reference "
                        f"images; use a VACE model ({takes}) or remove control")
    problems += animate_render.model_problems(cfg, info)
    if cfg.video2video.video and info.needs_image and not info.family.animate:
        problems.append(f"video2video: {info.variant} needs an image; restyle with a text-to-video or VACE model")
    if cfg.video2video.video and int(cfg.sampling.steps * cfg.video2video.strength) < 1:
        problems.append(f"video2video.strength: {cfg.video2video.strength} of {cfg.sampling.steps} steps runs no step "
                        f"(int(steps x strength) = 0); raise it to at least {1 / cfg.sampling.steps:g} or add steps")
    if len(info.experts) == 1 and (cfg.sampling.boundary is not None or cfg.sampling.guidance_scale_2 is not None):
        problems.append("sampling.boundary / sampling.guidance_scale_2: only apply to two-expert (A14B) models; "
                        "set them to null")
    if not (cfg.image and cfg.image_fit == "wan") or info.family.animate:   # with the image's aspect: once it is read
        frames = min(cfg.num_frames, window_frames(cfg, info)) if info.family.forcing else cfg.num_frames
        if info.family.animate:         # one segment and the reference's latent frame at a time
            frames = cfg.animate.segment_frames + info.vae_scale_temporal
        problems += info.limit_problems(cfg.width, cfg.height, frames)       # diffusion forcing: one window's
    return problems


def _output(cfg: RenderConfig, seed: int, own: tuple[Path, ...], problems: list[str]) -> tuple[Path, str, bool]:
    """(the output path, its codec, whether the name was numbered from a template), with every problem of
    the files the render writes appended."""
    try:
        output = output_path(cfg.output.path, seed, cfg.prompt)
    except (KeyError, IndexError, ValueError):
        output = Path(cfg.output.path)    # already reported by the config checks
    # A template names a series, not a file: a re-run takes the next free number (all its files free)
    numbering = has_placeholders(cfg.output.path) and not cfg.output.overwrite and not problems
    if numbering and (taken := output) != (output := numbered(output, _kept(cfg), own)):
        log.info("output.path: %s is taken; this render writes %s", taken, output)
    try:
        codec = codec_for_path(output) if cfg.output.codec == "auto" else cfg.output.codec
        problems += [f"output: {p}" for p in check_output(output, codec, cfg.output.pix_fmt, cfg.width, cfg.height,
                                                          crf=cfg.output.crf, profile=cfg.output.profile,
                                                          fps=cfg.output.fps or cfg.fps, timecode=cfg.output.timecode)]
        if not problems and (missing := encoder_problem(codec)):
            problems.append(f"output: {missing}")
    except OutputError as e:
        codec = "h264"
        problems.append(f"output.path: {e}")
    _check_files(cfg, output, codec, own, problems)
    problems += _delivery(cfg, output)
    return output, codec, numbering


def _delivery(cfg: RenderConfig, output: Path) -> list[str]:
    """The sound, credentials and watermark problems (docs/delivery.md): found now, before any weights load."""
    from . import provenance, sound, watermark

    problems = []
    fps = cfg.output.fps or cfg.fps
    if cfg.output.retime.weights and cfg.output.retime.method != "interpolate":
        log.warning("output.retime.weights: only method interpolate reads it; %s frames need none, so it is not read",
                    cfg.output.retime.method)
    if cfg.audio.path:
        seconds = retimed_count(cfg.num_frames, cfg.fps, fps) / fps
        problems += [f"audio: {p}" for p in sound.check(cfg.audio.path, cfg.audio.offset, cfg.audio.fit, seconds,
                                                        output.suffix.lower(), fps=fps)]
    if cfg.provenance.signs:
        if why := provenance.supports(output):
            problems.append(f"provenance: {why}")
        problems += [f"provenance: {p}" for p in provenance.check_credentials(cfg.provenance.key, cfg.provenance.cert)]
    if cfg.provenance.watermark and (why := watermark.size_problem(cfg.width, cfg.height)):
        problems.append(f"provenance.watermark: {why}")
    return problems


def _read(path: str | None, key: str, pending: dict | None):
    """The image at `path`; a frame an earlier queued job will write (`pending`: path -> its size), a stand-in."""
    if path and pending and os.path.abspath(path) in pending:
        from PIL import Image

        return Image.new("RGB", pending[os.path.abspath(path)][:2], (128, 128, 128))
    return _load_image(path, key) if path else None


def _placed(cfg: RenderConfig, info: ModelInfo, given: Target | None, memo: Memo | None,
            animated=None) -> tuple[Target, MemoryPlan, PlanEstimate]:
    """(the target, this render's memory plan, its decode plan): the target `given` (a warm pipeline's)
    or this render's; the memory plan made once here (a warm pipeline compares it with its own), and
    logged for a render that loads. Both planners share `memo` (one of their own without it)."""
    placed, spec = given or target(cfg, info), ModelSpec.of(info)
    memo = Memo() if memo is None else memo
    memory = plan_render(cfg, device=placed.device, dtype=placed.dtype, vae_dtype=placed.vae_dtype, spec=spec,
                         memo=memo).chosen
    if given is None:
        log.info("%s", memory.line())
    return placed, memory, _decode_plan(cfg, spec, placed, memory, memo, animated)


def _loras(cfg: RenderConfig, info: ModelInfo, memo: Memo | None) -> tuple[RenderConfig, tuple]:
    """Each LoRA checked against the experts it applies to (safetensors headers only), its SHA-256
    filled into the config (so the digest, the sidecar and --resume know the file), per expert.
    `memo` keeps each file's SHA-256 by path, size and modification time, so a warm pipeline's
    renders hash a file once."""
    if not cfg.loras:
        return cfg, ()
    shapes = [info.weights_of(name).shapes for name in info.experts]
    per_expert: list[list] = [[] for _ in info.experts]
    filled = []
    for i, lora in enumerate(cfg.loras):
        path = Path(lora.path).expanduser()
        targets = list(range(len(info.experts))) if lora.expert == "both" else [0 if lora.expert == "high" else 1]
        try:
            st = path.stat()
            key = ("lora sha256", str(path.resolve()), st.st_size, st.st_mtime_ns)
        except OSError:
            key = None           # plan_lora says what is wrong with the file
        plans = plan_lora(path, lora.strength, lora.expert, [shapes[e] for e in targets],
                          memo.get(key) if memo is not None and key is not None else None)
        sha = plans[0].sha256
        if memo is not None and key is not None:
            memo[key] = sha
        if lora.sha256 is not None and lora.sha256 != sha:
            raise InputError(f"LoRA {path}: its SHA-256 is {sha}, the config's loras[{i}].sha256 says {lora.sha256}; "
                             "use the file the config names, or set sha256: null")
        for e, plan in zip(targets, plans):
            per_expert[e].append(plan)
        filled.append(replace(lora, sha256=sha))
    refuse_repeats(filled, len(info.experts))     # one file twice on an expert: strengths to add
    return replace(cfg, loras=filled), tuple(tuple(p) for p in per_expert)


def _sampling(cfg: RenderConfig, info: ModelInfo) -> tuple[Schedule, float | None, tuple[float, ...]]:
    """(the schedule, the expert-switch timestep, each expert's guidance scale) of `cfg` on this model."""
    s = cfg.sampling
    shift = s.shift if s.shift is not None or s.schedule == "diffusers" else info.flow_shift
    sched = schedule(s.solver, s.steps, shift, s.schedule,
                     scheduler_config=info.scheduler_config if s.schedule == "diffusers" else None)
    if cfg.video2video.video:           # restyle: the last int(steps x strength) steps (diffusers' get_timesteps)
        sched = restyle_schedule(sched, int(s.steps * cfg.video2video.strength))
    guidance = (s.guidance_scale,)
    boundary_t = None
    if len(info.experts) == 2:
        guidance += (s.guidance_scale_2 if s.guidance_scale_2 is not None else s.guidance_scale,)
        boundary = s.boundary if s.boundary is not None else info.boundary_ratio
        boundary_t = None if boundary is None else boundary * info.num_train_timesteps
    return sched, boundary_t, guidance


def _decode_plan(cfg: RenderConfig, spec: ModelSpec, placed: Target, memory: MemoryPlan,
                 memo: Memo | None, animated=None) -> PlanEstimate:
    """The decode plan within vae.memory_budget (a budget too small for this frame size fails now, not
    after sampling), or for auto what the decode would take: on a GPU under an explicit
    memory.device_budget what the memory plan leaves it, else a fraction of the memory free now (on
    the CPU at most vae.plan.CPU_AUTO_CAP). The decode is exact under any plan.

    Planned on a meta copy of the VAE built from its config.json (no weights read). An Animate render
    decodes a segment at a time (its latents without the reference's frame).
    """
    vae = meta_vae(spec.vae, placed.vae_dtype, memo=memo)
    if animated is not None:
        b, z, t, h, w = animate_render.segment_latent_shape(cfg, spec.info)
        shape = (b, z, t - 1, h, w)
    else:
        shape = spec.info.latent_shape(cfg.width, cfg.height, cfg.num_frames)
    return choose_plan(vae, shape, memory_budget=_decode_budget(cfg, memory), device=placed.device,
                       dtype=placed.vae_dtype, memo=memo, output_bytes=canvas_bytes(vae.config, shape, cfg.output.deep))


def _decode_budget(cfg: RenderConfig, memory: MemoryPlan) -> Budget:
    """vae.memory_budget, or with auto under an explicit memory.device_budget on a GPU, what the
    memory plan leaves the decode (free memory may be more than the budget allows)."""
    if cfg.vae.memory_budget == "auto" and cfg.memory.device_budget != "auto" and memory.device_type != "cpu":
        return memory.decode_budget
    return cfg.vae.memory_budget


def _wan_image_size(cfg: RenderConfig, info: ModelInfo, image) -> RenderConfig:
    """Wan's output size for an image: `size`'s pixel area at the image's aspect ratio.

    I2V-A14B (image2video.py): height and width rounded down to whole patches of the latent grid.
    TI2V-5B (textimage2video.py, best_output_size): width-first or height-first rounding to
    multiples of 32, whichever keeps the aspect ratio better.
    """
    iw, ih = image.size
    area, m = cfg.width * cfg.height, info.size_multiple
    if info.family.size_rule == "best":
        ratio = iw / ih
        w1 = int((area * ratio) ** 0.5 // m * m)
        h1 = int(area / w1 // m * m) if w1 else 0
        h2 = int((area / ratio) ** 0.5 // m * m)
        w2 = int(area / h2 // m * m) if h2 else 0
        err = lambda w, h: max(ratio / (w / h), (w / h) / ratio) if w and h else float("inf")  # noqa: E731
        w, h = (w1, h1) if err(w1, h1) < err(w2, h2) else (w2, h2)
    else:
        s, p = info.vae_scale_spatial, info.patch_size[1]
        h = round((area * ih / iw) ** 0.5 // s // p * p) * s
        w = round((area * iw / ih) ** 0.5 // s // p * p) * s
    if min(w, h) < m or max(w, h) > 8192:
        raise InputError(f"image: {iw}x{ih} is too narrow for size {cfg.size} with image_fit=wan (the output would be "
                         f"{w}x{h}; width and height must be {m}..8192); crop the image closer to the output's shape, "
                         f"or set image_fit=crop")
    if (w, h) != (cfg.width, cfg.height):
        log.info("size %s -> %dx%d: the image's aspect ratio within the same area, as Wan does "
                 "(image_fit=crop keeps %s)", cfg.size, w, h, cfg.size)
    return replace(cfg, size=f"{w}x{h}")
