"""An Animate render's own stages: its checks in preflight, and its sampling and frames in the pipeline.

Wan2.2-Animate renders in segments that each condition on the frames the one before decoded
(vidgen.animate), so it cannot sample one latent clip and decode it afterwards as the other families
do. `check` (called by preflight, no weights read) checks the driving videos (vidgen.animate_inputs:
every problem at once), cuts the performance into segments and sets the clip's length to the pose
video's; `render` (called by the pipeline's run, the model loaded) reads the videos, samples segment by
segment with a checkpoint (the finished segments' latents and the sampler state) every
`sampling.checkpoint_every` steps, decodes each segment with vidgen's memory-bounded exact decoder,
and hands the frames to the delivery stage (vidgen.deliver), which writes them as any render's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Callable

import torch

from .animate import (AnimateResume, Segments, animate, clip_image_tokens, decode_segments, plan_segments,
                      prepare_pixels)
from .animate_config import segment_latent_shape
from .animate_inputs import read_inputs, scan_inputs
from .config import RenderConfig
from .errors import ConfigError
from .families import FAMILIES
from .vae import decode, to_uint8, to_uint16

log = logging.getLogger("vidgen")
DEFAULT_FRAMES = RenderConfig.__dataclass_fields__["num_frames"].default


@dataclass(frozen=True)
class AnimatePlan:
    """What preflight worked out for an Animate render (Plan.animate)."""

    segments: Segments
    face_size: int                  # the motion encoder's input size (face crops are face_size x face_size)
    given_frames: int = DEFAULT_FRAMES  # num_frames as configured (kept in a checkpoint's and a latents file's
                                        # config: a resume or a decode reads the pose video again)


def model_problems(cfg, info) -> list[str]:
    """What an Animate model cannot do, or a non-Animate model is asked to (no file read)."""
    if not info.family.animate:
        if not cfg.animate.engaged:
            return []
        takes = ", ".join(f.name for f in FAMILIES.values() if f.animate)
        return [f"animate: {info.variant} has no pose or face inputs; use an Animate model ({takes}) or remove animate"]
    out = [] if cfg.animate.engaged else [
        f"animate.pose_video: {info.variant} is driven by a pose video and a face video (animate.pose_video, "
        "animate.face_video; docs/animate.md says how to make them)"]
    conflicts = {"control": cfg.control.engaged, "video2video.video": bool(cfg.video2video.video),
                 "image_frames": bool(cfg.image_frames), "last_image": bool(cfg.last_image)}
    out += [f"{key}: an Animate render does not take it (its segments condition on the frames they decode); "
            "remove it" for key, on in conflicts.items() if on]
    if cfg.parallel.devices > 1:
        out.append("parallel: an Animate render runs on one device; remove parallel")
    return out


def check(cfg, info, pending: dict | None = None):
    """(cfg with num_frames = the pose video's frame count, the AnimatePlan), or (cfg, None) for another
    model; ConfigError with every problem of the driving videos at once (vidgen.animate_inputs)."""
    if not info.family.animate:
        return cfg, None
    a = cfg.animate
    face_size = int(info.config("transformer").get("motion_encoder_size", 512))
    problems, frames = scan_inputs(mode=a.mode, pose_video=a.pose_video, face_video=a.face_video,
                                   background_video=a.background_video, mask_video=a.mask_video, image=cfg.image,
                                   width=cfg.width, height=cfg.height, face_size=face_size, fps=cfg.fps,
                                   segment_frames=a.segment_frames, overlap_frames=a.overlap_frames, pending=pending)
    if problems:
        raise ConfigError(problems)
    if cfg.num_frames not in (frames, DEFAULT_FRAMES):      # the schema's default is no choice the user made
        log.warning("num_frames: %d is not used: an Animate clip has the pose video's %d frames", cfg.num_frames,
                    frames)
    if cfg.output.decode == "preview":
        log.info("output.decode: preview: an Animate render decodes every segment in full (the next segment is "
                 "conditioned on its frames), so its frames are the full decode")
    segments = plan_segments(frames, a.segment_frames, a.overlap_frames)
    log.info("animate: %d frames in %d segment(s) of %d frames, %d carried over", frames, segments.num_segments,
             a.segment_frames, a.overlap_frames)
    return replace(cfg, num_frames=frames), AnimatePlan(segments, face_size, cfg.num_frames)


def render(c, residency, plan, embeds: torch.Tensor, on_step: Callable) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Sample every segment and decode it: (the clip's frames, uint8 [H, W, 3] host tensors (uint16 with
    output.deep); the segments' latents stacked [segments, z, 1 + T, h, w], what a latents file holds).
    `c`: loading.Components; `on_step(segment, StepReport)` after every step (its state carries the
    finished segments, all a checkpoint needs). The reference is preflight's (plan.image), not read again."""
    cfg, a, ap = plan.config, plan.config.animate, plan.animate
    inputs = read_inputs(mode=a.mode, pose_video=a.pose_video, face_video=a.face_video,
                         background_video=a.background_video, mask_video=a.mask_video)
    info = c.info
    pixels = prepare_pixels(plan.image, inputs.pose_video, inputs.face_video, ap.segments, height=cfg.height,
                            width=cfg.width, face_size=ap.face_size, background_video=inputs.background_video,
                            mask_video=inputs.mask_video, vae_scale=info.vae_scale_spatial,
                            patch=tuple(info.patch_size[1:]), lazy=True)
    model, processor = c.image_encoder
    with residency.visit("image_encoder", model, "encode"):
        tokens = clip_image_tokens(model, processor, plan.image).to(c.device)
    guidance = plan.guidance[0]
    generator = torch.Generator("cpu").manual_seed(plan.seed)      # one clip for a seed on every device
    state = plan.resume_state
    resume = AnimateResume.of(state) if state is not None else None
    frames, keep, decoded = _collector(c.vae, plan)
    with residency.visit("vae", c.vae, "encode"):       # each segment encodes and decodes with it
        result = animate(c.experts[0], c.vae, plan.schedule, pixels, ap.segments, prompt_embeds=embeds[:1],
                         negative_prompt_embeds=embeds[1:] if guidance > 1 and len(embeds) > 1 else None,
                         guidance_scale=guidance, image_tokens=tokens, generator=generator, device=c.device,
                         callback=on_step, resume=resume, decode=decoded, on_frames=keep)
    return frames, torch.cat(result.segment_latents)


def _collector(vae, plan) -> tuple[list, Callable, Callable]:
    """(the frames list, an on_frames that fills it with host frames, the exact decode on the tile plan
    preflight made for a segment within its budget)."""
    frames: list[torch.Tensor] = []
    to_host = to_uint16 if plan.config.output.deep else to_uint8

    def keep(_: int, video: torch.Tensor) -> None:
        frames.extend(to_host(video[0].movedim(1, 0)).cpu().unbind(0))

    def decoded(latents: torch.Tensor) -> torch.Tensor:
        return decode(vae, latents, space="model", kernels=plan.target.kernels, plan=plan.decode)
    return frames, keep, decoded


def latents_shape(plan) -> tuple[int, ...]:
    """What an Animate render's latents file holds: every segment's latents, [segments, z, 1 + T, h, w]."""
    _, z, t, h, w = segment_latent_shape(plan.config, plan.info)
    return (plan.animate.segments.num_segments, z, t, h, w)


def frames_of(vae, latents: torch.Tensor, plan) -> list[torch.Tensor]:
    """The clip's frames from a saved Animate latents file's tensor (latents_shape), decoded segment by
    segment as the render did (no transformer)."""
    frames, keep, decoded = _collector(vae, plan)
    param = next(vae.parameters())
    decode_segments([lat[None].to(param.device) for lat in latents], plan.animate.segments, decoded, keep)
    return frames
