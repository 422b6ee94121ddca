"""The render pipeline: config -> load -> encode prompt -> denoise -> save latents -> decode -> write.

Numbered stages, one progress callback, one result dataclass. Everything that can be checked
without weights (config, model folder JSON, image file, every output file) is checked first by
`vidgen.preflight`, so bad input costs nothing.
"""

from __future__ import annotations

import json
import logging
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from . import __version__, checkpoint, guard, vae as vae_ops
from .config import RenderConfig, digest, load_config, to_dict
from .denoiser import Expert, ExpertPlacement, WanDenoiser
from .errors import ConfigError, InputError
from .io import VideoWriter
from .loading import (Components, inspect_model, load_components, load_vae, resolve_device, resolve_dtype,
                      resolve_offload)
from .paths import ensure_folder
from .preflight import Plan, preflight
from .prompt import encode_prompts
from .sampling import SamplerState, sample, schedule
from .speed import reset_step_cache

log = logging.getLogger("vidgen")
LATENTS_FORMAT = "vidgen-latents-1"


@dataclass
class Progress:
    """One progress report: `stage` is encode | denoise | decode; `step` of `total` done."""

    stage: str
    step: int
    total: int


ProgressCallback = Callable[[Progress], None]


@dataclass
class RenderResult:
    path: Path                      # the finished video (or PNG frame folder)
    latents_path: Path | None       # sampled latents (None if output.save_latents is false)
    num_frames: int
    fps: int
    width: int
    height: int
    seed: int
    config_digest: str
    timings: dict[str, float] = field(default_factory=dict)   # seconds per stage
    peak_memory_bytes: int = 0      # CUDA: max allocated during the render; CPU: process peak RSS
    peak_memory_kind: str = "cpu-rss"
    guard: dict | None = None       # the guard's report (scores per check) when it ran


# --------------------------------------------------------------------------------------------
# Stages


def _prepare_image(image, width: int, height: int, fit: str, variant: str) -> torch.Tensor:
    """PIL image -> [1, 3, H, W] in [-1, 1], resized the way `fit` says (see RenderConfig.image_fit)."""
    import numpy as np
    from PIL import Image

    def to_tensor(im) -> torch.Tensor:
        x = torch.from_numpy(np.asarray(im, dtype=np.uint8).copy()).permute(2, 0, 1).float().div(255)
        return x.sub(0.5).div(0.5)[None]

    if fit == "wan" and variant == "wan2.2-i2v-a14b":      # bicubic on the whole image (no crop)
        return torch.nn.functional.interpolate(to_tensor(image), size=(height, width), mode="bicubic")
    if fit == "wan":                                       # LANCZOS to cover, then centre crop
        iw, ih = image.size
        scale = max(width / iw, height / ih)
        image = image.resize((round(iw * scale), round(ih * scale)), Image.LANCZOS)
        x0, y0 = (image.width - width) // 2, (image.height - height) // 2
        return to_tensor(image.crop((x0, y0, x0 + width, y0 + height)))
    from diffusers.video_processor import VideoProcessor

    iw, ih = image.size
    target = width / height
    if abs(iw / ih - target) > 0.01:
        cw, ch = (round(ih * target), ih) if iw / ih > target else (iw, round(iw / target))
        left, top = (iw - cw) // 2, (ih - ch) // 2
        log.info("image %dx%d centre-cropped to %dx%d to match the %dx%d output", iw, ih, cw, ch, width, height)
        image = image.crop((left, top, left + cw, top + ch))
    return VideoProcessor(vae_scale_factor=8).preprocess(image, height=height, width=width).to(torch.float32)


def _image_condition(c: Components, plan: Plan, latents: torch.Tensor):
    """I2V: (concat [B, 4+z, T, h, w], None); TI2V: (None, (condition, first-frame mask)); T2V: (None, mask|None)."""
    info, cfg = plan.info, plan.config
    _, _, T, h, w = latents.shape
    if info.expand_timesteps:
        mask = torch.ones(1, 1, T, h, w, device=latents.device)
        if plan.image is None:
            return None, (None, mask)
        image = _prepare_image(plan.image, cfg.width, cfg.height, cfg.image_fit, info.variant)
        cond = vae_ops.normalize(c.vae, vae_ops.encode(c.vae, image[:, :, None]).float()).to(latents.device)
        mask[:, :, 0] = 0
        return None, (cond, mask)
    if plan.image is None:
        return None, None
    image = _prepare_image(plan.image, cfg.width, cfg.height, cfg.image_fit, info.variant)   # [1, 3, H, W]
    video = torch.cat([image[:, :, None], image.new_zeros(1, 3, cfg.num_frames - 1, cfg.height, cfg.width)], dim=2)
    cond = vae_ops.normalize(c.vae, vae_ops.encode(c.vae, video).float()).to(latents.device)   # [1, z, T, h, w]
    mask = torch.zeros(1, info.vae_scale_temporal, T, h, w, device=latents.device)
    mask[:, :, 0] = 1                                                          # the given frame is known
    return torch.cat([mask, cond], dim=1).expand(latents.shape[0], -1, -1, -1, -1), None


def _save_latents(latents: torch.Tensor, plan: Plan) -> Path:
    meta = {"format": LATENTS_FORMAT, "vidgen_version": __version__,
            "config": json.dumps(to_dict(plan.config)), "variant": plan.info.variant}
    if plan.job is not None:
        meta["job"] = json.dumps(plan.job, sort_keys=True)
    path = plan.latents_path
    checkpoint.write_safetensors(path, {"latents": latents.float()}, meta, f"cannot write latents to {path}",
                                 root=plan.config.output.root)
    return path


def _decode_and_write(vae, latents: torch.Tensor, plan: Plan, callback: ProgressCallback,
                      timings: dict[str, float]) -> tuple[int, dict | None]:
    """Stage 5+6: decode model-space latents and stream frames through the guard into the writer.

    Returns (frames written, the guard's report or None); `timings` gains decode_write. The
    sidecar is written by the writer before it renames the video into place. A clip the guard
    blocks, or a guard error, raises inside the writer, which then deletes its partial file:
    nothing reaches the output path.
    """
    cfg = plan.config
    meta = {"title": cfg.prompt[:250],
            "comment": json.dumps({"prompt": cfg.prompt, "negative_prompt": cfg.negative_prompt, "seed": plan.seed,
                                   "config_digest": digest(cfg), "vidgen": __version__})}
    total = cfg.num_frames
    t0 = time.perf_counter()
    callback(Progress("decode", 0, total))
    device = next(vae.parameters()).device
    z = vae_ops.denormalize(vae, latents.to(device, torch.float32))
    if plan.codec in ("gif", "png"):
        meta = None                      # these keep no container metadata: the JSON sidecar has it all
    checks = guard.frame_guard(cfg.guard, fps=cfg.fps, width=cfg.width, height=cfg.height,
                               device=device)
    report = None

    def sidecar() -> dict:
        timings["decode_write"] = time.perf_counter() - t0
        return _sidecar(plan, writer.frames_written, timings, report)

    ensure_folder(plan.output, cfg.output.root)
    with VideoWriter(plan.output, fps=cfg.fps, width=cfg.width, height=cfg.height, codec=plan.codec,
                     crf=cfg.output.crf, pix_fmt=cfg.output.pix_fmt, metadata=meta, overwrite=cfg.output.overwrite,
                     root=cfg.output.root, sidecar=sidecar) as writer:
        frames = vae_ops.iter_frames(vae, z, memory_budget=cfg.vae.memory_budget, kernels=cfg.vae.kernels)
        for i, frame in enumerate(frames, 1):
            for ready in (checks.push(frame) if checks else [frame]):
                writer.write(ready.numpy())
            callback(Progress("decode", i, total))
        if checks:
            rest, found = checks.finish()
            for ready in rest:
                writer.write(ready.numpy())
            log.info("guard: %s", found.summary())
            guard.enforce(found)
            report = found.to_dict()
    return writer.frames_written, report


def _peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda-allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "cpu-rss"


def _sidecar(plan: Plan, frames: int, timings: dict, report: dict | None) -> dict:
    cfg = plan.config
    sidecar = {"prompt": cfg.prompt, "negative_prompt": cfg.negative_prompt, "seed": plan.seed,
               "config_digest": digest(cfg), "variant": plan.info.variant,
               "num_frames": frames, "fps": cfg.fps, "size": [cfg.width, cfg.height],
               "timings": timings, "vidgen": __version__, "config": to_dict(cfg)}
    if plan.job is not None:
        sidecar["job"] = plan.job
    if report is not None:
        sidecar["guard"] = report
    return sidecar


def _result(plan: Plan, written: tuple[int, dict | None], timings: dict, device: torch.device,
            latents_written: bool) -> RenderResult:
    cfg = plan.config
    frames, report = written
    peak, kind = _peak_memory(device)
    keep = cfg.output.save_latents or not latents_written
    if not keep:
        plan.latents_path.unlink(missing_ok=True)      # this render wrote it: it may delete it
    return RenderResult(path=plan.output, latents_path=plan.latents_path if keep else None,
                        num_frames=frames, fps=cfg.fps, width=cfg.width, height=cfg.height, seed=plan.seed,
                        config_digest=digest(cfg), timings=timings, peak_memory_bytes=peak, peak_memory_kind=kind,
                        guard=report)


def _no_progress(_: Progress) -> None:
    pass


class StopRender(Exception):
    """Raised by a progress callback to stop a render after the current step (a queue's cancel,
    pause or shutdown). During sampling the sampler state is checkpointed first, so
    `render(..., resume=True)` continues from that step; during decode the partial video is
    deleted and the saved latents remain."""


class Pipeline:
    """A loaded Wan pipeline; `generate` renders many clips without reloading the models."""

    def __init__(self, components: Components, config: RenderConfig):
        self.components = components
        self.config = config

    @classmethod
    def from_config(cls, config: str | Path | dict | RenderConfig | None = None, *, overrides: Any = None,
                    **kwargs) -> "Pipeline":
        """Validate `config` (+ overrides / keyword overrides), then load the model it names."""
        cfg = load_config(config, _merge_overrides(overrides, kwargs))
        preflight(cfg)
        return cls.load(cfg)

    @classmethod
    def load(cls, cfg: RenderConfig) -> "Pipeline":
        """Load the model `cfg` names (a config preflight has passed), with its speed settings applied."""
        info = inspect_model(cfg.model.path)
        device = resolve_device(cfg.model.device)
        dtype = resolve_dtype(cfg.model.dtype, device)
        offload = resolve_offload(cfg.model.offload, info, device, dtype)
        components = load_components(info, device, dtype, resolve_dtype(cfg.vae.dtype, device), offload)
        if cfg.speed.engaged():
            from .speed import apply_speed

            apply_speed(components, cfg.speed)
        return cls(components, cfg)

    def loaded_for(self, cfg: RenderConfig) -> bool:
        """Whether `cfg` renders with this pipeline as loaded (the same model, vae and speed settings)."""
        return cfg.model == self.config.model and cfg.vae == self.config.vae and cfg.speed == self.config.speed

    def generate(self, config: str | Path | dict | RenderConfig | None = None, *,
                 callback: ProgressCallback | None = None, overrides: Any = None, **kwargs) -> RenderResult:
        """Render one clip. `config` replaces the pipeline's config; overrides apply on top.

        Returns:
            RenderResult with the output path, frame count, seed, timings and peak memory.
        """
        cfg = load_config(self.config if config is None else config, _merge_overrides(overrides, kwargs))
        if not self.loaded_for(cfg):
            raise ConfigError("model/vae/speed settings differ from the loaded pipeline's; create a new Pipeline for them")
        return self.run(preflight(cfg, self.components.info), callback or _no_progress)

    @torch.no_grad()
    def run(self, plan: Plan, callback: ProgressCallback) -> RenderResult:
        c, cfg, timings = self.components, plan.config, {}
        if c.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(c.device)
        ensure_folder(plan.output, cfg.output.root)      # checkpoints and latents are written beside the video

        # 1. Encode the prompt (and the negative prompt when any expert uses guidance).
        t0 = time.perf_counter()
        callback(Progress("encode", 0, 1))
        scales = [cfg.sampling.guidance_scale]
        if len(c.experts) == 2:
            scales.append(cfg.sampling.guidance_scale_2 if cfg.sampling.guidance_scale_2 is not None
                          else cfg.sampling.guidance_scale)
        use_cfg = any(s > 1.0 for s in scales)
        prompts = [cfg.prompt] + ([cfg.negative_prompt] if use_cfg else [])
        offload_te = cfg.model.offload_text_encoder and c.device.type != "cpu"
        if offload_te:
            c.text_encoder.to(c.device)
        embeds = encode_prompts(c.tokenizer, c.text_encoder, prompts, max_sequence_length=cfg.model.max_sequence_length,
                                device=c.device, dtype=c.dtype)
        if offload_te:      # the encoder is not needed again until the next render
            c.text_encoder.to("cpu")
            if c.device.type == "cuda":
                torch.cuda.empty_cache()
        callback(Progress("encode", 1, 1))
        timings["encode"] = time.perf_counter() - t0

        # 2. Initial noise (drawn on the CPU so a seed gives the same clip on every device) and conditions.
        t0 = time.perf_counter()
        info = c.info
        shape = (1, info.z_dim, *info.latent_grid(cfg.width, cfg.height, cfg.num_frames))
        if plan.resume_state is None:
            noise = torch.randn(shape, generator=torch.Generator().manual_seed(plan.seed), dtype=torch.float32)
            latents = noise.to(c.device)                                       # [1, z, T, h, w]
        else:
            latents = plan.resume_state.latents.to(c.device)
        concat, first_frame = _image_condition(c, plan, latents)

        # 3. Denoise, saving the sampler state every `checkpoint_every` steps.
        s = cfg.sampling
        boundary = s.boundary if s.boundary is not None else info.boundary_ratio
        experts = [Expert(m, g) for m, g in zip(c.experts, scales)]
        shift = s.shift if s.shift is not None or s.schedule == "diffusers" else info.flow_shift
        sched_config = info.scheduler_config if s.schedule == "diffusers" else None
        _, sigmas = schedule(s.solver, s.steps, shift, s.schedule, scheduler_config=sched_config)
        reset_step_cache(c.experts)          # a step cache must not carry state from the last render
        denoiser = WanDenoiser(experts, boundary_t=None if boundary is None or len(experts) == 1
                               else boundary * info.num_train_timesteps,
                               cond=embeds[:1], uncond=embeds[1:] if use_cfg else None,
                               concat=concat, first_frame=first_frame,
                               placement=ExpertPlacement(c.experts, c.device, c.offload_experts),
                               sigmas=sigmas, step_index=plan.resume_state.step if plan.resume_state else 0)
        resume_file = checkpoint.resume_path(plan.output)

        def on_step(i: int, n: int, t, state: SamplerState) -> None:
            saved = bool(s.checkpoint_every) and (i + 1) % s.checkpoint_every == 0 and i + 1 < n
            if saved:
                checkpoint.save(resume_file, state, cfg)
            try:
                callback(Progress("denoise", i + 1, n))
            except StopRender:          # asked to stop: keep this step, so a resume loses nothing
                if i + 1 < n and not saved:
                    checkpoint.save(resume_file, state, cfg)
                raise

        callback(Progress("denoise", plan.resume_state.step if plan.resume_state else 0, s.steps))

        latents = sample(denoiser, latents, solver=s.solver, steps=s.steps, shift=shift, kind=s.schedule,
                         scheduler_config=sched_config, callback=on_step, state=plan.resume_state)
        latents = denoiser.apply_condition(latents)
        timings["denoise"] = time.perf_counter() - t0

        # 4. Save the latents before decoding, so a failed decode never loses the sampling.
        _save_latents(latents, plan)
        resume_file.unlink(missing_ok=True)

        # 5-6. Decode and stream frames to the video file (its sidecar first).
        written = _decode_and_write(c.vae, latents, plan, callback, timings)
        return _result(plan, written, timings, c.device, latents_written=True)


def _merge_overrides(overrides: Any, kwargs: dict) -> Any:
    if overrides is None:
        return kwargs or None
    if not kwargs or not isinstance(overrides, (dict, list, tuple)):
        return overrides                # load_config says what is wrong with any other kind
    if isinstance(overrides, dict):
        return {**overrides, **kwargs}
    return list(overrides) + [f"{k}={json.dumps(v) if isinstance(v, str) else v}" for k, v in kwargs.items()]


def render(config: str | Path | dict | RenderConfig | None = None, *, callback: ProgressCallback | None = None,
           overrides: Any = None, resume: bool | str | Path | None = None, **kwargs) -> RenderResult:
    """Render one clip from a config (path, dict or RenderConfig) with optional overrides.

    `vidgen.render("configs/tiny.yaml", prompt="a fox", **{"sampling.steps": 4})`

    Args:
        resume: continue an interrupted render from a checkpoint: its path, or True for the newest
            `*.resume.safetensors` in the output folder. Settings must match the checkpoint's.
    """
    cfg = load_config(config, _merge_overrides(overrides, kwargs))
    state = None
    if resume:
        source = checkpoint.find(cfg) if resume is True else Path(resume).expanduser()
        cfg, state = checkpoint.resume_from(cfg, source)
        log.info("resuming %s at step %d of %d", source, state.step, state.steps)
    plan = preflight(cfg, own=(Path(source).absolute(),) if resume else ())
    plan.resume_state = state
    return Pipeline.load(cfg).run(plan, callback or _no_progress)


def read_latents(path: str | Path) -> tuple[torch.Tensor, dict]:
    """Load a latents file written by a render: (latents [1, z, T, h, w], its config as a dict)."""
    tensors, meta = checkpoint.read_safetensors(path, LATENTS_FORMAT, "vidgen latents file",
                                                f"is not a vidgen latents file (no '{LATENTS_FORMAT}' metadata)")
    if "latents" not in tensors:
        raise InputError(f"cannot read {str(path)!r} as a vidgen latents file (no 'latents' tensor)")
    latents = tensors["latents"]
    return latents, json.loads(meta["config"])


def decode_latents(path: str | Path, *, callback: ProgressCallback | None = None, overrides: Any = None,
                   **kwargs) -> RenderResult:
    """Finish a render from its saved latents: decode and write the video the config names."""
    latents, saved = read_latents(path)
    cfg = load_config(saved, _merge_overrides(overrides, kwargs))
    info = inspect_model(cfg.model.path)
    plan = preflight(cfg, info, own=(Path(path).absolute(),))
    expected = (1, info.z_dim, *info.latent_grid(cfg.width, cfg.height, cfg.num_frames))
    if tuple(latents.shape) != expected:
        raise InputError(f"latents shape {list(latents.shape)} does not match the config (expected {list(expected)})")
    plan.latents_path = Path(path)
    device = resolve_device(cfg.model.device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    vae = load_vae(info, device, resolve_dtype(cfg.vae.dtype, device))
    timings: dict[str, float] = {}
    written = _decode_and_write(vae, latents, plan, callback or _no_progress, timings)
    return _result(plan, written, timings, device, latents_written=False)
