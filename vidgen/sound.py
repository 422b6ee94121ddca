"""Sound under a finished video: a track laid at an offset, fitted to the video's length, and muxed
beside the video stream, which is copied packet for packet (never re-encoded: the pixels a render
or a stitch wrote are the pixels delivered).

Film time 0 is track time `offset` seconds: a positive offset starts the film that far into the
track, a negative one puts that much silence first. The sound is then made exactly as long as the
video (to the sample: round(video_seconds * 48000)), as `fit` allows:

    both   pad a short track with silence, cut a long one
    pad    pad a short track; refuse a long one
    cut    cut a long track; refuse a short one
    exact  refuse a track that differs from the video by more than one video frame

Padding or cutting is never silent: one warning line on the "vidgen" logger says how much, and the
SoundReport records it. Every track is resampled to 48 kHz (what video deliveries use, and the only
rate Opus takes), its channels kept as they are.

Encoder delay: AAC and Opus encoders emit priming samples before the first real one. FFmpeg gives
those packets negative timestamps and the mp4/mov muxers write an edit list (Matroska and WebM a
codec delay) that tells players to skip them, so track sample 0 plays with the first video frame;
the audio frames are stamped from the first video frame's own timestamp, so a container whose
video starts later than 0 stays in sync too. tests/test_sound.py measures both, through the
container's stream duration and by decoding.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from .errors import InputError, OutputError
from .output_config import AUDIO_FITS
from .io import CONTAINERS, MUXER_KEYS
from .paths import confine, discard

log = logging.getLogger("vidgen")

SAMPLE_RATE = 48000
"""Every track is resampled to this rate (video deliveries use 48 kHz; Opus takes nothing else)."""
FITS = AUDIO_FITS
"""both | pad | cut | exact: the names the config's audio.fit allows (vidgen.output_config)."""
SLACK = 4
"""Samples a track may differ from the video by without counting as padded or cut: resampling
rounds a track's length to the new rate, and a few samples (0.08 ms) are no one's intent."""

ENCODERS: dict[str, tuple[str, ...]] = {
    "aac": ("aac",), "pcm_s16le": ("pcm_s16le",), "pcm_s24le": ("pcm_s24le",),
    "opus": ("libopus",), "vorbis": ("libvorbis",)}
"""Audio codec names (the `codec` argument) -> the FFmpeg encoders that write them, the first
installed one used. FFmpeg's own opus and vorbis encoders are experimental, so they are not offered."""

SOUND_CODECS: dict[str, tuple[str, ...]] = {
    ".mp4": ("aac",),
    ".mkv": ("aac", "pcm_s16le", "pcm_s24le", "opus", "vorbis"),
    ".mov": ("pcm_s16le", "pcm_s24le", "aac"),
    ".mxf": ("pcm_s16le", "pcm_s24le"),
    ".webm": ("opus", "vorbis"),
}
"""Container extension -> the sound codecs it holds, the default first (its muxer: vidgen.io.CONTAINERS)."""
_NO_SOUND = {".gif": "a GIF holds no sound", "": "a folder of image frames holds no sound"}
_BIT_RATE = {"aac": 96_000, "opus": 64_000}      # per channel
_DTYPES = {"flt": np.float32, "dbl": np.float64, "s16": np.int16, "s32": np.int32}     # planar or packed
_CODEC_OF = {encoder: name for name, encoders in ENCODERS.items() for encoder in encoders}
_LAYOUTS = {1: "mono", 2: "stereo"}     # WAV files often give "2 channels", which encoders refuse


@dataclass
class SoundReport:
    """What mux laid under the video, in samples at `sample_rate` (film sample s = track sample
    s - lead + skip while the track plays)."""

    track: str
    codec: str
    """The FFmpeg encoder used (aac, pcm_s16le, libopus, ...)."""
    sample_rate: int
    channels: int
    offset: float
    fit: str
    video_seconds: float
    samples: int
    """Samples of sound written: round(video_seconds * sample_rate)."""
    lead: int = 0
    """Silence before the track's first sample (a negative offset)."""
    skip: int = 0
    """Track samples before film time 0 (a positive offset), not heard."""
    padded: int = 0
    """Silence after the track's end, added to reach the video's end (fit)."""
    cut: int = 0
    """Track samples after the video's end, left out (fit)."""

    @property
    def padded_seconds(self) -> float:
        return self.padded / self.sample_rate

    @property
    def cut_seconds(self) -> float:
        return self.cut / self.sample_rate

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------- checks


def container_problem(ext: str, codec: str | None = None) -> str | None:
    """Why a file with extension `ext` cannot hold sound of `codec` (None: the container's default),
    or None when it can."""
    ext = ext.lower()
    if ext in _NO_SOUND:
        return f"{_NO_SOUND[ext]}; write the video as .mp4, .mkv, .mov or .webm to add sound"
    if ext not in SOUND_CODECS:
        return f"cannot add sound to a {ext} file; use one of {', '.join(SOUND_CODECS)}"
    allowed = SOUND_CODECS[ext]
    if codec is not None and codec not in ENCODERS:
        return f"audio codec {codec!r} is unknown; allowed: {', '.join(ENCODERS)}"
    if codec is not None and codec not in allowed:
        return f"a {ext} file cannot hold {codec} sound; it holds {', '.join(allowed)}"
    if _encoder(ext, codec) is None:
        wanted = [codec] if codec else list(allowed)
        encoders = ", ".join(e for c in wanted for e in ENCODERS[c])
        return (f"this FFmpeg has no encoder for {' or '.join(wanted)} ({encoders}), which a {ext} file needs; "
                "install a PyAV whose FFmpeg has one, or write .mp4 (AAC)")
    return None


def _encoder(ext: str, codec: str | None) -> str | None:
    """The FFmpeg encoder for `codec` (None: the first of the container's codecs this FFmpeg can write)."""
    for name in [codec] if codec else SOUND_CODECS[ext]:
        for encoder in ENCODERS[name]:
            if encoder in av.codecs_available:
                try:
                    av.Codec(encoder, "w")
                    return encoder
                except (av.FFmpegError, ValueError):
                    continue
    return None


def check(track: str | os.PathLike, offset: float = 0.0, fit: str = "both", video_seconds: float | None = None,
          container_ext: str = ".mp4", *, fps: float | None = None, codec: str | None = None) -> list[str]:
    """Every problem with laying `track` under a video, as sentences ([] if none); decodes nothing
    unless the track's container does not say how long it is.

    Checks: the container can hold sound (a .gif or a folder of frames cannot; .webm needs an Opus or
    Vorbis encoder), `fit` is known, the track exists and holds an audio stream, some of it plays
    (the offset is not past its end, nor, given `video_seconds`, the film's end), and, given
    `video_seconds`, that `fit` allows its length (`exact` allows one frame of `fps` either way).
    The track's length is the container's (exact for WAV; an estimate for some compressed files,
    which mux measures again by decoding).
    """
    problems = []
    if why := container_problem(container_ext, codec):
        problems.append(why)
    if fit not in FITS:
        problems.append(f"fit: {fit!r} is not allowed; choose one of {', '.join(FITS)}")
    try:
        length = track_seconds(track)
    except InputError as e:
        return problems + [str(e)]
    if offset >= length:
        problems.append(f"offset {offset:g} s is at or past the end of {Path(track).name} ({length:.3f} s): none of it "
                        "would play; give a smaller offset")
    elif video_seconds is not None and -offset >= video_seconds:
        problems.append(f"offset {offset:g} s starts {Path(track).name} at or after the video's end "
                        f"({video_seconds:.3f} s): none of it would play")
    elif video_seconds is not None and fit in FITS:
        problems += _fit_problems(Path(track).name, length - offset - video_seconds, fit, fps)
    return problems


def _fit_problems(name: str, extra: float, fit: str, fps: float | None) -> list[str]:
    """The refusal, if any, of a track running `extra` seconds past the video's end (< 0: short)."""
    frame, slack = (1 / fps if fps else 0.0), SLACK / SAMPLE_RATE
    if fit == "pad" and extra > slack:
        return [f"{name} runs {extra:.3f} s past the video's end and fit: pad never cuts; use fit: cut or both, "
                "a larger offset or a shorter track"]
    if fit == "cut" and -extra > slack:
        return [f"{name} ends {-extra:.3f} s before the video does and fit: cut never pads; use fit: pad or both, "
                "a smaller offset or a longer track"]
    if fit == "exact" and abs(extra) > frame + slack:
        side = f"runs {extra:.3f} s past the video's end" if extra > 0 else f"ends {-extra:.3f} s before the video"
        return [f"{name} {side}; fit: exact allows one frame ({frame:.3f} s); use fit: both, pad or cut"]
    return []


def track_seconds(track: str | os.PathLike) -> float:
    """The length of `track`'s first audio stream in seconds, from its container (nothing decoded).

    Raises:
        InputError: the track is missing, not a regular file, unreadable, or holds no audio stream.
    """
    path = Path(track)
    if not path.exists():
        raise InputError(f"audio track {str(path)!r} does not exist")
    if not path.is_file():
        raise InputError(f"audio track {str(path)!r} is not a regular file")
    try:
        with av.open(os.fspath(path)) as container:
            if not container.streams.audio:
                raise InputError(f"audio track {str(path)!r} holds no audio stream")
            stream = container.streams.audio[0]
            if stream.duration is not None and stream.time_base:
                return float(stream.duration * stream.time_base)
            if container.duration is not None:
                return container.duration / av.time_base
            return sum(frame.samples for frame in container.decode(stream)) / stream.codec_context.sample_rate
    except (OSError, av.FFmpegError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read audio track {str(path)!r}: {e}") from None


# ------------------------------------------------------------------------------- mux


def mux(video: str | os.PathLike, dest: str | os.PathLike, *, track: str | os.PathLike, offset: float = 0.0,
        fit: str = "both", codec: str | None = None, root: str | os.PathLike | None = None) -> SoundReport:
    """Write `video`'s video stream (copied, not re-encoded) with `track` laid under it to `dest`.

    Args:
        video: a finished video file (.mp4, .mkv, .mov, .webm, .mxf).
        dest: a fresh temporary path with the same extension; the caller renames it into place
            (vidgen.paths.publish). It must not exist; on any failure nothing is left there.
        track: any audio file FFmpeg reads; decoded, resampled to 48 kHz, channels kept.
        offset: film time 0 = track time `offset` seconds (negative: that much silence first).
        fit: both | pad | cut | exact (module docstring).
        codec: aac | pcm_s16le | pcm_s24le | opus | vorbis; None = AAC for .mp4/.mkv, 16-bit PCM for
            .mov/.mxf, Opus (else Vorbis) for .webm.
        root: `dest` must be inside it (vidgen.paths.confine), links resolved now.
    Returns:
        SoundReport: what was laid, padded and cut, in samples.
    Raises:
        InputError: the track is missing, unreadable or without sound, or `fit` refuses its length.
        OutputError: the container cannot hold sound (a .gif, a folder of frames), `dest` exists or
            has another extension than `video`, or writing failed.
    """
    video, dest = Path(video), Path(dest)
    if not video.exists():
        raise OutputError(f"cannot add sound to {video}: it does not exist")
    ext = video.suffix.lower() if video.is_file() else ""
    if why := container_problem(ext, codec):
        raise OutputError(f"cannot add sound to {video}: {why}")
    if dest.suffix.lower() != ext:
        raise OutputError(f"sound: {dest} must have the extension of {video} ({ext}): the video stream is copied as is")
    if os.path.lexists(dest):
        raise OutputError(f"sound: {dest} already exists; mux writes a fresh temporary only")
    confine(dest, root)
    frames, fps, start = _video_timing(video)
    seconds = float(frames / fps)
    if problems := check(track, offset, fit, seconds, ext, fps=float(fps), codec=codec):
        raise InputError(f"sound for {video.name}: " + "; ".join(problems))
    encoder, length = _encoder(ext, codec), track_seconds(track)
    try:
        report = _write(video, dest, Path(track), encoder, offset, fit, (seconds, float(fps), start), length)
    except BaseException as e:
        discard(dest)
        if isinstance(e, (OSError, av.FFmpegError)):
            raise OutputError(f"sound: writing {dest.name} failed: {e}") from e
        raise
    lines = []
    if report.padded > SLACK:
        lines.append(f"ends {report.padded_seconds:.3f} s before the video does: {report.padded_seconds:.3f} s of "
                     f"silence added at the end (fit: {fit})")
    if report.cut > SLACK:
        lines.append(f"runs {report.cut_seconds:.3f} s past the video's end: cut there (fit: {fit})")
    if lines:
        log.warning("sound: %s %s", Path(track).name, "; ".join(lines))
    return report


def _video_timing(video: Path) -> tuple[int, Fraction, Fraction]:
    """(frames, fps, the first frame's time in seconds) of `video`'s first video stream, from its packets."""
    try:
        with av.open(os.fspath(video)) as container:
            if not container.streams.video:
                raise OutputError(f"cannot add sound to {video}: it holds no video stream")
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate
            stamps = [p.pts for p in container.demux(stream) if p.size and p.pts is not None]
    except (OSError, av.FFmpegError) as e:
        raise OutputError(f"cannot read {video}: {e}") from None
    if not stamps or not rate:
        raise OutputError(f"cannot add sound to {video}: it holds no frames (or no frame rate)")
    return len(stamps), Fraction(rate), min(stamps) * stream.time_base


def _write(video: Path, dest: Path, track: Path, encoder: str, offset: float, fit: str,
           timing: tuple[float, float, Fraction], length: float) -> SoundReport:
    seconds, fps, start = timing
    with av.open(os.fspath(video)) as src, av.open(os.fspath(track)) as sound, \
            av.open(os.fspath(dest), "w", format=CONTAINERS[dest.suffix.lower()][0]) as out:
        out.metadata.update({k: v for k, v in src.metadata.items() if k.lower() not in MUXER_KEYS})
        vin = src.streams.video[0]
        if "timecode" in vin.metadata:      # QuickTime/MP4 keep it on the video stream; the muxer remakes tmcd
            out.metadata["timecode"] = vin.metadata["timecode"]
        vout = out.add_stream_from_template(vin)
        ain = sound.streams.audio[0]
        given = ain.codec_context.layout
        layout = _LAYOUTS.get(given.nb_channels, given.name)
        aout = out.add_stream(encoder, rate=SAMPLE_RATE)
        aout.layout = layout
        formats = [f.name for f in (aout.codec_context.codec.audio_formats or ())]
        aout.format = next((f for f in ("fltp", "flt") if f in formats), formats[0] if formats else "fltp")
        channels = given.nb_channels
        if per_channel := _BIT_RATE.get(_CODEC_OF.get(encoder, "")):
            aout.bit_rate = per_channel * channels
        aout.codec_context.open()
        report = SoundReport(str(track), encoder, SAMPLE_RATE, channels, offset, fit, seconds,
                             round(seconds * SAMPLE_RATE))
        laid = _laid(sound, ain, aout.format.name, layout, report, fps, length)
        packets = _encoded(aout, laid, aout.codec_context.frame_size or 1024, round(start * SAMPLE_RATE))
        pending = next(packets, None)
        for packet in src.demux(vin):
            if not packet.size:         # the demuxer's final empty packet
                continue
            when = packet.dts if packet.dts is not None else packet.pts
            # interleave: the sound up to this frame's time goes first
            while pending is not None and (when is None or pending.pts * pending.time_base <= when * packet.time_base):
                out.mux(pending)
                pending = next(packets, None)
            packet.stream = vout
            out.mux(packet)
        while pending is not None:
            out.mux(pending)
            pending = next(packets, None)
    return report


def _laid(sound, stream, fmt: str, layout: str, report: SoundReport, fps: float,
          length: float) -> Iterator[np.ndarray]:
    """The film's sound as [channels, samples] blocks in the encoder's sample format: `report.lead`
    samples of silence, the track from its sample `report.skip`, then silence: `report.samples` in
    all. Fills in the report; decoding stops at the video's end, so what is cut is counted from the
    container's length of the track (`length` seconds). Refuses a track that decodes shorter than
    its container said when `report.fit` allows no padding."""
    want, name = report.samples, Path(report.track).name
    shift = round(report.offset * SAMPLE_RATE)
    report.lead, report.skip = max(0, -shift), max(0, shift)
    resampler = av.AudioResampler(format=fmt, layout=layout, rate=SAMPLE_RATE)
    dtype = _DTYPES[fmt.rstrip("p")]
    given, skip = min(report.lead, want), report.skip
    if given:
        yield np.zeros((report.channels, given), dtype)
    for block in _decoded(sound, stream, resampler, report):
        if skip:
            dropped = min(skip, block.shape[1])
            block, skip = block[:, dropped:], skip - dropped
        block = block[:, :want - given]
        given += block.shape[1]
        if block.shape[1]:
            yield block
        if given == want:
            break
    if skip:
        raise InputError(f"sound: offset {report.offset:g} s is at or past the end of {name}: none of it would play")
    if given == want:
        report.cut = max(0, round((length - report.offset) * SAMPLE_RATE) - want)
    else:
        report.padded = want - given
        if problems := _fit_problems(name, -report.padded / SAMPLE_RATE, report.fit, fps):
            raise InputError(f"sound: {problems[0]} (as decoded; its container said {length:.3f} s)")
        yield np.zeros((report.channels, report.padded), dtype)


def _decoded(sound, stream, resampler: av.AudioResampler, report: SoundReport) -> Iterator[np.ndarray]:
    """The track's samples, resampled, as [channels, samples] blocks (the resampler's tail included)."""
    try:
        for frame in sound.decode(stream):
            frame.pts = None            # the resampler times its output itself
            for out in resampler.resample(frame):
                yield _planes(out, report.channels)
        for out in resampler.resample(None):
            yield _planes(out, report.channels)
    except (av.FFmpegError, OSError) as e:
        raise InputError(f"cannot decode audio track {report.track!r}: {e}") from None


def _planes(frame: av.AudioFrame, channels: int) -> np.ndarray:
    """A frame's samples as [channels, samples], whether its format is planar or packed."""
    data = frame.to_ndarray()
    return data if frame.format.is_planar else data.reshape(-1, channels).T


def _encoded(stream, blocks: Iterator[np.ndarray], size: int, first: int) -> Iterator[av.Packet]:
    """Encode [channels, samples] blocks in frames of `size` samples, stamped from `first` (in
    1/SAMPLE_RATE units: the first video frame's time), then flush the encoder."""
    fmt, layout = stream.format.name, stream.layout.name
    planar = stream.format.is_planar
    held: list[np.ndarray] = []
    count, at = 0, first

    def frame_of(block: np.ndarray) -> av.AudioFrame:
        nonlocal at
        data = block if planar else block.T.reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(data), format=fmt, layout=layout)
        frame.sample_rate, frame.time_base, frame.pts = SAMPLE_RATE, Fraction(1, SAMPLE_RATE), at
        at += block.shape[1]
        return frame

    for block in blocks:
        held.append(block)
        count += block.shape[1]
        if count < size:
            continue
        joined = np.concatenate(held, axis=1)
        whole = joined.shape[1] - joined.shape[1] % size
        for i in range(0, whole, size):
            yield from stream.encode(frame_of(joined[:, i:i + size]))
        held, count = ([joined[:, whole:]], joined.shape[1] - whole) if whole < joined.shape[1] else ([], 0)
    if count:
        yield from stream.encode(frame_of(np.concatenate(held, axis=1)))      # a short last frame
    yield from stream.encode(None)
