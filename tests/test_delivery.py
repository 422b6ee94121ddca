"""Delivery: master codecs read back with their codec, pix_fmt and depth; 10-bit keeps more than 256
levels; image sequences within the stated float error; frame-rate conversion; timecode; refusals
before sampling. (Sound: test_sound.py; timelines: test_timeline.py; credentials: test_provenance.py.)"""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
import yaml
from hostile import assert_refused, untouched
from media import make_track

import vidgen
import vidgen.deliver
import vidgen.pipeline
from vidgen.cli import main
from vidgen.config import RenderConfig
from vidgen.io import VideoWriter, check_output, read_frames, read_video_info
from vidgen.masters import srgb_to_linear
from vidgen.retime import retime, retimed_count

W, H = 256, 128     # DNxHR's smallest frames are 256x120


def gradient(width: int = W, height: int = H) -> np.ndarray:
    """A grey ramp 0..65535 across the frame: uint16 [H, W, 3]."""
    ramp = np.linspace(0, 65535, width).round().astype(np.uint16)
    return np.repeat(np.repeat(ramp[None, :, None], height, 0), 3, 2)


def write(path: Path, frames, **kw) -> Path:
    with VideoWriter(path, fps=kw.pop("fps", 24), width=frames[0].shape[1], height=frames[0].shape[0], **kw) as w:
        for f in frames:
            w.write(f)
    return w.path


@pytest.mark.parametrize("name, codec, profile, expect", [
    ("hq.mov", "prores", None, ("prores", "HQ", "yuv422p10le", 10)),
    ("4444.mov", "prores", "4444", ("prores", "4444", "yuva444p12le", 12)),    # FFmpeg decodes 4444 at 12 bits
    ("lt.mov", "prores", "lt", ("prores", "LT", "yuv422p10le", 10)),
    ("hqx.mov", "dnxhr", None, ("dnxhd", "DNXHR HQX", "yuv422p10le", 10)),
    ("hqx.mxf", "auto", None, ("dnxhd", "DNXHR HQX", "yuv422p10le", 10)),
    ("hq8.mov", "dnxhr", "hq", ("dnxhd", "DNXHR HQ", "yuv422p", 8)),
    ("main10.mp4", "h265", None, ("hevc", "Main 10", "yuv420p10le", 10)),
])
def test_masters_read_back_with_codec_pix_fmt_and_depth(tmp_path, name, codec, profile, expect):
    kw = {"pix_fmt": "yuv420p10le"} if codec == "h265" else {"profile": profile}
    out = write(tmp_path / name, [gradient()] * 3, codec=codec, **kw)
    info = read_video_info(out)
    assert (info["codec"], info["profile"], info["pix_fmt"], info["bits"]) == expect
    assert (info["frames"], info["width"], info["height"], info["fps"]) == (3, W, H, 24)


@pytest.mark.parametrize("codec, kw", [("prores", {}), ("dnxhr", {}), ("h265", {"pix_fmt": "yuv420p10le"})])
def test_a_ten_bit_master_holds_more_than_256_levels_of_a_gradient(tmp_path, codec, kw):
    out = write(tmp_path / "ramp.mov", [gradient(1024, 128)] * 2, codec=codec, **kw)
    row = next(read_frames(out, deep=True))[64, :, 1]
    levels = len(np.unique(row >> 6))       # 10-bit codes
    assert levels > 700, levels             # 1024 columns over a limited-range 10-bit ramp (876 codes)
    eight = next(read_frames(write(tmp_path / "ramp8.mov", [gradient(1024, 128)] * 2, codec="h264", crf=0), deep=True))
    assert len(np.unique(eight[64, :, 1] >> 6)) <= 256         # the 8-bit file cannot


@pytest.mark.parametrize("light", ["decoded", "linear"])
def test_exr_frames_read_back_within_half_float_error(tmp_path, light):
    frames = [gradient(64, 16), np.random.default_rng(0).integers(0, 65536, (16, 64, 3), dtype=np.uint16)]
    out = write(tmp_path / "exr", frames, codec="exr", exr=light)
    assert sorted(p.name for p in out.iterdir()) == ["frame_00000.exr", "frame_00001.exr"]
    for given, back in zip(frames, read_frames(out, deep=True)):
        want = given / 65535.0
        want = srgb_to_linear(want) if light == "linear" else want
        # half float has 11 significant bits: a step of 2^-11 (4.9e-4) just under 1.0, which FFmpeg's
        # encoder truncates to; plus reading back to 16 bits (7.6e-6)
        assert np.abs(back / 65535.0 - want).max() < 2**-11 + 1e-5
    info = read_video_info(out)
    assert (info["codec"], info["frames"], info["bits"]) == ("exr", 2, 16)


def test_png16_frames_are_exact(tmp_path):
    frames = [np.random.default_rng(1).integers(0, 65536, (16, 64, 3), dtype=np.uint16) for _ in range(2)]
    out = write(tmp_path / "png16", frames, codec="png16")
    assert all(np.array_equal(a, b) for a, b in zip(frames, read_frames(out, deep=True)))
    assert read_video_info(out)["pix_fmt"] in ("rgb48be", "rgb48le")


def test_settings_a_master_cannot_take_are_refused(tmp_path):
    assert "256" in check_output("a.mov", "dnxhr", "auto", 128, 128)[0]
    assert "MXF takes 24, 25" in check_output("a.mxf", "dnxhr", "auto", W, H, fps=16)[0]
    assert "timecode" in check_output("a.gif", "gif", "auto", W, H, timecode="01:00:00:00")[0]
    assert "not a prores profile" in check_output("a.mov", "prores", "auto", W, H, profile="hqx")[0]
    assert "takes its pix_fmt from output.profile" in check_output("a.mov", "prores", "yuv420p", W, H)[0]
    assert "has no profiles" in check_output("a.mp4", "h264", "auto", W, H, profile="hq")[0]
    assert "writes a folder of frames" in check_output("a.exr", "exr", "auto", W, H)[0]
    assert check_output("frames", "exr", "auto", W, H) == []


def test_timecode_is_written_into_the_container(tmp_path):
    for name in ("tc.mov", "tc.mp4", "tc.mxf"):
        out = write(tmp_path / name, [gradient()], codec="dnxhr" if name.endswith("mxf") else "auto",
                    timecode="01:00:00:00")
        assert read_video_info(out)["timecode"] == "01:00:00:00", name


# ------------------------------------------------------------------------------- retime

def _steps(n: int) -> list[np.ndarray]:
    return [np.full((2, 2, 3), 10 * i, np.uint8) for i in range(n)]


def test_retime_16_to_24_duplicate_and_blend():
    assert retimed_count(81, 16, 24) == 122 and retimed_count(9, 16, 24) == 14 and retimed_count(81, 16, 25) == 127
    dup = [int(f[0, 0, 0]) for f in retime(_steps(9), 9, 16, 24, "duplicate")]
    assert dup == [0, 0, 10, 20, 20, 30, 40, 40, 50, 60, 60, 70, 80, 80]        # a 2:1 cadence, the last held
    blend = [int(f[0, 0, 0]) for f in retime(_steps(9), 9, 16, 24, "blend")]
    assert blend == [0, 7, 13, 20, 27, 33, 40, 47, 53, 60, 67, 73, 80, 80]       # p = j*2/3: 10*p rounded
    deep = list(retime([f.astype(np.uint16) * 257 for f in _steps(3)], 3, 16, 24, "blend"))
    assert deep[1].dtype == np.uint16 and int(deep[1][0, 0, 0]) == round(2 / 3 * 2570)


def test_interpolate_is_refused_naming_what_it_needs():
    cfg = RenderConfig(prompt="x")
    cfg.output.retime.method = "interpolate"
    assert any("needs output.retime.weights: a local RIFE-family .safetensors" in p for p in cfg.problems())
    cfg.output.timecode = "01:00:00:20"
    assert any("frame 20 does not exist at 16 fps" in p for p in cfg.problems())


# ------------------------------------------------------------------------------- renders

def test_a_prores_render_reaches_the_encoder_at_16_bits(base_cfg, monkeypatch, tmp_path):
    seen = []
    real = vidgen.deliver.VideoWriter.write
    monkeypatch.setattr(vidgen.deliver.VideoWriter, "write", lambda self, f: (seen.append(np.array(f)), real(self, f)))
    cfg = base_cfg(output={"path": str(tmp_path / "out" / "clip.mov"), "codec": "prores"})
    result = vidgen.render(cfg)
    assert all(f.dtype == np.uint16 for f in seen) and len(seen) == 9
    assert any((f % 257).any() for f in seen)       # not 8-bit codes scaled up: no 8-bit step on the way
    info = read_video_info(result.path)
    assert (info["codec"], info["pix_fmt"], info["frames"]) == ("prores", "yuv422p10le", 9)


def test_a_render_retimed_16_to_24_has_the_frames_and_timestamps(base_cfg, tmp_path):
    cfg = base_cfg(fps=16, output={"fps": 24, "retime": {"method": "blend"}, "timecode": "00:59:59:00"})
    result = vidgen.render(cfg)
    with av.open(str(result.path)) as c:
        stream = c.streams.video[0]
        times = [float(f.pts * f.time_base) for f in c.decode(stream)]
    assert len(times) == 14 == retimed_count(9, 16, 24)
    assert times == pytest.approx([j / 24 for j in range(14)], abs=1e-6)
    assert read_video_info(result.path)["timecode"] == "00:59:59:00"
    assert (result.fps, result.num_frames) == (24, 14)      # delivered; the sidecar says what was rendered too
    side = __import__("json").loads(Path(str(result.path) + ".json").read_text())
    assert side["fps"] == 24 and side["rendered"] == {"num_frames": 9, "fps": 16, "retime": "blend",
                                                      "delivered_frames": 14}


def test_a_missing_encoder_is_refused_before_sampling(base_cfg, tmp_path, monkeypatch, capsys):
    real = av.codec.Codec

    def no_prores(name, mode="r"):
        if name == "prores_ks":
            raise av.codec.codec.UnknownCodecError(name)
        return real(name, mode)
    monkeypatch.setattr(av.codec, "Codec", no_prores)
    monkeypatch.setattr(vidgen.pipeline, "load_components", lambda *a, **k: pytest.fail("weights were loaded"))
    cfg = base_cfg(output={"path": str(tmp_path / "out" / "clip.mov"), "codec": "prores"})
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with untouched(tmp_path):
        code = main(["render", str(path), "-q"])
    assert_refused(code, capsys.readouterr().err, "no prores_ks encoder", "output.codec")


# ------------------------------------------------------------------------------- sound on a render

def _durations(path: Path) -> tuple[float, float]:
    """(video, audio) seconds, from the decoded frames' and samples' timestamps."""
    with av.open(str(path)) as c:
        v = [f for f in c.decode(video=0)]
        video = float(v[-1].pts * v[-1].time_base) + 1 / float(c.streams.video[0].average_rate)
    with av.open(str(path)) as c:
        a = list(c.decode(audio=0))
        audio = float(a[-1].pts * a[-1].time_base) + a[-1].samples / a[-1].sample_rate
    return video, audio


@pytest.mark.parametrize("name", ["clip.mp4", "clip.mov"])
def test_a_render_with_sound_lasts_as_long_as_its_video(base_cfg, tmp_path, caplog, name):
    track = make_track(tmp_path / "track.wav", 3.0)
    cfg = base_cfg(audio={"path": str(track), "offset": 0.5}, output={"path": str(tmp_path / "out" / name),
                                                                     "codec": "prores" if name.endswith("mov") else "auto"})
    with caplog.at_level("WARNING", logger="vidgen"):
        result = vidgen.render(cfg)
    video, audio = _durations(result.path)
    assert video == pytest.approx(9 / 8)
    assert abs(audio - video) <= 1 / 8, (video, audio)          # within one frame
    assert any("cut" in r.getMessage() for r in caplog.records)   # 3 s - 0.5 s for 1.125 s: said, not silent
    with av.open(str(result.path)) as c:
        assert c.streams.audio[0].codec_context.name == ("pcm_s16le" if name.endswith("mov") else "aac")


def test_sound_refusals_come_before_any_weights(base_cfg, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(vidgen.pipeline, "load_components", lambda *a, **k: pytest.fail("weights were loaded"))
    track = make_track(tmp_path / "track.wav", 3.0)
    for extra, needle in (({"audio": {"path": str(track), "fit": "pad"}}, "audio:"),
                          ({"audio": {"path": str(track)}, "output": {"path": str(tmp_path / "out" / "c.gif")}},
                           "audio:")):
        path = tmp_path / "cfg.yaml"
        path.write_text(yaml.safe_dump(base_cfg(**extra)))
        with untouched(tmp_path):
            code = main(["render", str(path), "-q"])
        assert_refused(code, capsys.readouterr().err, needle)


def test_a_master_stitch_keeps_ten_bits_through_the_crossfade(tmp_path):
    from vidgen.queue.steps import run_stitch

    shots = [str(write(tmp_path / f"s{n}.mov", [gradient(512, 128)] * 4, codec="prores")) for n in range(2)]
    film = run_stitch({"inputs": shots, "output": str(tmp_path / "film.mov"), "fps": 24, "crossfade": 2 / 24,
                       "codec": "prores", "pix_fmt": "auto"})
    info = read_video_info(film)
    assert (info["codec"], info["pix_fmt"], info["frames"]) == ("prores", "yuv422p10le", 6)
    frames = list(read_frames(film, deep=True))
    assert all(len(np.unique(f[64, :, 1] >> 6)) > 400 for f in frames)      # 10-bit levels, blended ones too


def test_a_two_frame_hevc_always_muxes(tmp_path):
    """libx265 sometimes flushes a two-frame clip's keyframe with an uninitialised dts, which the MP4 and
    QuickTime muxers refuse: without io._sane_dts one write in four failed, so 12 pass by chance 3% of the time."""
    frame = gradient(512, 64)
    for n in range(12):
        out = write(tmp_path / f"two{n}.mov", [frame, frame], codec="h265", pix_fmt="yuv420p10le")
        assert read_video_info(out)["frames"] == 2
