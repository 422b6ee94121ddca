"""Continuity: first-last-frame, shots that continue from an earlier shot's frame, long takes in windows,
colour held to a reference."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vidgen
import vidgen.deliver  # the spies patch its VideoWriter: imported here, whatever ran before in this process
from vidgen.cli import main
from vidgen.continuity import ColourMatch, colour_stats, to_oklab
from vidgen.errors import ConfigError
from vidgen.io import read_frames, read_video_info
from vidgen.paths import kept_frame_path
from vidgen.queue.api import check_specs
from vidgen.queue.steps import run_contact_sheet, run_stitch
from vidgen.queue.workflow import load_workflow, plan_jobs

IMAGE = Path(__file__).parent.parent / "samples" / "first-frame.png"


def _wf(tmp_path: Path, model: Path, shots: str, extra: str = "", defaults: str = "") -> Path:
    """A workflow file of `shots` on `model` (64x64, 8 fps, 2 steps); `defaults`: more of its defaults."""
    path = tmp_path / "wf.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: cont
        output_dir: out
        defaults: {{model.path: {model}, model.device: cpu, size: 64x64, fps: 8, sampling.steps: 2, seed: 3{defaults}}}
        shots:
        """) + textwrap.indent(textwrap.dedent(shots), "  ") + textwrap.dedent(extra))
    return path


def queue_worker(db: Path):
    """A `vidgen queue worker --exit-when-idle` process on ledger `db`, with a 2 s lease (quick to take back)."""
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-m", "vidgen", "queue", "--db", str(db), "worker", "--exit-when-idle",
                             "--lease", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _run(jobs) -> None:
    """Run the planned jobs in order, each as a worker would (render, stitch, contact sheet)."""
    for job in jobs:
        if job.kind == "render":
            vidgen.render(job.payload)
        elif job.kind == "stitch":
            run_stitch(job.payload)
        else:
            run_contact_sheet(job.payload)


def test_last_image_needs_an_i2v_a14b_and_an_image(base_cfg, tmp_path, capsys):
    cfg = base_cfg("wan2.2-ti2v-5b", image=str(IMAGE), last_image=str(IMAGE))
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert main(["render", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert "last_image" in err and "Wan2.2 I2V-A14B" in err and len(err.strip().splitlines()) == 1
    cfg = base_cfg("wan2.2-i2v-a14b", last_image=str(IMAGE))
    (tmp_path / "d.json").write_text(json.dumps(cfg))
    assert main(["render", str(tmp_path / "d.json")]) == 2
    assert "last_image: is set without image" in capsys.readouterr().err


def test_a_shot_continues_from_the_last_frame_of_another(tiny_model, tmp_path, monkeypatch):
    """Shot B's conditioning image is A's last frame, kept as lossless PNG (the decoded pixels, not
    the H.264 file's), bit for bit; B depends on A in the ledger; the submit check passes before A exists."""
    monkeypatch.chdir(tmp_path)
    wf = load_workflow(_wf(tmp_path, tiny_model("wan2.2-ti2v-5b"), """\
        - {name: walk-in, prompt: a red circle moving right, num_frames: 9}
        - {name: walk-out, prompt: a red circle moving right, num_frames: 9, image: {from: walk-in, frame: last}}
        """))
    a, b = wf.shots
    assert a.config.output.keep_frames == [8] and b.deps == [0]
    assert b.config.image == str(kept_frame_path(Path(a.config.output.path), 8))
    jobs = plan_jobs(wf)
    assert jobs[1].deps == [0]
    check_specs(jobs)                   # B's image does not exist yet: a stand-in of A's size
    captured = {}
    real = vidgen.deliver.VideoWriter.write

    def spy(self, frame):
        captured.setdefault(str(self.path), []).append(frame.copy())
        return real(self, frame)
    monkeypatch.setattr(vidgen.deliver.VideoWriter, "write", spy)
    _run(jobs)
    kept = np.asarray(Image.open(b.config.image))
    last = [v for k, v in captured.items() if "walk-in" in k][0][-1]
    assert np.array_equal(kept, last)               # exactly the decoded frame
    compressed = list(read_frames(a.config.output.path))[-1]
    assert not np.array_equal(kept, compressed)     # which the H.264 file does not keep


def test_validation_reports_every_continuity_problem(tiny_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = _wf(tmp_path, tiny_model("wan2.2-ti2v-5b"), """\
        - {name: a, prompt: x, num_frames: 9, image: {from: b, frame: last}}
        - {name: b, prompt: x, num_frames: 9, image: {from: nowhere}}
        - {name: c, prompt: x, num_frames: 9, image: {from: a, frame: 9}}
        - {name: d, prompt: x, num_frames: 9, image: {from: a, frame: sideways}, continuity: {colour: pink}}
        - {name: e, prompt: x, num_frames: 9, continuity: {overlap_frames: 3, colour: match_reference}}
        """)
    with pytest.raises(ConfigError) as e:
        load_workflow(path)
    text = "\n".join(e.value.problems)
    for needle in ("frame: 'sideways'", "colour: 'pink'", "overlap_frames: 3", "needs a reference image"):
        assert needle in text, text
    path = _wf(tmp_path, tiny_model("wan2.2-ti2v-5b"), """\
        - {name: a, prompt: x, num_frames: 9, image: {from: b, frame: last}}
        - {name: b, prompt: x, num_frames: 9, image: {from: nowhere}}
        - {name: c, prompt: x, num_frames: 9, image: {from: a, frame: 9}}
        """)
    with pytest.raises(ConfigError) as e:
        load_workflow(path)
    text = "\n".join(e.value.problems)
    assert len(e.value.problems) == 3, text
    assert "'b' is a later shot" in text and "'nowhere' is not a shot" in text and "frame: 9 is beyond" in text


@pytest.mark.slow
def test_a_long_take_renders_in_windows_as_one_shot(tiny_model, tmp_path, monkeypatch):
    """25 frames with 9-frame windows: 3 windows (9, 9, 9 sharing one frame each), each starting on the
    last frame of the one before; the stitch has 25 frames and no repeated frame; one contact-sheet cell."""
    monkeypatch.chdir(tmp_path)
    wf = load_workflow(_wf(tmp_path, tiny_model("wan2.2-ti2v-5b"), """\
        - {name: intro, prompt: a blue square, num_frames: 5}
        - {name: take, prompt: a red circle moving right, num_frames: 25, continuity: {window_frames: 9}}
        """, "steps:\n  stitch: {output: film.mp4, crossfade: 0.25}\n  contact_sheet: {output: sheet.png}\n"))
    names = [s.name for s in wf.shots]
    assert names == ["intro", "take.w1", "take.w2", "take.w3"]
    assert [s.config.num_frames for s in wf.shots] == [5, 9, 9, 9] and [s.joins for s in wf.shots] == [0, 0, 1, 1]
    assert wf.shots[2].deps == [1] and wf.shots[3].deps == [2]
    jobs = plan_jobs(wf)
    check_specs(jobs)
    _run(jobs)
    stitched = wf.output_dir / "film.mp4"
    # 5 + 25 frames, less the 2 frames of the crossfade between intro and the take.
    assert read_video_info(stitched)["frames"] == 5 + 25 - 2
    frames = [f.astype(int) for f in read_frames(stitched)]
    repeats = [i for i in range(1, len(frames)) if np.abs(frames[i] - frames[i - 1]).max() == 0]
    assert not repeats
    assert Image.open(wf.output_dir / "sheet.png").size[0] == 2 * 64      # intro and the take: two cells
    for k in (2, 3):        # each window's conditioning is its predecessor's kept last frame
        prev = wf.shots[k - 1].config.output.path
        assert wf.shots[k].config.image == str(kept_frame_path(Path(prev), 8))


def test_a_long_take_needs_an_image_conditioned_model(tiny_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="image-conditioned model"):
        load_workflow(_wf(tmp_path, tiny_model(), """\
            - {name: take, prompt: x, num_frames: 17, continuity: {window_frames: 9}}
            """))


def _drifted(frames: int, drift: np.ndarray, rng) -> list[np.ndarray]:
    """A textured clip whose colour drifts by `drift` (RGB, per frame) over its frames."""
    base = rng.integers(40, 200, size=(32, 32, 3)).astype(np.float64)
    return [np.clip(base + t * drift, 0, 255).astype(np.uint8) for t in range(frames)]


def test_colour_matching_removes_a_drift():
    """A drift injected into each window of a chained take (each window starting where the last one
    ended, and drifting further) is removed by matching every frame to the take's first frame: the
    mean Oklab colour distance between the first and the last window falls below a tenth."""
    rng = np.random.default_rng(0)
    drift = np.array([1.2, -0.6, -0.9])
    windows, start = [], None
    for _ in range(3):
        clip = _drifted(9, drift, rng) if start is None else [np.clip(f.astype(np.float64) + (start.astype(np.float64)
                                                                      - _drifted(9, drift, rng)[0]), 0, 255).astype(np.uint8)
                                                              for f in _drifted(9, drift, rng)]
        windows.append(clip)
        start = clip[-1]
    ref = windows[0][0]
    match = ColourMatch(ref)

    def mean_lab(frames):
        return torch.stack([to_oklab(torch.from_numpy(f)).reshape(-1, 3).mean(0) for f in frames]).mean(0)

    before = (mean_lab(windows[-1]) - mean_lab(windows[0])).norm().item()
    matched = [[match(torch.from_numpy(f)).numpy() for f in w] for w in windows]
    after = (mean_lab(matched[-1]) - mean_lab(matched[0])).norm().item()
    assert before > 0.02 and after < before / 10, (before, after)
    mean, _ = colour_stats(torch.from_numpy(matched[-1][-1]))
    assert (mean - colour_stats(torch.from_numpy(ref))[0]).abs().max() < 2e-3


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [1, 5])
def test_a_long_take_resumes_after_a_worker_is_killed_mid_window(tiny_model, tmp_path, monkeypatch, overlap):
    """Windows are dependent queue jobs: a worker SIGKILLed in the middle of the second window leaves
    the first window as it was; a new worker finishes the second from its sampling checkpoint and
    then the rest, and the stitched take has every frame once (windows sharing 1 or 5 frames)."""
    import signal
    import time

    from vidgen.queue.ledger import JobState, Ledger

    monkeypatch.chdir(tmp_path)
    wf = load_workflow(_wf(tmp_path, tiny_model("wan2.2-ti2v-5b"), f"""\
        - {{name: take, prompt: a red circle moving right, num_frames: 25,
           continuity: {{window_frames: 9, overlap_frames: {overlap}}},
           overrides: {{sampling.steps: 300, sampling.checkpoint_every: 1}}}}
        """, "steps:\n  stitch: {output: film.mp4}\n"))
    db = tmp_path / "q.db"
    ledger = Ledger(db)
    ids = ledger.submit(plan_jobs(wf))

    def worker():
        return queue_worker(db)
    # progress reaches the ledger with each heartbeat (a quarter of the 2 s lease): 300 steps keep the
    # second window running for several beats (a tiny step takes milliseconds on one thread)
    w, deadline, first = worker(), time.monotonic() + 240, None
    while time.monotonic() < deadline and w.poll() is None:
        time.sleep(0.05)
        if first is None and ledger.get(ids[0]).state == JobState.SUCCEEDED:
            st = Path(ledger.get(ids[0]).output).stat()
            first = (st.st_ino, st.st_mtime_ns)
        job = ledger.get(ids[1])
        if job.state == JobState.RUNNING and (job.progress or {}).get("step", 0) >= 3:
            w.send_signal(signal.SIGKILL)
            w.wait()
            break
    assert w.returncode == -signal.SIGKILL, "the second window never ran"
    w = worker()
    w.wait(timeout=240)
    jobs = [ledger.get(i) for i in ids]
    assert all(j.state == JobState.SUCCEEDED for j in jobs), [(j.name, j.state, j.error) for j in jobs]
    assert jobs[1].attempts == 2 and jobs[0].attempts == 1
    st = Path(jobs[0].output).stat()
    assert (st.st_ino, st.st_mtime_ns) == first                   # the first window was not rendered again
    assert read_video_info(wf.output_dir / "film.mp4")["frames"] == 25
