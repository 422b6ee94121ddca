"""Frames deeper than 8 bits: the 16-bit frames the decoder gives a master, and the image files of
the sequences (EXR half float, PNG 16-bit) that vidgen.io writes one per frame.

A deep frame is uint16 [H, W, 3] RGB, 0..65535 for the decoder's [-1, 1]: 16 bits carry what every
master codec stores (10/12-bit video, PNG-16, and half float's 11-bit mantissa over [0, 1]) without
an 8-bit step. Encoding goes through PyAV's FFmpeg encoders (exr, png), as the video codecs do.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

import av
import numpy as np


def to_deep(frame: np.ndarray) -> np.ndarray:
    """uint8 or uint16 [H, W, 3] -> uint16 (8-bit codes scaled by 257: 255 -> 65535)."""
    return frame if frame.dtype == np.uint16 else frame.astype(np.uint16) * 257


def to_eight(frame: np.ndarray) -> np.ndarray:
    """uint16 or uint8 [H, W, 3] -> uint8, rounded to the nearest code."""
    if frame.dtype == np.uint8:
        return frame
    return ((frame.astype(np.uint32) + 128) // 257).astype(np.uint8)


def srgb_to_linear(x: np.ndarray) -> np.ndarray:
    """sRGB / BT.709 display code values in [0, 1] -> linear light (the sRGB curve, IEC 61966-2-1).

    Wan's VAE decodes to display-referred code values; EXR is scene-linear by convention, which is what
    a compositor expects to read, so output.exr: linear applies this inverse curve."""
    return np.where(x <= 0.04045, x / 12.92, ((x + 0.055) / 1.055) ** 2.4).astype(np.float32)


@lru_cache(maxsize=8)
def _context(codec: str, width: int, height: int, pix_fmt: str, options: tuple) -> av.CodecContext:
    ctx = av.CodecContext.create(codec, "w")
    ctx.width, ctx.height, ctx.pix_fmt, ctx.time_base = width, height, pix_fmt, Fraction(1, 1)
    ctx.options = dict(options)
    ctx.open()
    return ctx


def _encode(ctx: av.CodecContext, frame: av.VideoFrame) -> bytes:
    return b"".join(bytes(p) for p in ctx.encode(frame))


def exr_bytes(frame: np.ndarray, light: str, options: tuple) -> bytes:
    """One OpenEXR file of a deep frame: half float (options), linear light or the decoded code values."""
    x = frame.astype(np.float32) / 65535.0
    if light == "linear":
        x = srgb_to_linear(x)
    h, w = frame.shape[:2]
    vframe = av.VideoFrame(w, h, "gbrpf32le")      # planes filled directly: swscale would round the floats
    for plane, channel in zip(vframe.planes, (1, 2, 0)):
        rows = np.frombuffer(plane, dtype=np.float32).reshape(h, plane.line_size // 4)
        rows[:, :w] = x[..., channel]
    return _encode(_context("exr", w, h, "gbrpf32le", options), vframe)


def png16_bytes(frame: np.ndarray) -> bytes:
    """One 16-bit RGB PNG of a deep frame (Pillow writes 16 bits only for greyscale, so FFmpeg's png)."""
    h, w = frame.shape[:2]
    vframe = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb48le").reformat(format="rgb48be")
    return _encode(_context("png", w, h, "rgb48be", ()), vframe)


def read_image(path, deep: bool) -> np.ndarray:
    """An image file of a sequence (PNG 8/16-bit, EXR) as uint8 or, deep, uint16 [H, W, 3] RGB.

    EXR is read back as its stored float values scaled by 65535 (linear stays linear: read_image gives
    the file's numbers, not display codes)."""
    with av.open(str(path)) as container:
        frame = next(container.decode(video=0))
    if frame.format.name.startswith(("gbrpf", "gbrapf", "grayf")):
        x = _float_planes(frame)
        x = np.clip(np.nan_to_num(x), 0.0, 1.0) * (65535.0 if deep else 255.0)
        return np.rint(x).astype(np.uint16 if deep else np.uint8)
    return frame.to_ndarray(format="rgb48le" if deep else "rgb24")


def _float_planes(frame: av.VideoFrame) -> np.ndarray:
    """A planar float frame (EXR's gbrpf16/32, grey) as float32 RGB [H, W, 3], read from its planes: swscale's
    half-to-float conversion adds up to 3 steps of error, reading the halves directly none."""
    name = frame.format.name
    dtype = np.float16 if "f16" in name else np.float32
    planes = [np.frombuffer(p, dtype=dtype).reshape(frame.height, p.line_size // dtype().itemsize)[:, :frame.width]
              for p in frame.planes]
    if name.startswith("gray"):
        return np.repeat(planes[0].astype(np.float32)[..., None], 3, 2)
    g, b, r = planes[:3]
    return np.stack([r, g, b], -1).astype(np.float32)
