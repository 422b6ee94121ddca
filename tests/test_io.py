"""vidgen.io: every codec round-trips (decoded frame by frame), writes are atomic, problems are named."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from vidgen.errors import OutputError
from vidgen.io import (CODECS, VideoWriter, check_output, codec_for_path, read_frames, read_video_info,
                       write_sidecar)

W, H, N = 64, 48, 9


def gradient(i: int, width: int = W, height: int = H) -> np.ndarray:
    """A smooth moving gradient: easy to compress, so any colour or ordering bug shows in the error."""
    y, x = np.mgrid[0:height, 0:width]
    frame = np.empty((height, width, 3), np.uint8)
    frame[..., 0] = x * 255 // (width - 1)
    frame[..., 1] = y * 255 // (height - 1)
    frame[..., 2] = 40 + 20 * i
    return frame


def write_clip(path, *, fps=16, **kwargs) -> VideoWriter:
    with VideoWriter(path, fps=fps, width=kwargs.pop("width", W), height=kwargs.pop("height", H),
                     **kwargs) as writer:
        for i in range(N):
            writer.write(gradient(i, writer.width, writer.height))
    return writer


def leftovers(folder) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.startswith("."))


@pytest.mark.parametrize("name, codec, fps", [
    ("clip.mp4", "h264", 16), ("clip.mkv", "h264", 24), ("clip.mov", "h264", 16),
    ("clip.mp4", "h265", 16), ("clip.mkv", "h265", 16), ("clip.mov", "h265", 16), ("clip.webm", "vp9", 16),
    ("clip.mkv", "vp9", 16), ("clip.gif", "gif", 25), ("frames", "png", 16),
])
def test_round_trip(tmp_path, name, codec, fps):
    writer = write_clip(tmp_path / name, fps=fps, codec=codec)
    info = read_video_info(tmp_path / name)
    assert writer.frames_written == info["frames"] == N
    assert (info["width"], info["height"]) == (W, H)
    if codec == "png":
        assert sorted(os.listdir(tmp_path / name))[0] == "frame_00000.png"
        assert info["fps"] is None
    else:
        assert info["fps"] == pytest.approx(fps)
    assert leftovers(tmp_path) == []
    # Every codec should keep a smooth gradient close; GIF pays for its 256-colour palette.
    frames = np.stack(list(read_frames(tmp_path / name))).astype(np.int16)
    expected = np.stack([gradient(i) for i in range(N)]).astype(np.int16)
    assert np.abs(frames - expected).mean() < (6 if codec == "gif" else 3)


def test_h264_crf18_keeps_pixels_and_yuv444p(tmp_path):
    for pix_fmt in ("yuv420p", "yuv444p"):
        path = tmp_path / f"{pix_fmt}.mp4"
        write_clip(path, codec="h264", crf=18, pix_fmt=pix_fmt)
        frames = np.stack(list(read_frames(path))).astype(np.int16)
        expected = np.stack([gradient(i) for i in range(N)]).astype(np.int16)
        assert np.abs(frames - expected).mean() < 2.5, pix_fmt


@pytest.mark.parametrize("name", ["clip.mp4", "clip.mov"])
def test_h265_is_tagged_hvc1_for_quicktime(tmp_path, name):
    import av

    write_clip(tmp_path / name, codec="h265")
    with av.open(str(tmp_path / name)) as container:
        assert container.streams.video[0].codec_context.codec_tag == "hvc1"


def test_odd_size_with_yuv444p_is_allowed(tmp_path):
    write_clip(tmp_path / "odd.mp4", width=65, height=47, pix_fmt="yuv444p")
    info = read_video_info(tmp_path / "odd.mp4")
    assert (info["width"], info["height"], info["frames"]) == (65, 47, N)


def test_metadata_survives(tmp_path):
    meta = {"title": "a fox", "comment": '{"seed": 42}', "description": "wan2.2 t2v"}
    write_clip(tmp_path / "clip.mp4", metadata=meta)
    assert read_video_info(tmp_path / "clip.mp4")["metadata"] == meta
    # Matroska keeps any key but reads it back upper-case; read_video_info lower-cases.
    write_clip(tmp_path / "clip.webm", codec="vp9", metadata={"vidgen_seed": "42", **meta})
    assert read_video_info(tmp_path / "clip.webm")["metadata"] == {"vidgen_seed": "42", **meta}


def test_metadata_the_container_would_drop_is_refused(tmp_path):
    problems = check_output("clip.mp4", "h264", "yuv420p", W, H, metadata={"seed": "1"})
    assert len(problems) == 1 and "['seed']" in problems[0] and "comment" in problems[0]
    assert check_output("clip.gif", "gif", "yuv420p", W, H, metadata={"title": "x"})
    with pytest.raises(OutputError, match="seed"):
        VideoWriter(tmp_path / "clip.mp4", fps=16, width=W, height=H, metadata={"seed": "1"})
    assert os.listdir(tmp_path) == []


def test_check_output():
    assert check_output("clip.mp4", "h264", "yuv420p", W, H) == []
    assert check_output("out/frames/", "auto", "yuv420p", W, H) == []
    assert check_output("clip.webm", "vp9", "yuv420p", 65, 47) == []  # libvpx encodes odd sizes
    assert check_output("clip.mp4", "h264", "yuv420p", 833, 480) == [
        "width 833 is odd; yuv420p needs even width and height — use an even size or pix_fmt=yuv444p"]
    assert len(check_output("clip.mp4", "h265", "yuv420p", 833, 481)) == 2
    assert check_output("clip.mp4", "h264", "yuv444p", 833, 481) == []
    assert "does not match codec vp9" in check_output("clip.mp4", "vp9", "yuv420p", W, H)[0]
    assert "without an extension" in check_output("clip.mp4", "png", "yuv420p", W, H)[0]
    assert "rgb24" in check_output("clip.mp4", "h264", "rgb24", W, H)[0]
    assert check_output("clip.gif", "gif", "rgb24", W, H) == []  # gif/png ignore pix_fmt
    assert "unknown" in check_output("clip.mp4", "av1", "yuv420p", W, H)[0]
    assert "known extensions" in check_output("clip.avi", "auto", "yuv420p", W, H)[0]


def test_codec_for_path():
    assert [codec_for_path(p) for p in ("a.mp4", "a.MKV", "a.mov", "a.webm", "a.gif", "frames",
                                        "frames.v2/", "a.mxf")] == ["h264"] * 3 + ["vp9", "gif", "png", "png", "dnxhr"]
    assert set(CODECS) == {"h264", "h265", "vp9", "gif", "png", "prores", "dnxhr", "exr", "png16"}


@pytest.mark.parametrize("name", ["clip.mp4", "clip.gif", "frames"])
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_exception_leaves_nothing(tmp_path, name, error):
    with pytest.raises(error):
        with VideoWriter(tmp_path / name, fps=25, width=W, height=H, codec="auto") as writer:
            for i in range(60):  # enough for x264 to get past its lookahead and write packets
                writer.write(gradient(i % N))
            assert leftovers(tmp_path) == [writer._tmp.name]
            assert not (tmp_path / name).exists()  # nothing at the final path while writing...
            raise error("stop")
    assert os.listdir(tmp_path) == []  # ...nor after, and the partial output is gone


def test_failed_write_keeps_previous_output(tmp_path):
    for name in ("clip.mp4", "frames"):
        write_clip(tmp_path / name, codec="auto")
        before = read_video_info(tmp_path / name)
        with pytest.raises(ValueError, match=r"\[48, 64, 3\]"):
            with VideoWriter(tmp_path / name, fps=16, width=W, height=H, codec="auto", overwrite=True) as writer:
                writer.write(gradient(0)[:, :, :2])
        assert read_video_info(tmp_path / name) == before
        assert leftovers(tmp_path) == []


def test_png_folder_is_replaced_whole(tmp_path):
    folder = tmp_path / "frames"
    write_clip(folder, codec="png")
    with pytest.raises(OutputError, match="already exists"):         # never without overwrite
        VideoWriter(folder, fps=16, width=W, height=H, codec="png")
    with VideoWriter(folder, fps=16, width=W, height=H, codec="png", overwrite=True) as writer:
        writer.write(gradient(0))
    assert os.listdir(folder) == ["frame_00000.png"]
    assert leftovers(tmp_path) == []


def test_png_folder_with_other_files_is_never_replaced(tmp_path):
    folder = tmp_path / "frames"
    write_clip(folder, codec="png")
    (folder / "notes.txt").write_text("mine")
    before = sorted(os.listdir(folder))
    with pytest.raises(OutputError, match=r"holds more than an earlier render's frames \(notes.txt\)"):
        with VideoWriter(folder, fps=16, width=W, height=H, codec="png", overwrite=True) as writer:
            writer.write(gradient(0))
    assert sorted(os.listdir(folder)) == before and (folder / "notes.txt").read_text() == "mine"
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("name", ["clip.mp4", "frames"])
def test_a_file_that_appears_meanwhile_is_kept(tmp_path, name):
    """Two writers to one path: the second never replaces the first; its clip is kept as NAME-2."""
    first = VideoWriter(tmp_path / name, fps=16, width=W, height=H, codec="auto")
    second = VideoWriter(tmp_path / name, fps=16, width=W, height=H, codec="auto")
    for writer in (first, second):
        writer.write(gradient(0))
    first.close()
    before = read_video_info(tmp_path / name)
    alt = "clip-2.mp4" if name == "clip.mp4" else "frames-2"
    with pytest.raises(OutputError, match=f"appeared while this ran.*kept as .*{alt}"):
        second.close()
    assert read_video_info(tmp_path / name) == before
    assert read_video_info(tmp_path / alt)["frames"] == 1
    assert leftovers(tmp_path) == []


def test_sidecar_is_written_before_the_rename(tmp_path):
    """A sidecar that cannot be written leaves nothing at the output path (defect: disk full after the rename)."""
    def failing():
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputError, match="No space left on device"):
        with VideoWriter(tmp_path / "clip.mp4", fps=16, width=W, height=H, sidecar=failing) as writer:
            writer.write(gradient(0))
    assert os.listdir(tmp_path) == []
    with VideoWriter(tmp_path / "clip.mp4", fps=16, width=W, height=H, sidecar=lambda: {"seed": 1}) as writer:
        writer.write(gradient(0))
    assert sorted(os.listdir(tmp_path)) == ["clip.mp4", "clip.mp4.json"]


def test_frames_are_checked_and_tensors_accepted(tmp_path):
    with VideoWriter(tmp_path / "clip.mp4", fps=16, width=W, height=H) as writer:
        writer.write(torch.from_numpy(gradient(0)))
        with pytest.raises(ValueError, match="float32"):
            writer.write(gradient(1).astype(np.float32))
        with pytest.raises(ValueError, match=r"\[3, 48, 64\]"):
            writer.write(np.ascontiguousarray(gradient(1).transpose(2, 0, 1)))
    assert read_video_info(tmp_path / "clip.mp4")["frames"] == 1


def test_unwritable_folder(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(OutputError, match="not an existing folder"):
        VideoWriter(tmp_path / "missing" / "clip.mp4", fps=16, width=W, height=H)
    for name in ("clip.mp4", "frames"):
        with pytest.raises(OutputError):
            VideoWriter(blocker / name, fps=16, width=W, height=H, codec="auto")
    if os.geteuid() != 0:  # root ignores permission bits
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        with pytest.raises(OutputError, match="cannot write"):
            VideoWriter(locked / "clip.mp4", fps=16, width=W, height=H)


def test_bad_settings_raise_before_any_file(tmp_path):
    for kwargs in ({"width": 65}, {"crf": 60}, {"fps": 0}, {"pix_fmt": "rgb24"}):
        settings = {"fps": 16, "width": W, "height": H, **kwargs}
        with pytest.raises(OutputError, match="cannot write"):
            VideoWriter(tmp_path / "clip.mp4", **settings)
    with pytest.raises(OutputError, match="no frames"):
        with VideoWriter(tmp_path / "clip.mp4", fps=16, width=W, height=H):
            pass
    assert os.listdir(tmp_path) == []


def test_gif_fps_rounding_is_reported(tmp_path, caplog, recwarn):
    """One warning line through vidgen's log (the CLI prints it above its bars), not a Python warning."""
    with caplog.at_level("WARNING", logger="vidgen"):
        write_clip(tmp_path / "clip.gif", fps=16, codec="auto")
    [record] = [r for r in caplog.records if "GIF" in r.getMessage()]
    assert record.levelname == "WARNING" and "fps 16 plays as 16.67" in record.getMessage()
    assert not [w for w in recwarn if "GIF" in str(w.message)]
    assert read_video_info(tmp_path / "clip.gif")["fps"] == pytest.approx(100 / 6)


@pytest.mark.slow
def test_gif_warning_is_one_line_above_the_bars(base_cfg, tmp_path):
    """`vidgen render` with progress bars: the warning is its own `vidgen: warning:` line, not drawn
    into a bar, and no UserWarning text."""
    import json
    import subprocess
    import sys

    cfg = base_cfg(output={"path": str(tmp_path / "clip.gif")}, num_frames=5)
    (tmp_path / "cfg.yaml").write_text(json.dumps(cfg))
    done = subprocess.run([sys.executable, "-m", "vidgen", "render", str(tmp_path / "cfg.yaml")],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr
    segments = [line.split("\r")[-1] for line in done.stderr.split("\n")]      # what each line shows at its end
    warnings = [s for s in segments if "GIF stores" in s]
    assert warnings == ["vidgen: warning: GIF stores frame delays in 1/100 s: fps 8 plays as 8.33; use 10, 20, 25 "
                        "or 50 for exact timing"], done.stderr
    assert "UserWarning" not in done.stderr


def test_write_sidecar(tmp_path):
    out = write_sidecar(tmp_path / "clip.mp4", {"seed": 42, "prompt": "a fox — in snow"})
    assert out == tmp_path / "clip.mp4.json"
    assert '"seed": 42' in out.read_text(encoding="utf-8")
    with pytest.raises(ValueError):
        write_sidecar(tmp_path / "bad.mp4", {"x": float("nan")})
    assert sorted(os.listdir(tmp_path)) == ["clip.mp4.json"]
