"""Takes and review gates (vidgen.queue.review): a shot's takes render and wait; the approved take alone goes
on (its full decode, its lossless last frame, the stitch); reroll adds a take, reject fails what follows;
decisions survive a killed worker or service."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vidgen
from vidgen.cli import main
from vidgen.errors import ConfigError, InputError
from vidgen.io import read_frames, read_video_info
from vidgen.paths import kept_frame_path, sidecar_path
from vidgen.queue.jobs import JobState
from vidgen.queue.ledger import Ledger
from vidgen.queue.workflow import load_workflow, plan_jobs
from vidgen.queue.worker import run_worker


def _workflow(tmp_path: Path, model: Path, review: str = "true", takes: str = "3") -> Path:
    """Shot `hero` with takes and review; `after` continues from hero's last frame; a stitch of both."""
    return _write(tmp_path, "rv", model, f"""\
        - {{name: hero, prompt: a red circle moving right, num_frames: 9, takes: {takes}, review: {review}}}
        - {{name: after, prompt: a red circle moving right, num_frames: 9, image: {{from: hero, frame: last}}}}
        """)


def _write(tmp_path: Path, name: str, model: Path, shots: str) -> Path:
    """A workflow `name` of `shots` on the tiny `model` (64x64, 8 fps, 2 steps, seed 3), stitched to film.mp4."""
    path = tmp_path / "wf.yaml"
    path.write_text(f"name: {name}\noutput_dir: out\ndefaults: {{model.path: {model}, model.device: cpu, size: 64x64, "
                    "fps: 8, sampling.steps: 2, seed: 3}\nshots:\n" + textwrap.indent(textwrap.dedent(shots), "  ")
                    + "steps:\n  stitch: {output: film.mp4}\n")
    return path


def _by_name(ledger: Ledger) -> dict:
    return {j.name: j for j in ledger.jobs()}


@pytest.fixture
def reviewed(tiny_model, tmp_path, monkeypatch):
    """The workflow submitted and run until it waits for review: (ledger, workflow)."""
    monkeypatch.chdir(tmp_path)
    wf = load_workflow(_workflow(tmp_path, tiny_model("wan2.2-ti2v-5b")))
    ledger = Ledger(tmp_path / "q.db")
    ledger.submit(plan_jobs(wf))
    run_worker(tmp_path / "q.db", exit_when_idle=True, lease_s=30)
    return ledger, wf


def test_takes_render_and_wait_then_the_approved_take_goes_on(reviewed, tmp_path):
    """3 takes (seeds 3, 4, 5) render as preview decodes and the shot waits; approving take 2 decodes its
    latents in full to the shot's own file, whose lossless last frame the next shot starts from, and the
    stitch shows it. The approval is recorded in the ledger and in the sidecar."""
    ledger, wf = reviewed
    jobs = _by_name(ledger)
    hero, after, stitch = jobs["rv/hero"], jobs["rv/after"], jobs["rv/stitch"]
    assert hero.state == JobState.AWAITING_REVIEW and hero.kind == "review"
    assert after.state == JobState.WAITING and stitch.state == JobState.WAITING
    takes = [jobs[f"rv/hero/take{k}"] for k in (1, 2, 3)]
    assert all(t.state == JobState.SUCCEEDED for t in takes)
    assert [t.payload["seed"] for t in takes] == [3, 4, 5]
    shot_file = Path(wf.shots[0].config.output.path)
    assert not shot_file.exists() and all(Path(t.output).exists() for t in takes)
    assert all(read_video_info(t.output)["frames"] == 9 for t in takes)

    ledger.approve(hero.id, 2, by="supervisor")
    assert ledger.get(hero.id).state == JobState.QUEUED
    run_worker(tmp_path / "q.db", exit_when_idle=True, lease_s=30)
    jobs = _by_name(ledger)
    assert all(jobs[n].state == JobState.SUCCEEDED for n in ("rv/hero", "rv/after", "rv/stitch"))
    side = json.loads(sidecar_path(shot_file).read_text())
    assert side["seed"] == 4 and side["job"]["review"]["take"] == 2 and side["job"]["review"]["by"] == "supervisor"
    assert ledger.get(hero.id).payload["approved"]["take"] == 2
    # The next shot starts from take 2's lossless last frame: take 2's latents decoded in full, exactly.
    again = vidgen.decode_latents(_latents(takes[1].output), **{"output.path": str(tmp_path / "check.mp4"),
                                                                "output.keep_frames": [-1]})
    check = np.asarray(Image.open(kept_frame_path(again.path, 8)))
    kept = np.asarray(Image.open(wf.shots[1].config.image))
    assert np.array_equal(kept, check)
    other = vidgen.decode_latents(_latents(takes[0].output), **{"output.path": str(tmp_path / "take1.mp4"),
                                                                "output.keep_frames": [-1]})
    assert not np.array_equal(kept, np.asarray(Image.open(kept_frame_path(other.path, 8))))
    film = np.asarray(list(read_frames(wf.output_dir / "film.mp4")), dtype=float)
    near = np.abs(film[:9] - np.asarray(list(read_frames(shot_file)))).mean()      # re-encoded: near, not equal
    assert len(film) == 18 and near < 4 < np.abs(film[:9] - np.asarray(list(read_frames(other.path)))).mean()


def _latents(output: str) -> Path:
    p = Path(output)
    return p.with_name(p.stem + ".latents.safetensors")


def test_reroll_adds_a_take_and_reject_fails_the_dependents(reviewed, tmp_path):
    ledger, wf = reviewed
    hero = _by_name(ledger)["rv/hero"]
    new = ledger.reroll(hero.id)
    assert ledger.get(hero.id).state == JobState.WAITING
    take = ledger.get(new)
    assert take.name == "rv/hero/take4" and take.payload["seed"] == 6 and take.state == JobState.QUEUED
    with pytest.raises(InputError, match="waiting-on-deps; it can be approved while awaiting_review"):
        ledger.approve(hero.id, 4)
    run_worker(tmp_path / "q.db", exit_when_idle=True, lease_s=30)
    hero = ledger.get(hero.id)
    assert hero.state == JobState.AWAITING_REVIEW and len(hero.payload["takes"]) == 4
    with pytest.raises(InputError, match="takes 1..4; 5 is not one"):
        ledger.approve(hero.id, 5)
    ledger.reject(hero.id, "the fox never leaves the frame")
    jobs = _by_name(ledger)
    assert jobs["rv/hero"].state == JobState.FAILED and "rejected in review: the fox" in jobs["rv/hero"].error
    assert jobs["rv/after"].state == JobState.FAILED and jobs["rv/stitch"].state == JobState.FAILED
    assert f"dependency #{hero.id} failed" in jobs["rv/after"].error


@pytest.mark.slow
def test_the_cli_approves_rerolls_and_rejects(reviewed, tmp_path, capsys):
    ledger, _ = reviewed
    hero = _by_name(ledger)["rv/hero"]
    db = ["queue", "--db", str(tmp_path / "q.db")]
    assert main([*db, "approve", str(hero.id), "7"]) == 2
    assert "takes 1..3; 7 is not one of them" in capsys.readouterr().err
    assert main([*db, "reroll", str(hero.id), "--seed", "42"]) == 0
    assert ledger.get(hero.id).payload["takes"][-1]["seed"] == 42
    run_worker(tmp_path / "q.db", exit_when_idle=True, lease_s=30)
    assert main([*db, "approve", str(hero.id), "4"]) == 0
    assert ledger.get(hero.id).payload["approved"]["take"] == 4


def test_review_settings_are_checked(tiny_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = tiny_model("wan2.2-ti2v-5b")
    for takes, review, message in (("3", "false", "takes: several takes need review: true"),
                                   ("0", "true", "takes: 0; give a count (1..64) or a list of seeds"),
                                   ("3", "{decode: fast}", "review.decode: 'fast'; use preview or full")):
        with pytest.raises(ConfigError) as e:
            load_workflow(_workflow(tmp_path, model, review, takes))
        assert any(message in p for p in e.value.problems), e.value.problems
    wf = load_workflow(_workflow(tmp_path, model, "{decode: full}", "[11, 42]"))
    jobs = plan_jobs(wf)
    assert [j.payload["seed"] for j in jobs[:2]] == [11, 42] and jobs[2].kind == "review"
    assert all(j.payload["output"]["decode"] == "full" for j in jobs[:2])
    assert jobs[3].deps == [2] and jobs[4].deps == [2, 3]


@pytest.mark.slow
def test_a_retried_upstream_shot_reopens_the_review_after_it(tiny_model, tmp_path, monkeypatch):
    """`base` -> `hero` (2 takes, reviewed, starting from base's last frame) -> stitch, all done with take 1
    approved. Running `base` again sends everything after it back: hero's takes render again from the new
    frame and its review opens again (the approval cleared); the earlier files are set aside, not lost."""
    monkeypatch.chdir(tmp_path)
    model = tiny_model("wan2.2-ti2v-5b")
    path = _write(tmp_path, "up", model, """\
        - {name: base, prompt: a red circle moving right, num_frames: 9}
        - {name: hero, prompt: a red circle, num_frames: 9, takes: 2, review: true, image: {from: base, frame: last}}
        """)
    ledger, db = Ledger(tmp_path / "q.db"), tmp_path / "q.db"
    ledger.submit(plan_jobs(load_workflow(path)))
    run_worker(db, exit_when_idle=True, lease_s=30)
    jobs = _by_name(ledger)
    ledger.approve(jobs["up/hero"].id, 1, by="a")
    run_worker(db, exit_when_idle=True, lease_s=30)
    assert all(j.state == JobState.SUCCEEDED for j in ledger.jobs())
    film = tmp_path / "out" / "film.mp4"
    before = film.read_bytes()

    assert main(["queue", "--db", str(db), "retry", str(jobs["up/base"].id)]) == 0
    jobs = _by_name(ledger)
    assert jobs["up/base"].state == JobState.QUEUED and jobs["up/hero"].payload.get("approved") is None
    assert all(jobs[n].state == JobState.WAITING for n in ("up/hero/take1", "up/hero/take2", "up/hero", "up/stitch"))
    assert not film.exists() and [p.read_bytes() for p in (tmp_path / "out").glob("film.superseded-*.mp4")] == [before]
    assert len(list((tmp_path / "out" / "shots").glob("02-hero.take1.superseded-*.mp4"))) == 1
    run_worker(db, exit_when_idle=True, lease_s=30)
    jobs = _by_name(ledger)
    assert jobs["up/hero"].state == JobState.AWAITING_REVIEW
    assert jobs["up/hero/take1"].state == JobState.SUCCEEDED and jobs["up/hero/take1"].attempts == 1
    ledger.approve(jobs["up/hero"].id, 2)
    run_worker(db, exit_when_idle=True, lease_s=30)
    assert all(j.state == JobState.SUCCEEDED for j in ledger.jobs()) and film.exists()
    side = json.loads(sidecar_path(tmp_path / "out" / "shots" / "02-hero.mp4").read_text())
    assert side["job"]["review"]["take"] == 2


@pytest.mark.slow
def test_killed_worker_and_service_lose_no_take_and_no_decision(reviewed, tmp_path):
    """The service SIGKILLed right after it answered an approval: the approval is in the ledger. A worker
    SIGKILLed while it decodes the approved take: the takes are untouched, the approval stands, and the
    next worker (once the lease runs out) finishes the shot."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    ledger, wf = reviewed
    hero = _by_name(ledger)["rv/hero"]
    takes = {t: Path(t).read_bytes() for t in (x["output"] for x in hero.payload["takes"])}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    db = tmp_path / "q.db"
    server = subprocess.Popen([sys.executable, "-m", "vidgen", "queue", "--db", str(db), "serve", "--port", str(port),
                               "--root", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(url + "/api/jobs", timeout=5)
                break
            except OSError:
                time.sleep(0.1)
        req = urllib.request.Request(f"{url}/api/jobs/{hero.id}/approve", data=json.dumps({"take": 2}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            assert json.loads(r.read())["state"] == "queued"
        os.kill(server.pid, signal.SIGKILL)
    finally:
        server.kill()
        server.wait()
    assert Ledger(db).get(hero.id).payload["approved"]["take"] == 2 and Ledger(db).integrity_check() == "ok"
    assert "approve take 2 by 127.0.0.1" in " ".join(text for _, _, text in Ledger(db).logs(hero.id))

    worker = subprocess.Popen([sys.executable, "-m", "vidgen", "queue", "--db", str(db), "worker", "--exit-when-idle",
                               "--lease", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while Ledger(db).get(hero.id).state != JobState.RUNNING and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.kill()
    worker.wait()
    assert Ledger(db).get(hero.id).state == JobState.RUNNING        # its lease has not run out yet
    assert {t: Path(t).read_bytes() for t in takes} == takes
    time.sleep(2.5)
    run_worker(db, exit_when_idle=True, lease_s=30)
    jobs = _by_name(ledger)
    assert all(jobs[n].state == JobState.SUCCEEDED for n in ("rv/hero", "rv/after", "rv/stitch"))
    assert jobs["rv/hero"].attempts == 2 and jobs["rv/hero"].payload["approved"]["take"] == 2
    assert json.loads(sidecar_path(Path(wf.shots[0].config.output.path)).read_text())["seed"] == 4
    assert {t: Path(t).read_bytes() for t in takes} == takes
