"""Sound under a finished video (vidgen.sound): the video stream is copied bit for bit, the sound lasts
as long as the video within one frame (measured through the container and by decoding), a click in
the track lands on the film sample its offset says (AAC's encoder delay included), padding and
cutting are logged and recorded, and every refusal is one line before anything is written."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import av
import numpy as np
import pytest
from media import make_track

from vidgen import sound
from vidgen.errors import InputError, OutputError
from vidgen.io import VideoWriter

FPS, FRAMES, RATE = 8, 17, 48000
SECONDS = FRAMES / FPS          # 2.125 s: 102000 samples


def make_video(path: Path, frames: int = FRAMES, fps: int = FPS, **options) -> Path:
    with VideoWriter(path, fps=fps, width=32, height=32, codec="auto", **options) as writer:
        for i in range(frames):
            writer.write(np.full((32, 32, 3), (i * 13) % 256, np.uint8))
    return path


def decoded(path: Path) -> np.ndarray:
    """The file's sound as float [channels, samples], as a player decodes it (priming skipped)."""
    with av.open(str(path)) as container:
        blocks = []
        for frame in container.decode(audio=0):
            data = frame.to_ndarray().astype(np.float64)
            blocks.append(data if frame.format.is_planar else data.reshape(-1, frame.layout.nb_channels).T)
    return np.concatenate(blocks, axis=1)


def audio_seconds(path: Path) -> float:
    """How long the container says the sound lasts: the stream's duration, else (Matroska) the end of
    its last packet, as a player times it."""
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        if stream.duration:
            return float(stream.duration * stream.time_base)
        return max(float((p.pts + p.duration) * p.time_base) for p in container.demux(stream) if p.size)


def clicks_at(samples: np.ndarray, near: list[int], reach: int = 300) -> list[int]:
    """Where each click is, found as the loudest sample within `reach` of where it should be."""
    return [start + int(np.argmax(np.abs(samples[0, start:n + reach])))
            for n in near for start in [max(0, n - reach)]]


def video_packets(path: Path) -> list[bytes]:
    with av.open(str(path)) as container:
        return [bytes(p) for p in container.demux(video=0) if p.size]


@pytest.fixture
def track(tmp_path):
    return make_track(tmp_path / "track.wav", 3.0, clicks=(0.5, 1.0, 1.75, 2.5))


# ------------------------------------------------------------------------------- sync and length


@pytest.mark.parametrize("ext, codec", [(".mp4", "aac"), (".mkv", "aac"), (".mov", "pcm_s16le"), (".webm", "libopus")])
@pytest.mark.parametrize("offset", [0.25, -0.5])
def test_clicks_land_on_their_film_sample_and_the_sound_lasts_as_long_as_the_video(tmp_path, track, ext, codec, offset):
    video = make_video(tmp_path / f"v{ext}")
    out = tmp_path / f"o{ext}"
    report = sound.mux(video, out, track=track, offset=offset)
    assert report.codec == codec and report.sample_rate == RATE and report.channels == 2
    assert report.samples == round(SECONDS * RATE) == 102000
    # film sample = (track time - offset) * 48000, for every click inside the film
    wanted = [round((t - offset) * RATE) for t in (0.5, 1.0, 1.75, 2.5) if 0 <= t - offset < SECONDS]
    got = clicks_at(decoded(out), wanted)
    assert max(abs(g - w) for g, w in zip(got, wanted)) <= (0 if codec == "pcm_s16le" else 1), (got, wanted)
    # as long as the video within one frame: through the container, and as decoded
    assert abs(audio_seconds(out) - SECONDS) < 1 / FPS
    assert abs(decoded(out).shape[1] / RATE - SECONDS) < 1 / FPS
    assert video_packets(out) == video_packets(video)      # the video stream copied, not re-encoded


def test_measured_figures(tmp_path, track):
    """The figures docs/queue.md quotes: AAC in .mp4 lasts exactly the video in the container (the
    encoder's last frame is trimmed by the edit list) and decodes 400 samples longer (its last frame
    whole); PCM is sample-exact."""
    video = make_video(tmp_path / "v.mp4")
    sound.mux(video, tmp_path / "o.mp4", track=track)
    assert audio_seconds(tmp_path / "o.mp4") == SECONDS
    assert decoded(tmp_path / "o.mp4").shape[1] - 102000 == 400
    video = make_video(tmp_path / "v.mov")
    sound.mux(video, tmp_path / "o.mov", track=track)
    assert audio_seconds(tmp_path / "o.mov") == SECONDS and decoded(tmp_path / "o.mov").shape[1] == 102000


def test_a_44k_mono_track_is_resampled_and_stays_mono(tmp_path):
    track = make_track(tmp_path / "mono.wav", 2.125, rate=44100, channels=1, clicks=(1.0,))
    out = tmp_path / "o.mp4"
    report = sound.mux(make_video(tmp_path / "v.mp4"), out, track=track)
    assert report.channels == 1 and report.padded == 0 and report.cut == 0
    samples = decoded(out)
    assert samples.shape[0] == 1
    assert abs(clicks_at(samples, [48000])[0] - 48000) <= 1


def test_metadata_and_timecode_are_kept(tmp_path, track):
    video = make_video(tmp_path / "v.mov", fps=24, timecode="01:00:00:00", metadata={"title": "a fox", "comment": "seed 3"})
    out = tmp_path / "o.mov"
    sound.mux(video, out, track=track)
    with av.open(str(out)) as container:
        assert container.metadata["title"] == "a fox" and container.metadata["comment"] == "seed 3"
        assert container.streams.video[0].metadata.get("timecode") == "01:00:00:00"     # the tmcd track made again


# ------------------------------------------------------------------------------- fit


def test_fit_both_pads_a_short_track_and_says_so(tmp_path, caplog):
    short = make_track(tmp_path / "short.wav", 1.5, clicks=(1.0,))
    out = tmp_path / "o.mp4"
    with caplog.at_level(logging.WARNING, logger="vidgen"):
        report = sound.mux(make_video(tmp_path / "v.mp4"), out, track=short, offset=-0.25)
    assert report.lead == 12000 and report.padded == 102000 - 12000 - 72000 and report.cut == 0
    [line] = [r.getMessage() for r in caplog.records]
    assert line == "sound: short.wav ends 0.375 s before the video does: 0.375 s of silence added at the end (fit: both)"
    samples = decoded(out)
    assert abs(clicks_at(samples, [60000])[0] - 60000) <= 1
    assert np.abs(samples[:, 85000:102000]).max() < 1e-3        # silence after the track's end


def test_fit_both_cuts_a_long_track_and_says_so(tmp_path, track, caplog):
    with caplog.at_level(logging.WARNING, logger="vidgen"):
        report = sound.mux(make_video(tmp_path / "v.mp4"), tmp_path / "o.mp4", track=track, offset=0.5)
    assert report.skip == 24000 and report.cut == 144000 - 24000 - 102000 and report.padded == 0
    assert [r.getMessage() for r in caplog.records] == [
        "sound: track.wav runs 0.375 s past the video's end: cut there (fit: both)"]


def test_a_track_as_long_as_the_video_is_neither_padded_nor_cut(tmp_path, caplog):
    exact = make_track(tmp_path / "exact.wav", SECONDS, rate=44100)
    with caplog.at_level(logging.WARNING, logger="vidgen"):
        report = sound.mux(make_video(tmp_path / "v.mp4"), tmp_path / "o.mp4", track=exact, fit="exact")
    assert report.padded <= sound.SLACK and report.cut == 0 and not caplog.records


@pytest.mark.parametrize("fit, seconds, offset, message", [
    ("pad", 3.0, 0.0, "track.wav runs 0.875 s past the video's end and fit: pad never cuts"),
    ("cut", 2.0, 0.0, "track.wav ends 0.125 s before the video does and fit: cut never pads"),
    ("cut", 3.0, 1.0, "track.wav ends 0.125 s before the video does and fit: cut never pads"),
    ("exact", 2.4, 0.0, "track.wav runs 0.275 s past the video's end; fit: exact allows one frame (0.125 s)"),
])
def test_fit_refusals_leave_nothing(tmp_path, fit, seconds, offset, message):
    track = make_track(tmp_path / "track.wav", seconds)
    out = tmp_path / "o.mp4"
    with pytest.raises(InputError, match=re.escape(message)) as e:
        sound.mux(make_video(tmp_path / "v.mp4"), out, track=track, offset=offset, fit=fit)
    assert "\n" not in str(e.value) and not out.exists()


def test_exact_allows_up_to_one_frame(tmp_path):
    track = make_track(tmp_path / "track.wav", SECONDS + 0.1)
    report = sound.mux(make_video(tmp_path / "v.mp4"), tmp_path / "o.mp4", track=track, fit="exact")
    assert report.cut == 4800


# ------------------------------------------------------------------------------- refusals


def test_check_lists_every_problem(tmp_path):
    video_only = make_video(tmp_path / "v.mp4")
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"not audio at all")
    assert sound.check(tmp_path / "missing.wav") == [f"audio track {str(tmp_path / 'missing.wav')!r} does not exist"]
    assert sound.check(video_only) == [f"audio track {str(video_only)!r} holds no audio stream"]
    assert sound.check(junk)[0].startswith(f"cannot read audio track {str(junk)!r}")
    assert sound.check(tmp_path, container_ext=".mp4") == [f"audio track {str(tmp_path)!r} is not a regular file"]
    track = make_track(tmp_path / "t.wav", 1.0)
    assert sound.check(track, 1.0) == ["offset 1 s is at or past the end of t.wav (1.000 s): none of it would play; "
                                       "give a smaller offset"]
    assert sound.check(track, -2.5, video_seconds=2.0) == [
        "offset -2.5 s starts t.wav at or after the video's end (2.000 s): none of it would play"]
    assert sound.check(track, fit="loop") == ["fit: 'loop' is not allowed; choose one of both, pad, cut, exact"]
    gif = sound.check(track, container_ext=".gif")
    assert gif == ["a GIF holds no sound; write the video as .mp4, .mkv, .mov or .webm to add sound"]
    assert sound.check(track, container_ext="") == [
        "a folder of image frames holds no sound; write the video as .mp4, .mkv, .mov or .webm to add sound"]
    assert sound.check(track, container_ext=".mp4", codec="pcm_s16le") == [
        "a .mp4 file cannot hold pcm_s16le sound; it holds aac"]
    assert sound.check(track, 0.0, "pad", 0.5, ".mov") == [
        "t.wav runs 0.500 s past the video's end and fit: pad never cuts; use fit: cut or both, a larger offset or a "
        "shorter track"]
    # every problem at once
    assert len(sound.check(tmp_path / "missing.wav", fit="loop", container_ext=".gif")) == 3


def test_mux_refuses_a_gif_and_a_frames_folder_in_one_line(tmp_path, track):
    gif = make_video(tmp_path / "v.gif")
    with pytest.raises(OutputError, match=r"^cannot add sound to .*v\.gif: a GIF holds no sound; write the video as "):
        sound.mux(gif, tmp_path / "o.gif", track=track)
    frames = make_video(tmp_path / "frames")
    with pytest.raises(OutputError, match="a folder of image frames holds no sound"):
        sound.mux(frames, tmp_path / "o", track=track)
    assert not (tmp_path / "o.gif").exists() and not (tmp_path / "o").exists()


def test_mux_refuses_a_missing_track_an_existing_dest_and_another_container(tmp_path):
    video = make_video(tmp_path / "v.mp4")
    with pytest.raises(InputError, match=r"^sound for v\.mp4: audio track .*nope\.wav' does not exist$"):
        sound.mux(video, tmp_path / "o.mp4", track=tmp_path / "nope.wav")
    track = make_track(tmp_path / "t.wav", 2.0)
    (tmp_path / "taken.mp4").write_bytes(b"someone's")
    with pytest.raises(OutputError, match="already exists"):
        sound.mux(video, tmp_path / "taken.mp4", track=track)
    assert (tmp_path / "taken.mp4").read_bytes() == b"someone's"
    with pytest.raises(OutputError, match=r"must have the extension of .*\(\.mp4\)"):
        sound.mux(video, tmp_path / "o.mkv", track=track)
    assert sorted(os.listdir(tmp_path)) == ["t.wav", "taken.mp4", "v.mp4"]
