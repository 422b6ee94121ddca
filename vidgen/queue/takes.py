"""Continuity in a workflow: shots that start from (or end on) a frame of an earlier shot, long takes
rendered as windows, and colour held to a reference.

    - name: walk-out
      image: {from: walk-in, frame: last}      # continue from that shot's last frame (I2V / TI2V)
      last_image: keyframes/door.png           # and land on a key frame (first-last-frame, I2V-A14B)
    - name: long-take
      seconds: 20                              # longer than the model's clip: windows
      continuity: {overlap_frames: 5, colour: match_first, prompts: [{at: 240, prompt: ...}]}

A frame another shot needs is written losslessly by the shot that makes it (`output.keep_frames`:
PNG, as decoded, never read back from the compressed video), and the shot that uses it depends on
that one in the ledger: it runs after it, and fails with it. A shot longer than the model's clip
(families.Family.frames, or continuity.window_frames) becomes consecutive windows, each starting on
the previous window's last K = overlap_frames frames (4k+1: `image` and `image_frames` of an
image-conditioned model, `control.frames` kept as given on a VACE model); the stitch drops those
shared frames (or blends them, continuity.fuse: linear) and joins the windows without a crossfade, and
the contact sheet shows the take once. A diffusion-forcing model (SkyReels-V2 DF) is not windowed here:
one render makes the whole take, its windows sharing latent frames (vidgen.forcing, the forcing: section).
Each window takes the prompt in force at its first frame (continuity.prompts), and the windows are laid
so that one ends on each key frame (continuity.keyframes), which it takes as its last_image. `colour: match_first` matches every later
window's frames to the take's first frame; `match_reference` every frame to `reference`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

from ..errors import VidgenError
from ..families import FAMILIES
from .edits import VERBS, keep_frame, link, source_span

COLOURS = ("none", "match_first", "match_reference")
CONTINUITY_KEYS = ("overlap_frames", "colour", "reference", "window_frames", "prompts", "keyframes", "fuse")
FUSES = ("none", "linear")


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
    k = raw.get("overlap_frames", 1)
    if not (isinstance(k, int) and not isinstance(k, bool) and k >= 1 and (k - 1) % 4 == 0):
        out.append(f"{key}.overlap_frames: {k!r}; windows share 4k+1 frames (1, 5, 9, ...: a latent frame holds 4 "
                   "video frames after the first, so the windows stay 4k+1 long and TI2V-5B keeps whole latent frames)")
    fuse = raw.get("fuse", "none")
    if fuse not in FUSES:
        out.append(f"{key}.fuse: {fuse!r}; use one of {', '.join(FUSES)}")
    elif fuse == "linear" and k == 1:
        out.append(f"{key}.fuse: linear blends the frames windows share; with overlap_frames: 1 there is only the one "
                   "frame to blend with itself: set overlap_frames to 5 or more, or fuse: none")
    prompts = raw.get("prompts", [])
    if not isinstance(prompts, list) or not all(isinstance(p, dict) and set(p) == {"at", "prompt"} and isinstance(
            p["at"], int) and not isinstance(p["at"], bool) and p["at"] >= 0 and isinstance(p["prompt"], str)
            and p["prompt"].strip() for p in prompts):
        out.append(f"{key}.prompts: {prompts!r}; give a list of {{at: FRAME, prompt: TEXT}} (a window takes the prompt "
                   "in force at its first frame)")
    elif len({p["at"] for p in prompts}) < len(prompts):
        out.append(f"{key}.prompts: two prompts at one frame; give each `at` once")
    keys = raw.get("keyframes", [])
    if not isinstance(keys, list) or not all(isinstance(k, dict) and set(k) == {"at", "image"} and isinstance(
            k["at"], int) and not isinstance(k["at"], bool) and isinstance(k["image"], str) for k in keys):
        out.append(f"{key}.keyframes: {keys!r}; give a list of {{at: FRAME, image: PATH}}")
        return out
    ats = [k["at"] for k in keys]
    if len(set(ats)) < len(ats):
        out.append(f"{key}.keyframes: two key frames at frame {max(ats, key=ats.count)}: one window's last frame takes one")
    out += [f"{key}.keyframes: at {a}; a window ends on frames 4k (its 4k+1 frames after the one before), so a key "
            f"frame lands at a multiple of 4: use {' or '.join(str(v) for v in (a - a % 4, a - a % 4 + 4) if v >= 4)}"
            for a in ats if a % 4]
    for k in keys:
        if not os.path.isfile(path := os.path.abspath(os.path.expanduser(k["image"]))):
            out.append(f"{key}.keyframes: at {k['at']}: image {k['image']!r} does not exist (relative paths start at "
                       f"{os.getcwd()})")
        k["image"] = path
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
    windowed = [v.frames for v in FAMILIES.values() if not (v.forcing or v.animate)]     # the others render one clip
    if variant == "auto" and shot.config.num_frames > min(windowed):
        try:
            variant = inspect(shot.config.model).variant
        except VidgenError as e:
            problems.append(f"shot {shot.name!r}: cannot tell how long a clip its model makes: {e}")
            return shot.config.num_frames
    family = FAMILIES.get(variant)      # diffusion forcing makes a long take in one render (vidgen.forcing), and
    # Animate a performance of any length (its segments inside the render: vidgen.animate)
    return family.frames if family is not None and not (family.forcing or family.animate) else shot.config.num_frames


def _text_only(variant: str) -> bool:
    """Whether `variant` is a text-to-video family (no image or kept frames to continue a window from)."""
    return variant in FAMILIES and not (FAMILIES[variant].accepts_image or FAMILIES[variant].control)


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
    out, spans = [], {}             # spans: shot name (lower) -> (first entry, windows, each window's first frame)
    for shot in shots:
        total, w = shot.config.num_frames, _window_frames(shot, problems)
        if any(verb in shot.refs for verb in VERBS):        # an edit renders as one clip (edits.verb_problems)
            w = total
        elif shot.config.animate.engaged or any(k.startswith("animate.") for k in shot.refs):
            w = total           # Animate: one render, its segments inside it (vidgen.animate), its length the pose's
        elif total > w and not shot.continuity.get("window_frames") and _text_only(_variant(shot)):
            notes.append(f"shot {shot.name!r}: {total} frames is longer than the {w} the model was trained on; a "
                         "text-to-video model cannot continue a window from the last, so it renders as one clip")
            w = total
        overlap = shot.continuity.get("overlap_frames", 1)
        if total > w and overlap >= w:
            problems.append(f"shot {shot.name!r}: continuity.overlap_frames: {overlap} is not less than the {w}-frame "
                            "window; windows must generate frames of their own")
            overlap = 1
        keys = {k["at"]: k["image"] for k in shot.continuity.get("keyframes", [])}
        windows = _windows(total, w, overlap, [at for at in keys if at < total - 1])
        starts = [s for s, _ in windows]
        _check_prompts(shot, starts, total, problems, notes)
        _check_keyframes(shot, keys, total, overlap, problems)
        start = len(out)
        out += _entries(shot, windows, overlap, keys)
        if len(windows) > 1:
            _chain(out, start, shot, w, overlap, problems, notes)
        spans[shot.name.lower()] = (start, len(windows), starts)
        _colour(out, start, len(windows), shot, notes)
    for i, entry in enumerate(out):
        for key, ref in list(entry.refs.items()):
            if key in VERBS:
                link(out, spans, i, key, ref, _variant(entry), problems)
            elif key.startswith("animate."):
                _performance(out, spans, i, key, ref, problems)
            else:
                _resolve(out, spans, i, key, ref, problems)
        entry.refs = {}
    return out


def _entries(shot, windows: list[tuple[int, int]], overlap: int, keys: dict) -> list:
    """The workflow entries of `shot`: itself, or one per window (first frame, frames), each with its own
    config: length, seed, prompt, first or last image, output name and kept frames."""
    n, cfg, out = len(windows), shot.config, []
    vace = bool(keys) and (variant := _variant(shot)) in FAMILIES and FAMILIES[variant].control
    for k, (first, frames) in enumerate(windows):
        output = dataclasses.replace(cfg.output, keep_frames=list(cfg.output.keep_frames))
        if n == 1:
            window = dataclasses.replace(cfg, prompt=_prompt_at(shot, 0), last_image=keys.get(frames - 1, cfg.last_image),
                                         control=dataclasses.replace(cfg.control), output=output)
        else:
            output.path = _window_path(Path(cfg.output.path), k)
            window = dataclasses.replace(cfg, num_frames=frames, seed=None if cfg.seed is None else cfg.seed + k,
                                         prompt=_prompt_at(shot, first), image=cfg.image if k == 0 else None,
                                         last_image=keys.get(first + frames - 1, cfg.last_image if k == n - 1 else None),
                                         control=dataclasses.replace(cfg.control), output=output)  # each its own
        if vace:                        # a key frame on VACE: the window's last frame, kept as given
            window.control.last_frame, window.last_image = window.last_image, None
        out.append(dataclasses.replace(shot, name=f"{shot.name}.w{k + 1}" if n > 1 else shot.name, config=window,
                                       take=shot.name if n > 1 else "", joins=k > 0, deps=[],
                                       overlap=overlap if k > 0 else 0,
                                       refs={key: v for key, v in shot.refs.items() if key in VERBS
                                             or key.startswith("animate.") or (key == "image" and k == 0) or (key == "last_image" and k == n - 1)}))
    return out


def _chain(out: list, start: int, shot, w: int, overlap: int, problems: list[str], notes: list[str]) -> None:
    """A take's windows (from entry `start`) each start on the last `overlap` frames of the one before."""
    windows, total = out[start:], shot.config.num_frames
    shared = "one frame" if overlap == 1 else f"{overlap} frames"
    why = f"longer than the model's {w}" if total > w else "split at its key frames"
    notes.append(f"shot {shot.name!r}: {total} frames is {why}: {len(windows)} windows of "
                 f"{', '.join(str(e.config.num_frames) for e in windows)} frames sharing {shared} each")
    variant = _variant(shot)
    if _text_only(variant):
        problems.append(f"shot {shot.name!r}: a long take ({total} frames, more than the model's {w}) continues "
                        f"each window from the last frames of the one before, which needs an image-conditioned "
                        f"model (Wan2.2 I2V-A14B or TI2V-5B) or a VACE model, not {variant}")
    elif shot.config.control.engaged:
        problems.append(f"shot {shot.name!r}: a long take on a VACE model carries its windows through "
                        "control.frames; a control clip of its own over several windows is not supported: "
                        "remove control.* or render the take as one clip")
    for k in range(1, len(windows)):
        _carry(out, start + k - 1, start + k, overlap, variant)


def _colour(out: list, start: int, n: int, shot, notes: list[str]) -> None:
    """continuity.colour on the take's n windows from entry `start`."""
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


def _resolve(out: list, spans: dict, i: int, key: str, ref: dict, problems: list[str]) -> None:
    shot = out[i]
    where = f"shot {(shot.take or shot.name)!r}: {key}"
    name = str(ref.get("from", ""))
    if (span := source_span(spans, i, name, where, "start from, end on or match", problems)) is None:
        return
    start, n, starts = span             # window k starts at frame starts[k] of the take
    total = starts[-1] + out[start + n - 1].config.num_frames
    frame = {"last": total - 1, "first": 0}.get(ref.get("frame", "last"), ref.get("frame"))
    if not isinstance(frame, int) or frame >= total:
        problems.append(f"{where}.frame: {frame!r} is beyond shot {name!r}, which has {total} frames (0..{total - 1})")
        return
    k = next(k for k in range(n) if frame < starts[k] + out[start + k].config.num_frames)   # the first that has it
    _link(out, start + k, frame - starts[k], i, key)


def _performance(out: list, spans: dict, i: int, key: str, ref: dict, problems: list[str]) -> None:
    """An Animate shot's driving video `key` (animate.pose_video, ...) is the video shot `ref` names renders
    (a rig's pose pass): that file, once it is written (a dependency); the submit checks it as a stand-in."""
    shot = out[i]
    where = f"shot {(shot.take or shot.name)!r}: {key}"
    name = str(ref.get("from", ""))
    if (span := source_span(spans, i, name, where, "take its performance from", problems)) is None:
        return
    start, n, _ = span
    if n > 1:
        problems.append(f"{where}.from: {name!r} is a long take in {n} windows, each its own file; drive an Animate "
                        "shot with a shot rendered as one clip")
        return
    src = out[start].config         # its video file, or its PNG folder: animate_inputs reads both
    setattr(shot.config.animate, key.removeprefix("animate."), src.output.path)
    if start not in shot.deps:
        shot.deps.append(start)


def _window_path(shot: Path, k: int) -> str:
    """Window k's output: take.mp4 -> take.w1.mp4; a PNG folder take -> take-w1 (no dot: a folder has no suffix)."""
    return str(shot.with_name(f"{shot.stem}.w{k + 1}{shot.suffix}" if shot.suffix else f"{shot.name}-w{k + 1}"))


def _carry(out: list, source: int, target: int, overlap: int, variant: str) -> None:
    """Window `target` starts on the last `overlap` frames of window `source`, kept losslessly: as its
    image (and image_frames after it), or on a VACE model as control.frames it keeps as given."""
    src = out[source].config
    paths = [keep_frame(src, f) for f in range(src.num_frames - overlap, src.num_frames)]
    out[target].deps.append(source)
    cfg = out[target].config
    if variant in FAMILIES and FAMILIES[variant].control:
        cfg.image, cfg.control.frames, cfg.control.keep_first = None, paths, overlap
    else:
        cfg.image, cfg.image_frames = paths[0], paths[1:]


def _windows(total: int, w: int, overlap: int, keyframes: list[int]) -> list[tuple[int, int]]:
    """(first frame, frames) of each window of a take: at most `w` frames, each sharing `overlap` with the one
    before, one ending on each key frame and the last on the take's last frame. Ends advance by multiples of
    4 (the windows stay 4k+1 long): full windows, then what is left before the next key frame."""
    if total <= w and not keyframes:
        return [(0, total)]
    ends, end, step = [], overlap - 1, w - overlap          # as if a window before the first ended at overlap - 1
    for target in sorted(set(keyframes)) + [total - 1]:
        count = max(1, math.ceil((target - end) / step))
        ends += [end + step * j for j in range(1, count)] + [target]
        end = target
    return [(0 if j == 0 else ends[j - 1] - overlap + 1, e - (0 if j == 0 else ends[j - 1] - overlap + 1) + 1)
            for j, e in enumerate(ends)]


def _check_keyframes(shot, keys: dict, total: int, overlap: int, problems: list[str]) -> None:
    """continuity.keyframes against the take and its model: each lands as a window's last frame (last_image)."""
    where = f"shot {shot.name!r}: continuity.keyframes"
    for at in sorted(keys):
        if at >= total:
            problems.append(f"{where}: at {at} is beyond the take's {total} frames (0..{total - 1})")
        elif at < overlap + 3:
            problems.append(f"{where}: at {at} leaves the first window no frame to generate; a key frame lands at "
                            f"frame {overlap + 3} or later (a window is at least overlap_frames + 4 frames)")
    if total - 1 in keys and shot.config.last_image:
        problems.append(f"{where}: at {total - 1} and last_image both set the take's last frame; give one")
    variant = _variant(shot) if keys else ""
    family = FAMILIES.get(variant)      # FLF2V is told from its folder: preflight refuses a plain Wan2.1 I2V's
    if family is not None and family.last_frame == "none" and not family.control:
        can = ", ".join(f"{f.name} ({f.display})" for f in FAMILIES.values() if f.last_frame != "none" or f.control)
        problems.append(f"{where}: a key frame lands as a window's last frame (last_image, or VACE's kept last "
                        f"frame), which {variant} cannot take; use a first-last-frame or VACE model: {can}")


def _prompt_at(shot, frame: int) -> str:
    """The prompt in force at `frame` of the take: the last of continuity.prompts at or before it, else the shot's."""
    given = [p for p in shot.continuity.get("prompts", []) if p["at"] <= frame]
    return max(given, key=lambda p: p["at"])["prompt"] if given else shot.config.prompt


def _check_prompts(shot, starts: list[int], total: int, problems: list[str], notes: list[str]) -> None:
    """continuity.prompts against the take's windows (first frames `starts`): a prompt takes effect at the
    first window that starts at or after its frame (noted when that is later); one that none reaches is refused."""
    for p in shot.continuity.get("prompts", []):
        at, where = p["at"], f"shot {shot.name!r}: continuity.prompts: at {p['at']}"
        begins = next((s for s in starts if s >= at), None)
        if at >= total:
            problems.append(f"{where} is beyond the take's {total} frames (0..{total - 1})")
        elif begins is None:
            problems.append(f"{where} falls in the last window, which starts at frame {starts[-1]}; a window takes "
                            "the prompt in force at its first frame: move it to a window's start or set window_frames")
        elif begins != at:
            notes.append(f"{where} takes effect at frame {begins}, where the next window starts")


def _link(out: list, source: int, frame: int, target: int, key: str) -> None:
    """`target`'s image / last_image / colour_reference is frame `frame` of entry `source`, kept losslessly."""
    path = keep_frame(out[source].config, frame)
    cfg = out[target].config
    if key == "colour_reference":
        cfg.output.colour_reference = path
    else:
        setattr(cfg, key, path)
    if source not in out[target].deps:
        out[target].deps.append(source)
