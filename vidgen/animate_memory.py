"""What an Animate render holds in memory, for the memory plan (vidgen.memory): one segment at a time.

Wan2.2-Animate never samples the clip at once. vidgen.animate cuts the performance into segments of
animate.segment_frames (L) frames and, for each, VAE-encodes that many pose frames and an L-frame
condition video, samples latents [1, z, 1 + T, h, w] (T = (L - 1) / 4 + 1; the first latent frame the
reference image's) and decodes its T frames before the next segment starts, conditioned on them. So
every device figure is one segment's, whatever the clip's length (num_frames: the pose video's frame
count, any number of frames, not only 4n + 1). Only two things grow with the clip: the finished
segments' latents, kept on the device for a resume checkpoint (18.5 MiB a segment at 720p), and what
the host keeps: the clip's frames (uint8 RGB, 16-bit with output.deep) and the driving videos' frames.

The forward's activations are counted on meta tensors by footprint.animate_activations (the real
WanAnimateTransformer3DModel forward: pose latents, face crops through the motion and face encoders,
the face adapter, CLIP image tokens); the rest here is the arithmetic of the tensors vidgen.animate
keeps live around it, named where they are counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .animate import plan_segments
from .footprint import animate_activations, image_encoder_activations, vae_encode_activations

PIL_RGB = 4                 # bytes a pixel of a PIL RGB image (Pillow stores RGB four bytes a pixel)
DRIVING_COPIES = 1          # each driving video's frames as read (animate_inputs.read_inputs); the padded list
                            # (animate.pad_frames) refers to the same frames


@dataclass(frozen=True)
class Segment:
    """One Animate segment's shapes and the bytes held around its stages, besides the weights and the
    counted forwards and VAE runs (see `segment`)."""

    frames: int                     # L: pixel frames a segment generates (and encodes, and decodes)
    count: int                      # segments the clip is made in
    latent_shape: tuple[int, ...]   # what a segment samples: [1, z, 1 + T, h, w]
    decode_shape: tuple[int, ...]   # what it decodes: [1, z, T, h, w] (the reference's frame dropped)
    image_tokens: tuple[int, int]   # the CLIP image tokens: (count, width)
    kept: int                       # device: the conditioning of a segment, live through its encode, sampling
                                    # and decode
    forward_extra: int              # device: the transformer's input and, guided, the second branch's face and output
    encode_inputs: int              # device: the pixels around one L-frame VAE encode
    host: int                       # host: the clip's frames, the driving videos, decoded and preprocessed segments

    def forward(self, r, shape: tuple[int, ...]) -> int:
        """Device bytes of sampling a segment, besides the weights and the solver's latents: one forward over
        latents of `shape` (memory._Render `r`'s model, dtype, text length and device), the conditioning
        it keeps and the forward's own inputs."""
        act = animate_activations(r.spec.transformer, r.dtype, shape, r.text_len, self.image_tokens, self.frames,
                                  r.device_type, memo=r.memo)
        return act + self.kept + self.forward_extra

    def encode_stages(self, r, h, resident: bool) -> list[tuple]:
        """The encode stages, as memory.Stage fields (name, device weights, device activations, host,
        slowdown): the CLIP image encoder on the device while it encodes the reference image (once), then
        each segment's VAE encodes of L frames (the pose video, the condition video: one at a time) with
        their pixels on the device and the segment kept around them. `r`, `h`: memory's _Render and _Held;
        `resident`: the text encoder stays on the device (resident placements)."""
        cfg = r.cfg
        weights = h.idle_w + h.vae_bytes + (h.te_on_device if resident else 0)
        host = h.host_experts + h.te_kept
        vae = vae_encode_activations(r.spec.vae, r.vae_dtype, self.frames, cfg.height, cfg.width, r.device_type,
                                     memo=r.memo)
        stages = [("segment encoding", weights, vae + self.encode_inputs + self.kept, host + self.host, 1.0)]
        if h.clip:
            clip = image_encoder_activations(r.spec.image_encoder, r.dtype, r.device_type, memo=r.memo)
            stages.insert(0, ("image encoding", weights + h.clip, clip, host, 1.0))
        return stages


def is_animate(spec) -> bool:
    """Whether the model is Wan2.2-Animate's (its transformer has a face motion encoder)."""
    return "motion_encoder_size" in spec.transformer


def segments_of(num_frames: int, frames: int, overlap: int) -> int:
    """How many segments of `frames` overlapping by `overlap` make a clip of `num_frames`, as the render cuts
    it (animate.plan_segments); at least one, for a clip not longer than the overlap too (a plan made
    before the driving videos exist)."""
    return plan_segments(max(num_frames, overlap + 1), frames, overlap).num_segments


def segment(cfg, spec, dtype: torch.dtype, vae_dtype: torch.dtype, guided: bool) -> Segment | None:
    """One segment of an Animate render of `cfg` (None for another model): every Animate render, with
    animate.pose_video set or not (its segments are the only way the model renders; without driving
    videos the plan is for a clip of num_frames frames). `spec`: footprint.ModelSpec; `guided`: the
    second (unconditional) forward runs each step."""
    if not is_animate(spec):
        return None
    a, info = cfg.animate, spec.info
    L, z, s = a.segment_frames, spec.z_dim, info.vae_scale_spatial
    T = (L - 1) // info.vae_scale_temporal + 1
    h, w, H, W = cfg.height // s, cfg.width // s, cfg.height, cfg.width
    b, m = dtype.itemsize, vae_dtype.itemsize
    face = spec.transformer.get("motion_encoder_size", 512)
    clip = spec.image_encoder or {}
    tokens = ((clip.get("image_size", 224) // clip.get("patch_size", 14)) ** 2 + 1,
              clip.get("hidden_size", spec.transformer.get("image_dim") or 1280))
    count = segments_of(cfg.num_frames, L, a.overlap_frames)
    replace = a.mode == "replace"
    grid, pixels = h * w, H * W
    latents = z * (1 + T) * grid * 4                       # a segment's sampled latents, float32
    kept = ((4 + z) * (1 + T) * grid * m                   # the reference's latents and the condition (VAE dtype)
            + (4 + z) * T * grid * m                       # the condition, also on its own
            + z * T * grid * (m + (b if b != m else 0))    # the pose latents, and the transformer's copy
            + 3 * L * face * face * b                      # the face crops, in the transformer's dtype
            + tokens[0] * tokens[1] * b                    # the CLIP image tokens
            + (4 * L * pixels * 4 if replace else 0))      # replace: the segment's background and mask, float32
    forward_extra = ((2 * z + 4) * (1 + T) * grid * b      # the transformer's input (latents and conditioning)
                     + (3 * L * face * face * b + z * (1 + T) * grid * b if guided else 0))
    # Around an encode: the pose frames, float32, and their copy in the VAE's dtype; or the condition video's
    # two parts and their concatenation in the VAE's dtype.
    encode_inputs = 3 * L * pixels * max(4 + (m if m != 4 else 0), 2 * m)
    # The clip's frames as they are made (a list of uint8 or uint16 frames: no file to spill to).
    canvas = cfg.num_frames * pixels * 3 * (2 if cfg.output.deep else 1)
    # Every driving video's frames, at the render's size (the face crops at the motion encoder's; a larger
    # source video holds more), over the padded length of the segments.
    padded = count * (L - a.overlap_frames) + a.overlap_frames
    driving = DRIVING_COPIES * padded * PIL_RGB * ((3 if replace else 1) * pixels + face * face)
    # vidgen.vae.decode assembles a segment's video on the host in the VAE's dtype while the last one's is
    # still held (its final frames condition the next segment); the frames' conversion, two float32 copies.
    decoded = 3 * L * pixels * (2 * m + 2 * 4)
    preprocessed = L * (3 * pixels + 3 * face * face + (4 * pixels if replace else 0)) * 4     # one segment's, float32
    finished = (count - 1) * latents        # the finished segments' latents (a resume checkpoint), in host memory
    return Segment(L, count, (1, z, 1 + T, h, w), (1, z, T, h, w), tokens, kept, forward_extra, encode_inputs,
                   canvas + driving + decoded + preprocessed + finished)
