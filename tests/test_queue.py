"""The queue end to end: warm models, cancel/pause/resume, guard blocks, dependencies, workers that
die (local processes and Ray actors), and the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from vidgen.queue import api
from vidgen.queue.executor import Executor
from vidgen.queue.ledger import JobSpec, JobState, Ledger
from vidgen.queue.workflow import load_workflow, plan_jobs

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _render_specs(base_cfg, tmp_path, n: int, **extra) -> list[JobSpec]:
    specs = []
    for i in range(n):
        cfg = base_cfg(seed=i, output={"path": str(tmp_path / "out" / f"shot{i:02d}.mp4")}, **extra)
        specs.append(JobSpec(kind="render", payload=cfg, name=f"shot{i}", output=cfg["output"]["path"]))
    return specs


def _drain(ledger: Ledger, ex: Executor) -> list[str]:
    outcomes = []
    while (job := ledger.claim(ex.owner, 30)) is not None:
        outcomes.append(ex.execute(job))
    return outcomes


@pytest.fixture
def loads(monkeypatch):
    """The plans Pipeline.load is called with, in order (counted here, not by the product)."""
    from vidgen.pipeline import Pipeline

    seen, real = [], Pipeline.load.__func__
    monkeypatch.setattr(Pipeline, "load", classmethod(lambda cls, plan, **kw: seen.append(plan) or real(cls, plan, **kw)))
    return seen


def test_same_model_loads_once_per_worker(base_cfg, tmp_path, loads):
    ledger = Ledger(tmp_path / "q.db")
    ledger.submit(_render_specs(base_cfg, tmp_path, 3))
    ex = Executor(ledger, "w1", lease_s=30)
    assert _drain(ledger, ex) == ["succeeded"] * 3
    assert len(loads) == 1
    assert all(Path(j.output).exists() for j in ledger.jobs())


def test_cancel_and_pause_a_running_job_then_resume_from_its_checkpoint(base_cfg, tmp_path, loads):
    ledger = Ledger(tmp_path / "q.db")
    many_steps = {"steps": 12, "checkpoint_every": 100, "guidance_scale": 4.0, "schedule": "diffusers"}
    a, b = ledger.submit(_render_specs(base_cfg, tmp_path, 2, sampling=many_steps))
    ex = Executor(ledger, "w1", lease_s=30, heartbeat_s=0.05)
    job = ledger.claim("w1", 30)
    assert job.id == a
    ledger.cancel(a)                                    # requested while running: seen at the next step
    assert ex.execute(job) == "canceled" and ledger.get(a).state == JobState.CANCELED

    job = ledger.claim("w1", 30)
    steps_seen = []
    original = ex.progress

    def pause_midway(p):
        if p.stage == "denoise":
            steps_seen.append(p.step)
            if p.step == 5:
                ledger.pause(b)
                time.sleep(0.3)                          # let the heartbeat carry the request
        original(p)

    ex.progress = pause_midway
    assert ex.execute(job) == "paused" and ledger.get(b).state == JobState.PAUSED
    out = Path(ledger.get(b).payload["output"]["path"])
    assert out.with_name(out.stem + ".resume.safetensors").exists() and not out.exists()
    ledger.resume(b)
    ex.progress = original
    job = ledger.claim("w1", 30)
    assert ex.execute(job) == "succeeded" and out.exists()
    assert any("resuming job" in text for _, _, text in ledger.logs(b))
    assert len(loads) == 1


def test_guard_block_is_not_retried_and_fails_dependents(base_cfg, tmp_path):
    ledger = Ledger(tmp_path / "q.db")
    specs = _render_specs(base_cfg, tmp_path, 1, guard={"enabled": True, "frames": False, "photosensitivity": False})
    specs[0].payload["prompt"] = "a p0rn clip"
    specs.append(JobSpec(kind="stitch", payload={"inputs": [specs[0].output], "output": str(tmp_path / "all.mp4"),
                                                  "fps": 8, "crossfade_frames": 0},
                         deps=[0], output=str(tmp_path / "all.mp4")))
    shot, stitch = ledger.submit(specs)
    ex = Executor(ledger, "w1", lease_s=30)
    assert _drain(ledger, ex) == ["blocked-by-guard"]
    assert ledger.get(shot).attempts == 1 and "rule 'explicit'" in ledger.get(shot).error
    assert ledger.get(stitch).state == JobState.FAILED and f"#{shot}" in ledger.get(stitch).error


def _workflow(base_cfg, tmp_path, shots: int, steps: int = 2) -> Path:
    cfg = base_cfg()
    cfg.pop("output")
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(cfg))
    wf = {"name": "reliability", "output_dir": str(tmp_path / "film"),
          "defaults": {"config": str(tmp_path / "tiny.yaml"), "sampling.steps": steps},
          "shots": [{"name": f"s{i:02d}", "prompt": cfg["prompt"], "seed": i} for i in range(shots)],
          "steps": {"stitch": {"output": "film.mp4"}}}
    path = tmp_path / "wf.yaml"
    path.write_text(yaml.safe_dump(wf))
    return path


def _one_thread() -> dict[str, str]:
    """The environment for worker processes run side by side: one torch thread each (several workers
    with torch's default threads thrash on a 2-core machine)."""
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _worker(db: Path, lease: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "vidgen", "queue", "--db", str(db), "worker", "--exit-when-idle",
                             "--lease", str(lease)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=_one_thread())


def _first_frames_in_order(film: Path, shots: list[Path]) -> None:
    import numpy as np

    from vidgen.io import read_frames

    frames = list(read_frames(film))
    starts = [0]
    for s in shots:
        starts.append(starts[-1] + len(list(read_frames(s))))
    assert len(frames) == starts[-1]
    for s, i in zip(shots, starts):
        first = next(iter(read_frames(s)))
        assert np.abs(frames[i].astype(int) - first.astype(int)).mean() < 3, s


@pytest.mark.slow
def test_reliability_workers_killed_mid_job(base_cfg, tmp_path):
    """40 renders + a stitch, 3 worker processes, two of them SIGKILLed mid-job again and again:
    every job succeeds, none is lost, no finished output is written twice, the ledger is intact."""
    db = tmp_path / "q.db"
    ledger = Ledger(db)
    ids = ledger.submit(plan_jobs(load_workflow(_workflow(base_cfg, tmp_path, 40))))
    lease = 2.0
    workers = [_worker(db, lease) for _ in range(3)]
    finished: dict[int, tuple[int, float]] = {}          # job -> (inode, mtime) when first seen done
    kills, deadline = 0, time.monotonic() + 420
    while time.monotonic() < deadline:
        time.sleep(0.5)
        for j in ledger.jobs(JobState.SUCCEEDED):
            st = Path(j.output).stat()
            finished.setdefault(j.id, (st.st_ino, st.st_mtime_ns))
        # kill a worker that is mid-job, on a job in its first attempt (each death costs the job an
        # attempt, and a job may have 3)
        # (not only one with progress: a 2-step job can end before its first beat carries any)
        running = [j for j in ledger.jobs(JobState.RUNNING) if j.attempts == 1]
        if kills < 6 and running:
            pid = int(running[0].lease_owner.split(":")[1])
            victim = next((w for w in workers[:2] if w.pid == pid and w.poll() is None), None)
            if victim is not None:
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                kills += 1
                workers[workers.index(victim)] = _worker(db, lease)     # a replacement joins
        if all(w.poll() is not None for w in workers):
            break
    for w in workers:
        if w.poll() is None:
            w.kill()
    jobs = {j.id: j for j in ledger.jobs()}
    assert kills >= 2
    assert sorted(jobs) == sorted(ids) and all(j.state == JobState.SUCCEEDED for j in jobs.values()), \
        {j.id: (j.state.value, j.error) for j in jobs.values() if j.state != JobState.SUCCEEDED}
    for j in jobs.values():
        st = Path(j.output).stat()
        assert (st.st_ino, st.st_mtime_ns) == finished.get(j.id, (st.st_ino, st.st_mtime_ns)), j.id
    assert ledger.integrity_check() == "ok"
    shots = [Path(jobs[i].output) for i in ids[:40]]
    _first_frames_in_order(Path(jobs[ids[40]].output), shots)


@pytest.mark.slow
def test_ray_actor_killed_mid_job(base_cfg, tmp_path):
    ray = pytest.importorskip("ray", reason="the Ray backend needs pip install 'vidgen[ray]'")
    from vidgen.queue.ray_backend import run_ray_dispatcher

    db = tmp_path / "q.db"
    ledger = Ledger(db)
    # shot 0 runs 120 steps, long enough to span several of the dispatcher's heartbeats (every
    # 0.5 s), so its progress must reach the ledger while it runs; the others run 30
    wf = _workflow(base_cfg, tmp_path, 6, steps=30)
    spec = yaml.safe_load(wf.read_text())
    spec["shots"][0]["overrides"] = {"sampling.steps": 120}
    wf.write_text(yaml.safe_dump(spec))
    ids = ledger.submit(plan_jobs(load_workflow(wf)))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        killed, seen = [], []

        def killer(actors):
            import threading

            def watch():
                end = time.monotonic() + 120
                while time.monotonic() < end and not (killed and seen):
                    seen.extend(j.id for j in ledger.jobs(JobState.RUNNING) if j.progress)
                    if not killed:
                        try:         # the actor's own progress: it is mid-sampling right now
                            p = ray.get(actors[0].progress.remote(), timeout=5)
                        except Exception:
                            p = None
                        if p and p["stage"] == "denoise" and p["step"] < p["total"] - 3:
                            ray.kill(actors[0], no_restart=True)
                            killed.append(p)
                    time.sleep(0.05)
            threading.Thread(target=watch, daemon=True).start()

        counts = run_ray_dispatcher(db, num_actors=2, exit_when_idle=True, lease_s=2, poll_s=0.1, on_start=killer)
    finally:
        ray.shutdown()
    jobs = ledger.jobs()
    assert killed and counts["actor_deaths"] >= 1, (killed, counts)
    assert seen, "no running job showed progress in the ledger"
    assert all(j.state == JobState.SUCCEEDED for j in jobs), {j.id: (j.state.value, j.error) for j in jobs}
    _first_frames_in_order(Path(ledger.get(ids[-1]).output), [Path(ledger.get(i).output) for i in ids[:6]])


def _broken_environment(tmp_path: Path, module: str = "diffusers.models.transformers.transformer_wan") -> dict[str, str]:
    """A worker environment in which `module` does not import. The default, diffusers' Wan
    transformer, fails as when a folder on sys.path shadowed Hugging Face's `kernels` (issue 34):
    the worker starts, every render fails at its model load."""
    site = tmp_path / "broken-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "class Refuse:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name == {module!r}:\n"
        "            raise ImportError('broken on purpose: ' + name)\n"
        "sys.meta_path.insert(0, Refuse())\n")
    return {**_one_thread(), "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.slow
def test_worker_stops_when_its_environment_fails_every_job(base_cfg, tmp_path):
    """Every job failing for one reason of the machine (here an ImportError) is the worker's problem,
    not the jobs': it gives them back uncounted and stops, non-zero, with one line saying why."""
    from vidgen.queue.executor import ENVIRONMENT_STREAK

    db = tmp_path / "q.db"
    ledger = Ledger(db)
    ids = ledger.submit(_render_specs(base_cfg, tmp_path, 2))
    done = subprocess.run([sys.executable, "-m", "vidgen", "queue", "--db", str(db), "worker", "--exit-when-idle"],
                          capture_output=True, text=True, timeout=300, env=_broken_environment(tmp_path))
    errors = [line for line in done.stderr.splitlines() if line.startswith("vidgen: error:")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"worker stopped: {ENVIRONMENT_STREAK} attempts in a row" in errors[0], errors[0]
    assert "broken on purpose: diffusers.models.transformers.transformer_wan" in errors[0], errors[0]
    for i in ids:                      # not burned: queued, no attempt counted, the reason in its log
        job = ledger.get(i)
        assert job.state == JobState.QUEUED and job.attempts == 0 and job.lease_owner is None, job
    assert any("broken on purpose" in text for i in ids for _, _, text in ledger.logs(i))
    assert not any(Path(j.output).exists() for j in ledger.jobs())


@pytest.mark.slow
@pytest.mark.parametrize("broken", ["diffusers.models.transformers.transformer_wan", "vidgen.queue.executor"])
def test_ray_dispatcher_stops_when_its_actors_environment_fails_every_job(base_cfg, tmp_path, broken):
    """The same with Ray: jobs failing for want of a module in the actors (or actors that cannot start)
    are given back uncounted, and the dispatcher stops with the reason instead of burning them."""
    ray = pytest.importorskip("ray", reason="the Ray backend needs its extra")
    from vidgen.errors import EnvironmentProblem
    from vidgen.queue.ray_backend import run_ray_dispatcher

    db = tmp_path / "q.db"
    ledger = Ledger(db)
    ids = ledger.submit(_render_specs(base_cfg, tmp_path, 2))
    env = _broken_environment(tmp_path, broken)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {k: env[k] for k in ("PYTHONPATH", "OMP_NUM_THREADS")}})
    try:
        with pytest.raises(EnvironmentProblem, match=f"worker stopped: .*broken on purpose: {broken}"):
            run_ray_dispatcher(db, num_actors=1, exit_when_idle=True, lease_s=10, poll_s=0.1)
    finally:
        ray.shutdown()
    for i in ids:
        job = ledger.get(i)
        assert job.state == JobState.QUEUED and job.attempts == 0 and job.lease_owner is None, job


def test_environment_failures_in_a_row_stop_an_executor_other_outcomes_break_the_row(base_cfg, tmp_path):
    """The streak: only one reason in a row counts; a success or another failure starts it again;
    a job failing for want of a package goes back to the queue uncounted, a bad config still fails."""
    from vidgen.errors import MissingExtra
    from vidgen.queue import executor as X

    ledger = Ledger(tmp_path / "q.db")
    ex = Executor(ledger, "w1", lease_s=30)
    ledger.submit(_render_specs(base_cfg, tmp_path, 1))
    job = ledger.claim("w1", 30)
    reasons = iter([ImportError("no module named x"), RuntimeError("Found no NVIDIA driver on your system"),
                    MissingExtra("vae.kernels: triton needs Triton installed"), ValueError("a bug")])

    def fail(ex, job):
        e = next(reasons)
        if isinstance(e, RuntimeError):
            raise RuntimeError("Failed to import diffusers.models.x") from e
        raise e
    X.KINDS["render"], real = fail, X.KINDS["render"]
    try:
        outcomes = [ex.run(job) for _ in range(4)]
    finally:
        X.KINDS["render"] = real
    assert [o.environment for o in outcomes] == [True, True, True, False]
    assert outcomes[0].error == "ImportError: no module named x"
    assert outcomes[1].error == "RuntimeError: Found no NVIDIA driver on your system"
    assert outcomes[2].error.startswith("invalid config: vae.kernels: triton needs Triton installed")
    assert ex.record(job, outcomes[0]) == "released"
    j = ledger.get(job.id)
    assert j.state == JobState.QUEUED and j.attempts == 0
    env = outcomes[0]
    for _ in range(X.ENVIRONMENT_STREAK - 1):
        ex.record(ledger.claim("w1", 30), env)
    assert ex.stop_reason() and "#1" in ex.stop_reason() and "no module named x" in ex.stop_reason()
    ex.record(ledger.claim("w1", 30), outcomes[1])          # another reason: the row starts again
    assert ex.stop_reason() is None
    ex.record(ledger.claim("w1", 30), env)
    ex.record(ledger.claim("w1", 30), X.Outcome("stopped", stop="shutdown"))      # a stop is neither
    ex.record(ledger.claim("w1", 30), env)
    assert ex.stop_reason() is None
    assert ex.record(ledger.claim("w1", 30), outcomes[3]) == "queued"            # a bug: retried, counted
    assert ex.stop_reason() is None and ledger.get(job.id).attempts == 1


def test_queue_cli(base_cfg, tmp_path, capsys):
    from vidgen.cli import main

    db = str(tmp_path / "q.db")
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(base_cfg()))
    assert main(["queue", "--db", db, "submit", str(path)]) == 0
    assert main(["queue", "--db", db, "list", "--json"]) == 0
    jobs = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    assert [(j["id"], j["state"], j["attempts"]) for j in jobs] == [(1, "queued", 0)] and jobs[0]["output"]
    assert main(["queue", "--db", db, "pause"]) == 0 and main(["queue", "--db", db, "resume"]) == 0
    assert main(["queue", "--db", db, "worker", "--exit-when-idle"]) == 0
    capsys.readouterr()
    assert main(["queue", "--db", db, "show", "1"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["state"] == "succeeded" and Path(shown["output"]).exists()
    assert main(["queue", "--db", db, "logs", "1"]) == 0 and "attempt 1" in capsys.readouterr().out
    first = Path(shown["output"]).read_bytes()
    assert main(["queue", "--db", db, "retry", "1"]) == 0          # succeeded: it runs again, its file set aside
    assert not Path(shown["output"]).exists() and api.get(api.open_ledger(db), 1).state.value == "queued"
    assert [p.read_bytes() for p in Path(shown["output"]).parent.glob("*.superseded-*.mp4")] == [first]
    assert main(["queue", "--db", db, "cancel", "99"]) == 2


def test_submit_refuses_a_blocked_prompt_and_queues_nothing(base_cfg, tmp_path, capsys):
    from vidgen.cli import main

    db = str(tmp_path / "q.db")
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(base_cfg()))
    assert main(["queue", "--db", db, "submit", str(path), "guard.enabled=true", "prompt=a p0rn clip"]) == 3
    assert "rule 'explicit'" in capsys.readouterr().err and Ledger(db).jobs() == []


@pytest.mark.slow
def test_sigterm_checkpoints_and_releases_then_resumes(base_cfg, tmp_path):
    db = tmp_path / "q.db"
    ledger = Ledger(db)
    many_steps = {"steps": 400, "checkpoint_every": 1000, "guidance_scale": 4.0, "schedule": "diffusers"}
    (job_id,) = ledger.submit(_render_specs(base_cfg, tmp_path, 1, sampling=many_steps))
    w = _worker(db, 2.0)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        j = ledger.get(job_id)
        if j.state == JobState.RUNNING and (j.progress or {}).get("stage") == "denoise" and j.progress.get("step", 0) >= 3:
            break
        time.sleep(0.2)
    w.send_signal(signal.SIGTERM)
    assert w.wait(timeout=60) == 0
    j = ledger.get(job_id)
    out = Path(j.output)
    assert j.state == JobState.QUEUED and j.attempts == 0 and j.lease_owner is None       # released, not counted
    assert out.with_name(out.stem + ".resume.safetensors").exists() and not out.exists()
    w = _worker(db, 2.0)
    assert w.wait(timeout=180) == 0
    assert ledger.get(job_id).state == JobState.SUCCEEDED and out.exists()
    assert any("resuming job" in text for _, _, text in ledger.logs(job_id))


@pytest.mark.slow
def test_one_worker_process_per_device(base_cfg, tmp_path):
    """`worker --devices 0,1` starts a process per device (CUDA_VISIBLE_DEVICES; on a machine without
    two GPUs, `--devices cpu,cpu`: both on the CPU): two jobs, two different worker processes."""
    import torch

    devices = "0,1" if torch.cuda.device_count() >= 2 else "cpu,cpu"
    db = tmp_path / "q.db"
    ledger = Ledger(db)
    ids = ledger.submit(_render_specs(base_cfg, tmp_path, 2, sampling={"steps": 60, "guidance_scale": 4.0,
                                                                       "schedule": "diffusers"}))
    done = subprocess.run([sys.executable, "-m", "vidgen", "queue", "--db", str(db), "worker", "--devices", devices,
                           "--exit-when-idle", "--lease", "5"], capture_output=True, text=True, timeout=180,
                          env=_one_thread())
    assert done.returncode == 0, done.stderr[-2000:]
    assert all(ledger.get(i).state == JobState.SUCCEEDED for i in ids)
    owners = {text.split(" on ")[1] for i in ids for _, _, text in ledger.logs(i) if text.startswith("attempt 1 on ")}
    assert len({o.split(":")[1] for o in owners}) == 2, owners          # two worker pids


def test_devices_that_are_not_there_are_refused(base_cfg, tmp_path, capsys, monkeypatch):
    """`--devices 0,1` on a machine without GPUs would start CPU workers without a word: one line,
    exit 2, nothing claimed; `cpu` says CPU workers are meant."""
    import torch

    from hostile import assert_refused
    from vidgen.cli import main
    from vidgen.queue.cli import _devices

    db = tmp_path / "q.db"
    (job_id,) = Ledger(db).submit(_render_specs(base_cfg, tmp_path, 1))
    cases = [(0, "0,1", ["--devices 0,1: this machine has no CUDA GPU", "say so: --devices cpu,cpu"]),
             (0, "1", ["--devices 1: this machine has no CUDA GPU", "say so: --devices cpu"]),
             (1, "0,1", ["--devices 0,1: there is no GPU 1 (torch sees 1: 0)"]),
             (1, "1", ["--devices 1: there is no GPU 1"])]
    for gpus, devices, needles in cases:
        monkeypatch.setattr(torch.cuda, "device_count", lambda gpus=gpus: gpus)
        code = main(["queue", "--db", str(db), "worker", "--devices", devices, "--exit-when-idle"])
        assert_refused(code, capsys.readouterr().err, *needles)
    code = main(["queue", "--db", str(db), "worker", "--devices", "gpu0", "--exit-when-idle"])
    assert_refused(code, capsys.readouterr().err, "'gpu0' is not a GPU index (0, 1, ...) or cpu")
    job = Ledger(db).get(job_id)
    assert job.state == JobState.QUEUED and job.attempts == 0
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")       # indices as this process sees its GPUs
    assert _devices("1,cpu,3") == ["5", "", "7"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _devices("1, 3") == ["1", "3"]


def test_worker_picks_cpu_threads_per_job_unless_the_user_did(base_cfg, tmp_path, monkeypatch):
    """A worker's small CPU render runs on one torch thread (vidgen.threads), not one per core (the
    OMP_NUM_THREADS rule: test_cli.py::test_cpu_threads_for_small_clips_and_busy_machines)."""
    import torch

    before = torch.get_num_threads()
    ledger = Ledger(tmp_path / "q.db")
    (job_id,) = ledger.submit(_render_specs(base_cfg, tmp_path, 1))
    ex = Executor(ledger, "w1", lease_s=30)
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
        torch.set_num_threads(2)
        assert ex.execute(ledger.claim("w1", 30)) == "succeeded"
        assert torch.get_num_threads() == 1 and ex.cpu_threads == 1
        assert any("CPU render: 1 torch thread of" in text for _, _, text in ledger.logs(job_id))
    finally:
        torch.set_num_threads(before)


def test_a_retry_after_running_out_of_memory_while_sampling_takes_the_error_s_plan(base_cfg, tmp_path, monkeypatch):
    """outofmemory.SamplingOutOfMemory carries the next cheaper plan, worked out as it was raised: the
    retry's patch takes it and plans nothing again; any other out-of-memory (the decode's) is planned
    again from the payload."""
    import torch

    from vidgen.outofmemory import SamplingOutOfMemory
    from vidgen.queue import executor as X

    ledger = Ledger(tmp_path / "q.db")
    ex = Executor(ledger, "w1", lease_s=30)
    ledger.submit(_render_specs(base_cfg, tmp_path, 1))
    job = ledger.claim("w1", 30)
    sampling = SamplingOutOfMemory("out of memory while sampling")
    sampling.cheaper = ("stream_blocks", "fp8")
    errors = iter([sampling, torch.OutOfMemoryError("CUDA out of memory")])
    planned = []
    monkeypatch.setattr(X, "next_cheaper", lambda cfg: planned.append(cfg) or ("swap_experts", "bf16"))

    def fail(ex, job):
        raise next(errors)
    monkeypatch.setitem(X.KINDS, "render", fail)
    first, second = ex.run(job), ex.run(job)
    assert first.kind == second.kind == X.FailureKind.OOM
    assert first.patch == {"vae": {"memory_budget": "1GiB"}, "memory": {"placement": "stream_blocks", "weights": "fp8"},
                           "model": {"offload": "auto"}}
    assert second.patch["memory"] == {"placement": "swap_experts", "weights": "bf16"} and len(planned) == 1
