"""Wan2.2-Animate's user-made inputs checked before any weights load, and read for vidgen.animate.

vidgen ships no pose or face model: the pose, face, background and mask videos come from the user
(docs/animate.md says how to make them). `check_inputs` finds every problem at once, one line each
with its key (`animate.pose_video: ...`), so the CLI can refuse with exit 2 before loading weights:

- each video exists and decodes (a video file, or a folder of PNG frames in name order), with frames
  of one size;
- pose, face, background and mask have the same number of frames: WanAnimatePipeline pads each
  driving video on its own (by reflection) to the segments' length, so clips of different lengths
  would silently drift apart;
- the face video is face_size x face_size (the motion encoder's `motion_encoder_size`, 512 in
  Wan2.2-Animate-14B): diffusers stretches any other size to it, distorting the face;
- pose, background and mask frames have the render's aspect ratio: diffusers resizes them to the
  render size without keeping the aspect (a stretched skeleton gives the character other
  proportions, a stretched mask misses the character), so another aspect is refused; the same aspect
  at another size is resized (LANCZOS, as diffusers' VideoProcessor does) and said so (a log line);
- the mask is binary: WanAnimatePipeline uses its grey levels as they are (no threshold), so a soft
  mask becomes a half-known region the model was not trained on (MASK_* below: the tolerance that
  lets H.264's ringing at the mask's edges through);
- mode "replace" has a background and a mask; mode "animate" has neither (they would be ignored);
- a video whose container fps differs from the render's is said (a log line): each driving frame
  becomes one output frame, so the motion plays at another speed.

Cost: every video is decoded once, frame by frame, keeping only counts and sizes (and, for the mask,
how many pixels are grey): about as long as a decode of each clip, with one frame in memory.
`read_inputs` then holds all frames (PIL images) for `vidgen.animate.prepare_pixels`.
"""

from __future__ import annotations

import os

import logging
from dataclasses import dataclass

import numpy as np

from .animate import MODES, plan_segments
from .control import clip_frames, read_clip
from .errors import ConfigError, InputError, OutputError
from .io import video_fps
from .records import path_problem

log = logging.getLogger("vidgen")

FACE_SIZE = 512
"""WanAnimateTransformer3DModel's motion_encoder_size in Wan2.2-Animate-14B: face crops are S x S."""
ASPECT_TOLERANCE = 0.01
"""Relative aspect-ratio difference below which a clip counts as the render's aspect (control.fit_clip's)."""
MASK_GREY_LEVEL = 32
"""A mask pixel (luma, 0..255) more than this far from both 0 and 255 counts as grey."""
MASK_GREY_FRACTION = 0.01
"""A mask frame with more than this fraction of grey pixels is not binary. Measured on binary masks
(moving ellipses and wavy silhouettes) written by VideoWriter as H.264 yuv420p and decoded: the worst
frame's grey fraction was <= 0.07% at crf 18 and <= 0.43% at crf 28 for 128x96 and larger frames
(<= 0.05% at 832x480, crf 28; 0.98% at 64x64, crf 28), while a mask feathered by a Gaussian blur of
radius 2 had 1.05% (832x480) to 12% (64x64) and a uniformly grey mask has 100%."""

DRIVING = ("pose_video", "face_video", "background_video", "mask_video")


@dataclass(frozen=True)
class ClipScan:
    """What one streaming decode of a clip found."""

    frames: int
    width: int                          # of the first frame
    height: int
    fps: float | None                   # the container's; None for a PNG folder
    other_size: tuple[int, int, int] | None = None    # (frame index, width, height) of a frame of another size
    grey: tuple[int, float] | None = None             # mask only: (frame index, grey fraction) of the worst frame


def scan_clip(path: str, key: str, *, mask: bool = False) -> ClipScan:
    """Frame count, size and fps of a clip (and, with `mask`, its greyest frame), decoding it once.
    InputError says what makes it unusable (missing, unreadable, no frames)."""
    if problem := path_problem(path, "file or folder"):
        raise InputError(f"{key}: {path!r} {problem}; give a video file or a folder of PNG frames")
    try:
        fps = video_fps(path)
    except OutputError as e:
        raise InputError(f"{key}: {str(e).splitlines()[0]}") from None
    count, size, other, grey = 0, None, None, None
    for frame in clip_frames(path, key):
        h, w = frame.shape[:2]          # clip_frames refuses frames larger than any vidgen renders
        if size is None:
            size = (w, h)
        elif (w, h) != size and other is None:
            other = (count, w, h)
        if mask:
            # luma as PIL's convert("L") (ITU-R 601), which diffusers' mask processor applies
            luma = frame.astype(np.float32) @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
            fraction = float((np.minimum(luma, 255 - luma) > MASK_GREY_LEVEL).mean())
            if grey is None or fraction > grey[1]:
                grey = (count, fraction)
        count += 1
    if size is None:
        raise InputError(f"{key}: {path!r} holds no frames; give a clip with at least one frame")
    return ClipScan(count, size[0], size[1], fps, other, grey)


def _aspect_differs(w: int, h: int, width: int, height: int) -> bool:
    return abs((w / h) / (width / height) - 1) > ASPECT_TOLERANCE


def check_inputs(**kwargs) -> list[str]:
    """Every problem with an Animate render's inputs (see scan_inputs), one line each; [] when they can be used."""
    return scan_inputs(**kwargs)[0]


def scan_inputs(*, mode: str, pose_video: str | None, face_video: str | None, background_video: str | None = None,
                mask_video: str | None = None, image: str | None = None, width: int, height: int,
                face_size: int = FACE_SIZE, fps: float | None = None, segment_frames: int | None = None,
                overlap_frames: int | None = None, pending: dict | None = None) -> tuple[list[str], int]:
    """(every problem with an Animate render's inputs, one line each keyed `animate.<name>` (`image` for the
    character reference), the pose video's frame count (0 when unknown)). Notes that change nothing (a
    resize of the same aspect, another fps) are logged as warnings on the "vidgen" logger.

    Args:
        mode: "animate" (the character moves as the pose/face videos say, on the reference's background)
            or "replace" (the character replaces the masked person of background_video).
        pose_video, face_video, background_video, mask_video: video files or folders of PNG frames.
        image: the character reference (the render's `image`), checked only to open as an image.
        width, height: the render size; fps: the render's fps (None: not compared).
        face_size: the motion encoder's input size (the transformer config's motion_encoder_size).
        segment_frames, overlap_frames: when both given, the segment rule (vidgen.animate.plan_segments)
            is checked against the pose video's frame count.
    """
    problems: list[str] = []
    if mode not in MODES:
        problems.append(f"animate.mode: {mode!r} must be one of {', '.join(MODES)}")
    paths = {"pose_video": pose_video, "face_video": face_video, "background_video": background_video,
             "mask_video": mask_video}
    for name in ("pose_video", "face_video"):
        if not paths[name]:
            problems.append(f"animate.{name}: missing; give a video file or a folder of PNG frames "
                            "(docs/animate.md says how to make one)")
    if mode == "replace":
        for name in ("background_video", "mask_video"):
            if not paths[name]:
                problems.append(f"animate.{name}: mode 'replace' needs it (the background the character is put "
                                "into and the mask of where it goes); give it, or use mode 'animate'")
    elif mode == "animate":
        for name in ("background_video", "mask_video"):
            if paths[name]:
                problems.append(f"animate.{name}: is used only in mode 'replace' (mode 'animate' would ignore it); "
                                "remove it, or set animate.mode: replace")
        paths["background_video"] = paths["mask_video"] = None

    scans: dict[str, ClipScan] = {}
    for name in DRIVING:
        if not paths[name]:
            continue
        key = f"animate.{name}"
        coming = (pending or {}).get(os.path.abspath(paths[name]))
        try:
            scan = scans[name] = (ClipScan(coming[2], coming[0], coming[1], None) if coming and len(coming) == 3
                                  else scan_clip(paths[name], key, mask=name == "mask_video"))
        except InputError as e:
            problems.append(str(e))
            continue
        if scan.other_size:
            i, w, h = scan.other_size
            problems.append(f"{key}: frame {i} is {w}x{h}, the first is {scan.width}x{scan.height}; "
                            "every frame must have one size")
        if name == "face_video":
            if (scan.width, scan.height) != (face_size, face_size):
                problems.append(f"{key}: frames are {scan.width}x{scan.height}; face crops must be {face_size}x"
                                f"{face_size} (the motion encoder's size): crop each frame around the face "
                                f"and resize the crop to {face_size}x{face_size}")
        elif _aspect_differs(scan.width, scan.height, width, height):
            problems.append(f"{key}: frames are {scan.width}x{scan.height} (aspect {scan.width / scan.height:.3f}), "
                            f"the render is {width}x{height} (aspect {width / height:.3f}); they would be stretched "
                            "to it: render or crop them at the render's aspect ratio")
        elif (scan.width, scan.height) != (width, height):
            log.warning("%s: %dx%d frames are resized to %dx%d", key, scan.width, scan.height, width, height)
        if scan.grey is not None and scan.grey[1] > MASK_GREY_FRACTION:
            i, fraction = scan.grey
            problems.append(f"{key}: not binary: {fraction:.1%} of frame {i}'s pixels are grey (more than "
                            f"{MASK_GREY_LEVEL} levels from black and white; at most {MASK_GREY_FRACTION:.0%} is "
                            "compression); give white (generate) and black (keep) only, not a soft or feathered mask")
        if fps and scan.fps and abs(scan.fps - fps) > 1e-3:
            log.warning("%s: %g fps, the render writes %g fps: each frame becomes one output frame, so its motion "
                        "plays %.2fx as fast; export it at %g fps to keep its speed", key, scan.fps, fps,
                        fps / scan.fps, fps)

    if len(scans) > 1:
        first = next(iter(scans))
        for name, scan in scans.items():
            if scan.frames != scans[first].frames:
                problems.append(f"animate.{name}: {scan.frames} frames, animate.{first} has {scans[first].frames}; "
                                "every driving video must have the same frames, one per output frame")
    if image:
        problems += _image_problems(image, width, height)
    if segment_frames is not None and overlap_frames is not None and "pose_video" in scans:
        try:
            plan_segments(scans["pose_video"].frames, segment_frames, overlap_frames)
        except ConfigError as e:
            names = {"segment_frame_length:": "animate.segment_frames:",
                     "prev_segment_conditioning_frames:": "animate.overlap_frames:",
                     "pose_video:": "animate.pose_video:"}
            for p in e.problems:
                head, _, rest = p.partition(" ")
                problems.append(f"{names.get(head, head)} {rest}")
    return problems, scans["pose_video"].frames if "pose_video" in scans else 0


def _image_problems(path: str, width: int, height: int) -> list[str]:
    """The character reference: it must open as an image; another aspect is fitted (a log line)."""
    from PIL import Image

    if problem := path_problem(path, "file"):
        return [f"image: {path!r} {problem}"]
    try:
        with Image.open(path) as im:
            im.verify()
            w, h = im.size
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        return [f"image: cannot read {path!r} as an image ({e.__class__.__name__})"]
    if _aspect_differs(w, h, width, height):
        log.warning("image: the %dx%d reference is fitted inside %dx%d (aspect kept, black around it), as "
                    "WanAnimatePipeline does", w, h, width, height)
    return []


@dataclass(frozen=True)
class AnimateInputs:
    """The inputs as `vidgen.animate.prepare_pixels` takes them: PIL RGB images, in frame order."""

    image: object | None                # PIL.Image.Image
    pose_video: list
    face_video: list
    background_video: list | None
    mask_video: list | None


def read_inputs(*, mode: str, pose_video: str, face_video: str, background_video: str | None = None,
                mask_video: str | None = None, image: str | None = None) -> AnimateInputs:
    """Every frame of the (already checked) inputs as PIL images; InputError if one cannot be read."""
    from PIL import Image

    def clip(path: str, key: str) -> list:
        return [Image.fromarray(f) for f in read_clip(path, key)[0]]

    replace = mode == "replace"
    ref = None
    if image:
        with Image.open(image) as im:
            ref = im.convert("RGB")
    return AnimateInputs(ref, clip(pose_video, "animate.pose_video"), clip(face_video, "animate.face_video"),
                         clip(background_video, "animate.background_video") if replace else None,
                         clip(mask_video, "animate.mask_video") if replace else None)
