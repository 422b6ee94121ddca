"""A workflow's editing verbs: a shot continued from an earlier shot's last frames, and a region of a
finished shot rendered again. Both run on a VACE model (families.Family.control) and take the
source's frames losslessly, never from its compressed video.

    - name: walk-on
      extend: {from: walk-in, frames: 8}             # walk-in's last 8 frames as given, the rest generated
    - name: walk-in-fixed
      repaint: {from: walk-in, mask: masks/hand.png} # white: generate again; black: keep walk-in's pixels

`extend`: the source keeps its last N frames (`output.keep_frames`: PNG, as decoded), and they become
this shot's `control.frames` with `control.keep_first: N`, so VACE sees them kept and the rest masked,
and the composite writes them bit for bit as this shot's first N frames. `num_frames` counts them.
In the film the shot shows them once: when the entry before it is its source (or a repaint standing
in for it), the stitch drops its first N frames and joins the two without a crossfade.

`repaint`: the source keeps every frame, they become `control.frames` under the mask given (a video,
a PNG folder or one image for every frame, fitted as `control.mask` is), and the shot has the source's
length. Unmasked pixels are written as the source's; the repaint takes the source's place in the
stitch and the contact sheet (a repaint of a repaint: the latest).

Both are ledger dependencies, as `image: {from: ...}` is: the shot runs after its source and fails with
it, and a killed render resumes from its own checkpoint. A source must have this shot's size (its
frames are used as they are) and render as one clip (a long take's last window can be extended).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..families import FAMILIES
from ..paths import kept_frame_path

VERBS = ("extend", "repaint")
_KEYS = {"extend": ("from", "frames"), "repaint": ("from", "mask")}
_FORM = {"extend": "{from: SHOT, frames: N}", "repaint": "{from: SHOT, mask: PATH}"}


def verb_problems(spec: Any, where: str) -> list[str]:
    """What is wrong with a shot's extend / repaint as written (`spec`: its ShotSpec); a repaint's mask is
    made absolute here (relative paths start at the current directory)."""
    given = [v for v in VERBS if getattr(spec, v) is not None]
    out = [f"{where}: give extend or repaint, not both"] if len(given) > 1 else []
    for verb in given:
        value, key = getattr(spec, verb), f"{where}.{verb}"
        if not isinstance(value, dict):
            out.append(f"{key}: expected {_FORM[verb]}, got {value!r}")
            continue
        out += [f"{key}.{k}: unknown key; {verb} is {_FORM[verb]}" for k in value if k not in _KEYS[verb]]
        if not isinstance(value.get("from"), str) or not value.get("from"):
            out.append(f"{key}.from: give the name of an earlier shot")
        if verb == "extend":
            n = value.get("frames")
            if not (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
                out.append(f"{key}.frames: {n!r}; give how many of the source's last frames to keep (1 or more)")
        else:
            mask = value.get("mask")
            if not isinstance(mask, str) or not mask.strip():
                out.append(f"{key}.mask: give a mask (white = generate again, black = keep): a video, PNG folder or image")
            elif not os.path.exists(path := os.path.abspath(os.path.expanduser(mask))):
                out.append(f"{key}.mask: {mask!r} does not exist (relative paths start at {os.getcwd()})")
            else:
                value["mask"] = path
        if verb == "repaint" and (spec.num_frames is not None or spec.seconds is not None):
            out.append(f"{where}: a repaint has its source's length; remove num_frames / seconds")
        if spec.continuity.get("window_frames"):
            out.append(f"{where}.continuity.window_frames: a shot that uses {verb} renders as one clip; remove it")
    return out


def link(out: list, spans: dict, i: int, verb: str, ref: dict, variant: str, problems: list[str]) -> None:
    """Entry `i` (of model `variant`, "" = unknown) extends or repaints the shot `ref` names: the source
    keeps the frames it needs (PNG), they become entry i's control.frames, and entry i depends on it."""
    shot = out[i]
    cfg, where, name = shot.config, f"shot {shot.name!r}: {verb}", str(ref.get("from", ""))
    if (span := source_span(spans, i, name, where, "extend or repaint", problems)) is None:
        return
    start, n = span[:2]
    source = start + n - 1                               # a long take: its last window
    src, before = out[source].config, len(problems)
    if variant in FAMILIES and not FAMILIES[variant].control:
        takes = ", ".join(f.name for f in FAMILIES.values() if f.control)
        problems.append(f"{where}: renders with VACE, which {variant} has not; use a VACE model ({takes})")
    if (src.width, src.height) != (cfg.width, cfg.height):
        problems.append(f"{where}: {name!r} is {src.width}x{src.height} and this shot {cfg.width}x{cfg.height}; "
                        "its frames are used as they are: give both the same size")
    if cfg.control.engaged or cfg.control.keep_first or cfg.control.start:
        problems.append(f"{where}: sets the shot's control frames itself; remove control.* from the shot")
    total = src.num_frames
    if verb == "extend":
        keep = ref["frames"]
        if keep > total:
            problems.append(f"{where}.frames: {keep} is more than the {total} frames {name!r} has"
                            + (" in its last window" if n > 1 else ""))
        elif keep >= cfg.num_frames:
            problems.append(f"{where}.frames: keeping {keep} of this shot's {cfg.num_frames} frames generates none; "
                            "give the shot more num_frames (4k+1) than it keeps")
        frames = range(total - keep, total)
    else:
        if n > 1:
            problems.append(f"{where}.from: {name!r} is a long take in {n} windows; repaint a shot rendered as one clip")
        frames = range(total)
    if len(problems) > before:
        return
    cfg.control.frames = [keep_frame(src, k) for k in frames]
    if verb == "extend":
        cfg.control.keep_first, shot.extends, shot.overlap = len(frames), source, len(frames)
    else:
        cfg.num_frames, cfg.control.mask, shot.replaces = total, ref["mask"], source
        shot.extends, shot.overlap = out[source].extends, out[source].overlap   # it stands where its source stood
    if source not in shot.deps:
        shot.deps.append(source)


def source_span(spans: dict, i: int, name: str, where: str, doing: str,
                problems: list[str]) -> tuple[int, int, list[int]] | None:
    """(first entry, windows, each window's first frame in the take) of the shot `name` that entry `i`
    takes frames from, or None with the problem reported: a shot not in the workflow, or not before entry i."""
    if name.lower() not in spans:
        problems.append(f"{where}.from: {name!r} is not a shot of this workflow")
        return None
    span = spans[name.lower()]
    if span[0] >= i:
        problems.append(f"{where}.from: {name!r} is {'this shot' if span[0] <= i < span[0] + span[1] else 'a later shot'}"
                        f"; a shot can {doing} only a shot before it (shots render in order)")
        return None
    return span


def keep_frame(cfg, frame: int) -> str:
    """The path of frame `frame` of the render `cfg` (a RenderConfig), which now keeps it (output.keep_frames)."""
    if frame not in cfg.output.keep_frames:
        cfg.output.keep_frames.append(frame)
    return str(kept_frame_path(Path(cfg.output.path), frame))


def film(shots: list) -> list[tuple[int, int]]:
    """The stitch's order: (entry, frames it shares with the clip before, dropped there) for each entry
    shown, a repaint in its source's place, the source then not shown."""
    slot: dict[int, int] = {}
    order: list[int] = []
    for i, shot in enumerate(shots):
        if shot.replaces is not None:
            slot[i] = slot[shot.replaces]
            order[slot[i]] = i
        else:
            slot[i] = len(order)
            order.append(i)
    out = []
    for p, i in enumerate(order):
        shot = shots[i]
        continues = shot.extends is not None and p > 0 and slot[shot.extends] == p - 1
        out.append((i, shot.overlap if shot.joins or continues else 0))    # windows: their overlap_frames
    return out

