"""The output codecs a render may write (output.codec): registered names, with what each encoder takes.

A leaf: it imports nothing of vidgen, so config.py (which re-exports CODECS and PIX_FMTS) stays one.

Delivery masters (docs/delivery.md) are the codecs whose pix_fmts hold more than 8 bits: ProRes and
DNxHR (10-bit 4:2:2 / 4:4:4 intermediates an editor cuts without loss), HEVC Main 10, and the image
sequences a compositor reads (EXR half float, PNG 16-bit). Their frames reach the encoder from the
decoder's 16-bit output, never through an 8-bit step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CodecSpec:
    """One output codec (output.codec)."""

    encoder: str | None                     # FFmpeg encoder; None for 8-bit png frames (written with Pillow)
    extensions: tuple[str, ...]             # allowed path extensions, the first the default; "" is a folder
    pix_fmts: tuple[str, ...] = ()          # allowed pix_fmt values, the first what "auto" means; () = none to pick
    crf_max: int | None = None              # largest crf the encoder takes (smallest 0); None = crf is ignored
    even_yuv420: bool = False               # the encoder refuses odd sizes in yuv420p (x264, x265; libvpx does not)
    options: tuple[tuple[str, str], ...] = ()   # fixed encoder options, merged with crf
    profiles: dict[str, tuple[str, str]] = field(default_factory=dict)
    """output.profile -> (the encoder's profile option value, the pix_fmt it takes); the first is the default."""
    min_size: tuple[int, int] = (1, 1)      # smallest width, height the encoder takes
    sequence: bool = False                  # a folder of numbered image files, one per frame

    def pix_fmt(self, asked: str, profile: str | None) -> str:
        """The pix_fmt a writer uses for output.pix_fmt `asked` ("auto": the profile's, else the first)."""
        if self.profiles:
            return self.profiles[profile or next(iter(self.profiles))][1]
        if asked == "auto":
            return self.pix_fmts[0] if self.pix_fmts else ""
        return asked


def bits(pix_fmt: str) -> int:
    """Bits per channel a pix_fmt stores: 8 for the 8-bit formats, 10/12/16 as named, 32 for float."""
    for mark, depth in (("f32", 32), ("f16", 16), ("p10", 10), ("p12", 12), ("48", 16), ("64", 16)):
        if mark in pix_fmt:
            return depth
    return 8


CODECS: dict[str, CodecSpec] = {
    "h264": CodecSpec("libx264", (".mp4", ".mkv", ".mov"), ("yuv420p", "yuv444p"), 51, True),
    # x265 prints a banner and stats per file unless told otherwise. 10-bit: HEVC Main 10 (a delivery master).
    "h265": CodecSpec("libx265", (".mp4", ".mkv", ".mov"), ("yuv420p", "yuv444p", "yuv420p10le", "yuv444p10le"),
                      51, True, (("x265-params", "log-level=error"),)),
    # b=0: libvpx's crf is constant quality, not capped by a bitrate; row-mt: rows in parallel, same quality.
    "vp9": CodecSpec("libvpx-vp9", (".webm", ".mkv"), ("yuv420p", "yuv444p"), 63, False, (("b", "0"), ("row-mt", "1"))),
    "gif": CodecSpec("gif", (".gif",)), "png": CodecSpec(None, ("",), sequence=True),
    # Apple ProRes through FFmpeg's prores_ks (the encoder with every profile); QuickTime only.
    "prores": CodecSpec("prores_ks", (".mov",), profiles={
        "hq": ("hq", "yuv422p10le"), "proxy": ("proxy", "yuv422p10le"), "lt": ("lt", "yuv422p10le"),
        "standard": ("standard", "yuv422p10le"), "4444": ("4444", "yuva444p10le")}),
    # Avid DNxHR through FFmpeg's dnxhd encoder; hq/sq/lb are 8-bit by definition, hqx and 444 10-bit.
    # FFmpeg refuses DNxHR frames under 256x120.
    "dnxhr": CodecSpec("dnxhd", (".mov", ".mxf"), profiles={
        "hqx": ("dnxhr_hqx", "yuv422p10le"), "hq": ("dnxhr_hq", "yuv422p"), "sq": ("dnxhr_sq", "yuv422p"),
        "lb": ("dnxhr_lb", "yuv422p"), "444": ("dnxhr_444", "yuv444p10le")}, min_size=(256, 120)),
    # Image sequences for compositing: half-float OpenEXR (zip per 16 lines, lossless) and 16-bit PNG.
    "exr": CodecSpec("exr", ("",), ("gbrpf32le",), options=(("format", "half"), ("compression", "zip16")),
                     sequence=True),
    "png16": CodecSpec("png", ("",), ("rgb48be",), sequence=True),
}
PIX_FMTS = ("auto", "yuv420p", "yuv444p", "yuv420p10le", "yuv444p10le")
"""output.pix_fmt: auto (the codec's own, or its profile's) or one of these (h264/h265/vp9; 10-bit h265 only)."""
MASTERS = tuple(name for name, spec in CODECS.items() if spec.profiles or spec.sequence and spec.encoder
                or any(bits(p) > 8 for p in spec.pix_fmts))
"""Codecs that can carry more than 8 bits per channel (their frames come from the decoder's 16-bit path)."""


def codec_by_extension(ext: str) -> str | None:
    """The codec output.codec auto means for a lower-case extension ("" = a folder): the first listing it."""
    return next((name for name, spec in CODECS.items() if ext in spec.extensions), None)


def extension(path: str) -> str:
    """A path's lower-case extension; "" for a folder (no extension, or a trailing slash)."""
    return "" if path.endswith(("/", os.sep)) else os.path.splitext(path)[1].lower()


def output_bits(path: str, codec: str, pix_fmt: str = "auto", profile: str | None = None) -> int:
    """Bits per channel an output of these settings stores (8 when they are invalid: the checks say why)."""
    spec = CODECS.get(codec_by_extension(extension(path)) if codec == "auto" else codec)
    if spec is None or spec.encoder is None or (profile is not None and profile not in spec.profiles):
        return 8
    return min(16, bits(spec.pix_fmt(pix_fmt, profile)))
