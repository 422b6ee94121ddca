"""A workflow's stitch with sound and an editorial timeline (vidgen.queue.steps, .stitching, .timeline):
one clip per shot with the frames the stitch used, dissolves for crossfades and fuses, markers at the
cuts, each shot's prompt/seed/digest from its sidecar, the film's frame count and fps; the files read
back through OpenTimelineIO's readers; a cut lands on the track's sample; every refusal comes before
any shot renders (at load) and again before any frame is written (at run)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import av
import numpy as np
import pytest
from media import make_track

otio = pytest.importorskip("opentimelineio")

from vidgen.errors import ConfigError, InputError, MissingExtra, OutputError  # noqa: E402
from vidgen.io import VideoWriter, read_video_info  # noqa: E402
from vidgen.queue import timeline  # noqa: E402
from vidgen.queue.steps import run_stitch  # noqa: E402
from vidgen.queue.workflow import load_workflow, plan_jobs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "demo.yaml"
FPS, RATE = 8, 48000


def shot(folder: Path, name: str, frames: int = 9, colour=(200, 40, 40), seed: int = 1) -> str:
    """A tiny clip with the sidecar a render writes beside it (prompt, seed, config digest)."""
    path = folder / f"{name}.mp4"
    with VideoWriter(path, fps=FPS, width=32, height=32) as writer:
        for i in range(frames):
            writer.write(np.full((32, 32, 3), colour, np.uint8))
    Path(f"{path}.json").write_text(json.dumps({"prompt": f"the {name} shot", "seed": seed,
                                                "config_digest": f"digest-{name}"}))
    return str(path)


def track(path: Path, seconds: float, clicks=()) -> Path:
    return make_track(path, seconds, rate=RATE, channels=1, clicks=clicks)


def film_sound(path: Path) -> np.ndarray:
    with av.open(str(path)) as container:
        return np.concatenate([f.to_ndarray()[0].astype(np.float64) for f in container.decode(audio=0)])


def clips(tl) -> list:
    return [c for c in tl.video_tracks()[0] if isinstance(c, otio.schema.Clip)]


def frames_of(r) -> tuple[int, int]:
    """A range as (first frame, end frame) at FPS."""
    return round(r.start_time.to_seconds() * FPS), round(r.end_time_exclusive().to_seconds() * FPS)


@pytest.fixture
def three(tmp_path):
    folder = tmp_path / "shots"
    folder.mkdir()
    colours = ((200, 40, 40), (40, 200, 40), (40, 40, 200))
    return [shot(folder, n, colour=c, seed=i) for i, (n, c) in enumerate(zip(("a", "b", "c"), colours))]


# ------------------------------------------------------------------------------- the timeline


def test_one_clip_per_shot_with_the_frames_the_stitch_used(three, tmp_path):
    """3 shots of 9 frames, crossfades of 2: the film has 23 frames, the clips cut at each dissolve's
    centre, the dissolves' halves the handles, so each shot's frames 0..8 are all used."""
    out = tmp_path / "film" / "film.mp4"
    run_stitch({"inputs": three, "output": str(out), "fps": FPS, "crossfade": 0.25, "names": ["a", "b", "c"],
                "audio": {"path": str(track(tmp_path / "t.wav", 4.0)), "offset": 0.0, "fit": "both"},
                "timeline": ["otio", "edl", "fcpxml"]})
    assert sorted(os.listdir(out.parent)) == ["film.edl", "film.mp4", "film.otio", "film.xml"]
    assert read_video_info(out)["frames"] == 23
    tl = otio.adapters.read_from_file(str(out.with_suffix(".otio")))
    video = tl.video_tracks()[0]
    assert video.duration() == otio.opentime.RationalTime(23, FPS) and tl.global_start_time.rate == FPS
    assert [c.name for c in clips(tl)] == ["a", "b", "c"]
    assert [frames_of(c.source_range) for c in clips(tl)] == [(0, 8), (1, 8), (1, 9)]
    assert [frames_of(c.range_in_parent()) for c in clips(tl)] == [(0, 8), (8, 15), (15, 23)]
    dissolves = [c for c in video if isinstance(c, otio.schema.Transition)]
    assert [(t.name, t.transition_type, t.in_offset.value, t.out_offset.value) for t in dissolves] == \
        [("crossfade", "SMPTE_Dissolve", 1, 1)] * 2
    # with the handles, every frame of every shot is used
    for clip, before, after in zip(clips(tl), [None] + dissolves, dissolves + [None]):
        first = clip.source_range.start_time.value - (before.in_offset.value if before else 0)
        end = clip.source_range.end_time_exclusive().value + (after.out_offset.value if after else 0)
        assert (first, end) == (0, 9) == tuple(clip.metadata["vidgen"]["frames_used"])
    a, b, c = clips(tl)
    meta = json.loads(otio.core.serialize_json_to_string(b.metadata["vidgen"]))
    assert meta == {"shot": "b", "master": three[1], "prompt": "the b shot", "seed": 1, "config_digest": "digest-b",
                    "frames_used": [0, 9]}
    assert a.media_reference.target_url == Path(three[0]).as_uri()
    assert a.media_reference.available_range.duration.value == 9
    assert not a.markers
    assert [(m.name, m.metadata["vidgen"]["film_frame"], frames_of(m.marked_range)[0]) for m in b.markers + c.markers] \
        == [("cut 1: a | b, 2-frame crossfade", 8, 1), ("cut 2: b | c, 2-frame crossfade", 15, 1)]
    [sound] = tl.audio_tracks()
    assert sound.duration().to_seconds() == 23 / FPS and [type(i).__name__ for i in sound] == ["Clip"]


def test_edl_and_fcp_xml_read_back(three, tmp_path):
    """EDL (CMX 3600): the video track, at 24 fps timecode (three per frame), each dissolve as a D event
    starting where the blend starts; FCP XML: both tracks, dissolves, markers and the shots' logging info."""
    out = tmp_path / "film.mp4"
    run_stitch({"inputs": three, "output": str(out), "fps": FPS, "crossfade": 0.25, "names": ["a", "b", "c"],
                "audio": {"path": str(track(tmp_path / "t.wav", 3.0)), "offset": 0.0, "fit": "both"},
                "timeline": ["edl", "fcpxml"]})
    text = out.with_suffix(".edl").read_text()
    assert text.startswith("TITLE: film\n") and "D 006" in text and "* FROM CLIP NAME:  a" in text
    assert "* LOC: 00:00:00:03 RED     CUT 1: A | B, 2-FRAME CROSSFADE" in text
    edl = otio.adapters.read_from_file(str(out.with_suffix(".edl")), rate=24)
    assert [c.name for c in clips(edl)] == ["a", "b", "c"] and not edl.audio_tracks()
    assert edl.video_tracks()[0].duration().to_seconds() == 23 / FPS
    # an EDL dissolve starts at the blend's start: b's event from film frame 7, its source from frame 0
    assert [frames_of(c.range_in_parent()) for c in clips(edl)] == [(0, 7), (7, 14), (14, 23)]
    assert [frames_of(c.source_range)[0] for c in clips(edl)] == [0, 0, 0]
    xml = otio.adapters.read_from_file(str(out.with_suffix(".xml")))
    assert [frames_of(c.source_range) for c in clips(xml)] == [(0, 8), (1, 8), (1, 9)]
    assert [t.out_offset.to_seconds() for t in xml.video_tracks()[0] if isinstance(t, otio.schema.Transition)] == \
        [1 / FPS] * 2
    assert clips(xml)[1].metadata["fcp_xml"]["logginginfo"] == {
        "description": "the b shot", "scene": "b", "lognote": "seed 1; config digest-b"}
    assert [m.name for m in clips(xml)[2].markers] == ["cut 2: b | c, 2-frame crossfade"]
    assert xml.audio_tracks()[0].duration().to_seconds() == 23 / FPS


def test_joins_and_fuses(tmp_path):
    """A window joining the one before (its first frame dropped: no transition, the clip starts after it)
    and a 5-frame fuse (a dissolve of the shared frames)."""
    folder = tmp_path / "s"
    folder.mkdir()
    inputs = [shot(folder, n) for n in ("w1", "w2", "next")]
    reviewed = {"prompt": "next", "seed": 5, "config_digest": "d", "job": {"review": {"take": 2, "by": "127.0.0.1"}}}
    Path(f"{inputs[2]}.json").write_text(json.dumps(reviewed))      # a reviewed shot: its approved take
    out = tmp_path / "film.mp4"
    run_stitch({"inputs": inputs, "output": str(out), "fps": FPS, "joins": [0, 1, 0], "blends": [0, 0, 5],
                "timeline": ["otio"]})
    assert read_video_info(out)["frames"] == 27 - 1 - 5
    tl = otio.adapters.read_from_file(str(out.with_suffix(".otio")))
    assert [frames_of(c.source_range) for c in clips(tl)] == [(0, 9), (1, 6), (2, 9)]
    assert [frames_of(c.range_in_parent()) for c in clips(tl)] == [(0, 9), (9, 14), (14, 21)]
    [fuse] = [t for t in tl.video_tracks()[0] if isinstance(t, otio.schema.Transition)]
    assert (fuse.name, fuse.in_offset.value, fuse.out_offset.value) == ("fuse", 2, 3)
    assert [dict(m.metadata["vidgen"]) for c in clips(tl) for m in c.markers] == [
        {"film_frame": 9, "kind": "join"}, {"film_frame": 14, "kind": "fuse"}]
    assert clips(tl)[1].markers[0].name == "cut 1: w1 | w2, its first 1 frames shown by w1"
    assert list(clips(tl)[1].metadata["vidgen"]["frames_used"]) == [1, 9]
    assert clips(tl)[2].metadata["vidgen"]["take"] == 2 and "take" not in clips(tl)[1].metadata["vidgen"]


def test_png_frame_shots_are_image_sequences(tmp_path):
    """Shots written as folders of PNG frames: an image sequence in the .otio, the folder in EDL and FCP XML."""
    inputs = []
    for name in ("a", "b"):
        with VideoWriter(tmp_path / name, fps=FPS, width=32, height=32, codec="png") as writer:
            for _ in range(9):
                writer.write(np.zeros((32, 32, 3), np.uint8))
        Path(f"{tmp_path / name}.json").write_text(json.dumps({"prompt": name, "seed": 0, "config_digest": "d"}))
        inputs.append(str(tmp_path / name))
    out = tmp_path / "film"
    run_stitch({"inputs": inputs, "output": str(out), "fps": FPS, "crossfade": 0.25, "timeline": ["otio", "edl", "fcpxml"]})
    assert len(os.listdir(out)) == 16
    tl = otio.adapters.read_from_file(str(tmp_path / "film.otio"))
    ref = clips(tl)[1].media_reference
    assert isinstance(ref, otio.schema.ImageSequenceReference) and ref.abstract_target_url("#") == \
        f"{(tmp_path / 'b').as_uri()}/frame_#.png"
    xml = otio.adapters.read_from_file(str(tmp_path / "film.xml"))
    assert [c.media_reference.target_url for c in clips(xml)] == [Path(p).as_uri() for p in inputs]
    assert "s0" not in (tmp_path / "film.edl").read_text() and "001  a " in (tmp_path / "film.edl").read_text()


def test_a_cut_lands_on_the_tracks_sample(three, tmp_path):
    """Clicks at track times (cut frame / fps + offset): in the film each is at sample cut frame / fps * 48000."""
    offset, cuts = 0.3, [8, 15]          # the dissolves' centres (the timeline's markers say so too)
    t = track(tmp_path / "t.wav", 4.0, clicks=[f / FPS + offset for f in cuts])
    out = tmp_path / "film.mp4"
    run_stitch({"inputs": three, "output": str(out), "fps": FPS, "crossfade": 0.25, "timeline": ["otio"],
                "audio": {"path": str(t), "offset": offset, "fit": "both"}})
    tl = otio.adapters.read_from_file(str(out.with_suffix(".otio")))
    assert [m.metadata["vidgen"]["film_frame"] for c in clips(tl) for m in c.markers] == cuts
    samples = film_sound(out)
    for frame in cuts:
        want = frame * RATE // FPS
        got = want - 200 + int(np.argmax(np.abs(samples[want - 200:want + 200])))
        assert abs(got - want) <= 1, (frame, got, want)
    with av.open(str(out)) as container:
        stream = container.streams.audio[0]
        assert abs(float(stream.duration * stream.time_base) - 23 / FPS) < 1 / FPS


# ------------------------------------------------------------------------------- refusals at run time


def test_run_refuses_before_writing(three, tmp_path, monkeypatch):
    out = tmp_path / "o" / "film.mp4"
    base = {"inputs": three, "output": str(out), "fps": FPS}
    os.remove(f"{three[1]}.json")
    with pytest.raises(InputError, match=r"b\.mp4\.json does not exist; a shot's clip takes its prompt"):
        run_stitch({**base, "timeline": ["otio"]})
    with pytest.raises(InputError, match=r"^stitch audio: audio track .*nope\.wav' does not exist$"):
        run_stitch({**base, "audio": {"path": str(tmp_path / "nope.wav")}})
    with pytest.raises(InputError, match="fit: pad never cuts"):
        run_stitch({**base, "audio": {"path": str(track(tmp_path / "long.wav", 9.0)), "fit": "pad"}})
    with pytest.raises(InputError, match="a GIF holds no sound"):
        run_stitch({**base, "output": str(tmp_path / "o" / "film.gif"), "audio": {"path": str(tmp_path / "long.wav")}})
    with pytest.raises(ConfigError, match="'aaf' is not a timeline format; choose from otio, edl, fcpxml"):
        run_stitch({**base, "timeline": ["aaf"]})
    monkeypatch.setattr(timeline, "installed_adapters", lambda: {"otio_json"})
    with pytest.raises(MissingExtra, match=r"edl needs the package otio-cmx3600-adapter, which is not installed: "
                                           r"pip install otio-cmx3600-adapter \(vidgen's 'timeline' extra has it"):
        run_stitch({**base, "timeline": ["otio", "edl"]})
    assert not out.parent.exists() or not os.listdir(out.parent)


def test_an_existing_timeline_file_is_refused_unless_overwrite(three, tmp_path):
    out = tmp_path / "film.mp4"
    out.with_suffix(".edl").write_text("an editor's own EDL")
    with pytest.raises(OutputError, match=r"stitch timeline \(edl\): .*film\.edl' already exists"):
        run_stitch({"inputs": three, "output": str(out), "fps": FPS, "timeline": ["otio", "edl"]})
    assert not out.exists() and not out.with_suffix(".otio").exists()
    run_stitch({"inputs": three, "output": str(out), "fps": FPS, "timeline": ["otio", "edl"], "overwrite": True})
    assert out.with_suffix(".edl").read_text().startswith("TITLE: film")


# ------------------------------------------------------------------------------- the workflow's keys


@pytest.fixture
def workflow(tmp_path, monkeypatch):
    """write(stitch step YAML) -> a 3-shot workflow on the demo preset (17 frames at 8 fps each)."""
    monkeypatch.chdir(tmp_path)

    def write(stitch: str) -> Path:
        path = tmp_path / "wf.yaml"
        path.write_text(textwrap.dedent(f"""\
            name: t
            output_dir: out
            defaults: {{config: {DEMO}}}
            shots:
              - {{name: a, prompt: a red circle moving right on a black background, seed: 1}}
              - {{name: b, prompt: a blue square moving up on a gray background, seed: 2}}
              - {{name: c, prompt: a green circle moving down on a gray background, seed: 3}}
            steps:
              stitch: {stitch}
            """))
        return path
    return write


def problems_of(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_workflow(path)
    return e.value.problems


def test_the_stitch_payload_carries_sound_timeline_and_names(workflow, tmp_path):
    track(tmp_path / "score.wav", 6.0)
    path = workflow("{output: film.mp4, crossfade: 0.25, audio: {path: score.wav, offset: -0.5}, timeline: [otio, edl]}")
    stitch = plan_jobs(load_workflow(path))[-1]
    assert stitch.kind == "stitch"
    assert stitch.payload["audio"] == {"path": str(tmp_path / "score.wav"), "offset": -0.5, "fit": "both"}
    assert stitch.payload["timeline"] == ["otio", "edl"] and stitch.payload["names"] == ["a", "b", "c"]
    silent = plan_jobs(load_workflow(workflow("{output: film.mp4}")))[-1].payload
    assert silent["audio"] is None and silent["timeline"] is None


def test_the_workflow_refuses_at_load(workflow, tmp_path, monkeypatch):
    """Each refusal before any shot renders; the film is 3 * 17 - 2 * 2 = 47 frames (5.875 s)."""
    track(tmp_path / "long.wav", 6.0)
    track(tmp_path / "fits.wav", 5.875)
    assert problems_of(workflow("{output: film.mp4, timeline: [otio, aaf, otio]}")) == [
        "steps.stitch.timeline: 'aaf' is not a timeline format; choose from otio, edl, fcpxml",
        "steps.stitch.timeline: 'otio' is listed twice"]
    assert problems_of(workflow("{output: film.mp4, audio: {path: nope.wav}}")) == [
        f"steps.stitch.audio: audio track {str(tmp_path / 'nope.wav')!r} does not exist"]
    assert problems_of(workflow("{output: film.mp4, crossfade: 0.25, audio: {path: long.wav, fit: pad}}")) == [
        "steps.stitch.audio: long.wav runs 0.125 s past the video's end and fit: pad never cuts; use fit: cut or "
        "both, a larger offset or a shorter track"]
    load_workflow(workflow("{output: film.mp4, crossfade: 0.25, audio: {path: fits.wav, fit: exact}}"))
    assert problems_of(workflow("{output: film.gif, audio: {path: fits.wav}}")) == [
        "steps.stitch.audio: a GIF holds no sound; write the video as .mp4, .mkv, .mov or .webm to add sound"]
    assert problems_of(workflow("{output: film.mp4, audio: {path: fits.wav, fit: loop}}")) == [
        "steps.stitch.audio.fit: 'loop' is not allowed; choose one of both, pad, cut, exact"]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "film.otio").write_text("{}")
    [taken] = problems_of(workflow("{output: film.mp4, timeline: [otio]}"))
    assert taken.startswith("steps.stitch.timeline (otio): ") and "film.otio' already exists" in taken
    monkeypatch.setattr(timeline, "installed_adapters", lambda: {"otio_json", "cmx_3600"})
    [missing] = problems_of(workflow("{output: film.mp4, timeline: [edl, fcpxml]}"))
    assert missing.startswith("steps.stitch.timeline: fcpxml needs the package otio-fcp-adapter, which is not "
                              "installed: pip install otio-fcp-adapter (vidgen's 'timeline' extra has it: pip install")


def test_the_service_refuses_a_track_outside_its_roots(tmp_path):
    """A submitted workflow's track is a file it names: outside the service's roots it is refused before
    anything is opened, whether or not it exists."""
    from vidgen.queue.service import Service

    (tmp_path / "root").mkdir()
    svc = Service(tmp_path / "q.db", [tmp_path / "root"], None, 2**20, 1.0)
    outside = str(track(tmp_path / "score.wav", 1.0))
    doc = {"name": "t", "output_dir": str(tmp_path / "root" / "out"), "defaults": {"config": str(DEMO)},
           "shots": [{"name": "a", "prompt": "a red circle moving right on a black background"}],
           "steps": {"stitch": {"output": "film.mp4", "audio": {"path": outside}}}}
    with pytest.raises(ConfigError, match=f"{outside}' is outside the service's roots"):
        svc.plan(doc, True, [])


def test_edl_needs_a_frame_rate_timecode_counts():
    assert timeline.timecode_rate(8) == 24 and timeline.timecode_rate(16) == 48 and timeline.timecode_rate(25) == 25
    assert timeline.problems(["otio", "edl"], 7) == [
        "edl needs timecode, which counts 24, 25, 30, 48, 50, 60 fps; 7 fps divides none of them: use otio, or an fps "
        "such as 8, 12, 16, 24"]


# ------------------------------------------------------------------------------- the demo workflow


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """The repository's configs/, samples/ and workflows/ seen from an empty folder (outputs/ is the test's)."""
    for name in ("configs", "samples", "workflows"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.slow      # 4 demo renders: 17 s alone on a 2-core CPU, a minute beside the other tests
def test_the_demo_workflows_film_and_timeline(checkout):
    """workflows/demo-shapes.yaml on the demo model: 4 shots of 17 frames, crossfades of 2, the tones
    track. One clip per shot with the right in/out points, read back by OTIO's reader, exported to EDL;
    the sound as long as the film, each tone change on its cut."""
    import vidgen

    text = Path("workflows/demo-shapes.yaml").read_text()      # the demo, with the timeline the extra gives
    assert "    timeline:" not in text
    (checkout / "shapes.yaml").write_text(text.replace("  contact_sheet:", "    timeline: [otio, edl, fcpxml]\n"
                                                        "  contact_sheet:"))
    jobs = plan_jobs(load_workflow("shapes.yaml"))
    for job in jobs[:4]:
        vidgen.render(job.payload)
    film = run_stitch(jobs[4].payload)
    assert read_video_info(film)["frames"] == 62
    tl = otio.adapters.read_from_file(str(film.with_suffix(".otio")))
    assert [c.name for c in clips(tl)] == ["red-circle-right", "blue-square-up", "yellow-triangle-left",
                                           "green-circle-down"]
    assert [frames_of(c.source_range) for c in clips(tl)] == [(0, 16), (1, 16), (1, 16), (1, 17)]
    assert tl.video_tracks()[0].duration() == otio.opentime.RationalTime(62, 8)
    assert clips(tl)[2].metadata["vidgen"]["prompt"] == "a yellow triangle moving left on a black background"
    assert clips(tl)[2].metadata["vidgen"]["seed"] == 3
    edl = otio.adapters.read_from_file(str(film.with_suffix(".edl")), rate=24)
    assert len(clips(edl)) == 4 and edl.video_tracks()[0].duration().to_seconds() == 62 / 8
    assert otio.adapters.read_from_file(str(film.with_suffix(".xml"))).video_tracks()[0].duration().to_seconds() == 7.75
    samples = film_sound(film)
    assert abs(len(samples) / RATE - 7.75) < 1 / 8
    for cut in (16, 31, 46):        # the tones fall silent for 10 ms either side of each change
        at = cut * RATE // 8
        assert np.abs(samples[at - 50:at + 50]).max() < 0.05 < np.abs(samples[at - 2000:at - 1000]).max()


def test_submit_counts_every_timeline_file_a_stitch_may_write():
    """queue.jobs.written_files lists a stitch's timeline names itself (the API imports no timeline code);
    they must be the names timeline.paths gives."""
    from vidgen.queue.jobs import written_files

    film = "/w/film.mp4"
    assert {str(p) for p in timeline.paths(film, list(timeline.FORMATS)).values()} <= \
        set(written_files("stitch", film).values())
