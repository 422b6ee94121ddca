"""Photosensitivity check (vidgen.guard.flash) on small synthetic clips with known flash rates."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vidgen.errors import ConfigError
from vidgen.guard.flash import FlashCheck, FlashReport, check_frames, srgb_to_linear_lut


def square_wave(n: int, fps: float, hz: float) -> np.ndarray:
    """[n] bool: on for the first half of each period of a hz flash, sampled at fps."""
    t = np.arange(n) / fps
    return (t * hz) % 1.0 < 0.5


def clip(on: np.ndarray, size=(64, 64), high=(255, 255, 255), low=(0, 0, 0), mask=None) -> np.ndarray:
    """uint8 [T, H, W, 3]: pixels in mask (all by default) show high when on[t], else low."""
    h, w = size
    frames = np.empty((len(on), h, w, 3), np.uint8)
    frames[:] = np.asarray(low, np.uint8)
    mask = np.ones((h, w), bool) if mask is None else mask
    for t in np.flatnonzero(on):
        frames[t][mask] = high
    return frames


def test_lut_follows_wcag_linearisation():
    lut = srgb_to_linear_lut()
    assert lut[0] == 0 and lut[255] == pytest.approx(1.0)
    assert lut[10] == pytest.approx(10 / 255 / 12.92)
    assert lut[128] == pytest.approx(((128 / 255 + 0.055) / 1.055) ** 2.4, rel=1e-6)


def test_1hz_full_frame_passes():
    report = check_frames(clip(square_wave(72, 24, 1.0)), fps=24)
    assert report.passed and report.reason == ""
    assert report.max_general_flashes == 1.0 and not report.extended_failure
    assert report.first_failure_s is None and report.frames == 72


def test_4hz_full_frame_fails_as_general_flash():
    report = check_frames(clip(square_wave(72, 24, 4.0)), fps=24)
    assert not report.passed
    assert report.max_general_flashes == 4.0 and report.max_red_flashes == 0
    assert report.reason.startswith("general flash: 4 flashes in 1 s")
    # transitions every 3 frames from frame 3: the 7th (more than 3 flashes) is at frame 21
    assert report.first_failure_s == pytest.approx(21 / 24)


@pytest.mark.parametrize("high, low", [((150, 0, 0), (0, 0, 0)),       # red / black: Y changes 0.065
                                       ((160, 0, 0), (100, 0, 0))])    # bright / dark red: 0.048
def test_4hz_saturated_red_fails_as_red_flash(high, low):
    lut = srgb_to_linear_lut()
    assert 0.2126 * (lut[high[0]] - lut[low[0]]) < 0.1          # the general rule alone would pass
    report = check_frames(clip(square_wave(72, 24, 4.0), high=high, low=low), fps=24)
    assert not report.passed
    assert report.max_general_flashes == 0 and report.max_red_flashes == 4.0
    assert report.reason.startswith("red flash:")


def test_bright_flash_above_dark_limit_is_not_a_general_flash():
    # 0.85 <-> 1.0 relative luminance: the darker state is not below 0.8
    report = check_frames(clip(square_wave(48, 24, 4.0), high=(255, 255, 255), low=(237, 237, 237)), fps=24)
    assert report.passed and report.max_general_flashes == 0


def rows(size, period: int, lit: int) -> np.ndarray:
    mask = np.zeros(size, bool)
    for r in range(lit):
        mask[r::period] = True
    return mask


@pytest.mark.parametrize("period, lit, passes", [(5, 1, True), (10, 3, False)])
def test_8hz_flash_over_20_percent_passes_30_percent_fails(period, lit, passes):
    # rows spread evenly: every 10-degree field (40x40 px of this 120x120 clip) holds exactly the
    # frame's share of flashing pixels
    size = (120, 120)
    mask = rows(size, period, lit)
    assert mask.mean() == pytest.approx(0.2 if passes else 0.3)
    report = check_frames(clip(square_wave(48, 16, 8.0), size=size, mask=mask), fps=16)
    assert report.passed is passes
    if passes:
        assert report.max_general_flashes == 0
    else:
        assert report.max_general_flashes == 8.0


def test_area_is_measured_per_10_degree_field_not_per_frame():
    # a 32x32 square is 11% of the frame but fills a whole field: fails; a 14x14 one is 19% of a field
    size = (96, 96)
    for side, passes in ((32, False), (14, True)):
        mask = np.zeros(size, bool)
        mask[40:40 + side, 20:20 + side] = True
        report = check_frames(clip(square_wave(32, 16, 8.0), size=size, mask=mask), fps=16)
        assert report.passed is passes, side


def test_flash_with_ragged_edges_counts_once():
    # a random half of the pixels switches a frame late: still 4 flashes a second, not 8
    rng = np.random.default_rng(3)
    on = square_wave(72, 24, 4.0)
    late = rng.random((64, 64)) < 0.5
    frames = clip(on)
    frames[1:, late] = frames[:-1, late]                     # the right side is a copy
    report = check_frames(frames, fps=24)
    assert not report.passed and report.max_general_flashes == 4.0


def smooth_texture(rng, h: int, w: int, feature: int) -> np.ndarray:
    """uint8 [h, w, 3] grey texture with blobs about `feature` px across, std ~70 codes."""
    coarse = rng.random((h // feature + 2, w // feature + 2))
    y, x = np.mgrid[:h, :w] / feature
    y0, x0 = y.astype(int), x.astype(int)
    fy, fx = y - y0, x - x0                                       # bilinear upsampling
    v = (coarse[y0, x0] * (1 - fy) * (1 - fx) + coarse[y0 + 1, x0] * fy * (1 - fx)
         + coarse[y0, x0 + 1] * (1 - fy) * fx + coarse[y0 + 1, x0 + 1] * fy * fx)
    v = (v - v.mean()) / v.std() * 70 + 128
    return np.repeat(np.clip(v, 0, 255).astype(np.uint8)[..., None], 3, axis=2)


@pytest.mark.parametrize("speed", [2, 8])
def test_camera_pan_over_texture_passes(speed):
    # every pixel flickers as the texture (blobs ~1.4 degrees across) slides by at up to 1.5 frame
    # widths a second, but neighbourhoods do not brighten together; counting each pixel's own
    # flashes failed both
    rng = np.random.default_rng(4)
    texture = smooth_texture(rng, 96, 128 + 48 * speed, feature=6)
    frames = np.stack([texture[:, i * speed:i * speed + 128] for i in range(48)])
    report = check_frames(frames, fps=24)
    assert report.passed and report.max_general_flashes < 3


@pytest.mark.parametrize("square, passes", [(1, True), (24, False)])
def test_reversing_checkerboard(square, passes):
    # squares far below 1 degree balance out (WCAG's fine-pattern exception); 24 px (~2.5 degrees
    # here) flash as areas, though the frame's mean luminance never changes
    y, x = np.mgrid[:96, :96]
    board = ((y // square + x // square) % 2).astype(bool)
    on = square_wave(32, 16, 4.0)
    frames = np.zeros((32, 96, 96, 3), np.uint8)
    frames[(board[None] ^ on[:, None, None])] = 255
    report = check_frames(frames, fps=16)
    assert report.passed is passes
    assert report.max_general_flashes == (0 if passes else 4.0)


def test_chunked_input_gives_the_same_report():
    rng = np.random.default_rng(0)
    size = (48, 64)
    mask = np.zeros(size, bool)
    mask[:, :40] = True
    frames = clip(square_wave(75, 25, 4.0), size=size, mask=mask)
    noise = rng.integers(-6, 7, frames.shape)
    frames = np.clip(frames.astype(int) + noise + 60, 0, 255).astype(np.uint8)
    frames[30:, 10:20, :, 1:] = 0                                 # a red bar that appears, then stays
    whole = check_frames(frames, fps=25)
    assert not whole.passed
    for sizes in ([1] * 75, [7, 1, 30, 37], [74, 1]):
        check = FlashCheck(25, 64, 48)
        start = 0
        for n in sizes:
            check.update(torch.from_numpy(frames[start:start + n]) if n % 2 else frames[start:start + n])
            start += n
        assert check.result() == whole


def test_chunking_is_exact_with_pooling():
    # 640 px wide: 0.1 degree is 2.1 px, so the analysis averages 1x2 blocks (300 rows: 1 px)
    rng = np.random.default_rng(1)
    frames = np.repeat(rng.integers(0, 200, (1, 300, 640, 3), dtype=np.uint8), 24, axis=0)
    frames[square_wave(24, 24, 4.0), :, :320] += 55                # the left half flashes
    check = FlashCheck(24, 640, 300)
    assert check.block == (1, 2)
    whole = check_frames(frames, fps=24)
    assert whole.max_general_flashes > 0
    for n in (5, 19):
        check.update(frames[:n] if n == 5 else frames[5:])
    assert check.result() == whole


def test_static_and_slow_clips_pass():
    rng = np.random.default_rng(2)
    still = np.repeat(rng.integers(0, 256, (1, 64, 64, 3), dtype=np.uint8), 48, axis=0)
    assert check_frames(still, fps=24).passed
    # black -> white -> black over 3 s: two transitions in all
    level = np.round(255 * (1 - np.abs(np.linspace(-1, 1, 72)))).astype(np.uint8)
    fade = np.broadcast_to(level[:, None, None, None], (72, 64, 64, 3)).copy()
    report = check_frames(fade, fps=24)
    assert report.passed and report.max_general_flashes == 0.5
    # grey with +-6 codes of noise every frame: swings never reach 0.1, nothing flashes
    grey = np.clip(128 + rng.integers(-6, 7, (48, 64, 64, 3)), 0, 255).astype(np.uint8)
    report = check_frames(grey, fps=24)
    assert report.passed and report.max_general_flashes == 0


def test_extended_failure_for_sustained_3hz():
    # 3 Hz is 6 transitions a second: within the limit, but 4 s of it within 5 s is extended failure
    short = check_frames(clip(square_wave(72, 24, 3.0), size=(32, 32)), fps=24)
    assert short.passed and short.max_general_flashes == 3.0 and not short.extended_failure
    long = check_frames(clip(square_wave(120, 24, 3.0), size=(32, 32)), fps=24)
    assert not long.passed and long.extended_failure and long.max_general_flashes == 3.0
    assert long.reason.startswith("extended general flashing")
    assert 4.0 < long.first_failure_s < 5.0
    lenient = check_frames(clip(square_wave(120, 24, 3.0), size=(32, 32)), fps=24, fail_on_extended=False)
    assert lenient.passed and lenient.extended_failure


def test_report_and_arguments():
    report = check_frames(torch.from_numpy(clip(square_wave(48, 24, 4.0))), fps=24)
    d = report.to_dict()
    assert isinstance(report, FlashReport) and d["passed"] is False and set(d) >= {
        "reason", "max_general_flashes", "max_red_flashes", "extended_failure", "first_failure_s"}
    with pytest.raises(ConfigError) as e:
        FlashCheck(0, -1, 64, area_fraction=2.0)
    assert len(e.value.problems) == 3
    with pytest.raises(ValueError):
        FlashCheck(24, 64, 64).update(np.zeros((2, 64, 32, 3), np.uint8))
