"""The render config's delivery sections: `output` (file, codec, master profile, frame rate, timecode),
`audio` (a soundtrack muxed under the video) and `provenance` (signed content credentials, watermark).

A leaf like config.py, which re-exports these classes: it imports nothing of vidgen but the leaves
`codecs` and `fields`. docs/delivery.md says what each option writes and what it needs installed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Optional

from .codecs import CODECS, PIX_FMTS, output_bits
from .fields import _choices, _file

MAX_FPS = 240
"""The highest frame rate a config may ask for (fps and output.fps: 1..MAX_FPS)."""
RETIME_METHODS = ("duplicate", "blend", "interpolate")
"""output.retime.method (vidgen.retime)."""
EXR_LIGHT = ("linear", "decoded")
AUDIO_FITS = ("both", "pad", "cut", "exact")
"""audio.fit: how a track that is not the video's length is made to fit (vidgen.sound)."""
TIMECODE = re.compile(r"(\d\d):([0-5]\d):([0-5]\d)([:;])(\d\d)")


@dataclass
class RetimeConfig:
    CHOICES = {"method": RETIME_METHODS}
    method: str = "duplicate"
    """How frames are made for output.fps: duplicate (each output frame is the rendered frame at or before
    its time: no new pixels, uneven cadence), blend (the two nearest rendered frames mixed by distance:
    smooth, ghosts on fast motion) or interpolate (a learned frame interpolator; needs `weights`)."""
    weights: Optional[str] = _file("read")
    """interpolate: a local RIFE-family .safetensors file (vidgen never downloads one)."""

    def problems(self) -> list[str]:
        out = _choices(self, "output.retime")
        if self.method == "interpolate":
            out.append("output.retime.method: interpolate needs a RIFE-family frame interpolator, which vidgen "
                       "does not carry yet (no weights are ever downloaded); use blend or duplicate"
                       if self.weights else
                       "output.retime.method: interpolate needs output.retime.weights: a local RIFE-family "
                       ".safetensors file (never downloaded); or use blend or duplicate, which need nothing")
        return out


@dataclass
class OutputConfig:
    CHOICES = {"codec": ("auto", *CODECS), "pix_fmt": PIX_FMTS, "decode": ("full", "preview"), "exr": EXR_LIGHT}
    path: str = _file("write", "outputs/{time}-{seed}.mp4")
    """Output file; {seed}, {time} (YYYYmmdd-HHMMSS) and {prompt} (a short slug) are filled in."""
    codec: str = "auto"
    """auto (from the extension: .mp4 h264, .webm vp9, .gif gif, .mxf dnxhr, no extension png frames) or a codec:
    h264, h265, vp9, gif, png, and the masters prores, dnxhr, exr, png16 (docs/delivery.md)."""
    crf: int = 18
    """Constant rate factor for h264/h265/vp9 (lower = better; 18 is visually lossless for x264)."""
    pix_fmt: str = "auto"
    """auto (yuv420p for h264/h265/vp9, the profile's for prores/dnxhr), yuv420p (plays everywhere; needs even
    width and height), yuv444p, or h265's 10-bit yuv420p10le / yuv444p10le (HEVC Main 10)."""
    profile: Optional[str] = None
    """prores: hq (default), proxy, lt, standard, 4444 (with alpha, 4:4:4); dnxhr: hqx (default, 10-bit),
    hq, sq, lb (8-bit), 444 (10-bit 4:4:4). null = the default."""
    exr: str = "linear"
    """exr frames: linear (the decoded sRGB/BT.709 code values turned into linear light, what a compositor
    expects from EXR) or decoded (the code values as they are)."""
    fps: Optional[int] = None
    """Frame rate of the delivered file when it differs from the rendered `fps` (e.g. 24 or 25 from Wan's 16):
    the frames are retimed by output.retime. null = the rendered rate."""
    retime: RetimeConfig = field(default_factory=RetimeConfig)
    timecode: Optional[str] = None
    """Start timecode written into the container (HH:MM:SS:FF, or ;FF for drop-frame), e.g. 01:00:00:00.
    .mov, .mp4, .mxf and .mkv carry it; null = none."""
    save_latents: bool = True
    """Keep <output>.latents.safetensors after a successful render (always written before decode)."""
    overwrite: bool = False
    """Replace an earlier render at the output path: its video, latents and sidecar (otherwise any of them
    existing is an error). A folder of PNG frames is replaced only if it holds nothing but frames."""
    root: Optional[str] = None
    """Keep every file of this render inside this folder, symbolic links resolved at each write (a workflow
    sets its output_dir); null = no such rule."""
    keep_frames: list[int] = field(default_factory=list)
    """Frames also written as lossless PNG beside the output (<output>.frame-N.png), as decoded, before
    any video compression: what a continuing shot starts from. -1 = the last frame."""
    colour_reference: Optional[str] = _file("image")
    """An image whose colour every frame is matched to (per-channel mean and spread in Oklab, frame by
    frame): holds the colour of chained shots and long takes. null = frames as decoded."""
    decode: str = "full"
    """full: the exact VAE decode. preview: the latent preview map instead of the VAE (a take for review:
    blurred, nearly free; the latents are kept for the full decode of the take that is approved)."""

    def problems(self) -> list[str]:
        out = _choices(self, "output") + self.retime.problems()
        if not 0 <= self.crf <= 63:
            out.append(f"output.crf: {self.crf} is out of range; use 0..63 (x264: 0..51)")
        if not str(self.path).strip():
            out.append("output.path: is empty; give a file path such as outputs/clip.mp4")
        try:
            str(self.path).format(seed=0, time="t", prompt="p")
        except (KeyError, IndexError, ValueError) as e:
            out.append(f"output.path: {self.path!r} has a bad placeholder ({e}); allowed: {{seed}}, {{time}}, {{prompt}}")
        if self.fps is not None and not 1 <= self.fps <= MAX_FPS:
            out.append(f"output.fps: {self.fps} is out of range; use 1..{MAX_FPS}, or null for the rendered rate")
        if self.timecode is not None and not TIMECODE.fullmatch(str(self.timecode)):
            out.append(f"output.timecode: {self.timecode!r} is not HH:MM:SS:FF (or HH:MM:SS;FF for drop-frame), "
                       "e.g. 01:00:00:00")
        spec = CODECS.get(self.codec)
        if self.profile is not None and spec is not None and self.codec != "auto":
            if not spec.profiles:
                out.append(f"output.profile: {self.codec} has no profiles; remove output.profile")
            elif self.profile not in spec.profiles:
                out.append(f"output.profile: {self.profile!r} is not a {self.codec} profile; choose one of "
                           f"{', '.join(spec.profiles)}")
        return out

    @property
    def deep(self) -> bool:
        """Whether this output keeps more than 8 bits per channel (its frames come from the 16-bit decode)."""
        return output_bits(str(self.path), self.codec, self.pix_fmt, self.profile) > 8

    def timecode_problem(self, fps: int) -> str | None:
        """Why the timecode cannot be written at `fps` (its frame field must count frames of a second)."""
        match = TIMECODE.fullmatch(str(self.timecode)) if self.timecode else None
        if match is None:
            return None
        if int(match[5]) >= round(fps):
            return f"output.timecode: frame {match[5]} does not exist at {fps} fps (frames 00..{round(fps) - 1:02d})"
        if match[4] == ";" and fps not in (30, 60):
            return f"output.timecode: drop-frame (;) is for 29.97/59.94 material; write {self.timecode.replace(';', ':')}"
        return None


@dataclass
class AudioConfig:
    CHOICES = {"fit": AUDIO_FITS}
    path: Optional[str] = _file("read")
    """A sound file (WAV, FLAC, MP3, AAC, ...) muxed under the video: AAC in .mp4/.mkv, PCM in .mov/.mxf
    masters. null = no sound."""
    offset: float = 0.0
    """Seconds into the track where the video starts (negative: that much silence first)."""
    fit: str = "both"
    """A track of another length than the video: both (pad a short one with silence, cut a long one;
    one warning line says how much), pad (a long one is refused), cut (a short one is refused), exact
    (any difference over one frame is refused)."""

    def problems(self) -> list[str]:
        out = _choices(self, "audio")
        if not (isinstance(self.offset, (int, float)) and math.isfinite(self.offset)):
            out.append(f"audio.offset: {self.offset!r} must be a number of seconds")
        return out


@dataclass
class ProvenanceConfig:
    key: Optional[str] = _file("read")
    """PEM private key file that signs the C2PA manifest (content credentials); with `cert`."""
    cert: Optional[str] = _file("read")
    """PEM certificate chain file for `key` (the signer's certificate first)."""
    watermark: bool = False
    """Also hide an invisible watermark in the frames (it survives re-encoding; `vidgen verify` finds it)."""

    def problems(self) -> list[str]:
        if bool(self.key) != bool(self.cert):
            return ["provenance: key and cert go together (a PEM private key and its certificate); set both or neither"]
        return []

    @property
    def signs(self) -> bool:
        return bool(self.key and self.cert)
