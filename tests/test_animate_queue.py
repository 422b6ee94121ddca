"""Animate in a workflow: a shot's performance from another shot ({from: SHOT}), checked at submit against
the video that shot will write, and a worker killed mid-segment losing nothing."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from test_continuity import queue_worker
from vidgen.errors import ConfigError
from vidgen.io import read_frames, read_video_info
from vidgen.queue.api import check_specs
from vidgen.queue.workflow import load_workflow, plan_jobs
from vidgen.tiny import TINY_FACE


def _inputs(tmp_path: Path, frames: int = 9) -> tuple[str, str]:
    """(a character reference, a face video of `frames` 16x16 PNG frames)."""
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(tmp_path / "char.png")
    face = tmp_path / "face"
    face.mkdir()
    for i in range(frames):
        Image.fromarray(rng.integers(0, 256, (TINY_FACE, TINY_FACE, 3), dtype=np.uint8)).save(face / f"f{i:03d}.png")
    return str(tmp_path / "char.png"), str(face)


def _workflow(tmp_path: Path, tiny_model, animate_shot: str, extra: str = "") -> Path:
    """A rig pass (a 9-frame tiny T2V render standing in for a skeleton render) and an Animate shot."""
    path = tmp_path / "wf.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: perf
        output_dir: out
        defaults: {{model.path: {tiny_model("wan2.2-animate-14b")}, model.device: cpu, size: 32x32, fps: 8,
                    sampling.steps: 2, seed: 3, output.save_latents: false}}
        shots:
          - {{name: rig, prompt: a red circle moving right, num_frames: 9,
              overrides: {{model.path: {tiny_model("wan2.1-t2v")}}}}}
        """) + textwrap.indent(textwrap.dedent(animate_shot), "  ") + extra)
    return path


def test_a_performance_from_another_shot_is_its_video_and_waits_for_it(tiny_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    char, face = _inputs(tmp_path)
    wf = load_workflow(_workflow(tmp_path, tiny_model, f"""\
        - name: fox
          prompt: a fox dancing
          image: {char}
          animate: {{pose_video: {{from: rig}}, face_video: {face}, segment_frames: 5, overlap_frames: 1}}
        """))
    rig, fox = wf.shots
    assert fox.config.animate.pose_video == rig.config.output.path and fox.deps == [0]
    assert fox.config.num_frames == 81          # as configured; preflight takes the pose video's length
    jobs = plan_jobs(wf)
    assert jobs[1].deps == [0]
    check_specs(jobs)           # the rig's video does not exist yet: its size and length stand in for it


def test_performance_refusals(tiny_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    char, face = _inputs(tmp_path, frames=7)
    for animate, needle in (("{pose_video: {from: rig, frame: last}, face_video: FACE}",
                             "shots[1].animate.pose_video: frame: unknown key"),
                            ("{pose_video: {from: nobody}, face_video: FACE}", "pose_video.from: 'nobody' is not a shot"),
                            ("{pose_video: {from: fox}, face_video: FACE}", "'fox' is this shot")):
        with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace("[", r"\[")):
            load_workflow(_workflow(tmp_path, tiny_model, f"""\
                - name: fox
                  prompt: a fox dancing
                  image: {char}
                  animate: {animate.replace("FACE", face)}
                """))
    wf = load_workflow(_workflow(tmp_path, tiny_model, f"""\
        - name: fox
          prompt: a fox dancing
          image: {char}
          animate: {{pose_video: {{from: rig}}, face_video: {face}, segment_frames: 5}}
        """))
    with pytest.raises(ConfigError, match="animate.face_video: 7 frames, animate.pose_video has 9"):
        check_specs(plan_jobs(wf))


@pytest.mark.slow
def test_a_worker_killed_mid_segment_loses_nothing(tiny_model, tmp_path, monkeypatch):
    """The Animate shot's worker is SIGKILLed in its second segment; a new worker continues it from its
    checkpoint (the first segment not sampled again), and the video equals an uninterrupted render's."""
    import signal
    import time

    import vidgen
    from vidgen.queue.ledger import JobState, Ledger

    monkeypatch.chdir(tmp_path)
    char, face = _inputs(tmp_path)
    shot = f"""\
        - name: fox
          prompt: a fox dancing
          image: {char}
          animate: {{pose_video: {{from: rig}}, face_video: {face}, segment_frames: 5, overlap_frames: 1}}
          overrides: {{sampling.steps: 200, sampling.checkpoint_every: 1}}
        """
    jobs = plan_jobs(load_workflow(_workflow(tmp_path, tiny_model, shot)))
    db = tmp_path / "q.db"
    ledger = Ledger(db)
    ids = ledger.submit(jobs)
    w, deadline, killed = queue_worker(db), time.monotonic() + 300, False
    while time.monotonic() < deadline and w.poll() is None:
        time.sleep(0.05)
        job = ledger.get(ids[1])
        if job.state == JobState.RUNNING and (job.progress or {}).get("step", 0) >= 210:     # segment 2, step 10
            w.send_signal(signal.SIGKILL)
            w.wait()
            killed = True
            break
    assert killed, "the Animate job never reached its second segment"
    checkpoint = Path(jobs[1].output).with_name("02-fox.resume.safetensors")
    assert checkpoint.is_file()
    w = queue_worker(db)
    w.wait(timeout=300)
    done = [ledger.get(i) for i in ids]
    assert all(j.state == JobState.SUCCEEDED for j in done), [(j.name, j.state, j.error) for j in done]
    assert done[1].attempts == 2 and not checkpoint.exists()
    again = vidgen.render({**jobs[1].payload, "output": {**jobs[1].payload["output"],
                                                         "path": str(Path(jobs[1].output).with_name("again.mp4"))}})
    assert read_video_info(done[1].output)["frames"] == 9 == again.num_frames
    a, b = list(read_frames(done[1].output)), list(read_frames(again.path))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def _reviewed(tmp_path: Path, tiny_model):
    """The rig pass and an Animate shot of two takes, reviewed."""
    char, face = _inputs(tmp_path)
    return load_workflow(_workflow(tmp_path, tiny_model, f"""\
        - name: fox
          prompt: a fox dancing
          image: {char}
          animate: {{pose_video: {{from: rig}}, face_video: {face}, segment_frames: 5}}
          takes: 2
          review: true
        """))


def test_takes_and_review_apply_to_an_animate_shot(tiny_model, tmp_path, monkeypatch):
    """Two takes of an Animate shot (seeds 3 and 4) and its review job, planned and checked as any shot's."""
    monkeypatch.chdir(tmp_path)
    wf = _reviewed(tmp_path, tiny_model)
    jobs = plan_jobs(wf)
    kinds = [(j.kind, j.payload.get("seed") if j.kind == "render" else None) for j in jobs]     # rig, 2 takes, review
    assert kinds == [("render", 3), ("render", 3), ("render", 4), ("review", None)], kinds
    assert all(j.payload["animate"]["pose_video"] == wf.shots[0].config.output.path for j in jobs[1:3])
    check_specs(jobs)


@pytest.mark.slow
def test_a_reviewed_animate_shot_goes_on_with_the_approved_take(tiny_model, tmp_path, monkeypatch):
    """Two takes render and wait; approving take 2 decodes its segments' latents to the shot's own file:
    the frames of take 2's review copy, exactly."""
    from vidgen.queue.jobs import JobState
    from vidgen.queue.ledger import Ledger
    from vidgen.queue.worker import run_worker

    monkeypatch.chdir(tmp_path)
    wf = _reviewed(tmp_path, tiny_model)
    ledger = Ledger(tmp_path / "q.db")
    ids = ledger.submit(plan_jobs(wf))
    run_worker(tmp_path / "q.db", exit_when_idle=True, lease_s=30)
    review = ledger.get(ids[-1])
    assert review.state == JobState.AWAITING_REVIEW, [(j.name, j.state, j.error) for j in ledger.jobs()]
    take2 = ledger.get(ids[2])
    ledger.approve(review.id, 2, by="director")
    run_worker(tmp_path / "q.db", exit_when_idle=True, lease_s=30)
    done = ledger.get(review.id)
    assert done.state == JobState.SUCCEEDED, done.error
    shot, copy = list(read_frames(wf.shots[1].config.output.path)), list(read_frames(take2.output))
    assert len(shot) == len(copy) == 9 and all(np.array_equal(a, b) for a, b in zip(shot, copy))

