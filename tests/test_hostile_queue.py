"""Hostile input to the render queue: submit runs every check a worker would, outputs are never
replaced, writes stay inside output_dir at the moment they happen (links made after submit too), a
job knows its own finished file, and a damaged checkpoint costs a restart, not the job."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
import yaml
from hostile import assert_refused, untouched
from test_queue import _drain

from vidgen.cli import main
from vidgen.queue.executor import Executor, _render
from vidgen.queue.ledger import JobSpec, Ledger
from vidgen.queue.workflow import load_workflow, plan_jobs, plan_single

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _cli(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr().err


@pytest.fixture
def workflow(tiny_model, tmp_path, monkeypatch):
    """write(extra_top_level='') -> a two-shot tiny workflow writing under tmp_path/out, with stitch and sheet."""
    monkeypatch.chdir(tmp_path)

    def write(extra: str = "", name: str = "wf.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(f"""\
            name: hostile
            output_dir: out
            defaults: {{model.path: {tiny_model()}, model.device: cpu, size: 32x32, fps: 8, num_frames: 5,
                        sampling.steps: 2, sampling.checkpoint_every: 1}}
            shots:
              - {{name: one, prompt: a red circle moving right, seed: 1}}
              - {{name: two, prompt: a blue square moving up, seed: 2}}
            steps:
              stitch: {{output: film/all.mp4}}
              contact_sheet: {{output: sheet.png}}
            """) + extra)
        return path
    return write


# ------------------------------------------------------------------------------- 1, 26. submit refuses

@pytest.mark.parametrize("existing", ["out/film/all.mp4", "out/sheet.png", "out/shots/01-one.mp4"])
def test_submit_refuses_an_existing_output(capsys, workflow, tmp_path, tiny_model, existing):
    wf = workflow()
    (tmp_path / existing).parent.mkdir(parents=True)
    (tmp_path / existing).write_bytes(b"a film the user made")
    db = tmp_path / "q.db"
    with untouched(tmp_path, tiny_model()):
        code, err = _cli(capsys, "queue", "--db", str(db), "submit", str(wf))
    assert_refused(code, err, "already exists", existing.split("/")[-1])


def test_overwrite_lets_a_workflow_replace_its_outputs(workflow, tmp_path):
    wf = workflow("overwrite: true\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "sheet.png").write_bytes(b"last run's sheet")
    jobs = plan_jobs(load_workflow(wf))
    assert all(j.payload["output"]["overwrite"] if j.kind == "render" else j.payload["overwrite"] for j in jobs)


@pytest.mark.parametrize("override, needle", [
    ("model.path=/nonexistent/wan", "does not exist"),
    ("image=x.png", "text-to-video model"),             # needs the model folder's JSON to know
    ("num_frames=129", "rotary"),
])
def test_submit_runs_the_weight_free_checks(capsys, workflow, tmp_path, tiny_model, override, needle):
    from PIL import Image

    wf = workflow()
    Image.new("RGB", (32, 32)).save(tmp_path / "x.png")
    with untouched(tmp_path, tiny_model()):
        code, err = _cli(capsys, "queue", "--db", str(tmp_path / "q.db"), "submit", str(wf), override)
    assert_refused(code, err, needle)


def test_submit_refuses_resolvers_in_a_workflow(capsys, workflow, tmp_path, monkeypatch):
    monkeypatch.setenv("VIDGEN_TEST_SECRET", "hunter2")
    wf = workflow()
    wf.write_text(wf.read_text().replace("name: hostile", "name: ${oc.env:VIDGEN_TEST_SECRET}"))
    with untouched(tmp_path):
        code, err = _cli(capsys, "queue", "--db", str(tmp_path / "q.db"), "submit", str(wf))
    line = assert_refused(code, err, "calls a resolver")
    assert "hunter2" not in line


# ------------------------------------------------------------------------------- 7. links made after submit

def test_a_link_made_after_submit_cannot_redirect_a_write(workflow, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    ledger = Ledger(tmp_path / "q.db")
    ledger.submit(plan_jobs(load_workflow(workflow())))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "shots").symlink_to(outside)                # shots -> outside output_dir
    (tmp_path / "out" / "film").symlink_to(outside)
    ex = Executor(ledger, "w")
    _drain(ledger, ex)
    assert os.listdir(outside) == []                                 # nothing was written through the links
    jobs = ledger.jobs()
    assert [j.state.value for j in jobs[:2]] == ["failed", "failed"]
    assert "outside" in jobs[0].error and "symbolic link" in jobs[0].error


def test_a_link_made_after_submit_cannot_redirect_the_stitch(workflow, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    ledger = Ledger(tmp_path / "q.db")
    ledger.submit(plan_jobs(load_workflow(workflow())))
    ex = Executor(ledger, "w")
    while (job := ledger.claim("w", 30, kinds=["render"])) is not None:     # the shots render normally
        assert ex.execute(job) == "succeeded"
    (tmp_path / "out" / "film").symlink_to(outside)
    (tmp_path / "out" / "sheet.png").symlink_to(outside / "sheet.png")
    _drain(ledger, ex)
    assert os.listdir(outside) == []
    stitch, sheet = ledger.jobs()[2:]
    assert stitch.state.value == "failed" and "symbolic link" in stitch.error
    assert sheet.state.value == "failed" and "symbolic link" in sheet.error


# ------------------------------------------------------------------------------- 3. a job knows its own file

def test_a_file_another_job_wrote_is_not_this_jobs(base_cfg, tmp_path):
    out = tmp_path / "out" / "clip.mp4"
    ledger = Ledger(tmp_path / "q.db")
    spec = JobSpec(kind="render", payload=base_cfg(), name="a", output=str(out))
    [first] = ledger.submit([spec])
    ex = Executor(ledger, "w")
    assert _drain(ledger, ex) == ["succeeded"]
    video = out.read_bytes()
    assert json.loads(Path(f"{out}.json").read_text())["job"]["id"] == first
    [second] = ledger.submit([JobSpec(kind="render", payload=base_cfg(), name="b", output=str(out))])
    assert _drain(ledger, ex) == ["failed"]                         # not "succeeded" on the first's file
    assert "already exists" in ledger.get(second).error and out.read_bytes() == video
    # the first job, delivered again (its worker died after the rename), recognises its own file
    job = ledger.get(first)
    assert _render(ex, job) == (str(out), {"reused": True})


def test_submit_refuses_an_output_a_live_job_holds(capsys, base_cfg, tmp_path):
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(base_cfg()))
    db = str(tmp_path / "q.db")
    assert main(["queue", "--db", db, "submit", str(path)]) == 0
    capsys.readouterr()
    with untouched(tmp_path):
        code, err = _cli(capsys, "queue", "--db", db, "submit", str(path))
    assert_refused(code, err, "is already the output of job #1")



@pytest.mark.parametrize("other", ["x.mkv", pytest.param("x", marks=pytest.mark.slow), "x.webm"])    # quick loop: 2
def test_submit_refuses_a_job_whose_derived_files_a_live_job_writes(capsys, base_cfg, tmp_path, other):
    """x.mp4, x.mkv and the PNG frames x share x.latents.safetensors and x.resume.safetensors: with
    two workers they would overwrite each other's checkpoints."""
    db = str(tmp_path / "q.db")
    for name, out in (("one", "x.mp4"), ("two", other)):
        codec = {"codec": "png"} if "." not in out else {}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(base_cfg(output={"path": str(tmp_path / "out" / out),
                                                                                **codec})))
    assert main(["queue", "--db", db, "submit", str(tmp_path / "one.yaml")]) == 0
    capsys.readouterr()
    with untouched(tmp_path):
        code, err = _cli(capsys, "queue", "--db", db, "submit", str(tmp_path / "two.yaml"))
    assert_refused(code, err, f"both write {tmp_path}/out/x.latents.safetensors (the latents)",
                   "choose another output name or cancel #1")

# ------------------------------------------------------------------------------- 13. damaged checkpoints

def test_a_damaged_checkpoint_is_set_aside_and_the_job_restarts(base_cfg, tmp_path):
    out = tmp_path / "out" / "clip.mp4"
    ledger = Ledger(tmp_path / "q.db")
    ledger.submit([JobSpec(kind="render", payload=base_cfg(), name="a", output=str(out))])
    out.parent.mkdir()
    (out.parent / "clip.resume.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    assert _drain(ledger, Executor(ledger, "w")) == ["succeeded"]
    aside = [p.name for p in out.parent.iterdir() if ".damaged-" in p.name]
    assert len(aside) == 1 and aside[0].startswith("clip.resume.safetensors.damaged-")
    assert any("set the checkpoint aside" in text for _, _, text in ledger.logs(1))


# ------------------------------------------------------------------------------- 21. braces in a queued path

def test_escaped_braces_in_a_queued_output_path(base_cfg, tmp_path):
    cfg = base_cfg(output={"path": str(tmp_path / "out" / "{{draft}}-{seed}.mp4")})
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(cfg))
    [spec] = plan_single(path)
    assert spec.output == str(tmp_path / "out" / "{draft}-7.mp4")
    ledger = Ledger(tmp_path / "q.db")
    ledger.submit([spec])
    assert _drain(ledger, Executor(ledger, "w")) == ["succeeded"]
    assert (tmp_path / "out" / "{draft}-7.mp4").is_file()


# ------------------------------------------------------------------------------- 23. resume of a running job

def test_resume_of_a_running_job_is_refused(capsys, base_cfg, tmp_path):
    db = tmp_path / "q.db"
    ledger = Ledger(db)
    ledger.submit([JobSpec(kind="render", payload=base_cfg(), name="a", output=str(tmp_path / "x.mp4"))])
    ledger.claim("w", 60)
    code, err = _cli(capsys, "queue", "--db", str(db), "resume", "1")
    assert_refused(code, err, "job #1 is running, not paused; nothing to resume")
    ledger.pause(1)
    assert main(["queue", "--db", str(db), "resume", "1"]) == 0
    assert capsys.readouterr().out.strip() == "#1: pause withdrawn"


def test_stitch_and_sheet_jobs_refuse_an_output_that_appeared_after_submit(workflow, tmp_path):
    ledger = Ledger(tmp_path / "q.db")
    ledger.submit(plan_jobs(load_workflow(workflow())))
    ex = Executor(ledger, "w")
    while (job := ledger.claim("w", 30, kinds=["render"])) is not None:
        assert ex.execute(job) == "succeeded"
    (tmp_path / "out" / "film").mkdir()
    (tmp_path / "out" / "film" / "all.mp4").write_bytes(b"the user's film")
    (tmp_path / "out" / "sheet.png").write_bytes(b"the user's sheet")
    with untouched(tmp_path / "out" / "film", tmp_path / "out" / "sheet.png"):
        assert _drain(ledger, ex) == ["failed", "failed"]
    for job in ledger.jobs()[2:]:
        assert "already exists" in job.error and "`overwrite: true` in the workflow" in job.error
