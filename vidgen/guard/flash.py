"""Photosensitivity check: general and red flashes (WCAG 2.3.1) and extended flashing, streamed.

Frames arrive chunk by chunk as the VAE decodes them; `FlashCheck.update` takes each chunk and keeps
state of a fixed size (per pixel of a grid pooled to ~0.1 degree, per 10 degree field position, and
5 s of per-frame numbers), so memory does not grow with the clip.

    check = FlashCheck(fps, width, height)
    for chunk in chunks:               # uint8 [T, H, W, 3] RGB, numpy or torch
        check.update(chunk)
    report = check.result()            # FlashReport: passed, reason, max flashes, extended_failure, ...

The rules, and where they come from
-----------------------------------
WCAG 2.2, definition "general flash and red flash thresholds", with the numbers of EA's IRIS
(github.com/electronicarts/IRIS: config/appsettings.json, src/TransitionTrackerByFPS.cpp, README):

* Relative luminance Y = 0.2126 R + 0.7152 G + 0.0722 B of sRGB-linearised channels
  (c <= 0.04045: c / 12.92, else ((c + 0.055) / 1.055) ** 2.4; WCAG 2.2 "relative luminance").
* A transition is the change between adjacent peak and valley of a signal plotted against time; a
  flash is two opposing transitions (WCAG notes).
  - General: Y changes by >= 0.1 and the darker state has Y < 0.8.
  - Red: either state is saturated red, R / (R + G + B) >= 0.8, and (R - G - B) * 320 (negatives
    set to 0; linear channels) changes by > 20: the Harding-Binnie working definition WCAG 2.0-2.2
    give, and IRIS's. Not implemented: the note WCAG 2.2 added (ISO 9241-391: a change of > 0.2 in
    CIE 1976 u'v'), because black has no chromaticity, dark noise makes u'v' jump, and it misses
    the dark-red / bright-red flash that (R - G - B) * 320 catches.
* Pixels: peaks and valleys are found with hysteresis equal to the threshold (a reversal smaller
  than 0.1, or 20, is not a peak), so noise neither splits one change into several nor resets it.
  A swing gives one transition, on the first frame it spans the threshold with a qualifying end,
  however many frames it takes. IRIS forgets swing parts older than 1 s; we do not, which is
  stricter, and a slow change is still one transition.
* Area, ">25% of any 10 degree visual field": a pixel's transitions summed with their sign give
  its state (0 or +-1). |mean state over a ~1 degree box| is how much of that neighbourhood flashes
  together; its sum over a field is the field's flashing area, in pixels. A field transition is a
  swing of that area by more than 25% of the field (same hysteresis). The clip fails when a field
  makes more than 6 transitions (more than 3 flashes) within 1 s, i.e. the last round(fps) frames.
  Why: counting each pixel's own flashes fails every camera pan over texture (each pixel flickers
  as the texture slides by); a mean over the whole frame (IRIS) cancels that, but also passes two
  areas flashing out of phase, or a reversing checkerboard. Signs cancel within ~1 degree (texture,
  noise, fine balanced patterns: WCAG exempts those below 0.1 degree), while coarser areas add up
  whatever their phase (WCAG: "the combined area of flashes occurring concurrently"; whether
  out-of-phase areas add is left open, w3c/wcag discussion #5189). Summing transitions rather than
  testing each frame's changed area keeps a flash whose edges land on different frames one flash.
  Trade-off: structure coarser than ~1 degree that moves fast enough for each point to flicker
  more than 3 times a second fails: drifting high-contrast stripes, and pans over large contrasty
  shapes (synthetic blobs ~3 degrees across at +-70 codes failed at 0.75 frame widths a second).
* Extended flashing (IRIS README, TransitionTrackerByFPS.cpp; Harding's "extended flash"): fails
  when the worst field is at 2 to 3 flashes in its 1 s window (4 to 6 transitions) on frames
  filling at least 4 s of the last 5 s, checked at a frame that is itself at 2+. General and red
  are counted separately, as in IRIS.

The 10 degree field and "any window"
------------------------------------
WCAG: a 341 x 256 px rectangle anywhere on a 1024 x 768 screen estimates a 10 degree field. We
assume the clip fills such a screen: the field is width * 341/1024 by height * 256/768 clip px (a
third of each side; `field_size` overrides it), 0.1 degree about width/300 px, and linear light is
averaged over blocks of that size first (a partial last block is dropped). Every field position on
that pooled grid is tested, not a coarse grid of cells: summed-area tables give all positions in
O(pixels) per frame, where k x k cells per field can see as little as ((k - 1/2) / k)^2 of a flash
that straddles cells.

iris-pse-detection
------------------
iris-pse-detection 1.1.2 (MIT, a Python port of IRIS; pulls in opencv-python and scipy) was run on
the 21 clips of tests/test_guard_flash.py through its FlashDetection class (its VideoAnalyser only
reads files). Same verdict on 19: full-frame 1 Hz / 4 Hz, both red clips, the bright 0.85 <-> 1.0
flash, 20% / 30% striped 8 Hz, a small flashing square, a flash with ragged edges, both camera pans,
a fine reversing checkerboard, still, fading and noisy clips, 3 Hz for 3 s and for 5 s (extended
failure), and both chunking clips (though it missed the red bar, 16% of the frame, in one). It
passed an 8 Hz flash filling one 10 degree field (11% of the frame) and a reversing checkerboard of
~2.5 degree squares, and, outside the tests, two halves flashing in antiphase: it measures area
against the whole frame (the Ofcom TV rule) and averages luminance over it. On 81 frames of 832x480
it took 0.35-0.40 s, this module 0.55 s (2 CPU cores; its LUT is OpenCV SIMD). We use our own: the
WCAG 10 degree field rule, chunked input instead of a video file, and no opencv-python / scipy.
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import ConfigError

FIELD_AT_1024x768 = (341, 256)   # (w, h) px of a 10 degree field on a 1024 x 768 screen (WCAG note)
SCREEN_1024x768 = (1024, 768)
BLOCK_DEGREES = 0.1              # pooling block; also WCAG's fine-pattern exception size
LUMA = np.array([0.2126, 0.7152, 0.0722], np.float32)
_SUBBATCH_PIXELS = 1 << 20       # pixels linearised at once: keeps the float32 temporaries ~12 MB


def srgb_to_linear_lut() -> np.ndarray:
    """uint8 sRGB code -> linear light in [0, 1], float32 [256] (IEC 61966-2-1 as in WCAG 2.2)."""
    c = np.arange(256, dtype=np.float64) / 255.0
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4).astype(np.float32)


@dataclass
class FlashReport:
    """What the photosensitivity check found in one clip.

    Flash counts are half the most field transitions (swings of a 10 degree field's coherently
    flashing area by more than `area_fraction` of it) in any 1 s window: 3.5 means 7 transitions,
    a fail (more than 3 flashes).
    """

    passed: bool
    reason: str                      # one line; "" when passed
    max_general_flashes: float
    max_red_flashes: float
    extended_failure: bool
    first_failure_s: float | None    # time of the first failing frame (frame index / fps)
    frames: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


class _Swings:
    """Transitions of a signal, element-wise: peak/valley detection with hysteresis.

    WCAG's transition is the change between adjacent peak and valley. Per element we keep the
    lowest and highest value of the current swing (`lo`, `hi`), whether each extreme state
    qualifies (darker than 0.8, saturated red), and the trend. A move back from the running extreme
    by the threshold is a reversal: that extreme becomes the new swing's anchor, so reversals
    smaller than the threshold are not peaks. A swing yields one transition, on the first frame
    it spans the threshold with a qualifying end.
    """

    def __init__(self, shape: tuple[int, int], threshold: float, inclusive: bool):
        self.threshold, self.inclusive = threshold, inclusive
        self.lo = self.hi = self.lo_ok = self.hi_ok = None
        self.trend = np.zeros(shape, np.int8)       # +1 rising, -1 falling, 0 no swing yet
        self.counted = np.zeros(shape, bool)        # this swing already gave its transition

    def _reached(self, swing: np.ndarray) -> np.ndarray:
        return swing >= self.threshold if self.inclusive else swing > self.threshold

    def step(self, y: np.ndarray, ok: np.ndarray) -> np.ndarray:
        """Feed one frame: signal y and qualifier ok, [h, w] each -> int8 [h, w]: +1 a rising
        transition, -1 a falling one, 0 none."""
        if self.lo is None:
            self.lo, self.hi, self.lo_ok, self.hi_ok = y.copy(), y.copy(), ok.copy(), ok.copy()
            return np.zeros(y.shape, np.int8)
        rising, falling = self.trend >= 0, self.trend <= 0   # no trend yet: track both extremes
        m = rising & (y > self.hi)
        np.copyto(self.hi, y, where=m)
        np.copyto(self.hi_ok, ok, where=m)
        m = falling & (y < self.lo)
        np.copyto(self.lo, y, where=m)
        np.copyto(self.lo_ok, ok, where=m)
        # with no trend yet hi - lo was below the threshold, so at most one of these holds
        down = rising & self._reached(self.hi - y)
        up = falling & self._reached(y - self.lo)
        np.copyto(self.lo, y, where=down)
        np.copyto(self.lo_ok, ok, where=down)
        np.copyto(self.hi, y, where=up)
        np.copyto(self.hi_ok, ok, where=up)
        self.trend[down] = -1
        self.trend[up] = 1
        self.counted[down | up] = False
        # once it has a trend the swing spans the threshold; it counts when either end qualifies
        event = ~self.counted & (self.trend != 0) & (self.lo_ok | self.hi_ok)
        self.counted |= event
        return self.trend * event


class _Rolling:
    """How many events each element had in the last `window` frames (a ring of event masks)."""

    def __init__(self, shape: tuple[int, int], window: int):
        self.ring = np.zeros((window, *shape), bool)
        self.busy = [False] * window                # whether a ring slot holds any event
        self.count = np.zeros(shape, np.int16)
        self.t = 0

    def add(self, event: np.ndarray | None) -> bool:
        """Push one frame's events (None: none); returns whether the counts changed."""
        slot = self.t % len(self.busy)
        self.t += 1
        changed = self.busy[slot]
        if changed:
            self.count -= self.ring[slot]
            self.ring[slot] = False
        self.busy[slot] = event is not None and bool(event.any())
        if self.busy[slot]:
            self.ring[slot] = event
            self.count += event
            changed = True
        return changed


class _Verdict:
    """The per-frame levels of one flash kind (general or red) and the failures they make."""

    def __init__(self, max_transitions: int, extended_min: int, extended_frames: int, extended_window: int):
        self.max_transitions, self.extended_min = max_transitions, extended_min
        self.extended_frames = extended_frames
        self.sustained: deque[bool] = deque(maxlen=extended_window)
        self.sustained_count = 0
        self.max_level = 0
        self.fail_frame: int | None = None        # first frame over max_transitions
        self.extended_frame: int | None = None    # first frame of extended failure

    def add(self, t: int, level: int) -> None:
        self.max_level = max(self.max_level, level)
        if level > self.max_transitions and self.fail_frame is None:
            self.fail_frame = t
        at_limit = self.extended_min <= level <= self.max_transitions
        if len(self.sustained) == self.sustained.maxlen:
            self.sustained_count -= self.sustained[0]
        self.sustained.append(at_limit)
        self.sustained_count += at_limit
        if (self.extended_frame is None and self.sustained_count >= self.extended_frames
                and level >= self.extended_min):
            self.extended_frame = t


class _FlashKind:
    """One kind of flash (general or red): pixel transitions -> field transitions -> verdict.

    A pixel's transitions, summed with their sign, give its state (0 or +-1: they alternate).
    The state's mean over a ~1 degree box, taken as a magnitude, is how much of that neighbourhood
    flashes together: balanced changes finer than the box (texture sliding past, noise, fine
    reversing patterns) cancel, coarser areas add up whatever their phase. A field's signal is
    the sum of that over the field, in pixels; a field transition is a swing of it by more than
    area_fraction of the field, found with the same hysteresis as the pixels'.
    """

    def __init__(self, grid: tuple[int, int], field: tuple[int, int], cell: tuple[int, int],
                 threshold: float, inclusive: bool, area_fraction: float, window: int, verdict: _Verdict):
        self.field, self.cell = field, cell
        positions = (grid[0] - field[0] + 1, grid[1] - field[1] + 1)
        self.pixels = _Swings(grid, threshold, inclusive)
        self.state = np.zeros(grid, np.int8)             # net signed transitions per pixel
        # field signals are in 1 / (cell area) pixel units, so the threshold is too
        self.fields = _Swings(positions, area_fraction * field[0] * field[1] * cell[0] * cell[1], inclusive=False)
        self.always = np.ones(positions, bool)
        self.rolling = _Rolling(positions, window)
        self.verdict = verdict
        self.level = 0                                   # most field transitions in the 1 s window
        self._fresh = True

    def step(self, t: int, y: np.ndarray, ok: np.ndarray) -> None:
        event = self.pixels.step(y, ok)
        field_event = None
        if self._fresh or event.any():                   # still pixels leave the fields as they were
            self._fresh = False
            np.clip(self.state + event, -1, 1, out=self.state)
            field_event = self.fields.step(self._field_signal(), self.always) != 0
        if self.rolling.add(field_event):
            self.level = int(self.rolling.count.max())
        self.verdict.add(t, self.level)

    def _field_signal(self) -> np.ndarray:
        """Coherently flashing pixels in every field position, float64 [positions], in units of
        1 / (cell area) pixel: integers, so the area threshold is compared exactly."""
        ch, cw = self.cell
        padded = np.pad(self.state, ((ch // 2, (ch - 1) // 2), (cw // 2, (cw - 1) // 2)))
        coherent = np.abs(_box_sums(padded, ch, cw))     # [grid]
        return _box_sums(coherent, *self.field).astype(np.float64)


def _box_sums(a: np.ndarray, h: int, w: int) -> np.ndarray:
    """Sums of a over every h x w box inside it, int64 [H - h + 1, W - w + 1] (summed-area table, Crow 1984)."""
    table = np.zeros((a.shape[0] + 1, a.shape[1] + 1), np.int64)
    np.cumsum(np.cumsum(a, axis=0, dtype=np.int64), axis=1, out=table[1:, 1:])
    return table[h:, w:] - table[:-h, w:] - table[h:, :-w] + table[:-h, :-w]


class FlashCheck:
    """Streaming photosensitivity analyser for one clip (rules and sources: module docstring).

    Args:
        fps: frame rate of the clip; the 1 s window is round(fps) frames.
        width, height: frame size in pixels; every chunk must match it.
        luminance_change: general-flash transition size in relative luminance (>=).
        dark_luminance: the darker state of a general transition must be below this.
        red_change: red transition size in (R - G - B) * 320 (>).
        red_saturation: R / (R + G + B) at or above which a state is saturated red.
        area_fraction: fail only when flashing pixels cover more than this share of a field.
        max_flashes: more flashes than this in a 1 s window fail (transitions > 2 * max_flashes).
        extended_flashes: flashes a second, up to max_flashes, that count towards extended failure.
        extended_seconds, extended_window_s: extended failure when such frames fill this many seconds
            of this window.
        field_size: (width, height) of a 10 degree visual field in clip pixels; default: the
            clip shown as a 1024 x 768 screen (341 x 256 there).
        fail_on_extended: whether an extended failure fails the check.

    Raises:
        ConfigError: every bad argument at once.
    """

    def __init__(self, fps: float, width: int, height: int, *, luminance_change: float = 0.1,
                 dark_luminance: float = 0.8, red_change: float = 20.0, red_saturation: float = 0.8,
                 area_fraction: float = 0.25, max_flashes: int = 3, extended_flashes: int = 2,
                 extended_seconds: float = 4.0, extended_window_s: float = 5.0,
                 field_size: tuple[int, int] | None = None, fail_on_extended: bool = True):
        problems = []
        if not (isinstance(fps, numbers.Real) and math.isfinite(fps) and fps > 0):
            problems.append(f"fps: {fps!r} is not a positive number")
        for name, v in (("width", width), ("height", height)):
            if not (isinstance(v, numbers.Integral) and v > 0):
                problems.append(f"{name}: {v!r} is not a positive integer")
        for name, v, hi in (("luminance_change", luminance_change, 1.0), ("dark_luminance", dark_luminance, 1.0),
                            ("red_change", red_change, 320.0), ("red_saturation", red_saturation, 1.0),
                            ("area_fraction", area_fraction, 1.0)):
            if not (isinstance(v, (int, float)) and 0 < v <= hi):
                problems.append(f"{name}: {v!r} is not in (0, {hi:g}]")
        if not (isinstance(max_flashes, int) and max_flashes >= 1):
            problems.append(f"max_flashes: {max_flashes!r} is not an integer >= 1")
        elif not (isinstance(extended_flashes, int) and 1 <= extended_flashes <= max_flashes):
            problems.append(f"extended_flashes: {extended_flashes!r} is not an integer in [1, max_flashes]")
        if not (isinstance(extended_seconds, (int, float)) and isinstance(extended_window_s, (int, float))
                and 0 < extended_seconds <= extended_window_s):
            problems.append(f"extended_seconds / extended_window_s: {extended_seconds!r} / {extended_window_s!r} "
                            "are not 0 < seconds <= window")
        if field_size is not None and not (isinstance(field_size, (tuple, list)) and len(field_size) == 2
                                           and all(isinstance(v, int) and v > 0 for v in field_size)):
            problems.append(f"field_size: {field_size!r} is not (width, height) in positive pixels")
        if problems:
            raise ConfigError(problems, source="FlashCheck")

        self.fps, self.width, self.height = float(fps), int(width), int(height)
        self.dark_luminance, self.red_saturation = dark_luminance, red_saturation
        self.area_fraction, self.fail_on_extended = area_fraction, fail_on_extended
        self._lut = srgb_to_linear_lut()

        # pooling block of ~0.1 degree (a field is 10 degrees) and the pooled grid; the last
        # partial block is dropped
        field_w, field_h = field_size or (width * FIELD_AT_1024x768[0] / SCREEN_1024x768[0],
                                          height * FIELD_AT_1024x768[1] / SCREEN_1024x768[1])
        self.block = (max(1, int(field_h * BLOCK_DEGREES / 10)), max(1, int(field_w * BLOCK_DEGREES / 10)))
        self.grid = (height // self.block[0], width // self.block[1])
        if min(self.grid) < 1:
            raise ConfigError(f"field_size: {field_size!r} is too large for a {width}x{height} clip",
                              source="FlashCheck")
        # the 10 degree field on the pooled grid, never larger than the frame
        self.field = (min(self.grid[0], max(1, round(field_h / self.block[0]))),
                      min(self.grid[1], max(1, round(field_w / self.block[1]))))

        window = max(1, round(self.fps))
        verdict = dict(max_transitions=2 * max_flashes, extended_min=2 * extended_flashes,
                       extended_frames=max(1, round(extended_seconds * self.fps)),
                       extended_window=max(1, round(extended_window_s * self.fps)))
        # ~1 degree: finer balanced changes cancel, coarser flashing areas add up
        self.cell = (max(1, self.field[0] // 10), max(1, self.field[1] // 10))
        shared = dict(grid=self.grid, field=self.field, cell=self.cell, area_fraction=area_fraction, window=window)
        self._kinds = {"general": _FlashKind(threshold=luminance_change, inclusive=True, verdict=_Verdict(**verdict),
                                             **shared),
                       "red": _FlashKind(threshold=red_change, inclusive=False, verdict=_Verdict(**verdict),
                                         **shared)}
        self.frames = 0

    # -- feeding -----------------------------------------------------------------------------
    def update(self, frames) -> None:
        """Analyse the next frames of the clip: uint8 [T, H, W, 3] RGB, numpy array or torch tensor."""
        if hasattr(frames, "detach"):                    # torch, possibly on an accelerator
            frames = frames.detach().cpu().numpy()
        frames = np.asarray(frames)
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[1:] != (self.height, self.width, 3):
            raise ValueError(f"frames must be uint8 [T, {self.height}, {self.width}, 3] RGB; got "
                             f"{frames.dtype} {list(frames.shape)}")
        step = max(1, _SUBBATCH_PIXELS // (self.height * self.width))
        for start in range(0, frames.shape[0], step):
            luma, red, saturated = self._signals(frames[start:start + step])
            for i in range(luma.shape[0]):               # the swing state is sequential in time
                self._frame(luma[i], red[i], saturated[i])

    def _signals(self, frames: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """uint8 [t, H, W, 3] -> relative luminance, (R-G-B)*320 and saturated-red mask, [t, h, w] each."""
        bh, bw = self.block
        gh, gw = self.grid
        # channels first: strided pooling over interleaved RGB is ~10x slower than over planes
        planes = np.ascontiguousarray(np.moveaxis(frames[:, :gh * bh, :gw * bw], -1, 0))
        lin = np.take(self._lut, planes)                                  # [3, t, H', W'] linear light
        if bh * bw > 1:                                                    # mean over each block
            parts = [lin[:, :, i::bh, j::bw] for i in range(bh) for j in range(bw)]
            pooled = parts[0] + parts[1]
            for part in parts[2:]:
                pooled += part
            lin = pooled * np.float32(1.0 / (bh * bw))
        r, g, b = lin
        luma = LUMA[0] * r + LUMA[1] * g + LUMA[2] * b
        total = r + g + b
        saturated = (total > 0) & (r >= self.red_saturation * total)
        red = np.maximum(r - g - b, 0.0) * np.float32(320.0)
        return luma, red, saturated

    def _frame(self, luma: np.ndarray, red: np.ndarray, saturated: np.ndarray) -> None:
        self._kinds["general"].step(self.frames, luma, luma < self.dark_luminance)
        self._kinds["red"].step(self.frames, red, saturated)
        self.frames += 1

    # -- verdict -----------------------------------------------------------------------------
    def result(self) -> FlashReport:
        """The report for the frames seen so far (may be called again after more updates)."""
        reasons, failed_at = [], []
        area = f"{self.area_fraction:.0%}"
        for kind, v in ((k, f.verdict) for k, f in self._kinds.items()):
            if v.fail_frame is not None:
                reasons.append(f"{kind} flash: {v.max_level / 2:g} flashes in 1 s over more than {area} of a "
                               f"10-degree field, first at {v.fail_frame / self.fps:.2f} s")
                failed_at.append(v.fail_frame)
        for kind, v in ((k, f.verdict) for k, f in self._kinds.items()):
            if v.extended_frame is not None and self.fail_on_extended:
                lo, hi = v.extended_min / 2, v.max_transitions / 2
                reasons.append(f"extended {kind} flashing: {lo:g} to {hi:g} flashes a second for "
                               f"{v.extended_frames / self.fps:g} s within {v.sustained.maxlen / self.fps:g} s, "
                               f"at {v.extended_frame / self.fps:.2f} s")
                failed_at.append(v.extended_frame)
        return FlashReport(
            passed=not reasons, reason="; ".join(reasons),
            max_general_flashes=self._kinds["general"].verdict.max_level / 2,
            max_red_flashes=self._kinds["red"].verdict.max_level / 2,
            extended_failure=any(f.verdict.extended_frame is not None for f in self._kinds.values()),
            first_failure_s=round(min(failed_at) / self.fps, 4) if failed_at else None,
            frames=self.frames)


def check_frames(frames, fps: float, **thresholds) -> FlashReport:
    """Run the photosensitivity check on a whole clip: uint8 [T, H, W, 3] RGB (numpy or torch).

    `thresholds` are FlashCheck's keyword arguments.
    """
    _, height, width, _ = frames.shape
    check = FlashCheck(fps, int(width), int(height), **thresholds)
    check.update(frames)
    return check.result()
