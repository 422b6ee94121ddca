"""The workflow's editing verbs on a tiny VACE model: `extend` (a shot continued from another's last
frames, kept bit for bit, shown once in the film) and `repaint` (a region rendered again, the rest
kept, in the source's place), their refusals, and their resumption after a worker is killed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vidgen
import vidgen.deliver  # the spies patch its VideoWriter: imported here, whatever ran before in this process
from test_continuity import _run, _wf, queue_worker
from vidgen.errors import ConfigError
from vidgen.io import read_frames, read_video_info
from vidgen.paths import kept_frame_path
from vidgen.queue.api import check_specs
from vidgen.queue.steps import run_stitch
from vidgen.queue.workflow import load_workflow, plan_jobs


def _mask(path: Path) -> str:
    """One mask for every frame: the right half white (render again), the left black (keep)."""
    m = np.zeros((64, 64, 3), dtype=np.uint8)
    m[:, 32:] = 255
    Image.fromarray(m).save(path)
    return str(path)


def test_extend_keeps_the_source_frames_bit_for_bit_and_the_film_shows_them_once(tiny_model, tmp_path, monkeypatch):
    """b extends a by its last 4 frames: they are a's decoded frames (kept as PNG, not read back from a
    video), b's first 4 frames are exactly those, b depends on a, the submit check passes before a
    exists, and the film (PNG frames: lossless) is a's 9 frames then b's 5 new ones."""
    monkeypatch.chdir(tmp_path)
    wf = load_workflow(_wf(tmp_path, tiny_model("wan2.1-vace"), """\
        - {name: a, prompt: a red circle moving right, num_frames: 9}
        - {name: b, prompt: a red circle moving right, num_frames: 9, extend: {from: a, frames: 4}}
        """, "steps:\n  stitch: {output: film}\n  contact_sheet: {output: sheet.png}\n", ", output.codec: png"))
    a, b = wf.shots
    assert sorted(a.config.output.keep_frames) == [5, 6, 7, 8] and b.deps == [0]
    assert b.config.control.frames == [str(kept_frame_path(Path(a.config.output.path), k)) for k in (5, 6, 7, 8)]
    assert b.config.control.keep_first == 4
    jobs = plan_jobs(wf)
    assert jobs[1].deps == [0] and jobs[2].payload["joins"] == [0, 4]
    check_specs(jobs)                   # a's frames do not exist yet: stand-ins of a's size
    _run(jobs)
    first, second = (list(read_frames(s.config.output.path)) for s in (a, b))
    kept = [np.asarray(Image.open(p)) for p in b.config.control.frames]
    assert all(np.array_equal(k, f) for k, f in zip(kept, first[5:]))
    assert len(second) == 9 and all(np.array_equal(second[i], first[5 + i]) for i in range(4))
    assert not np.array_equal(second[4], first[8])          # what follows is generated
    film = list(read_frames(wf.output_dir / "film"))
    assert len(film) == 9 + 9 - 4
    assert all(np.array_equal(x, y) for x, y in zip(film, first + second[4:]))


@pytest.mark.slow
def test_repaint_keeps_the_unmasked_pixels_and_takes_the_source_place(tiny_model, tmp_path, monkeypatch):
    """c repaints a's right half: its left half is a's within the codec's error (and exactly a's decoded
    pixels before the codec), its right half is rendered again; in the film and on the contact sheet
    c stands where a stood, and b (extending a) follows it joined."""
    monkeypatch.chdir(tmp_path)
    mask = _mask(tmp_path / "mask.png")
    wf = load_workflow(_wf(tmp_path, tiny_model("wan2.1-vace"), f"""\
        - {{name: a, prompt: a red circle moving right, num_frames: 9}}
        - {{name: b, prompt: a red circle moving right, num_frames: 9, extend: {{from: a, frames: 2}}}}
        - {{name: c, prompt: a blue square moving up, seed: 11, repaint: {{from: a, mask: {mask}}}}}
        """, "steps:\n  stitch: {output: film.mp4}\n  contact_sheet: {output: sheet.png}\n"))
    a, b, c = wf.shots
    assert c.config.num_frames == 9 and c.deps == [0] and c.config.control.mask == mask
    assert sorted(a.config.output.keep_frames) == list(range(9))
    jobs = plan_jobs(wf)
    stitch, sheet = jobs[3].payload, jobs[4].payload
    assert stitch["inputs"] == [c.config.output.path, b.config.output.path] and stitch["joins"] == [0, 2]
    assert sheet["inputs"] == [c.config.output.path, b.config.output.path] and sheet["labels"] == ["c", "b"]
    check_specs(jobs)
    captured: dict[str, list] = {}
    real = vidgen.deliver.VideoWriter.write

    def spy(self, frame):
        captured.setdefault(Path(self.path).name.split(".")[0], []).append(frame.copy())
        return real(self, frame)
    monkeypatch.setattr(vidgen.deliver.VideoWriter, "write", spy)
    _run(jobs)
    src, new = np.stack(captured["01-a"]), np.stack(captured["03-c"])
    assert np.array_equal(new[:, :, :32], src[:, :, :32])          # kept: a's decoded pixels
    assert np.abs(new[:, :, 32:].astype(int) - src[:, :, 32:]).mean() > 10     # rendered again
    coded_src = np.stack(list(read_frames(a.config.output.path))).astype(int)
    coded_new = np.stack(list(read_frames(c.config.output.path))).astype(int)
    codec_error = np.abs(coded_src - src).mean()                   # H.264's own error on a
    # the left half, away from the seam the codec's blocks straddle
    assert np.abs(coded_new[:, :, :24] - coded_src[:, :, :24]).mean() <= 2 * codec_error + 1
    assert read_video_info(wf.output_dir / "film.mp4")["frames"] == 9 + 9 - 2


def test_edit_problems_are_reported_together(tiny_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    vace, t2v = tiny_model("wan2.1-vace"), tiny_model("wan2.1-t2v")
    mask = _mask(tmp_path / "mask.png")
    path = _wf(tmp_path, vace, f"""\
        - {{name: a, prompt: x, num_frames: 9, extend: {{from: b, frames: 2}}}}
        - {{name: b, prompt: x, num_frames: 9, extend: {{from: a, frames: 9}}}}
        - {{name: c, prompt: x, num_frames: 9, repaint: {{from: a, mask: {mask}}}}}
        - {{name: d, prompt: x, repaint: {{from: a, mask: nowhere.png, feather: 3}}}}
        - {{name: e, prompt: x, extend: {{from: a, frames: 0}}, repaint: {{from: a, mask: {mask}}}}}
        - {{name: f, prompt: x, num_frames: 9, extend: {{from: a, frames: 2}}, overrides: {{size: 32x32}}}}
        - {{name: g, prompt: x, num_frames: 9, extend: {{from: a, frames: 2}}, overrides: {{model.path: {t2v}}}}}
        - {{name: h, prompt: x, num_frames: 9, extend: {{from: nobody, frames: 2}}}}
        """)
    with pytest.raises(ConfigError) as e:
        load_workflow(path)
    text = "\n".join(e.value.problems)
    for needle in ("shot 'a': extend.from: 'b' is a later shot",
                   "shot 'b': extend.frames: keeping 9 of this shot's 9 frames generates none",
                   "shots[2]: a repaint has its source's length; remove num_frames",
                   "shots[3].repaint.mask: 'nowhere.png' does not exist", "shots[3].repaint.feather: unknown key",
                   "shots[4]: give extend or repaint, not both", "shots[4].extend.frames: 0",
                   "shot 'f': extend: 'a' is 64x64 and this shot 32x32",
                   "shot 'g': extend: renders with VACE, which wan2.1-t2v has not",
                   "shot 'h': extend.from: 'nobody' is not a shot"):
        assert needle in text, text


def test_a_stitch_payload_refuses_bad_join_counts(tmp_path):
    from vidgen.errors import InputError

    clip = tmp_path / "c"
    clip.mkdir()
    for i in range(3):
        Image.new("RGB", (16, 16)).save(clip / f"frame_{i:05d}.png")
    payload = {"inputs": [str(clip), str(clip)], "output": str(tmp_path / "f.mp4"), "fps": 8}
    for joins in ([0, -1], [1, 0], [0]):
        with pytest.raises(ConfigError, match="joins and blends must have one count"):
            run_stitch({**payload, "joins": joins})
    with pytest.raises(InputError, match="the 3 it shares with the clip before needs at least 4"):
        run_stitch({**payload, "joins": [0, 3]})
    run_stitch({**payload, "joins": [False, True]})           # an older payload's flags: 0 and 1
    assert read_video_info(tmp_path / "f.mp4")["frames"] == 5


@pytest.mark.slow
def test_extend_and_repaint_resume_after_a_worker_is_killed(tiny_model, tmp_path, monkeypatch):
    """A worker SIGKILLed in the middle of the extension, and another in the middle of the repaint: each
    time a new worker finishes that render from its sampling checkpoint, the source is not rendered
    again, and the film has every frame once."""
    import signal
    import time

    from vidgen.queue.ledger import JobState, Ledger

    monkeypatch.chdir(tmp_path)
    mask = _mask(tmp_path / "mask.png")
    slow = "overrides: {sampling.steps: 300, sampling.checkpoint_every: 1}"
    wf = load_workflow(_wf(tmp_path, tiny_model("wan2.1-vace"), f"""\
        - {{name: a, prompt: a red circle moving right, num_frames: 9}}
        - {{name: b, prompt: a red circle moving right, num_frames: 9, extend: {{from: a, frames: 4}}, {slow}}}
        - {{name: c, prompt: a blue square, repaint: {{from: a, mask: {mask}}}, {slow}}}
        """, "steps:\n  stitch: {output: film.mp4}\n"))
    db = tmp_path / "q.db"
    ledger = Ledger(db)
    ids = ledger.submit(plan_jobs(wf))

    def worker():
        return queue_worker(db)

    first = None
    for target in (1, 2):           # kill in the extension, then in the repaint
        w, deadline = worker(), time.monotonic() + 240
        while time.monotonic() < deadline and w.poll() is None:
            time.sleep(0.05)
            if first is None and ledger.get(ids[0]).state == JobState.SUCCEEDED:
                st = Path(ledger.get(ids[0]).output).stat()
                first = (st.st_ino, st.st_mtime_ns)
            job = ledger.get(ids[target])
            if job.state == JobState.RUNNING and (job.progress or {}).get("step", 0) >= 3:
                w.send_signal(signal.SIGKILL)
                w.wait()
                break
        assert w.returncode == -signal.SIGKILL, f"job {target} never ran"
    w = worker()
    w.wait(timeout=240)
    jobs = [ledger.get(i) for i in ids]
    assert all(j.state == JobState.SUCCEEDED for j in jobs), [(j.name, j.state, j.error) for j in jobs]
    assert [j.attempts for j in jobs[:3]] == [1, 2, 2]
    st = Path(jobs[0].output).stat()
    assert (st.st_ino, st.st_mtime_ns) == first                   # the source was not rendered again
    assert read_video_info(wf.output_dir / "film.mp4")["frames"] == 9 + 9 - 4
