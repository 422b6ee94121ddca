"""The render config's `animate` section: Wan2.2-Animate's driving videos and its segments.

A leaf like config.py, which re-exports it: it imports nothing of vidgen but the leaf `fields`. What the
videos must be, and how to make them, is docs/animate.md; vidgen.animate_inputs checks them before any
weights load, vidgen.animate samples the segments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .fields import _choices, _file

ANIMATE_MODES = ("animate", "replace")
"""animate.mode: the character performs the motion in the reference's scene (animate), or takes the
driving person's place in the footage (replace: background_video and mask_video needed)."""
OVERLAP_FRAMES = (1, 5)
"""animate.overlap_frames: what WanAnimatePipeline accepts for prev_segment_conditioning_frames."""


@dataclass
class AnimateConfig:
    CHOICES = {"mode": ANIMATE_MODES}
    mode: str = "animate"
    """animate: the character reference performs the pose and face videos' motion; replace: it takes the
    place of the person in the footage (background_video and mask_video)."""
    pose_video: Optional[str] = _file("video")
    """The driving skeleton drawn on black, at the render's aspect ratio (a video file or a folder of PNG
    frames): one frame per output frame, so its length sets the clip's. null = not an Animate render."""
    face_video: Optional[str] = _file("video")
    """The driving face, cropped and resized to 512x512 in every frame (as many frames as pose_video): a video
    file or a folder of PNG frames."""
    background_video: Optional[str] = _file("video")
    """replace: the footage with the person blacked out (as many frames as pose_video): a video file or PNG folder."""
    mask_video: Optional[str] = _file("video")
    """replace: white where the character goes, black where the background is kept; binary (a video file or
    PNG folder)."""
    segment_frames: int = 77
    """Frames each segment generates (4n + 1; diffusers' segment_frame_length): a longer performance
    renders in segments, each conditioned on the last overlap_frames frames of the one before."""
    overlap_frames: int = 1
    """Frames a segment takes over from the previous one (1 or 5; prev_segment_conditioning_frames)."""

    @property
    def engaged(self) -> bool:
        return bool(self.pose_video or self.face_video or self.background_video or self.mask_video)

    def problems(self) -> list[str]:
        out = _choices(self, "animate")
        if not self.engaged:
            return out
        if not self.pose_video:
            out.append("animate.pose_video: is not set; an Animate render is driven by a pose video "
                       "(and a face video): docs/animate.md")
        if not self.face_video:
            out.append("animate.face_video: is not set; give the driving face crops (512x512, one a frame)")
        if self.mode == "replace":
            out += [f"animate.{key}: is not set; mode replace needs the footage's {what}"
                    for key, what in (("background_video", "background (the person blacked out)"),
                                      ("mask_video", "character mask (white where the character goes)"))
                    if not getattr(self, key)]
        elif self.mode == "animate":
            out += [f"animate.{key}: is set, but mode animate does not use it (it would be ignored); set "
                    f"animate.mode: replace or remove it" for key in ("background_video", "mask_video")
                    if getattr(self, key)]
        if not (isinstance(self.segment_frames, int) and self.segment_frames >= 5 and self.segment_frames % 4 == 1):
            out.append(f"animate.segment_frames: {self.segment_frames!r} must be 4n + 1 and at least 5 (77 as published)")
        if self.overlap_frames not in OVERLAP_FRAMES:
            out.append(f"animate.overlap_frames: {self.overlap_frames!r}; use 1 or 5 (the previous segment's last "
                       f"frames each segment is conditioned on)")
        elif isinstance(self.segment_frames, int) and self.segment_frames <= 2 * self.overlap_frames:
            out.append(f"animate.segment_frames: {self.segment_frames} must exceed twice animate.overlap_frames "
                       f"({self.overlap_frames}) so that segments advance")
        return out


def segment_latent_shape(cfg, info) -> tuple[int, ...]:
    """The latents one Animate segment samples, [1, z, 1 + T, h, w] (T = the segment's latent frames, the
    first the reference's): what an Animate render's checkpoint holds. `cfg`: a RenderConfig; `info`: its
    loading.ModelInfo."""
    t = (cfg.animate.segment_frames - 1) // info.vae_scale_temporal + 1
    s = info.vae_scale_spatial
    return (1, info.z_dim, 1 + t, cfg.height // s, cfg.width // s)
