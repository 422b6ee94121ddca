"""vidgen.animate_inputs: Wan2.2-Animate's user-made inputs checked before weights load, every problem at once."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from PIL import Image

from vidgen.animate_inputs import check_inputs, read_inputs, scan_clip
from vidgen.io import VideoWriter

W, H, FACE, N, FPS = 64, 48, 32, 9, 16


def clip(path, frames, fps=FPS):
    """Write uint8 [H, W, 3] frames as an H.264 file (crf 18) or, for a path without suffix, PNG frames."""
    h, w = frames[0].shape[:2]
    with VideoWriter(path, fps=fps, width=w, height=h, codec="h264" if str(path).endswith(".mp4") else "png") as writer:
        for f in frames:
            writer.write(f)
    return str(path)


def pose(n=N, w=W, h=H):
    """A stick that moves: a bright line on black, as a skeleton render is."""
    out = []
    for i in range(n):
        f = np.zeros((h, w, 3), np.uint8)
        f[h // 4: 3 * h // 4, 10 + 3 * i: 14 + 3 * i] = (255, 128, 0)
        out.append(f)
    return out


def face(n=N, size=FACE):
    return [np.full((size, size, 3), 90 + 10 * i, np.uint8) for i in range(n)]


def mask(n=N, w=W, h=H, soft=False):
    yy, xx = np.mgrid[:h, :w]
    out = []
    for i in range(n):
        m = (((xx - 20 - 2 * i) / 12.0) ** 2 + ((yy - h / 2) / 16.0) ** 2 < 1).astype(np.float32)
        if soft:
            m = np.clip(1.2 - np.sqrt(((xx - 20 - 2 * i) / 12.0) ** 2 + ((yy - h / 2) / 16.0) ** 2), 0, 1)
        out.append(np.repeat((m * 255).round().astype(np.uint8)[..., None], 3, axis=-1))
    return out


def background(n=N, w=W, h=H):
    return [np.full((h, w, 3), (30, 120 + i, 60), np.uint8) for i in range(n)]


@pytest.fixture
def good(tmp_path):
    """A replace-mode set that passes: pose, face (32x32), background, mask, reference image."""
    ref = tmp_path / "ref.png"
    Image.new("RGB", (W, H), (200, 100, 50)).save(ref)
    return dict(pose_video=clip(tmp_path / "pose.mp4", pose()), face_video=clip(tmp_path / "face.mp4", face()),
                background_video=clip(tmp_path / "bg.mp4", background()),
                mask_video=clip(tmp_path / "mask.mp4", mask()), image=str(ref))


def check(**kw):
    args = dict(mode="replace", width=W, height=H, face_size=FACE, fps=FPS)
    return check_inputs(**{**args, **kw})


def test_good_replace_set_passes(good):
    assert check(**good) == []


def test_good_animate_set_passes_png_folders(tmp_path):
    assert check(mode="animate", pose_video=clip(tmp_path / "pose", pose()),
                 face_video=clip(tmp_path / "face", face())) == []


def test_missing_and_unreadable(tmp_path, good):
    (tmp_path / "junk.mp4").write_bytes(b"not a video")
    problems = check(**{**good, "pose_video": str(tmp_path / "nope.mp4"), "face_video": str(tmp_path / "junk.mp4")})
    assert len(problems) == 2
    assert problems[0].startswith("animate.pose_video:") and "does not exist" in problems[0]
    assert problems[1].startswith("animate.face_video: cannot read")


def test_empty_png_folder_has_no_frames(tmp_path, good):
    (tmp_path / "empty").mkdir()
    problems = check(**{**good, "face_video": str(tmp_path / "empty")})
    assert problems == [f"animate.face_video: {str(tmp_path / 'empty')!r} holds no frames; "
                        "give a clip with at least one frame"]


def test_frame_counts_disagree(tmp_path, good):
    problems = check(**{**good, "face_video": clip(tmp_path / "f7.mp4", face(7)),
                        "mask_video": clip(tmp_path / "m8.mp4", mask(8))})
    assert problems == [f"animate.face_video: 7 frames, animate.pose_video has {N}; every driving video must have "
                        "the same frames, one per output frame",
                        f"animate.mask_video: 8 frames, animate.pose_video has {N}; every driving video must have "
                        "the same frames, one per output frame"]


def test_face_video_wrong_size(tmp_path, good):
    problems = check(**{**good, "face_video": clip(tmp_path / "f.mp4", [f[:, :, :] for f in pose()])})
    assert len(problems) == 1
    assert problems[0].startswith(f"animate.face_video: frames are {W}x{H}; face crops must be {FACE}x{FACE}")


def test_pose_of_another_aspect_is_refused_same_aspect_resized(tmp_path, good, caplog):
    problems = check(**{**good, "pose_video": clip(tmp_path / "p.mp4", pose(w=48, h=48))})
    assert len(problems) == 1 and problems[0].startswith("animate.pose_video: frames are 48x48 (aspect 1.000)")
    with caplog.at_level(logging.WARNING, logger="vidgen"):
        assert check(**{**good, "pose_video": clip(tmp_path / "p2.mp4", pose(w=128, h=96))}) == []
    assert "animate.pose_video: 128x96 frames are resized to 64x48" in caplog.text


def test_frames_of_two_sizes(tmp_path, good):
    folder = tmp_path / "mixed"
    folder.mkdir()
    for i, f in enumerate(pose()):
        Image.fromarray(f if i != 3 else f[:, :32]).save(folder / f"{i:03d}.png")
    problems = check(**{**good, "pose_video": str(folder)})
    assert problems == ["animate.pose_video: frame 3 is 32x48, the first is 64x48; every frame must have one size"]


def test_soft_mask_is_not_binary_compressed_binary_mask_is(tmp_path, good):
    assert scan_clip(good["mask_video"], "m", mask=True).grey[1] <= 0.01       # H.264's ringing lets it pass
    problems = check(**{**good, "mask_video": clip(tmp_path / "soft.mp4", mask(soft=True))})
    assert len(problems) == 1 and problems[0].startswith("animate.mask_video: not binary: ")
    grey = [np.full((H, W, 3), 128, np.uint8)] * N
    assert check(**{**good, "mask_video": clip(tmp_path / "grey", grey)})[0].startswith(
        "animate.mask_video: not binary: 100.0% of frame 0's pixels are grey")


def test_replace_needs_background_and_mask(good):
    problems = check(**{**good, "background_video": None, "mask_video": ""})
    assert [p.split(":")[0] for p in problems] == ["animate.background_video", "animate.mask_video"]
    assert all("mode 'replace' needs it" in p for p in problems)


def test_animate_refuses_background_and_mask(good):
    problems = check(mode="animate", **good)
    assert [p.split(":")[0] for p in problems] == ["animate.background_video", "animate.mask_video"]
    assert all("would ignore it" in p for p in problems)


def test_other_fps_is_noted(tmp_path, good, caplog):
    with caplog.at_level(logging.WARNING, logger="vidgen"):
        assert check(**{**good, "pose_video": clip(tmp_path / "p30.mp4", pose(), fps=30)}) == []
    assert "animate.pose_video: 30 fps, the render writes 16 fps" in caplog.text


def test_segment_rule(good):
    assert check(**good, segment_frames=77, overlap_frames=1) == []
    problems = check(**good, segment_frames=8, overlap_frames=3)
    assert [p.split(":")[0] for p in problems] == ["animate.segment_frames", "animate.overlap_frames"]


def test_every_problem_at_once(tmp_path, good):
    problems = check_inputs(mode="replace", width=W, height=H, face_size=FACE, fps=FPS, image=str(tmp_path / "x.png"),
                            pose_video=good["pose_video"],
                            face_video=clip(tmp_path / "f.mp4", face(N - 1, size=FACE * 2)),
                            background_video=clip(tmp_path / "bg48.mp4", background(w=48, h=48)),
                            mask_video=clip(tmp_path / "soft.mp4", mask(soft=True)))
    keys = [p.split(":")[0] for p in problems]
    assert keys == ["animate.face_video", "animate.background_video", "animate.mask_video", "animate.face_video",
                    "image"], problems
    assert "face crops must be" in problems[0] and "stretched" in problems[1] and "not binary" in problems[2]
    assert "frames, animate.pose_video has" in problems[3] and "does not exist" in problems[4]


def test_read_inputs_gives_pil_frames(good):
    got = read_inputs(mode="replace", **good)
    assert len(got.pose_video) == len(got.face_video) == len(got.background_video) == len(got.mask_video) == N
    assert got.pose_video[0].size == (W, H) and got.face_video[0].size == (FACE, FACE)
    assert got.image.size == (W, H) and got.image.mode == "RGB"
    assert read_inputs(mode="animate", **good).mask_video is None
