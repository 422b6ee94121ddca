"""Continuity in a workflow: shots that start from (or end on) a frame of an earlier shot, long takes
rendered as windows, and colour held to a reference.

    - name: walk-out
      image: {from: walk-in, frame: last}      # continue from that shot's last frame (I2V / TI2V)
      last_image: keyframes/door.png           # and land on a key frame (first-last-frame, I2V-A14B)
    - name: long-take
      seconds: 20                              # longer than the model's clip: windows
      continuity: {overlap_frames: 1, colour: match_first}

A frame another shot needs is written losslessly by the shot that makes it (`output.keep_frames`:
PNG, as decoded, never read back from the compressed video), and the shot that uses it depends on
that one in the ledger: it runs after it, and fails with it. A shot longer than the model's clip
(families.Family.frames, or continuity.window_frames) becomes consecutive windows, each starting on
the previous window's last frame; the stitch drops that shared frame and joins the windows without
a crossfade, and the contact sheet shows the take once. `colour: match_first` matches every later
window's frames to the take's first frame; `match_reference` every frame to `reference`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from ..errors import VidgenError
from ..families import FAMILIES
from ..paths import kept_frame_path
from .edits import VERBS, link, source_span

COLOURS = ("none", "match_first", "match_reference")
CONTINUITY_KEYS = ("overlap_frames", "colour", "reference", "window_frames")


def ref_problems(value: Any, key: str) -> list[str]:
    """What is wrong with a {from: SHOT, frame: last | first | N} reference as written."""
    if not isinstance(value, dict):
        return []
    out = [f"{key}.{k}: unknown key; a frame of another shot is {{from: SHOT, frame: last | first | N}}"
           for k in value if k not in ("from", "frame")]
    if not isinstance(value.get("from"), str) or not value.get("from"):
        out.append(f"{key}.from: give the name of an earlier shot")
    frame = value.get("frame", "last")
    if not (frame in ("last", "first") or (isinstance(frame, int) and not isinstance(frame, bool) and frame >= 0)):
        out.append(f"{key}.frame: {frame!r}; use last, first or a frame number (0 is the first)")
    return out


def continuity_problems(raw: dict, key: str) -> list[str]:
    out = [f"{key}.{k}: unknown key; allowed: {', '.join(CONTINUITY_KEYS)}" for k in raw if k not in CONTINUITY_KEYS]
    if raw.get("overlap_frames", 1) != 1:
        out.append(f"{key}.overlap_frames: {raw['overlap_frames']!r}; windows share exactly 1 frame (the last of one "
                   "is the first of the next)")
    colour = raw.get("colour", "none")
    if colour not in COLOURS:
        out.append(f"{key}.colour: {colour!r}; use one of {', '.join(COLOURS)}")
    if colour == "match_reference" and not raw.get("reference"):
        out.append(f"{key}.reference: colour: match_reference needs a reference image (a path or {{from: SHOT, frame: N}})")
    if isinstance(raw.get("reference"), dict):
        out += ref_problems(raw["reference"], f"{key}.reference")
    w = raw.get("window_frames")
    if w is not None and not (isinstance(w, int) and w >= 5 and (w - 1) % 4 == 0):
        out.append(f"{key}.window_frames: {w!r}; use 4k+1 frames, at least 5 (the model's own clip length by default)")
    return out


def _window_frames(shot, problems: list[str]) -> int:
    """The longest clip one render of this shot makes: continuity.window_frames, else the model's."""
    from ..sources import inspect       # torch: not when a workflow is only read

    if shot.continuity.get("window_frames"):
        return int(shot.continuity["window_frames"])
    variant = shot.config.model.variant
    if variant == "auto" and shot.config.num_frames > min(v.frames for v in FAMILIES.values()):
        try:
            variant = inspect(shot.config.model).variant
        except VidgenError as e:
            problems.append(f"shot {shot.name!r}: cannot tell how long a clip its model makes: {e}")
            return shot.config.num_frames
    return FAMILIES[variant].frames if variant in FAMILIES else shot.config.num_frames


def _text_only(variant: str) -> bool:
    """Whether `variant` is a text-to-video family (no image to continue a window from)."""
    return variant in FAMILIES and not FAMILIES[variant].accepts_image


def _variant(shot) -> str:
    from ..sources import inspect       # torch: not when a workflow is only read

    if shot.config.model.variant != "auto":
        return shot.config.model.variant
    try:
        return inspect(shot.config.model).variant
    except Exception:  # noqa: BLE001 - reported by the submit's preflight
        return ""


def expand(shots: list, output_dir: Path, problems: list[str], notes: list[str]) -> list:
    """The workflow's shots with long takes split into windows and every {from: ...} reference turned
    into a kept frame (the source window's output.keep_frames), a path and a dependency."""
    out, spans = [], {}             # spans: shot name (lower) -> [(first entry, frames, window frames)]
    for shot in shots:
        total, w = shot.config.num_frames, _window_frames(shot, problems)
        if any(verb in shot.refs for verb in VERBS):        # an edit renders as one clip (edits.verb_problems)
            w = total
        elif total > w and not shot.continuity.get("window_frames") and _text_only(_variant(shot)):
            notes.append(f"shot {shot.name!r}: {total} frames is longer than the {w} the model was trained on; a "
                         "text-to-video model cannot continue a window from the last, so it renders as one clip")
            w = total
        n = 1 if total <= w else math.ceil((total - 1) / (w - 1))
        start = len(out)
        for k in range(n):
            frames = w if k < n - 1 else total - (n - 1) * (w - 1)
            cfg = shot.config
            if n > 1:
                stem = Path(cfg.output.path)
                cfg = dataclasses.replace(cfg, num_frames=frames, seed=None if cfg.seed is None else cfg.seed + k,
                                          last_image=cfg.last_image if k == n - 1 else None,
                                          image=cfg.image if k == 0 else None,
                                          output=dataclasses.replace(cfg.output, keep_frames=list(cfg.output.keep_frames),
                                                                     path=str(stem.with_name(f"{stem.stem}.w{k + 1}{stem.suffix}"))))
            else:
                cfg = dataclasses.replace(cfg, output=dataclasses.replace(cfg.output,
                                                                          keep_frames=list(cfg.output.keep_frames)))
            out.append(dataclasses.replace(shot, name=f"{shot.name}.w{k + 1}" if n > 1 else shot.name, config=cfg,
                                           take=shot.name if n > 1 else "", joins=k > 0, deps=[],
                                           refs={key: v for key, v in shot.refs.items() if key in VERBS
                                                 or (key == "image" and k == 0) or (key == "last_image" and k == n - 1)}))
        if n > 1:
            notes.append(f"shot {shot.name!r}: {total} frames is longer than the model's {w}: {n} windows of "
                         f"{', '.join(str(e.config.num_frames) for e in out[start:])} frames sharing one frame each")
            variant = _variant(shot)
            if _text_only(variant):
                problems.append(f"shot {shot.name!r}: a long take ({total} frames, more than the model's {w}) continues "
                                f"each window from the last frame of the one before, which needs an image-conditioned "
                                f"model (Wan2.2 I2V-A14B or TI2V-5B), not {variant}")
            for k in range(1, n):       # each window starts on the previous one's last frame
                _link(out, start + k - 1, out[start + k - 1].config.num_frames - 1, start + k, "image")
        spans[shot.name.lower()] = (start, n, w)
        colour = shot.continuity.get("colour", "none")
        if colour == "match_first" and n > 1:
            for k in range(1, n):
                _link(out, start, 0, start + k, "colour_reference")
        elif colour == "match_reference" and isinstance(shot.continuity.get("reference"), str):
            for k in range(n):
                ref = str(Path(shot.continuity["reference"]).expanduser().absolute())
                out[start + k].config.output.colour_reference = ref
        elif colour == "match_reference":
            for k in range(n):
                out[start + k].refs["colour_reference"] = shot.continuity["reference"]
        elif colour == "match_first":
            notes.append(f"shot {shot.name!r}: colour: match_first holds the colour of a long take's windows to its "
                         "first frame; this shot is one window, so it changes nothing")
    for i, entry in enumerate(out):
        for key, ref in list(entry.refs.items()):
            if key in VERBS:
                link(out, spans, i, key, ref, _variant(entry), problems)
            else:
                _resolve(out, spans, i, key, ref, problems)
        entry.refs = {}
    return out


def _resolve(out: list, spans: dict, i: int, key: str, ref: dict, problems: list[str]) -> None:
    shot = out[i]
    where = f"shot {(shot.take or shot.name)!r}: {key}"
    name = str(ref.get("from", ""))
    if (span := source_span(spans, i, name, where, "start from, end on or match", problems)) is None:
        return
    start, n, w = span
    total = sum(out[start + k].config.num_frames for k in range(n)) - (n - 1)
    frame = {"last": total - 1, "first": 0}.get(ref.get("frame", "last"), ref.get("frame"))
    if not isinstance(frame, int) or frame >= total:
        problems.append(f"{where}.frame: {frame!r} is beyond shot {name!r}, which has {total} frames (0..{total - 1})")
        return
    k = 0 if frame == 0 else min(n - 1, math.ceil(frame / (w - 1)) - 1) if n > 1 else 0
    _link(out, start + k, frame - k * (w - 1), i, key)


def _link(out: list, source: int, frame: int, target: int, key: str) -> None:
    """`target`'s image / last_image / colour_reference is frame `frame` of entry `source`, kept losslessly."""
    src = out[source].config
    if frame not in src.output.keep_frames:
        src.output.keep_frames.append(frame)
    path = str(kept_frame_path(Path(src.output.path), frame))
    cfg = out[target].config
    if key == "colour_reference":
        cfg.output.colour_reference = path
    else:
        setattr(cfg, key, path)
    if source not in out[target].deps:
        out[target].deps.append(source)
