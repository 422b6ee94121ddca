"""Stage 2 for VACE and video-to-video: control, mask and source clips read and fitted to the render,
the VACE conditioning latents built as diffusers' WanVACEPipeline builds them, the restyle start of
video-to-video as WanVideoToVideoPipeline makes it, and the composite of kept pixels at the write.

Fitting (docs/control.md): a clip's frames are taken at the render's fps (the nearest source frame
in time; a PNG folder, or the PNG files of `control.frames`, counts as already at the render's fps),
from `control.start` on, and each frame is centre-cropped to the render's aspect ratio and resized
(LANCZOS) to its size, as `image` is with image_fit: crop. A clip with fewer frames than the render needs is refused, unless
`control.keep_first` asks for an extension (frames past its end are then grey and generated).
`control.last_frame`, an image fitted the same way, is the clip's last frame, kept as given.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .errors import InputError, OutputError
from .io import read_frames, video_fps
from .records import path_problem
from .vae import encode, normalize

log = logging.getLogger("vidgen")
MAX_FRAME_PIXELS = 8192 * 8192
"""Largest frame read from a control, mask or source clip (the largest size a config may ask for)."""
MAX_CLIP_FRAMES = 16385
"""Most frames read from one clip (a config's longest clip)."""


@dataclass(frozen=True)
class Control:
    """A VACE render's fitted conditions: uint8 [F, H, W, 3] frames (None: no such clip), the
    reference images (PIL), the hints' scale and how many leading frames are kept as given."""

    video: np.ndarray | None
    mask: np.ndarray | None
    references: tuple = ()
    scale: float = 1.0
    keep_first: int = 0
    composite: bool = True
    keep_last: bool = False         # control.last_frame: the clip's last frame is kept as given


def clip_frames(path: str, key: str) -> Iterator[np.ndarray]:
    """The frames (uint8 [H, W, 3]) of a video file or a folder of PNG frames (its *.png in name order),
    one at a time, at most MAX_CLIP_FRAMES; InputError names `key` and what is wrong (a frame larger than
    any vidgen renders, an unreadable image or file)."""
    from PIL import Image

    p = Path(path)
    if p.is_dir():
        for name in sorted(f for f in p.iterdir() if f.suffix.lower() == ".png")[:MAX_CLIP_FRAMES]:
            try:
                with Image.open(name) as im:
                    if im.width * im.height > MAX_FRAME_PIXELS:
                        raise InputError(f"{key}: {name} is {im.width}x{im.height}, larger than any frame vidgen "
                                         "renders; downscale the clip")
                    yield np.asarray(im.convert("RGB"))
            except (OSError, ValueError, Image.DecompressionBombError) as e:
                raise InputError(f"{key}: cannot read {name} as an image ({e.__class__.__name__})") from None
        return
    try:
        for i, frame in enumerate(read_frames(p)):
            if i >= MAX_CLIP_FRAMES:
                return
            if frame.shape[0] * frame.shape[1] > MAX_FRAME_PIXELS:
                raise InputError(f"{key}: {path!r} has {frame.shape[1]}x{frame.shape[0]} frames, larger than any "
                                 "frame vidgen renders; downscale the clip")
            yield frame
    except OutputError as e:
        raise InputError(f"{key}: {str(e).splitlines()[0]}") from None


def read_clip(path: str, key: str) -> tuple[list[np.ndarray], float | None]:
    """(frames uint8 [H, W, 3], the container's fps or None) of a video file or a folder of PNG frames."""
    if problem := path_problem(path, "file or folder"):
        raise InputError(f"{key}: {path!r} {problem}; give a video file or a folder of PNG frames")
    p = Path(path)
    try:
        fps = None if p.is_dir() else video_fps(p)
    except OutputError as e:
        raise InputError(f"{key}: {str(e).splitlines()[0]}") from None
    frames = list(clip_frames(path, key))
    if not frames:
        raise InputError(f"{key}: {path!r} holds no frames; give a clip with at least one frame")
    return frames, fps


def fit_clip(frames: list[np.ndarray], src_fps: float | None, fps: int, num_frames: int, start: int,
             width: int, height: int, key: str, *, pad: bool = False) -> tuple[np.ndarray, int]:
    """(uint8 [num_frames, height, width, 3], how many are the clip's own) of a clip fitted to the render
    (the module docstring's rules); frames past the clip's end are grey (127) when `pad`."""
    from PIL import Image

    if src_fps and abs(src_fps - fps) > 1e-3:          # the nearest source frame at each render frame's time
        picks = [round(i * src_fps / fps) for i in range(int(len(frames) * fps / src_fps) + 1)]
        frames = [frames[j] for j in picks if j < len(frames)]
        log.info("%s: %g fps resampled to %d fps (%d frames)", key, src_fps, fps, len(frames))
    frames = frames[start:] if start >= 0 else frames[max(0, len(frames) + start):]
    if len(frames) < num_frames and not pad:
        raise InputError(f"{key}: has {len(frames)} frames at {fps} fps{f' from frame {start}' if start else ''}, "
                         f"the render needs {num_frames}; give a longer clip, or fewer num_frames")
    frames = frames[:num_frames]
    h0, w0 = frames[0].shape[:2]
    if min(h0, w0) < 16:
        raise InputError(f"{key}: its {w0}x{h0} frames cannot be fitted to {width}x{height} (at least 16 pixels a side)")
    target = width / height
    out = np.full((num_frames, height, width, 3), 127, dtype=np.uint8)
    for i, frame in enumerate(frames):
        im = Image.fromarray(frame)
        iw, ih = im.size
        if abs(iw / ih - target) > 0.01:                   # centre crop to the render's aspect ratio
            cw, ch = (round(ih * target), ih) if iw / ih > target else (iw, round(iw / target))
            im = im.crop(((iw - cw) // 2, (ih - ch) // 2, (iw - cw) // 2 + cw, (ih - ch) // 2 + ch))
        out[i] = np.asarray(im.resize((width, height), Image.LANCZOS) if im.size != (width, height) else im)
    return out, len(frames)


def preprocess(frames: np.ndarray, how: str) -> np.ndarray:
    """control.preprocess on uint8 [F, H, W, 3] frames: none; grey (Rec. 601 luma in every channel); canny
    (Canny-style edges: Sobel gradient magnitude, white where it exceeds a quarter of the clip's
    largest, on black) — weight-free, so no pose or depth model is ever needed here."""
    if how == "none":
        return frames
    luma = (frames.astype(np.float32) @ np.array([0.299, 0.587, 0.114], dtype=np.float32))      # [F, H, W]
    if how == "grey":
        return np.repeat(luma.round().clip(0, 255).astype(np.uint8)[..., None], 3, axis=-1)
    p = np.pad(luma, ((0, 0), (1, 1), (1, 1)), mode="edge")
    gx = (p[:, :-2, 2:] + 2 * p[:, 1:-1, 2:] + p[:, 2:, 2:]) - (p[:, :-2, :-2] + 2 * p[:, 1:-1, :-2] + p[:, 2:, :-2])
    gy = (p[:, 2:, :-2] + 2 * p[:, 2:, 1:-1] + p[:, 2:, 2:]) - (p[:, :-2, :-2] + 2 * p[:, :-2, 1:-1] + p[:, :-2, 2:])
    mag = np.hypot(gx, gy)
    edges = (mag > 0.25 * max(float(mag.max()), 1e-6)).astype(np.uint8) * 255
    return np.repeat(edges[..., None], 3, axis=-1)


def read_control(cfg, load_image) -> Control | None:
    """The fitted Control of `cfg` (a RenderConfig), or None when it has none. `load_image(path, key)`
    reads an image (preflight's: decompression bombs refused, a frame an earlier queued job will write
    read as a stand-in of its size)."""
    c = cfg.control
    if not c.engaged:
        return None
    video = mask = None
    problems = ["control.video / control.frames: give the control frames one way, a clip or a list of PNGs"] \
        if c.video and c.frames else []
    if c.last_frame and c.mask:
        problems.append("control.last_frame: keeps the last frame through its own mask; remove control.mask")
    if c.video or c.frames:
        key = "control.video" if c.video else "control.frames"
        try:
            frames, fps = read_clip(c.video, key) if c.video else (
                [np.asarray(load_image(path, f"control.frames[{i}]").convert("RGB")) for i, path in enumerate(c.frames)],
                None)
            video, own = fit_clip(frames, fps, cfg.fps, cfg.num_frames, c.start, cfg.width, cfg.height,
                                  key, pad=c.keep_first > 0)
            if c.keep_first > own:
                problems.append(f"control.keep_first: {c.keep_first} is more than the {own} frames {key} has")
            video = preprocess(video, c.preprocess)
        except InputError as e:
            problems.append(str(e))
    if c.mask:
        try:
            frames, fps = read_clip(c.mask, "control.mask")
            if len(frames) == 1:            # one mask for every frame
                frames, fps = frames * cfg.num_frames, None
            mask, _ = fit_clip(frames, fps, cfg.fps, cfg.num_frames, c.start, cfg.width, cfg.height, "control.mask")
        except InputError as e:
            problems.append(str(e))
    refs = []
    for i, path in enumerate(c.reference_images):
        try:
            refs.append(load_image(path, f"control.reference_images[{i}]"))
        except InputError as e:
            problems.append(str(e))
    if c.last_frame:
        try:
            key, _ = fit_clip([np.asarray(load_image(c.last_frame, "control.last_frame").convert("RGB"))], None,
                              cfg.fps, 1, 0, cfg.width, cfg.height, "control.last_frame")
            video = np.full((cfg.num_frames, cfg.height, cfg.width, 3), 127, np.uint8) if video is None else video
            video[-1] = key[0]
        except InputError as e:
            problems.append(str(e))
    if problems:
        from .errors import ConfigError

        raise ConfigError(problems)
    return Control(video, mask, tuple(refs), float(c.scale), c.keep_first, c.composite, bool(c.last_frame))


def read_source(cfg) -> np.ndarray | None:
    """video2video.video fitted to the render (uint8 [F, H, W, 3]), or None."""
    if not cfg.video2video.video:
        return None
    frames, fps = read_clip(cfg.video2video.video, "video2video.video")
    return fit_clip(frames, fps, cfg.fps, cfg.num_frames, 0, cfg.width, cfg.height, "video2video.video")[0]


def _pixels(frames: np.ndarray) -> torch.Tensor:
    """uint8 [F, H, W, 3] -> [1, 3, F, H, W] in [-1, 1], with diffusers' VideoProcessor's float32 steps."""
    x = torch.from_numpy(frames.astype(np.float32) / 255.0).permute(3, 0, 1, 2)[None]
    return 2.0 * x - 1.0


def _mask(control: Control, frames: int, height: int, width: int) -> torch.Tensor:
    """[1, 3, F, H, W] in [0, 1]: 1 = generate (white), 0 = keep."""
    if control.mask is not None:
        return torch.clamp((_pixels(control.mask) + 1) / 2, min=0, max=1)
    mask = torch.ones(1, 3, frames, height, width)
    mask[:, :, :control.keep_first] = 0
    if control.keep_last:
        mask[:, :, -1] = 0
    return mask


def _reference(image, height: int, width: int, scale_spatial: int) -> torch.Tensor:
    """A reference image fitted into the frame on a white canvas, [3, H, W] in [-1, 1] (diffusers' rule)."""
    from diffusers.video_processor import VideoProcessor

    x = VideoProcessor(vae_scale_factor=scale_spatial).preprocess(image, None, None)
    ih, iw = x.shape[-2:]
    s = min(height / ih, width / iw)
    nh, nw = int(ih * s), int(iw * s)
    resized = torch.nn.functional.interpolate(x, size=(nh, nw), mode="bilinear", align_corners=False)[0]
    canvas = torch.ones(3, height, width)
    top, left = (height - nh) // 2, (width - nw) // 2
    canvas[:, top:top + nh, left:left + nw] = resized
    return canvas


def vace_condition(vae, info, control: Control, num_frames: int, height: int, width: int,
                   device: torch.device) -> torch.Tensor:
    """VACE's control_hidden_states [1, 2z + s*s, R + T, h, w]: the inactive and reactive latents of the
    control video under its mask, each reference image's latents as a leading frame (the last given
    first, as diffusers prepends them), and the mask folded s x s pixels a latent pixel onto channels."""
    video = _pixels(control.video) if control.video is not None else torch.zeros(1, 3, num_frames, height, width)
    mask = _mask(control, num_frames, height, width)
    m = torch.where(mask > 0.5, 1.0, 0.0)
    latents = torch.cat([normalize(vae, encode(vae, video * (1 - m)).float()),
                         normalize(vae, encode(vae, video * m).float())], dim=1)[0]           # [2z, T, h, w]
    s, refs = info.vae_scale_spatial, control.references
    for image in refs:
        ref = normalize(vae, encode(vae, _reference(image, height, width, s)[None, :, None]).float())[0]
        latents = torch.cat([torch.cat([ref, torch.zeros_like(ref)], dim=0), latents], dim=1)
    p = info.patch_size[1]
    h, w = height // (s * p) * p, width // (s * p) * p
    folded = mask[0, 0].view(num_frames, h, s, w, s).permute(2, 4, 0, 1, 3).flatten(0, 1)      # [s*s, F, h, w]
    folded = torch.nn.functional.interpolate(folded[None], size=((num_frames + info.vae_scale_temporal - 1)
                                                                 // info.vae_scale_temporal, h, w),
                                             mode="nearest-exact")[0]
    folded = torch.cat([folded.new_zeros(folded.shape[0], len(refs), h, w), folded], dim=1)
    return torch.cat([latents.to(device), folded.to(device)], dim=0)[None]


def restyle_start(vae, source: np.ndarray, noise: torch.Tensor, sigma: float) -> torch.Tensor:
    """Video-to-video's first latents: the source's latents noised to the sliced schedule's first sigma,
    (1 - sigma) x0 + sigma noise (diffusers' UniPC add_noise under flow sigmas)."""
    x0 = normalize(vae, encode(vae, _pixels(source)).float()).to(noise.device)
    return (1 - sigma) * x0 + sigma * noise


def composite(control: Control | None, index: int, frame: torch.Tensor) -> torch.Tensor:
    """Frame `index` (uint8 [H, W, 3], or a master's uint16) with the kept pixels written from control.video
    as given (scaled x257 into a uint16 frame)."""
    if control is None or not control.composite or control.video is None:
        return frame
    given = torch.from_numpy(control.video[index].copy())
    if frame.dtype == torch.uint16:
        given = (given.to(torch.int32) * 257).to(torch.uint16)
    if control.mask is None:
        kept = index < control.keep_first or (control.keep_last and index == len(control.video) - 1)
        return given if kept else frame
    keep = torch.from_numpy(control.mask[index] <= 127)             # black in the mask: keep
    return torch.where(keep, given, frame)
