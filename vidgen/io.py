"""Video output: codecs (config.CODECS), an atomic frame-by-frame writer, and read-back for checks.

Frames are encoded one at a time with PyAV, so memory stays flat however long the clip is. Every
output is first written to `<dir>/.<name>.partial<ext>` and renamed into place with os.replace only
once complete: a plain MP4 cut off mid-write is unreadable, and a queue retrying a job must never
mistake half a video for a finished one.

Container metadata that survives a read-back (checked by tests/test_io.py):
  .mp4  title, comment, description, synopsis, keywords, artist, album, date, genre, copyright
  .mov  title, comment, artist, album, date, genre, copyright
  .mkv, .webm  any key (Matroska tags; read back upper-cased, so read_video_info lower-cases them)
  .gif, png frames  none: use write_sidecar.
Any other key would be dropped by the muxer without a word, so check_output reports it instead;
put machine-readable data as JSON in `comment`, or in the sidecar.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import av
import numpy as np
from PIL import Image

from vidgen.codecs import bits, codec_by_extension, extension, output_bits
from vidgen.config import CODECS
from vidgen.errors import OutputError
from vidgen.masters import exr_bytes, png16_bytes, read_image, to_deep, to_eight
from vidgen.paths import FRAME_RE, OutputSet, confine, discard, name_problem, partial_path, publish, sidecar_path

log = logging.getLogger("vidgen")

# extension -> (FFmpeg muxer, metadata keys it keeps; None = any key).
CONTAINERS: dict[str, tuple[str | None, frozenset[str] | None]] = {
    ".mp4": ("mp4", frozenset({"title", "comment", "description", "synopsis", "keywords", "artist",
                               "album", "date", "genre", "copyright"})),
    ".mov": ("mov", frozenset({"title", "comment", "artist", "album", "date", "genre", "copyright"})),
    ".mxf": ("mxf", frozenset()),
    ".mkv": ("matroska", None),
    ".webm": ("webm", None),
    ".gif": ("gif", frozenset()),
    "": (None, frozenset()),
}
# Keys the muxers write themselves; showing them as the caller's metadata would mislead.
MUXER_KEYS = {"major_brand", "minor_version", "compatible_brands", "encoder"}
TIMECODE_CONTAINERS = (".mov", ".mp4", ".mxf", ".mkv")
"""Containers that carry a start timecode (QuickTime/MP4 a tmcd track, MXF its material package, Matroska a tag)."""
MXF_RATES = (24, 25, 30, 48, 50, 60, 100, 120)
"""Whole frame rates FFmpeg's MXF (OP1a) muxer takes; 16 fps Wan output must be retimed (output.fps) first."""


def kept_metadata(path: str | os.PathLike, metadata: dict[str, str] | None) -> dict[str, str] | None:
    """`metadata` less the keys `path`'s container would drop (the sidecar holds everything); None if none left."""
    kept = CONTAINERS.get(_extension(path), (None, None))[1]
    left = {k: v for k, v in (metadata or {}).items() if kept is None or k in kept}
    return left or None


def frame_bits(codec: str, pix_fmt: str = "auto", profile: str | None = None) -> int:
    """Bits per channel `codec` stores with these settings (8, 10, 12, 16; 16 for half-float EXR)."""
    return output_bits("", codec, pix_fmt, profile)


def _extension(path: str | os.PathLike) -> str:
    """Lower-case extension; "" for a directory (no extension, or a trailing slash)."""
    return extension(os.fspath(path))


def codec_for_path(path: str | os.PathLike) -> str:
    """The codec that codec="auto" means for `path`: the first codec listing its extension."""
    if name := codec_by_extension(_extension(path)):
        return name
    known = ", ".join(sorted({e for s in CODECS.values() for e in s.extensions if e}))
    raise OutputError(f"cannot pick a codec for {os.fspath(path)!r}: known extensions are {known}, "
                      "or none for a folder of PNG frames")


def check_output(path: str | os.PathLike, codec: str, pix_fmt: str, width: int, height: int, *,
                 metadata: dict[str, str] | None = None, crf: int | None = None, profile: str | None = None,
                 fps: int | None = None, timecode: str | None = None) -> list[str]:
    """Every problem with these output settings, as sentences; [] if fine. Does not touch the disk
    (whether the installed FFmpeg has the encoder is encoder_problem)."""
    ext = _extension(path)
    if codec == "auto":
        try:
            codec = codec_for_path(path)
        except OutputError as e:
            return [str(e)]
    if codec not in CODECS:
        return [f"codec {codec!r} is unknown; allowed: auto, {', '.join(CODECS)}"]
    spec, problems = CODECS[codec], []
    if ext not in spec.extensions:
        if spec.sequence:
            problems.append(f"codec {codec} writes a folder of frames; give a path without an extension, "
                            f"not {os.fspath(path)!r}")
        else:
            problems.append(f"extension {ext or '(none)'!r} does not match codec {codec}; "
                            f"use {', '.join(spec.extensions)}")
    if crf is not None and spec.crf_max is not None and not 0 <= crf <= spec.crf_max:
        problems.append(f"crf {crf} is out of range for {codec}; use 0..{spec.crf_max}")
    if spec.profiles:
        if pix_fmt not in ("auto", spec.pix_fmt("auto", profile if profile in spec.profiles else None)):
            problems.append(f"pix_fmt {pix_fmt!r}: {codec} takes its pix_fmt from output.profile; set pix_fmt auto")
        if profile is not None and profile not in spec.profiles:
            problems.append(f"profile {profile!r} is not a {codec} profile; choose one of {', '.join(spec.profiles)}")
    elif profile is not None:
        problems.append(f"profile {profile!r}: {codec} has no profiles (prores and dnxhr have)")
    elif spec.pix_fmts and pix_fmt != "auto" and pix_fmt not in spec.pix_fmts:
        problems.append(f"pix_fmt {pix_fmt!r} is not supported by {codec}; use {', '.join(spec.pix_fmts)}")
    pix_fmt = spec.pix_fmt(pix_fmt, profile if profile in spec.profiles else None)
    if timecode and ext not in TIMECODE_CONTAINERS:
        problems.append(f"timecode: {ext or 'a folder of frames'} cannot carry one; use {', '.join(TIMECODE_CONTAINERS)}")
    if ext == ".mxf" and fps is not None and fps not in MXF_RATES:
        problems.append(f"fps {fps}: MXF takes {', '.join(map(str, MXF_RATES))} fps; set output.fps (e.g. 24) "
                        "to retime, or write .mov")
    for name, value, least in (("width", width, spec.min_size[0]), ("height", height, spec.min_size[1])):
        if not isinstance(value, int) or value <= 0:
            problems.append(f"{name} {value!r} must be a positive integer")
        elif value < least:
            problems.append(f"{name} {value} is under the {least} {codec} needs (FFmpeg's {spec.encoder} refuses "
                            f"smaller frames); render at least {spec.min_size[0]}x{spec.min_size[1]}")
        elif spec.even_yuv420 and pix_fmt == "yuv420p" and value % 2:
            problems.append(f"{name} {value} is odd; yuv420p needs even width and height "
                            "— use an even size or pix_fmt=yuv444p")
    kept = CONTAINERS.get(ext, (None, None))[1]
    if metadata and kept is not None:
        if not kept:
            problems.append(f"{codec} output cannot store metadata; use write_sidecar instead")
        elif dropped := sorted(set(metadata) - kept):
            problems.append(f"metadata keys {dropped} would be dropped by {ext}; it keeps only "
                            f"{', '.join(sorted(kept))} (put extra data in 'comment' or the sidecar)")
    return problems


def encoder_problem(codec: str) -> str | None:
    """Why the installed FFmpeg cannot encode `codec` (a CODECS name), or None. Checked before sampling,
    so a missing encoder never costs a render."""
    encoder = CODECS[codec].encoder
    if encoder is None:
        return None
    try:
        av.codec.Codec(encoder, "w")
    except (av.codec.codec.UnknownCodecError, ValueError):
        return (f"codec {codec}: the installed FFmpeg has no {encoder} encoder (PyAV {av.__version__}); install a "
                f"PyAV/FFmpeg build with it (docs/delivery.md) or choose another output.codec")
    return None


def _fsync(path: Path) -> None:
    # Without this a power cut after the rename can leave a complete-looking name with no data.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _as_frame(frame, height: int, width: int, deep: bool = False) -> np.ndarray:
    """A caller's frame (uint8, or uint16 0..65535: vidgen.masters) as a contiguous array [H, W, 3] of the
    writer's depth (uint16 when `deep`, else uint8); raises ValueError saying what is off."""
    if hasattr(frame, "detach"):  # torch.Tensor, without importing torch here
        frame = frame.detach().cpu().numpy()
    if not isinstance(frame, np.ndarray):
        raise ValueError(f"frame is a {type(frame).__name__}; expected a numpy array or torch tensor")
    if frame.dtype not in (np.uint8, np.uint16):
        raise ValueError(f"frame dtype is {frame.dtype}; expected uint8 (scale and round to 0..255 first) or uint16")
    if frame.shape != (height, width, 3):
        raise ValueError(f"frame shape is {list(frame.shape)}; expected [H, W, 3] = [{height}, {width}, 3]")
    return np.ascontiguousarray(to_deep(frame) if deep else to_eight(frame))


def _sane_dts(packets: list[av.Packet], fps: int) -> list[av.Packet]:
    """Packets with a decode timestamp no muxer refuses. libx265 given a clip of two frames now and then
    hands back its flushed keyframe with an uninitialised dts (-9.4e13 seen), which the MP4/QuickTime
    muxer refuses ("not yet implemented"): one run in four failed. A dts after its pts, or more than a
    reorder window (64 frames) before it, is such garbage and becomes the pts."""
    for packet in packets:
        if packet.dts is not None and packet.pts is not None and packet.time_base:
            window = 64 * max(1, packet.duration or round(1 / (fps * packet.time_base)))
            if not packet.pts - window <= packet.dts <= packet.pts:
                packet.dts = packet.pts
    return packets


def _gif_frame(rgb: np.ndarray) -> av.VideoFrame:
    """RGB [H, W, 3] -> a pal8 frame with its own 256-colour palette.

    FFmpeg's gif encoder only takes palette formats and swscale's rgb8 is a fixed 3-3-2 palette
    that bands badly, so Pillow picks each frame's palette; no dithering, because dither noise
    flickers from frame to frame and bloats the file. The palette is chosen on a downscaled copy:
    5x faster at 832x480 (~40 ms a frame) for about the same error.
    """
    full = Image.fromarray(rgb)
    palette_image = full.reduce(max(1, min(rgb.shape[:2]) // 120)).quantize(256, dither=Image.Dither.NONE)
    image = full.quantize(palette=palette_image, dither=Image.Dither.NONE)
    palette = np.zeros((256, 4), np.uint8)  # ARGB, as PyAV wants for pal8
    rgb_palette = np.asarray(image.getpalette(), np.uint8).reshape(-1, 3)[:256]
    palette[:, 0] = 255
    palette[: len(rgb_palette), 1:] = rgb_palette
    return av.VideoFrame.from_ndarray((np.asarray(image), palette), format="pal8")


class VideoWriter:
    """Writes frames one by one to a video file or a folder of PNGs, atomically.

    Use as a context manager: on leaving normally the output is flushed and renamed into place; on
    any exception (KeyboardInterrupt too) the partial output is deleted and `path` is untouched.
    Without `overwrite` nothing is ever replaced: an existing `path` is refused at once, and one
    that appears while frames are written makes close() keep the clip as `NAME-2.EXT` and raise
    OutputError saying so (vidgen.paths.publish).

    Args:
        path: final file, or folder for png (no extension or a trailing slash).
        fps: frames per second. GIF stores delays in 1/100 s, so an fps that does not divide 100
            (e.g. 16 -> 16.67) is rounded by the format; one warning line (logging) says so.
        width, height: frame size in pixels; every frame is [height, width, 3] RGB, uint8 or uint16 (a
            master's 16-bit frames, vidgen.masters; `bits` says what the codec keeps of them).
        codec: a CODECS key or "auto" (from the extension).
        crf: quality for h264/h265 (0..51) and vp9 (0..63); lower is better. Ignored for the others.
        pix_fmt: auto (the codec's or profile's), yuv420p (plays everywhere), yuv444p, h265's 10-bit ones.
        profile: prores / dnxhr profile (CODECS[codec].profiles; None = the first).
        exr: exr frames in "linear" light or as "decoded" (vidgen.masters.srgb_to_linear).
        timecode: start timecode (HH:MM:SS:FF) for .mov/.mp4/.mxf/.mkv.
        finish: called with the finished temporary file (not a frame folder) before it is put in place;
            returns the file to publish instead (a new temporary beside it: sound muxed, credentials
            signed). The writer deletes every temporary, whatever happens.
        metadata: container tags; see the module docstring for which keys each container keeps.
        overwrite: replace an existing file (a PNG folder only if it holds nothing but frames).
        root: every write stays inside this folder, links resolved when writing (vidgen.paths.confine).
        sidecar: a function returning the JSON sidecar (`<path>.json`), called once the frames are
            flushed; the sidecar is written before the rename, so a failure leaves nothing at `path`.
        outputs: the render's OutputSet (vidgen.paths): the video and sidecar are put in place through
            it, so they keep the name its other files have (`path` is then its current video name,
            and after close() where the video went).
    """

    def __init__(self, path: str | os.PathLike, *, fps: int, width: int, height: int,
                 codec: str = "h264", crf: int = 18, pix_fmt: str = "auto", profile: str | None = None,
                 exr: str = "linear", timecode: str | None = None,
                 metadata: dict[str, str] | None = None, overwrite: bool = False,
                 root: str | os.PathLike | None = None, sidecar: Callable[[], dict] | None = None,
                 outputs: OutputSet | None = None, finish: Callable[[Path], Path] | None = None):
        if outputs is not None:
            path, overwrite, root = outputs.path("video"), outputs.overwrite, outputs.root
        self.codec = codec_for_path(path) if codec == "auto" else codec
        problems = check_output(path, self.codec, pix_fmt, width, height, metadata=metadata, crf=crf,
                                profile=profile, fps=fps, timecode=timecode)
        if not problems and (missing := encoder_problem(self.codec)):
            problems.append(missing)
        if not isinstance(fps, int) or fps <= 0:
            problems.append(f"fps {fps!r} must be a positive integer")
        spec = CODECS.get(self.codec)
        if problems:
            raise OutputError(f"cannot write {os.fspath(path)}: " + "; ".join(problems))
        if self.codec == "gif" and 100 % fps:
            log.warning("GIF stores frame delays in 1/100 s: fps %d plays as %.2f; use 10, 20, 25 or 50 for exact "
                        "timing", fps, 100 / round(100 / fps))

        self.path = Path(path)
        self.width, self.height, self.fps = width, height, fps
        self.profile = profile or (next(iter(spec.profiles)) if spec.profiles else None)
        self.pix_fmt = spec.pix_fmt(pix_fmt, self.profile)
        self.bits = frame_bits(self.codec, pix_fmt, self.profile)
        self.exr, self.timecode, self._finish = exr, timecode, finish
        self.frames_written = 0
        self.overwrite, self.root, self._sidecar, self.outputs = overwrite, root, sidecar, outputs
        self._spec = spec
        self._tmp = partial_path(self.path)
        self._container = self._stream = None
        self._closed = False
        if not self.path.parent.is_dir():
            raise OutputError(f"cannot write {self.path}: {self.path.parent} is not an existing folder")
        if (why := name_problem(self.path)) is not None:
            raise OutputError(f"cannot write {why}")
        if os.path.lexists(self.path) and not overwrite and outputs is None:    # an OutputSet moves instead
            raise OutputError(f"cannot write {self.path}: it already exists (pass overwrite=True to replace it)")
        try:
            self._open(crf, metadata or {})
        except (OSError, av.FFmpegError) as e:
            self.abort()
            raise OutputError(f"cannot write {self.path}: {e}") from e

    def _open(self, crf: int, metadata: dict[str, str]) -> None:
        confine(self.path, self.root)
        if self._spec.encoder is None:  # png frames
            self._tmp.mkdir()
            return
        if self._spec.sequence:     # exr, png16: one file per frame, encoded by FFmpeg
            self._tmp.mkdir()
            return
        fmt = CONTAINERS[self.path.suffix.lower()][0]
        # Explicit format, because the muxer is otherwise guessed from the .partial name.
        self._container = av.open(os.fspath(self._tmp), "w", format=fmt,
                                  options={"loop": "0"} if fmt == "gif" else {})  # loop forever
        self._container.metadata.update(metadata)
        if self.timecode:
            self._container.metadata["timecode"] = self.timecode
        options = dict(self._spec.options)
        if self._spec.crf_max is not None:
            options["crf"] = str(crf)
        if self.profile is not None:
            options["profile"] = self._spec.profiles[self.profile][0]
        stream = self._container.add_stream(self._spec.encoder, rate=self.fps, options=options)
        stream.width, stream.height = self.width, self.height
        stream.pix_fmt = "pal8" if self.codec == "gif" else self.pix_fmt
        if self.codec != "gif":
            # Tag BT.709 limited range (what write() converts to): untagged HD video is shown as
            # BT.601 by some players and BT.709 by others, shifting colours.
            ctx = stream.codec_context
            ctx.colorspace = ctx.color_primaries = ctx.color_trc = 1  # AVCOL_*_BT709
            ctx.color_range = 1  # AVCOL_RANGE_MPEG
        if self.codec == "h265" and fmt in ("mp4", "mov"):
            stream.codec_context.codec_tag = "hvc1"  # QuickTime/Safari refuse FFmpeg's default hev1
        # Open the encoder now, so bad settings fail here rather than at the first frame.
        stream.codec_context.open()
        self._stream = stream

    def write(self, frame) -> None:
        """Encode one frame: [H, W, 3] RGB, uint8 or uint16, numpy array or torch tensor (any device).

        A uint16 frame reaches a deep codec at full depth; an 8-bit codec gets it rounded to uint8,
        and a deep codec gets a uint8 frame scaled (x257)."""
        if self._closed:
            raise ValueError(f"write() after close() on {self.path}")
        rgb = _as_frame(frame, self.height, self.width, deep=self.bits > 8)
        name = self._tmp / f"frame_{self.frames_written:05d}"
        try:
            if self.codec == "png":
                Image.fromarray(rgb).save(name.with_suffix(".png"))
            elif self.codec == "png16":
                _write_synced(name.with_suffix(".png"), png16_bytes(rgb))
            elif self.codec == "exr":
                _write_synced(name.with_suffix(".exr"), exr_bytes(rgb, self.exr, self._spec.options))
            else:
                if self.codec == "gif":
                    vframe = _gif_frame(rgb)
                else:
                    vframe = av.VideoFrame.from_ndarray(rgb, format="rgb48le" if self.bits > 8 else "rgb24").reformat(
                        format=self.pix_fmt, dst_colorspace="ITU709", dst_color_range="MPEG")
                vframe.pts = self.frames_written
                self._container.mux(_sane_dts(self._stream.encode(vframe), self.fps))
        except (OSError, av.FFmpegError) as e:
            raise OutputError(f"writing frame {self.frames_written} of {self.path} failed: {e}") from e
        self.frames_written += 1

    def close(self) -> None:
        """Flush the encoder, close the file, write the sidecar and rename both into place. Idempotent."""
        if self._closed:
            return
        if self.frames_written == 0:
            self.abort()
            raise OutputError(f"no frames were written to {self.path}; nothing saved")
        side_tmp = None
        try:
            if self._container is not None:
                self._container.mux(_sane_dts(self._stream.encode(None), self.fps))  # drain frames held back for B-frames
                self._container.close()
                self._container = None
                _fsync(self._tmp)
                if self._finish is not None:
                    self._finished()
            if self._sidecar is not None:
                side_tmp = partial_path(sidecar_path(self.path))
                _write_synced(side_tmp, _sidecar_bytes(self._sidecar()))
            if self.outputs is None:
                publish(self._tmp, self.path, overwrite=self.overwrite, sidecar_tmp=side_tmp, root=self.root)
            else:
                if side_tmp is not None:
                    self.outputs.put("sidecar", side_tmp)
                    side_tmp = None
                self.path = self.outputs.put("video", self._tmp)
        except (OSError, av.FFmpegError) as e:
            self.abort()
            if side_tmp is not None:
                discard(side_tmp)
            raise OutputError(f"finishing {self.path} failed: {e.strerror if isinstance(e, OSError) else e}") from e
        except BaseException:
            if os.path.lexists(self._tmp):      # kept under another name by publish, or not yet moved
                self.abort()
            if side_tmp is not None:
                discard(side_tmp)
            self._closed = True
            raise
        self._closed = True

    def _finished(self) -> None:
        """Run `finish` on the temporary; its result becomes the temporary (the old one is deleted)."""
        try:
            done = Path(self._finish(self._tmp))
        except BaseException:
            self.abort()
            raise
        if done != self._tmp:
            discard(self._tmp)
            self._tmp = done

    def abort(self) -> None:
        """Drop the partial output; `path` is left as it was. Idempotent."""
        self._closed = True
        if self._container is not None:
            try:
                self._container.close()
            except (OSError, av.FFmpegError):
                pass  # the file is being deleted anyway
            self._container = None
        discard(self._tmp)

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def read_frames(path: str | os.PathLike, deep: bool = False) -> Iterator[np.ndarray]:
    """Decode every frame of a file or frame folder (PNG, EXR) written by VideoWriter; yields uint8
    [H, W, 3] RGB, or with `deep` uint16 (a 10-bit master's levels kept; 8-bit sources scaled x257)."""
    path = Path(path)
    try:
        if path.is_dir():
            for name in _frame_files(path):
                if name.suffix == ".exr" or deep:
                    yield read_image(name, deep)
                elif name.suffix == ".png":
                    with Image.open(name) as image:
                        yield np.asarray(image.convert("RGB")) if image.mode in ("RGB", "RGBA", "P", "L") \
                            else read_image(name, False)
            return
        with av.open(os.fspath(path)) as container:
            if not container.streams.video:     # e.g. an .m4a: decode(video=0) would say "tuple index out of range"
                raise OutputError(f"cannot read {path}: it holds no video stream (audio only?); give a video file "
                                  f"or a folder of PNG frames")
            for frame in container.decode(video=0):     # converts using the frame's own colour tags
                yield frame.to_ndarray(format="rgb48le" if deep else "rgb24")
    except (OSError, av.FFmpegError) as e:
        raise OutputError(f"cannot read {path}: {e}") from e


def _frame_files(folder: Path) -> list[Path]:
    """The frame files of a sequence VideoWriter wrote (frame_NNNNN.png / .exr), in order."""
    return sorted(p for p in folder.iterdir() if FRAME_RE.fullmatch(p.name))


def video_fps(path: str | os.PathLike) -> float | None:
    """The frame rate a video file's container declares (nothing is decoded); None for PNG folders and
    for files without a video stream (read_frames says what is wrong with those)."""
    path = Path(path)
    if path.is_dir():
        return None
    try:
        with av.open(os.fspath(path)) as container:
            video = container.streams.video
            return _rate(video[0]) if video else None
    except (OSError, av.FFmpegError) as e:
        raise OutputError(f"cannot read {path}: {e}") from e


def _rate(stream) -> float | None:
    rate = stream.average_rate or stream.guessed_rate
    return float(rate) if rate else None


def read_video_info(path: str | os.PathLike) -> dict:
    """What a written output really holds, found by decoding every frame.

    Returns:
        {"codec": FFmpeg decoder name ("h264", "hevc", "vp9", "gif", "png", "prores", "dnxhd", "exr"),
         "frames": int, "fps": float (None for frame folders), "width": int, "height": int,
         "pix_fmt": the decoded pix_fmt, "bits": bits per channel it holds, "profile": the codec's
         profile name or None, "timecode": start timecode or None,
         "metadata": dict with lower-case keys, without the muxer's own keys}.
    """
    path = Path(path)
    frames, size = 0, (0, 0)
    for frame in read_frames(path):     # first: it refuses a file with no video stream
        frames, size = frames + 1, frame.shape[:2]
    info = {"codec": "png", "fps": None, "metadata": {}, "pix_fmt": None, "profile": None, "timecode": None}
    first = _frame_files(path)[:1] if path.is_dir() else [path]
    try:
        for name in first:
            with av.open(os.fspath(name)) as container:
                stream = container.streams.video[0]
                pix_fmt = next(container.decode(video=0)).format.name
        if first:
            info.update(codec=stream.codec_context.name, pix_fmt=pix_fmt, profile=stream.codec_context.profile)
    except (OSError, av.FFmpegError, StopIteration) as e:
        raise OutputError(f"cannot read {path}: {e}") from e
    info["bits"] = bits(info["pix_fmt"] or "")
    if not path.is_dir():
        try:
            with av.open(os.fspath(path)) as container:
                stream = container.streams.video[0]
                tags = {k.lower(): v for k, v in {**stream.metadata, **container.metadata}.items()}
                info.update(fps=_rate(stream), timecode=tags.get("timecode"),
                            metadata={k.lower(): v for k, v in container.metadata.items()
                                      if k.lower() not in MUXER_KEYS | {"timecode"}})
        except (OSError, av.FFmpegError) as e:
            raise OutputError(f"cannot read {path}: {e}") from e
    return {**info, "frames": frames, "width": size[1], "height": size[0]}


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "xb") as f:      # x: a temporary is always new, never someone's file
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _sidecar_bytes(data: dict) -> bytes:
    # allow_nan=False: NaN/Infinity are not JSON and other tools would reject the file.
    return (json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n").encode()


def atomic_write_bytes(path: str | os.PathLike, data: bytes, failure: str | None = None, *,
                       overwrite: bool = True, root: str | os.PathLike | None = None) -> Path:
    """Write `data` to `path` through a temporary file and a rename; returns `path`.

    With overwrite=False an existing `path` is never replaced (vidgen.paths.publish: the data is
    kept under another name and OutputError says so). An OSError becomes an OutputError
    (`{failure}: {reason}` when `failure` is given), and no temporary file is left behind.
    """
    path = Path(path)

    def place(tmp: Path) -> Path:
        publish(tmp, path, overwrite=overwrite, root=root)
        return path
    return _through_temporary(path, data, place, failure or f"cannot write {path}")


def put_bytes(outputs: OutputSet, role: str, data: bytes, failure: str) -> Path:
    """Write `data` as the render's `role` file (vidgen.paths.OutputSet.put: never over another's
    file; the render's files move together); returns where it went. An OSError becomes an
    OutputError `{failure}: {reason}`, and no temporary is left behind."""
    return _through_temporary(outputs.path(role), data, lambda tmp: outputs.put(role, tmp), failure)


def _through_temporary(path: Path, data: bytes, place: Callable[[Path], Path], failure: str) -> Path:
    """`data` written and synced beside `path`, then place(temporary) moves it; returns where it went.
    An OSError becomes OutputError `{failure}: {reason}`, and the temporary never stays behind."""
    tmp = partial_path(path)
    try:
        _write_synced(tmp, data)
        return place(tmp)
    except BaseException as e:
        discard(tmp)
        if isinstance(e, OSError):
            raise OutputError(f"{failure}: {e.strerror or e}") from None
        raise


def write_sidecar(path: str | os.PathLike, data: dict, *, overwrite: bool = True) -> Path:
    """Write `data` as JSON to `<path>.json` (out.mp4 -> out.mp4.json) atomically; returns that path."""
    return atomic_write_bytes(sidecar_path(Path(path)), _sidecar_bytes(data), overwrite=overwrite)


# ------------------------------------------------------------------------------- output names


def slug(text: str, n: int = 48) -> str:
    """A file-name-safe form of a prompt: words joined by '-', at most n characters, cut between words."""
    text = re.sub(r"[^a-zA-Z0-9]+", "-", text).strip("-").lower()
    if len(text) > n:
        text = text[:n + 1].rsplit("-", 1)[0] if "-" in text[:n + 1] else text[:n]
    return text or "render"


def literal(path: str) -> str:
    """`path` as an output.path template that formats to itself (braces escaped)."""
    return path.replace("{", "{{").replace("}", "}}")


def output_path(template: str, seed: int, prompt: str) -> Path:
    """output.path with its placeholders filled ({seed}, {time}, {prompt}) and ~ expanded."""
    return Path(template.format(seed=seed, time=time.strftime("%Y%m%d-%H%M%S"), prompt=slug(prompt))).expanduser()
