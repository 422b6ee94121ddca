"""Wan2.2-Animate: character animation and replacement, sampled segment by segment with vidgen's solver.

The inputs of diffusers' ``WanAnimatePipeline`` turned into what ``WanAnimateTransformer3DModel`` gets,
step for step as that pipeline builds them, so that `animate` reproduces it (tests/test_animate.py):

- the reference (character) image: its latents behind an all-ones 4-channel mask, one latent frame
  [B, 4 + z, 1, h, w], and its CLIP image tokens (penultimate hidden states) for the image cross-attention;
- the pose video: its latents [B, z, T, h, w], added to the patch embeddings of the T generated frames;
- the face video: face crops in [-1, 1] at the motion encoder's size [B, 3, F, S, S], turned into motion
  tokens inside the transformer (classifier-free guidance blanks them to -1 for the unconditional branch);
- per segment a condition [B, 4 + z, T, h, w]: the last `prev_segment_conditioning_frames` decoded frames
  of the previous segment (marked known in the mask), then zeros (mode "animate") or the background video
  (mode "replace", whose mask marks the background known outside the character: 1 - mask video).

The clip is made in segments of `segment_frame_length` frames that overlap by
`prev_segment_conditioning_frames`: segment k covers frames [k E, k E + L) with E = L - P, and only its
frames after the first P are kept (segment 0 keeps all). The driving videos are padded to P + n E frames
by reflection (`pad_frames`) and the output is cut back to their length. Each segment draws fresh noise
[B, z, 1 + T, h, w] from the one generator (the VAE encodes take the posterior mode and draw nothing),
is sampled from scratch with the same schedule, and is decoded (its first latent frame, the reference,
dropped) before the next segment can be conditioned on it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from .errors import ConfigError, NonFiniteOutput
from .sampling import SamplerState, Schedule, StepReport, sample
from .vae import denormalize, encode, normalize

MODES = ("animate", "replace")
PREV_SEGMENT_FRAMES = (1, 5)        # what WanAnimatePipeline accepts for prev_segment_conditioning_frames
TEMPORAL = 4                        # Wan VAE: 4 video frames a latent frame (after the first)


# ------------------------------------------------------------------------------------------ segments

@dataclass(frozen=True)
class Segments:
    """How a clip of `num_frames` driving frames is cut into overlapping segments (WanAnimatePipeline's rule)."""

    num_frames: int                 # frames of the pose video = frames of the output
    segment_frame_length: int       # L, frames each segment generates (4n + 1)
    prev_frames: int                # P, frames each later segment takes over from the previous one
    num_target_frames: int          # the driving videos padded to P + n (L - P) frames
    num_segments: int

    @property
    def stride(self) -> int:
        """E = L - P: how far each segment starts after the previous one."""
        return self.segment_frame_length - self.prev_frames

    def window(self, k: int) -> tuple[int, int]:
        """Frames [start, end) of the padded driving videos that segment k covers."""
        start = k * self.stride
        return start, start + self.segment_frame_length


def plan_segments(num_frames: int, segment_frame_length: int, prev_frames: int) -> Segments:
    """The segments of a clip, as WanAnimatePipeline counts them; ConfigError lists every bad value
    (where diffusers rounds `segment_frame_length` to 4n + 1 with a warning, this refuses it)."""
    problems = []
    if segment_frame_length < 1 or segment_frame_length % TEMPORAL != 1:
        problems.append(f"segment_frame_length: {segment_frame_length} must be 4n + 1 (e.g. 77)")
    if prev_frames not in PREV_SEGMENT_FRAMES:
        problems.append(f"prev_segment_conditioning_frames: {prev_frames} must be one of {PREV_SEGMENT_FRAMES}")
    elif segment_frame_length - prev_frames <= prev_frames:
        problems.append(f"segment_frame_length: {segment_frame_length} must exceed twice "
                        f"prev_segment_conditioning_frames ({prev_frames}) so that segments advance")
    if num_frames <= prev_frames:
        problems.append(f"pose_video: {num_frames} frames; needs more than prev_segment_conditioning_frames "
                        f"({prev_frames})")
    if problems:
        raise ConfigError(problems)
    stride = segment_frame_length - prev_frames
    rest = (num_frames - prev_frames) % stride
    target = num_frames + (stride - rest if rest else 0)
    return Segments(num_frames, segment_frame_length, prev_frames, target, target // stride)


def pad_frames(frames: Sequence, num_target_frames: int) -> list:
    """`frames` extended to `num_target_frames` by bouncing back and forth (1 2 3 -> 1 2 3 2 1 2 ...),
    as WanAnimatePipeline.pad_video_frames pads its driving videos."""
    if len(frames) < 2 and num_target_frames > len(frames):
        raise ConfigError(f"driving video: {len(frames)} frame(s) cannot be padded to {num_target_frames}")
    out, idx, step = [], 0, 1
    while len(out) < num_target_frames:
        out.append(frames[idx])         # the same frame object again: nothing downstream changes a frame
        idx += step
        if idx == 0 or idx == len(frames) - 1:
            step = -step
    return out


# ------------------------------------------------------------------------------------------ pixels

class SegmentVideo:
    """A driving video whose frames are preprocessed a segment at a time: `video[:, :, start:end]` gives
    [1, C, end - start, H, W] float32, the very values of slicing the whole clip preprocessed at once
    (each frame is resized and normalised on its own), so that a long performance never holds more
    than one segment's float frames."""

    def __init__(self, frames: Sequence, processor, height: int, width: int):
        self.frames, self.processor, self.height, self.width = frames, processor, height, width

    def __getitem__(self, key) -> torch.Tensor:
        window = key[2] if isinstance(key, tuple) and len(key) == 3 else None
        if not (isinstance(window, slice) and window.step in (None, 1) and all(k == slice(None) for k in key[:2])):
            raise TypeError("SegmentVideo takes [:, :, start:end] only")
        frames = self.frames[window]
        return self.processor.preprocess_video(frames, height=self.height, width=self.width).float()


@dataclass(frozen=True)
class AnimatePixels:
    """The pixel inputs of an Animate render, preprocessed as WanAnimatePipeline does (float32, [-1, 1]
    unless noted), the driving videos padded to the segments' length: tensors, or SegmentVideo (`lazy`),
    which preprocess a segment's frames when it is sliced."""

    image: torch.Tensor                     # [1, 3, H, W], the reference resized to fit and zero-filled
    pose: torch.Tensor | SegmentVideo       # [1, 3, N', H, W]
    face: torch.Tensor | SegmentVideo       # [1, 3, N', S, S]
    background: torch.Tensor | SegmentVideo | None      # [1, 3, N', H, W] (mode "replace")
    mask: torch.Tensor | SegmentVideo | None            # [1, 1, N', H, W] in [0, 1], 1 where the character goes


def prepare_pixels(image, pose_video: Sequence, face_video: Sequence, segments: Segments, *, height: int, width: int,
                   face_size: int, background_video: Sequence | None = None, mask_video: Sequence | None = None,
                   vae_scale: int = 8, patch: tuple[int, int] = (2, 2), lazy: bool = False) -> AnimatePixels:
    """PIL inputs -> AnimatePixels with diffusers' own processors (WanAnimateImageProcessor for the
    reference, bilinear fit-and-fill; VideoProcessor for the videos; grayscale, unnormalised for the mask).
    `lazy`: the videos preprocessed a segment at a time (SegmentVideo), the same values."""
    from diffusers.pipelines.wan.image_processor import WanAnimateImageProcessor
    from diffusers.video_processor import VideoProcessor

    if height % 16 or width % 16:
        raise ConfigError(f"height, width: {height}x{width} must both be multiples of 16")
    if (background_video is None) != (mask_video is None):
        raise ConfigError("background_video and mask_video: give both (mode 'replace') or neither")
    n = segments.num_target_frames
    videos = VideoProcessor(vae_scale_factor=vae_scale)

    def video(frames, processor, h, w):
        clip = SegmentVideo(pad_frames(frames, n), processor, h, w)
        return clip if lazy else clip[:, :, 0:n]

    ref = WanAnimateImageProcessor(vae_scale_factor=vae_scale, spatial_patch_size=tuple(patch), resample="bilinear",
                                   fill_color=0).preprocess(image, height=height, width=width, resize_mode="fill")
    pose = video(pose_video, videos, height, width)
    face = video(face_video, videos, face_size, face_size)
    background = mask = None
    if background_video is not None:
        background = video(background_video, videos, height, width)
        masks = VideoProcessor(vae_scale_factor=vae_scale, do_normalize=False, do_convert_grayscale=True)
        mask = video(mask_video, masks, height, width)
    return AnimatePixels(ref.float(), pose, face, background, mask)


@torch.no_grad()
def clip_image_tokens(image_encoder, image_processor, image) -> torch.Tensor:
    """The reference image's CLIP tokens [1, 1 + patches, dim]: penultimate hidden states of the vision
    model (ViT-H/14 in Wan2.2-Animate: 257 tokens of 1280), as WanAnimatePipeline.encode_image."""
    param = next(image_encoder.parameters())
    pixels = image_processor(images=image, return_tensors="pt").to(param.device)
    return image_encoder(**pixels, output_hidden_states=True).hidden_states[-2]


# ------------------------------------------------------------------------------------------ latents

def known_mask(mask: torch.Tensor, num_known: int) -> torch.Tensor:
    """Pixel-frame mask [B, 1, 1 + 4(T-1), h, w] (1 = known) -> latent mask [B, 4, T, h, w]: the first
    `num_known` frames set known, the first frame repeated 4 times so that each latent frame holds 4."""
    mask = mask.clone()
    mask[:, :, :num_known] = 1
    mask = torch.cat([mask[:, :, :1].repeat_interleave(TEMPORAL, dim=2), mask[:, :, 1:]], dim=2)
    b, _, f, h, w = mask.shape
    return mask.view(b, f // TEMPORAL, TEMPORAL, h, w).transpose(1, 2)


def reference_latents(vae, image: torch.Tensor) -> torch.Tensor:
    """Reference image [B, 3, H, W] -> [B, 4 + z, 1, h, w]: an all-known mask, then its latents."""
    lat = normalize(vae, encode(vae, image[:, :, None]))                   # [B, z, 1, h, w]
    b, _, _, h, w = lat.shape
    return torch.cat([lat.new_ones(b, TEMPORAL, 1, h, w), lat], dim=1)


def pose_latents(vae, pose: torch.Tensor) -> torch.Tensor:
    """Pose video segment [B, 3, L, H, W] -> its latents [B, z, T, h, w], T = (L - 1) / 4 + 1."""
    return normalize(vae, encode(vae, pose))


def segment_condition(vae, prev: torch.Tensor | None, num_frames: int, *, height: int, width: int,
                      num_known: int, background: torch.Tensor | None = None,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
    """A segment's condition [B, 4 + z, T, h, w]: mask, then the latents of the segment's condition video.

    Args:
        prev: the previous segment's last decoded frames [B, 3, P, H, W], or None for the first segment
            (whose condition video is then all background, or all zeros).
        num_frames: L, the segment's frames.
        num_known: frames marked known in the mask (P for later segments, 0 for the first).
        background: mode "replace": the segment's background [B, 3, L, H, W]; it fills frames P.. of the
            condition video (zeros in mode "animate").
        mask: mode "replace": the segment's character mask [B, 1, L, H, W] in [0, 1]; 1 - mask, nearest
            down to the latent grid, is the known region of every frame.
    """
    dtype = next(vae.parameters()).dtype
    if prev is None:       # diffusers' first P frames of zeros (background), then the rest: all zeros (background)
        video = background if background is not None else torch.zeros(1, 3, num_frames, height, width)
    else:
        if prev.shape[-2:] != (height, width):
            raise ConfigError(f"previous segment frames are {tuple(prev.shape[-2:])}, not {(height, width)}")
        p = prev.shape[2]
        prev = prev.to(next(vae.parameters()).device)
        rest = (background[:, :, p:].to(prev.device) if background is not None
                else prev.new_zeros(prev.shape[0], 3, num_frames - p, height, width))
        video = torch.cat([prev.to(dtype), rest.to(dtype)], dim=2)                 # [B, 3, L, H, W]
    video = video.to(dtype)
    lat = normalize(vae, encode(vae, video))                                     # [B, z, T, h, w]
    _, _, t, h, w = lat.shape
    if mask is None:
        known = lat.new_zeros(lat.shape[0], 1, (t - 1) * TEMPORAL + 1, h, w)
    else:
        frames = (1 - mask).permute(0, 2, 1, 3, 4).flatten(0, 1)                  # [B L, 1, H, W]
        known = F.interpolate(frames, size=(h, w), mode="nearest").unflatten(0, (mask.shape[0], -1))
        known = known.permute(0, 2, 1, 3, 4).to(lat.dtype)                       # [B, 1, L, h, w]
    return torch.cat([known_mask(known, num_known), lat], dim=1)


def segment_noise(shape: tuple[int, ...], generator: torch.Generator,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """One segment's starting noise [B, z, 1 + T, h, w], float32, drawn on the generator's device (CPU
    for a seed that must give the same clip everywhere) and moved to `device`: the draw diffusers'
    randn_tensor makes, so successive segments take successive draws of the same generator."""
    return torch.randn(shape, generator=generator, device=generator.device, dtype=torch.float32).to(device)


# ------------------------------------------------------------------------------------------ denoiser

class AnimateDenoiser:
    """velocity_fn(latents, t, i) over WanAnimateTransformer3DModel for one segment (vidgen.sampling.sample).

    Args:
        model: the WanAnimateTransformer3DModel.
        guidance_scale: CFG scale; guided only when > 1 and `uncond` is given (Animate is usually run at 1).
        cond, uncond: prompt embeddings [B, L, D] (uncond: the negative prompt's).
        image_tokens: CLIP tokens of the reference [B, tokens, dim].
        reference: the reference latents + segment condition on frames [B, 4 + z, 1 + T, h, w],
            concatenated to the latents on channels.
        pose: pose latents [B, z, T, h, w].
        face: face pixels [B, 3, L, S, S]; the unconditional branch sees them all -1 (no face).
        motion_encode_batch_size: face frames per motion-encoder batch (None: the model's config).
    """

    def __init__(self, model, *, guidance_scale: float, cond: torch.Tensor, uncond: torch.Tensor | None,
                 image_tokens: torch.Tensor, reference: torch.Tensor, pose: torch.Tensor, face: torch.Tensor,
                 motion_encode_batch_size: int | None = None):
        self.model, self.guidance_scale = model, guidance_scale
        dtype = self.dtype = model.dtype
        self.cond = cond.to(dtype)
        self.uncond = None if uncond is None or guidance_scale <= 1.0 else uncond.to(dtype)
        self.common = {"encoder_hidden_states_image": image_tokens.to(dtype), "pose_hidden_states": pose.to(dtype),
                       "motion_encode_batch_size": motion_encode_batch_size, "return_dict": False}
        self.reference = reference
        self.face = face.to(dtype)

    @torch.no_grad()
    def __call__(self, latents: torch.Tensor, t: torch.Tensor, i: int) -> torch.Tensor:
        """The guided velocity at step i (timestep t, int64 [1])."""
        x = torch.cat([latents, self.reference], dim=1).to(self.dtype)           # [B, 2z + 4, 1 + T, h, w]
        timestep = t.expand(latents.shape[0])
        with self.model.cache_context("cond"):
            velocity = self.model(hidden_states=x, timestep=timestep, encoder_hidden_states=self.cond,
                                  face_pixel_values=self.face, **self.common)[0]
        if self.uncond is not None:
            with self.model.cache_context("uncond"):
                uncond = self.model(hidden_states=x, timestep=timestep, encoder_hidden_states=self.uncond,
                                    face_pixel_values=self.face * 0 - 1, **self.common)[0]
            velocity = uncond + self.guidance_scale * (velocity - uncond)
        if not bool(torch.isfinite(velocity).all()):
            raise NonFiniteOutput(f"step {i + 1}: the Animate transformer's output holds NaN or infinite values")
        return velocity


# ------------------------------------------------------------------------------------------ the loop

@dataclass
class AnimateResume:
    """Where an interrupted Animate render continues: the finished segments' latents (model space) and the
    sampler state inside segment len(done) (None: that segment starts from its noise). Segment k's noise is
    the generator's k-th draw and the finished segments decode again to the same frames, so nothing else
    is needed for the result to equal the uninterrupted one."""

    done: list[torch.Tensor]
    state: SamplerState | None = None

    @classmethod
    def of(cls, state: SamplerState) -> "AnimateResume":
        """The resume point a checkpoint's state gives (its `segments`: the finished ones); a state whose
        steps are all taken is one more finished segment."""
        done = list(state.segments)
        if state.step >= state.steps:
            return cls(done + [state.latents], None)
        return cls(done, replace(state, segments=()))


@dataclass
class AnimateResult:
    """What `animate` returns."""

    video: torch.Tensor | None              # [B, 3, N, H, W] in [-1, 1], N = the pose video's frames (None: on_frames had them)
    segment_latents: list[torch.Tensor]     # each segment's sampled latents [B, z, 1 + T, h, w] (model space)
    segments: Segments


def new_frames(decoded: torch.Tensor, k: int, segments: Segments, emitted: int) -> torch.Tensor:
    """Segment k's frames that go into the clip, of its decoded video [B, 3, L, H, W]: all of the first
    segment's, the later ones' after the P they share with the segment before (diffusers keeps the earlier
    segment's), cut where the clip ends (`emitted`: frames the segments before gave)."""
    new = decoded if k == 0 else decoded[:, :, segments.prev_frames:]
    return new[:, :, :max(0, segments.num_frames - emitted)]


def decode_segments(latents: Sequence[torch.Tensor], segments: Segments, decode: Callable[[torch.Tensor], torch.Tensor],
                    on_frames: Callable[[int, torch.Tensor], None]) -> None:
    """The clip's frames from its segments' sampled latents (each [B, z, 1 + T, h, w], model space), as
    `animate` made them: each segment decoded without the reference's latent frame, its new frames to
    `on_frames`. No transformer is needed: a saved Animate latents file is decoded again so (vidgen decode,
    a reviewed take's full decode)."""
    emitted = 0
    for k, lat in enumerate(latents):
        new = new_frames(decode(lat[:, :, 1:]), k, segments, emitted)
        emitted += new.shape[2]
        on_frames(k, new)


def diffusers_decode(vae) -> Callable[[torch.Tensor], torch.Tensor]:
    """Model-space latents -> video in [-1, 1] with the VAE's own untiled decode (WanAnimatePipeline's)."""
    def decode(latents: torch.Tensor) -> torch.Tensor:
        dtype = next(vae.parameters()).dtype
        return vae.decode(denormalize(vae, latents.to(dtype)), return_dict=False)[0]
    return decode


@torch.no_grad()
def animate(transformer, vae, sched: Schedule, pixels: AnimatePixels, segments: Segments, *,
            prompt_embeds: torch.Tensor, image_tokens: torch.Tensor, generator: torch.Generator,
            negative_prompt_embeds: torch.Tensor | None = None, guidance_scale: float = 1.0,
            motion_encode_batch_size: int | None = None, device: torch.device | str = "cpu",
            callback: Callable[[int, StepReport], None] | None = None,
            resume: AnimateResume | None = None, decode: Callable[[torch.Tensor], torch.Tensor] | None = None,
            on_frames: Callable[[int, torch.Tensor], None] | None = None) -> AnimateResult:
    """Sample a Wan2.2-Animate clip segment by segment, as WanAnimatePipeline does (one video).

    Args:
        transformer, vae: WanAnimateTransformer3DModel and AutoencoderKLWan, on `device`.
        sched: the schedule every segment walks from scratch (diffusers' grid: ``schedule("unipc", steps,
            None, "diffusers", scheduler_config=<the folder's scheduler_config>)``).
        pixels: `prepare_pixels`' output (mode "replace" when it has a background).
        segments: `plan_segments(len(pose_video), segment_frame_length, prev_segment_conditioning_frames)`.
        prompt_embeds, negative_prompt_embeds: [1, L, D] text embeddings.
        image_tokens: `clip_image_tokens` of the reference [1, tokens, dim].
        generator: the seed's generator; segment k's noise is its k-th draw.
        callback: called with (segment index, StepReport) after every step; the report's state carries the
            finished segments' latents (`state.segments`), so it is all a checkpoint needs (AnimateResume.of).
        resume: continue an interrupted render: its finished segments are decoded again (their frames
            condition the next), not encoded or sampled.
        decode: model-space latents [B, z, T, h, w] -> video [B, 3, 1 + 4(T - 1), H, W] in [-1, 1], on any
            device (default: `diffusers_decode`; a render passes vidgen's memory-bounded exact decode).
        on_frames: given, each segment's new frames (segment index, [B, 3, n, H, W]) go to it as they are
            decoded, cut to the pose video's length, and the result holds no video.

    Returns:
        AnimateResult: the decoded video cut to the pose video's length, and each segment's latents.
    """
    z, s = vae.config.z_dim, vae.config.scale_factor_spatial
    _, _, height, width = pixels.image.shape
    h, w = height // s, width // s
    frames = segments.segment_frame_length
    latent_frames = (frames - 1) // TEMPORAL + 1
    decode = decode or diffusers_decode(vae)
    reference = reference_latents(vae, pixels.image.to(device))                   # [1, 4 + z, 1, h, w]
    outputs, all_latents, prev, emitted = [], [], None, 0
    done = len(resume.done) if resume is not None else 0
    for k in range(segments.num_segments):
        noise = segment_noise((1, z, 1 + latent_frames, h, w), generator, device)     # drawn for every segment
        if k < done:                    # finished before the interruption: its latents, not conditioned or sampled
            latents = resume.done[k].to(device)
        else:
            start, end = segments.window(k)
            pose = pose_latents(vae, pixels.pose[:, :, start:end].to(device))
            background = mask = None
            if pixels.background is not None:
                background = pixels.background[:, :, start:end].to(device)
                mask = pixels.mask[:, :, start:end].to(device)
            cond = segment_condition(vae, prev, frames, height=height, width=width,
                                     num_known=segments.prev_frames if k > 0 else 0, background=background, mask=mask)
            denoiser = AnimateDenoiser(transformer, guidance_scale=guidance_scale, cond=prompt_embeds,
                                       uncond=negative_prompt_embeds, image_tokens=image_tokens,
                                       reference=torch.cat([reference, cond], dim=2), pose=pose,
                                       face=pixels.face[:, :, start:end].to(device),
                                       motion_encode_batch_size=motion_encode_batch_size)
            finished = tuple(all_latents)

            def on_step(report: StepReport, k=k, finished=finished) -> None:
                if callback is not None:
                    callback(k, replace(report, state=replace(report.state, segments=finished)))

            if getattr(transformer, "is_cache_enabled", False):     # a step cache (speed.step_cache) must not
                transformer._reset_stateful_cache()                 # cross segments: each walks the schedule afresh
            state = resume.state if resume is not None and k == done else None
            latents = sample(denoiser, None if state else noise, sched, callback=on_step, state=state)
        all_latents.append(latents.cpu())      # kept for a checkpoint: in host memory, not growing on the device
        # the first latent frame is the reference's; the segment's own frames follow it
        decoded = decode(latents[:, :, 1:])
        new = new_frames(decoded, k, segments, emitted)
        emitted += new.shape[2]
        if on_frames is not None:
            on_frames(k, new)
        else:
            outputs.append(new)
        prev = decoded[:, :, -segments.prev_frames:].clone()      # not a view: the rest of the segment is freed
    video = torch.cat(outputs, dim=2) if on_frames is None else None
    return AnimateResult(video, all_latents, segments)
