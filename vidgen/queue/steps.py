"""The stitch and contact_sheet job kinds: their payloads and how they run (no ledger knowledge).

Both write through a hidden temporary and a no-replace rename (vidgen.paths), inside the workflow's
output_dir, so a crash or retry never leaves half a file under the final name and an output that
exists is never replaced unless the workflow says overwrite. A stitch with sound writes its frames to
one temporary, muxes the track in (vidgen.sound) into a second and publishes that; its editorial
timeline files (vidgen.queue.timeline) are put in place just before the film, so a film at its final
name means the whole delivery is there.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import os
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from .. import sound
from ..config import AudioConfig
from ..errors import ConfigError, InputError, OutputError
from ..io import VideoWriter, atomic_write_bytes, read_frames, read_video_info
from ..paths import check_targets, discard, ensure_folder, partial_path, publish
from . import timeline
from .film import Piece, film_frames, joined_by, layout  # noqa: F401  (the stitch's arithmetic, re-exported)

log = logging.getLogger("vidgen")

LABEL_HEIGHT = 14
"""Pixels of the caption strip under each contact-sheet cell (the default bitmap font is 11 px)."""
ProgressFn = Callable[[int, int], None]  # progress(step, total): frames written
WORKFLOW_OVERWRITE = "set `overwrite: true` in the workflow to replace an earlier run's outputs"


@dataclass
class StitchJob:
    """Payload of a `stitch` job."""

    inputs: list[str]
    """Shot videos (or PNG-frame folders), in order."""
    output: str
    fps: int
    crossfade: float = 0.0
    """Seconds; rounded to round(crossfade * fps) frames."""
    crf: int = 18
    pix_fmt: str = "yuv420p"
    overwrite: bool = False
    """Replace an existing output (otherwise the job refuses to run)."""
    root: Optional[str] = None
    """The workflow's output_dir: the write stays inside it, links resolved when writing."""
    joins: Optional[list[int]] = None
    """Per input: how many of its first frames are the previous clip's last ones (1: a window of a long
    take; N: a shot extended from the one before by its last N frames); those are dropped and the two
    join without a crossfade (true/false from older payloads mean 1/0). None = none join."""
    blends: Optional[list[int]] = None
    """Per input: how many of its first frames are the previous clip's last ones, blended with them
    linearly (weights 1/(K+1) ... K/(K+1), continuity.fuse: linear) instead of dropped. None = none."""
    audio: Optional[dict] = None
    """A render's `audio:` keys ({path, offset, fit}: config.AudioConfig), the path absolute: a track laid
    under the film (vidgen.sound.mux); None = a silent film."""
    timeline: Optional[list[str]] = None
    """Editorial timeline formats written beside the film (vidgen.queue.timeline.FORMATS); None = none."""
    names: Optional[list[str]] = None
    """Per input: its shot's name (the timeline's clip names); None = the files' stems."""
    codec: str = "auto"
    """The film's codec (config.CODECS; auto: by extension); a master's reads the shots at 16 bits."""
    profile: Optional[str] = None
    """prores / dnxhr profile."""
    provenance: Optional[dict] = None
    """{key, cert}: the film's C2PA credentials are signed, each input an ingredient (vidgen.provenance)."""


@dataclass
class ContactSheetJob:
    """Payload of a `contact_sheet` job."""

    inputs: list[str]
    output: str
    columns: int = 4
    labels: Optional[list[str]] = None
    """One caption per input, or None for no captions."""
    overwrite: bool = False
    root: Optional[str] = None


def _payload(cls: type, payload: dict, kind: str):
    names = {f.name for f in dataclasses.fields(cls)}
    problems = [f"{kind} payload: unknown key {k!r}; allowed: {', '.join(sorted(names))}" for k in payload
                if k not in names]
    if not problems:
        try:
            return cls(**payload)
        except TypeError as e:
            problems.append(f"{kind} payload: {e}")
    raise ConfigError(problems)


def _check_output(kind: str, job: StitchJob | ContactSheetJob) -> None:
    """Refuse, before any work, an output that exists (without overwrite) or leaves the job's root: a
    stitch's timeline files too."""
    targets = [(f"{kind} output", Path(job.output))]
    if isinstance(job, StitchJob) and job.timeline:
        targets += [(f"{kind} timeline ({fmt})", path) for fmt, path in timeline.paths(job.output, job.timeline).items()]
    if problems := check_targets(targets, overwrite=job.overwrite, root=job.root, overwrite_hint=WORKFLOW_OVERWRITE):
        raise OutputError("; ".join(problems))


def _audio(job: StitchJob) -> Optional[AudioConfig]:
    if job.audio is None:
        return None
    if not isinstance(job.audio, dict) or not isinstance(job.audio.get("path"), str):
        raise ConfigError(f"stitch payload: audio must be a mapping with a path (path, offset, fit), not {job.audio!r}")
    audio = _payload(AudioConfig, job.audio, "stitch audio")
    if problems := audio.problems():
        raise ConfigError([f"stitch payload: {p}" for p in problems])
    return audio


def _check_extras(job: StitchJob, seconds: Optional[float] = None) -> Optional[AudioConfig]:
    """Refuse, before any frame is written, a track the film cannot take and a timeline that cannot be
    written (a package missing: MissingExtra); returns the sound to lay, if any."""
    audio = _audio(job)
    if audio is not None and (problems := sound.check(audio.path, audio.offset, audio.fit, seconds,
                                                      Path(job.output).suffix, fps=job.fps)):
        raise InputError("stitch audio: " + "; ".join(problems))
    if job.timeline:
        timeline.require(job.timeline, job.fps)
    return audio


def check_step(kind: str, payload: dict) -> None:
    """The checks a stitch or contact_sheet job runs before any work (for a queue's submit)."""
    cls = {"stitch": StitchJob, "contact_sheet": ContactSheetJob}[kind]
    job = _payload(cls, payload, kind)
    _check_output(kind, job)
    if isinstance(job, StitchJob):
        _check_extras(job)


def _check_inputs(kind: str, inputs: list[str]) -> None:
    if not inputs:
        raise InputError(f"{kind}: no input clips")
    for path in inputs:
        if not Path(path).exists():
            raise InputError(f"{kind}: input {path!r} does not exist (did its render job succeed?)")


def run_stitch(payload: dict, progress: Optional[ProgressFn] = None) -> Path:
    """Concatenate the shot videos in order into one video (returns its path); optional crossfades,
    sound and editorial timeline.

    With a crossfade of k frames the last k frames of a shot are blended with the first k of the
    next (weights 1/(k+1) ... k/(k+1), so no blended frame is a plain copy): the result has
    sum(frames) - k * (shots - 1) frames (`layout` has the whole arithmetic, joins and fuses too).
    Clips must share size and fps (checked before anything is written). With `audio` the track is
    muxed under the frames (vidgen.sound.mux: the video stream copied, the sound as long as the
    film); with `timeline` the timeline files are written beside the film (vidgen.queue.timeline).
    An existing output is refused unless the payload says overwrite (then it is replaced
    atomically: it stays whole until the new video is); every write stays inside the payload's root.

    Raises:
        InputError: a clip is missing, unreadable, of another size or fps, or too short for the
            crossfade; the track is missing or its length is refused by `fit`; a sidecar is missing.
        MissingExtra: a timeline format's package is not installed.
    """
    job: StitchJob = _payload(StitchJob, payload, "stitch")
    _check_output("stitch", job)
    _check_inputs("stitch", job.inputs)
    out, infos = Path(job.output), []
    for path in job.inputs:
        try:
            infos.append(read_video_info(path))
        except OutputError as e:  # the reader's error names the file; to the stitch it is bad input
            raise InputError(f"stitch: {e}") from None
    sizes = {(i["width"], i["height"]) for i in infos}
    rates = {round(i["fps"], 3) for i in infos if i["fps"] is not None} | {float(job.fps)}
    if len(sizes) > 1 or len(rates) > 1:
        listing = ", ".join(f"{Path(p).name} {i['width']}x{i['height']}" + (f"@{i['fps']:g}" if i["fps"] else "")
                            for p, i in zip(job.inputs, infos))
        raise InputError(f"stitch: every clip must have the same size and fps ({job.fps}) to be joined; got {listing}")
    k = round(job.crossfade * job.fps)
    joins, blends = ([int(j) for j in counts or [0] * len(infos) if isinstance(j, int) and j >= 0]
                     for counts in (job.joins, job.blends))
    if len(joins) != len(infos) or joins[0] or len(blends) != len(infos) or blends[0]:
        raise ConfigError(f"stitch payload: joins and blends must have one count (>= 0) per input ({len(infos)}), "
                          "the first 0")
    if any(j and b for j, b in zip(joins, blends)):
        raise ConfigError("stitch payload: an input's shared frames are dropped (joins) or blended (blends), not both")
    names = job.names or [Path(p).stem for p in job.inputs]
    if len(names) != len(infos):
        raise ConfigError(f"stitch payload: {len(names)} names for {len(infos)} inputs")
    pieces = layout([i["frames"] for i in infos], joins, blends, k)
    for n, (info, piece) in enumerate(zip(infos, pieces)):
        need = piece.fade_in + piece.fade_out + piece.skip
        if info["frames"] < max(need, piece.skip + 1):
            shared = f" and the {piece.skip} it shares with the clip before" if piece.skip else ""
            raise InputError(f"stitch: {job.inputs[n]} has {info['frames']} frames; the crossfade of {k} frames"
                             f"{shared} needs at least {max(need, piece.skip + 1)}")
    total = film_frames(pieces)
    audio = _check_extras(job, total / job.fps)
    records = timeline.shot_records(job.inputs) if job.timeline else []
    ensure_folder(out, job.root)
    # A short hidden name with the film's extension (none for a folder of frames), which the writer reads
    # its codec from; the writer adds its own temporary beside it.
    silent = out.with_name(f".stitch-{os.getpid() % 10**6}-{secrets.token_hex(3)}{out.suffix}")
    tmp, report = silent, None
    try:
        _write_frames(job, silent, (infos[0]["width"], infos[0]["height"]), pieces, total, progress)
        if audio is not None:
            tmp = partial_path(out)
            report = sound.mux(silent, tmp, track=audio.path, offset=audio.offset, fit=audio.fit, root=job.root)
            discard(silent)
            log.info("stitch: %s laid under %s: %d samples at %d Hz (%s)", Path(audio.path).name, out.name,
                     report.samples, report.sample_rate, report.codec)
        if job.provenance:
            tmp = _signed(job, out, tmp, names)
        if job.timeline:
            cut = timeline.build(out, job.fps, job.inputs, names, records, pieces, joined_by(joins, blends, k), report)
            timeline.write(cut, job.timeline, out, job.fps, overwrite=job.overwrite, root=job.root)
        publish(tmp, out, overwrite=job.overwrite, root=job.root)
    except OSError as e:
        raise OutputError(f"stitch: finishing {out} failed: {e.strerror or e}") from None
    finally:
        discard(silent)     # gone by now unless something failed; the published film is not a temporary
        if tmp != silent:
            discard(tmp)
    return out


def _signed(job: StitchJob, out: Path, tmp: Path, names: list[str]) -> Path:
    """The finished film `tmp` signed into a new temporary (returned; `tmp` deleted), the shots its
    ingredients; a .mkv/.webm/.mxf film's credentials written beside it (NAME.c2pa) first."""
    from .. import __version__, provenance

    signed = out.with_name(f".stitch-{os.getpid() % 10**6}-{secrets.token_hex(3)}-signed{out.suffix}")
    claims = {"vidgen": __version__, "kind": "stitch", "shots": names, "fps": job.fps, "crossfade": job.crossfade}
    try:
        manifest = provenance.sign(tmp, signed, key=job.provenance["key"], cert=job.provenance["cert"],
                                   claims=claims, ingredients=[Path(p) for p in job.inputs], title=out.name)
        if manifest is not None:
            atomic_write_bytes(provenance.c2pa_sidecar(out), manifest, overwrite=job.overwrite, root=job.root)
    except BaseException:
        discard(signed)
        raise
    discard(tmp)
    return signed


def _write_frames(job: StitchJob, path: Path, size: tuple[int, int], pieces: list[Piece], total: int,
                  progress: Optional[ProgressFn]) -> None:
    """The stitched frames, blended where `pieces` say, written to `path` (a temporary name); a master's
    (a film codec keeping more than 8 bits) read and blended at 16 bits."""
    with VideoWriter(path, fps=job.fps, width=size[0], height=size[1], codec=job.codec, crf=job.crf,
                     pix_fmt=job.pix_fmt, profile=job.profile, root=job.root) as writer:
        def emit(frame: np.ndarray) -> None:
            writer.write(frame)
            if progress:
                progress(writer.frames_written, total)

        tail: list[np.ndarray] = []  # the previous clip's last frames, held back to blend
        for path_n, piece in zip(job.inputs, pieces):
            frames = read_frames(path_n, deep=writer.bits > 8)
            for _ in range(piece.skip):
                next(frames)            # the previous clip's last frames, already written
            for j, prev in enumerate(tail):
                a = (j + 1) / (len(tail) + 1)  # the weight of the incoming clip (k: a crossfade, K: a fuse)
                emit(np.rint((1 - a) * prev + a * next(frames)).astype(prev.dtype))
            held: deque[np.ndarray] = deque()
            for frame in frames:
                held.append(frame)
                if len(held) > piece.fade_out:
                    emit(held.popleft())
            tail = list(held)


def run_contact_sheet(payload: dict) -> Path:
    """A PNG grid of each shot's first frame, optionally captioned; written atomically.

    The grid has min(columns, shots) columns and ceil(shots / columns) rows of cells the size of the
    largest first frame (smaller frames centred), plus a LABEL_HEIGHT caption strip per row when
    labelled: width = cols * W, height = rows * (H + LABEL_HEIGHT or 0). An existing sheet is
    refused unless the payload says overwrite (then it is replaced atomically).
    """
    job: ContactSheetJob = _payload(ContactSheetJob, payload, "contact_sheet")
    _check_output("contact_sheet", job)
    _check_inputs("contact_sheet", job.inputs)
    if job.columns < 1:
        raise ConfigError(f"contact_sheet payload: columns {job.columns} must be >= 1")
    if job.labels is not None and len(job.labels) != len(job.inputs):
        raise ConfigError(f"contact_sheet payload: {len(job.labels)} labels for {len(job.inputs)} inputs")
    firsts = []
    for path in job.inputs:
        frames = read_frames(path)
        try:
            firsts.append(next(frames))
        except StopIteration:
            raise InputError(f"contact_sheet: {path} has no frames") from None
        except OutputError as e:
            raise InputError(f"contact_sheet: {e}") from None
        finally:
            frames.close()  # closes the container after one frame
    cell_w, cell_h = max(f.shape[1] for f in firsts), max(f.shape[0] for f in firsts)
    cols, strip = min(job.columns, len(firsts)), LABEL_HEIGHT if job.labels is not None else 0
    rows = math.ceil(len(firsts) / cols)
    sheet = Image.new("RGB", (cols * cell_w, rows * (cell_h + strip)), (16, 16, 16))
    draw, font = ImageDraw.Draw(sheet), ImageFont.load_default()
    for n, frame in enumerate(firsts):
        x, y = (n % cols) * cell_w, (n // cols) * (cell_h + strip)
        sheet.paste(Image.fromarray(frame), (x + (cell_w - frame.shape[1]) // 2, y + (cell_h - frame.shape[0]) // 2))
        if job.labels is not None:
            text = job.labels[n]
            while len(text) > 1 and draw.textlength(text, font=font) > cell_w - 2:
                text = text[:-1]  # cut to the cell: a caption must not run into its neighbour
            draw.text((x + 1, y + cell_h + 1), text, fill=(235, 235, 235), font=font)
    ensure_folder(Path(job.output), job.root)
    buf = io.BytesIO()
    sheet.save(buf, format="PNG")
    return atomic_write_bytes(job.output, buf.getvalue(), overwrite=job.overwrite, root=job.root)
