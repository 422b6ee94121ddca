"""The output codecs a render may write (output.codec): registered names, with what each encoder takes.

A leaf: it imports nothing of vidgen, so config.py (which re-exports CODECS and PIX_FMTS) stays one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CodecSpec:
    """One output codec (output.codec)."""

    encoder: str | None                     # PyAV encoder; None for png frames (written with Pillow)
    extensions: tuple[str, ...]             # allowed path extensions, the first the default; "" is a folder
    pix_fmts: tuple[str, ...] = ()          # allowed pix_fmt values; () = pix_fmt is ignored
    crf_max: int | None = None              # largest crf the encoder takes (smallest 0); None = crf is ignored
    even_yuv420: bool = False               # the encoder refuses odd sizes in yuv420p (x264, x265; libvpx does not)
    options: tuple[tuple[str, str], ...] = ()   # fixed encoder options, merged with crf


CODECS: dict[str, CodecSpec] = {
    "h264": CodecSpec("libx264", (".mp4", ".mkv", ".mov"), ("yuv420p", "yuv444p"), 51, True),
    # x265 prints a banner and stats per file unless told otherwise.
    "h265": CodecSpec("libx265", (".mp4", ".mkv", ".mov"), ("yuv420p", "yuv444p"), 51, True,
                      (("x265-params", "log-level=error"),)),
    # b=0: libvpx's crf is constant quality, not capped by a bitrate; row-mt: rows in parallel, same quality.
    "vp9": CodecSpec("libvpx-vp9", (".webm", ".mkv"), ("yuv420p", "yuv444p"), 63, False, (("b", "0"), ("row-mt", "1"))),
    "gif": CodecSpec("gif", (".gif",)), "png": CodecSpec(None, ("",))}
PIX_FMTS = ("yuv420p", "yuv444p")
