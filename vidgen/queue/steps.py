"""The stitch and contact_sheet job kinds: their payloads and how they run (no ledger knowledge).

Both write through a hidden temporary and a no-replace rename (vidgen.paths), inside the workflow's
output_dir, so a crash or retry never leaves half a file under the final name and an output that
exists is never replaced unless the workflow says overwrite.
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from ..errors import ConfigError, InputError, OutputError
from ..io import VideoWriter, atomic_write_bytes, read_frames, read_video_info
from ..paths import check_targets, ensure_folder

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
    """Refuse, before any work, an output that exists (without overwrite) or leaves the job's root."""
    if problems := check_targets([(f"{kind} output", Path(job.output))], overwrite=job.overwrite, root=job.root,
                                 overwrite_hint=WORKFLOW_OVERWRITE):
        raise OutputError("; ".join(problems))


def check_step(kind: str, payload: dict) -> None:
    """The checks a stitch or contact_sheet job runs before any work (for a queue's submit)."""
    cls = {"stitch": StitchJob, "contact_sheet": ContactSheetJob}[kind]
    _check_output(kind, _payload(cls, payload, kind))


def _check_inputs(kind: str, inputs: list[str]) -> None:
    if not inputs:
        raise InputError(f"{kind}: no input clips")
    for path in inputs:
        if not Path(path).exists():
            raise InputError(f"{kind}: input {path!r} does not exist (did its render job succeed?)")


def run_stitch(payload: dict, progress: Optional[ProgressFn] = None) -> Path:
    """Concatenate the shot videos in order into one video (returns its path); optional crossfades.

    With a crossfade of k frames the last k frames of a shot are blended with the first k of the
    next (weights 1/(k+1) ... k/(k+1), so no blended frame is a plain copy): the result has
    sum(frames) - k * (shots - 1) frames. Clips must share size and fps (checked before anything is
    written). An existing output is refused unless the payload says overwrite (then it is replaced
    atomically: it stays whole until the new video is); the write stays inside the payload's root.

    Raises:
        InputError: a clip is missing, unreadable, of another size or fps, or too short for the crossfade.
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
    fades = [0] + [b or (0 if j else k) for j, b in zip(joins[1:], blends[1:])]   # frames blended at each start
    for n, info in enumerate(infos):
        need = fades[n] + (fades[n + 1] if n + 1 < len(infos) else 0) + joins[n]
        if info["frames"] < max(need, joins[n] + 1):
            shared = f" and the {joins[n]} it shares with the clip before" if joins[n] else ""
            raise InputError(f"stitch: {job.inputs[n]} has {info['frames']} frames; the crossfade of {k} frames"
                             f"{shared} needs at least {max(need, joins[n] + 1)}")
    total = sum(i["frames"] for i in infos) - sum(fades) - sum(joins)
    ensure_folder(out, job.root)
    with VideoWriter(out, fps=job.fps, width=infos[0]["width"], height=infos[0]["height"], codec="auto",
                     crf=job.crf, pix_fmt=job.pix_fmt, overwrite=job.overwrite, root=job.root) as writer:
        def emit(frame: np.ndarray) -> None:
            writer.write(frame)
            if progress:
                progress(writer.frames_written, total)

        tail: list[np.ndarray] = []  # the previous clip's last k frames, held back to blend
        for n, path in enumerate(job.inputs):
            frames = read_frames(path)
            for _ in range(joins[n]):
                next(frames)            # the previous clip's last frames, already written
            for j, prev in enumerate(tail):
                a = (j + 1) / (len(tail) + 1)  # the weight of the incoming clip (k: a crossfade, K: a fuse)
                emit(np.rint((1 - a) * prev + a * next(frames)).astype(np.uint8))
            held: deque[np.ndarray] = deque()
            keep = fades[n + 1] if n < len(job.inputs) - 1 else 0
            for frame in frames:
                held.append(frame)
                if len(held) > keep:
                    emit(held.popleft())
            tail = list(held)
    return out


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
