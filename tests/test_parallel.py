"""One clip on several ranks (vidgen.parallel), on the CPU over gloo with tiny models: the latents of each
layout against one process's, rank 0 alone writing, a killed rank stopping them all with the checkpoint
kept, and the refusals. (N CPU processes are the test path, not a speed-up.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import vidgen
from vidgen.cli import main
from vidgen.resume import read_latents

IMAGE = Path(__file__).parent.parent / "samples" / "first-frame.png"
LAYOUTS = {   # variant, parallel
    "t2v-ulysses2": ("wan2.1-t2v", {"devices": 2, "ulysses": 2}),
    "t2v-ring2": ("wan2.1-t2v", {"devices": 2, "ring": 2}),
    "t2v-cfg2": ("wan2.1-t2v", {"devices": 2, "cfg": 2}),
    "a14b-ulysses2": ("wan2.2-t2v-a14b", {"devices": 2, "ulysses": 2}),
    "i2v-a14b-ulysses2": ("wan2.2-i2v-a14b", {"devices": 2, "ulysses": 2}),
    "t2v-cfg2-ulysses2": ("wan2.1-t2v", {"devices": 4, "cfg": 2, "ulysses": 2}),
    "i2v-a14b-ring2": ("wan2.2-i2v-a14b", {"devices": 2, "ring": 2}),
    "t2v-ulysses2-ring2": ("wan2.1-t2v", {"devices": 4, "ulysses": 2, "ring": 2}),
}


def _cfg(base_cfg, tmp_path: Path, variant: str, name: str, **extra):
    image = {"image": str(IMAGE), "image_fit": "crop"} if variant == "wan2.2-i2v-a14b" else {}
    return base_cfg(variant, output={"path": str(tmp_path / name / "clip.mp4")}, **image, **extra)


@pytest.mark.parametrize("layout", [k if k == "t2v-ulysses2" else pytest.param(k, marks=pytest.mark.slow)
                                    for k in LAYOUTS])     # the quick loop keeps one layout (under 5 minutes)
def test_each_layout_renders_the_single_process_latents(base_cfg, tmp_path, layout):
    """Ulysses splits tokens, CFG-parallel splits branches: the latents equal one process's bit for bit (each
    rank computes the same numbers; only whole-tensor gathers move them). Ring attention merges partial
    softmaxes by their log-sum-exp, another order of the sums: within 1e-5. Rank 0 alone writes the video,
    its latents and its sidecar."""
    variant, par = LAYOUTS[layout]
    one = vidgen.render(_cfg(base_cfg, tmp_path, variant, "one"))
    many = vidgen.render(_cfg(base_cfg, tmp_path, variant, "many", parallel=par))
    a, b = read_latents(one.latents_path)[0], read_latents(many.latents_path)[0]
    assert (a - b).abs().max().item() <= 1e-5
    assert torch.equal(a, b) or par.get("ring", 1) > 1
    assert sorted(p.name for p in (tmp_path / "many").iterdir()) == ["clip.latents.safetensors", "clip.mp4",
                                                                       "clip.mp4.json"]


def _ranks(parent: int) -> list[int]:
    """The rank processes a launcher spawned (children running multiprocessing's spawn_main), in start order."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and "spawn_main" in cmd:
            found.append(int(entry.name))
    return sorted(found)


def _stop_a_rank(cfg: dict, path: Path, checkpoint: Path, how: int) -> list[str]:
    """Render `cfg` (written to `path`) with `vidgen render` in a subprocess; once its first checkpoint is
    written, send rank 1 the signal `how`. Returns the render's error lines once every process ended
    (exit 1, one error line, no traceback, no rank left)."""
    path.write_text(json.dumps(cfg))
    proc = subprocess.Popen([sys.executable, "-m", "vidgen", "render", str(path)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    ranks = _ranks(proc.pid)
    assert checkpoint.exists() and len(ranks) == 2, (ranks, proc.poll())
    os.kill(ranks[1], how)
    _, err = proc.communicate(timeout=120)
    errors = [line for line in err.splitlines() if line.startswith("vidgen: error")]
    assert proc.returncode == 1 and len(errors) == 1 and "Traceback" not in err, err[-2000:]
    assert not _ranks(proc.pid)
    return errors


@pytest.mark.slow
def test_a_killed_rank_stops_every_rank_and_resume_finishes_with_another_count(base_cfg, tmp_path):
    """SIGKILL on rank 1 mid-sampling: every rank stops, exit 1 with one line, nothing at the output
    but the checkpoint; --resume with one process gives the uninterrupted render's latents."""
    sampling = {"steps": 60, "checkpoint_every": 1}
    whole = vidgen.render(_cfg(base_cfg, tmp_path, "wan2.1-t2v", "whole", sampling=sampling))
    cfg = _cfg(base_cfg, tmp_path, "wan2.1-t2v", "cut", sampling=sampling, parallel={"devices": 2, "ulysses": 2})
    path, checkpoint = tmp_path / "cut.yaml", tmp_path / "cut" / "clip.resume.safetensors"
    errors = _stop_a_rank(cfg, path, checkpoint, signal.SIGKILL)
    assert "rank 1 of 2 was killed by signal 9" in errors[0] and "--resume" in errors[0]
    assert checkpoint.exists() and not (tmp_path / "cut" / "clip.mp4").exists()
    assert main(["render", str(path), "parallel.devices=1", "parallel.ulysses=1", "--resume"]) == 0
    assert torch.equal(read_latents(whole.latents_path)[0],
                       read_latents(tmp_path / "cut" / "clip.latents.safetensors")[0])


def test_refusals(base_cfg, tmp_path, capsys):
    """One line each, exit 2, before any rank starts."""
    cases = [
        ({"devices": 3, "ulysses": 3}, "parallel.ulysses: 3 does not divide the model's 2 attention heads"),
        ({"devices": 2, "ulysses": 1}, "ulysses x ring x cfg = 1 must equal devices (2)"),
        ({"devices": 2, "cfg": 2, "_guidance": 1.0}, "parallel.cfg: 2 puts the guided and unguided branches"),
    ]
    for par, message in cases:
        guidance = par.pop("_guidance", 4.0)
        cfg = _cfg(base_cfg, tmp_path, "wan2.1-t2v", "bad", parallel=par, sampling={"guidance_scale": guidance})
        path = tmp_path / "bad.yaml"
        path.write_text(json.dumps(cfg))
        assert main(["render", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and message in err, err
    path.write_text(json.dumps(_cfg(base_cfg, tmp_path, "wan2.1-t2v", "bad", parallel={"devices": 2, "ulysses": 2},
                                    model={"device": "mps"})))
    assert main(["render", str(path)]) == 2
    assert "parallel: runs on CUDA GPUs (or CPU processes, for tests), not on mps" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").iterdir())


def test_ring_on_cuda_needs_a_half_precision_dtype(base_cfg, tmp_path, monkeypatch, capsys):
    """Ring attention runs diffusers' flash backend, which takes bf16/fp16 on CUDA: float32 is refused
    (checked as if on a 2-GPU machine); on the CPU test path any float dtype runs."""
    import vidgen.preflight

    monkeypatch.setattr(vidgen.preflight, "resolve_device", lambda _: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    path = tmp_path / "ring.yaml"
    path.write_text(json.dumps(_cfg(base_cfg, tmp_path, "wan2.1-t2v", "ring", parallel={"devices": 2, "ring": 2},
                                    model={"device": "cuda", "dtype": "float32"})))
    assert main(["render", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "parallel.ring: ring attention runs flash attention, which takes bfloat16" in err, err
    assert not (tmp_path / "ring").exists() or not any((tmp_path / "ring").iterdir())


@pytest.mark.slow
def test_a_queued_parallel_job_runs_on_a_worker_holding_its_devices(base_cfg, tmp_path, capsys):
    """A render asking for 2 devices: a 1-device worker leaves it; a worker holding 2 (--gpus cpu,cpu: two
    CPU ranks) claims it and renders it as one job across both."""
    from vidgen.queue.ledger import JobState, Ledger

    db = tmp_path / "q.db"
    cfg = _cfg(base_cfg, tmp_path, "wan2.1-t2v", "queued", parallel={"devices": 2, "ulysses": 2})
    (tmp_path / "job.yaml").write_text(json.dumps(cfg))
    assert main(["queue", "--db", str(db), "submit", str(tmp_path / "job.yaml")]) == 0
    ledger = Ledger(db)
    assert ledger.claim("one-device", 30, devices=1) is None
    assert main(["queue", "--db", str(db), "worker", "--gpus", "cpu,cpu", "--exit-when-idle", "--lease", "30"]) == 0
    (job,) = ledger.jobs()
    assert job.state == JobState.SUCCEEDED and job.attempts == 1
    one = vidgen.render(_cfg(base_cfg, tmp_path, "wan2.1-t2v", "one"))
    assert torch.equal(read_latents(one.latents_path)[0],
                       read_latents(tmp_path / "queued" / "clip.latents.safetensors")[0])


@pytest.mark.slow
def test_a_gpus_worker_keeps_its_ranks_between_jobs(base_cfg, tmp_path):
    """Two parallel jobs in a row on a worker holding 2 devices run on the same rank processes (each rank's
    model kept); a one-process job after them stops those ranks first. Each job's latents are one
    process's render's."""
    from vidgen.queue.executor import Executor
    from vidgen.queue.jobs import JobSpec
    from vidgen.queue.ledger import Ledger

    ledger = Ledger(tmp_path / "q.db")
    cfgs = [_cfg(base_cfg, tmp_path, "wan2.1-t2v", f"wide{s}", seed=s, parallel={"devices": 2, "ulysses": 2})
            for s in (7, 8)] + [_cfg(base_cfg, tmp_path, "wan2.1-t2v", "narrow", seed=7)]
    ledger.submit([JobSpec(kind="render", payload=c, name=f"j{i}", output=c["output"]["path"]) for i, c in enumerate(cfgs)])
    ex, pids = Executor(ledger, "w"), []
    try:
        for _ in range(2):
            assert ex.run(ledger.claim("w", 60, devices=2)).status == "succeeded"
            pids.append([p.pid for p in ex.ranks.ranks.procs])
        procs = ex.ranks.ranks.procs
        assert pids[0] == pids[1] and ex.ranks.ranks.alive
        assert ex.run(ledger.claim("w", 60, devices=2)).status == "succeeded"
        assert ex.ranks is None and all(p.exitcode is not None for p in procs)
    finally:
        ex.close_ranks()
    for s in (7, 8):
        one = vidgen.render(_cfg(base_cfg, tmp_path, "wan2.1-t2v", f"one{s}", seed=s))
        assert torch.equal(read_latents(one.latents_path)[0],
                           read_latents(tmp_path / f"wide{s}" / "clip.latents.safetensors")[0])
    assert torch.equal(read_latents(tmp_path / "one7" / "clip.latents.safetensors")[0],
                       read_latents(tmp_path / "narrow" / "clip.latents.safetensors")[0])


def test_a_parallel_config_gives_a_parallel_pipeline(base_cfg, tmp_path):
    """vidgen.Pipeline.from_config with a parallel config gives a ParallelPipeline (ranks spawned on its first
    render); a loaded one-process Pipeline refuses a parallel override, never a quiet one-rank render."""
    from vidgen.errors import ConfigError

    pipe = vidgen.Pipeline.from_config(_cfg(base_cfg, tmp_path, "wan2.1-t2v", "warm"))
    with pytest.raises(ConfigError, match="parallel: this pipeline renders in its own process; .*ParallelPipeline"):
        pipe.generate(overrides={"parallel.devices": 2, "parallel.ulysses": 2})
    many = vidgen.Pipeline.from_config(_cfg(base_cfg, tmp_path, "wan2.1-t2v", "warm", parallel={"devices": 2, "ulysses": 2}))
    assert isinstance(many, vidgen.ParallelPipeline) and many.ranks is None
    many.close()
    assert not (tmp_path / "warm").exists() or not any((tmp_path / "warm").iterdir())


@pytest.mark.slow
def test_a_parallel_pipeline_keeps_its_ranks_loaded_between_renders(base_cfg, tmp_path):
    """vidgen.Pipeline for a parallel config: the same rank processes (each with its model loaded) render one
    clip after another, each equal to one process's render; close() stops them."""
    import torch.multiprocessing as mp

    one = [read_latents(vidgen.render(_cfg(base_cfg, tmp_path, "wan2.1-t2v", f"one{s}", seed=s)).latents_path)[0]
           for s in (7, 8)]
    cfg = _cfg(base_cfg, tmp_path, "wan2.1-t2v", "pp", parallel={"devices": 2, "ulysses": 2})
    with vidgen.Pipeline.from_config(cfg) as pipe:
        first = pipe.generate(seed=7)
        pids = [p.pid for p in pipe.ranks.procs]
        second = pipe.generate(seed=8, **{"output.path": str(tmp_path / "pp" / "second.mp4")})
        assert [p.pid for p in pipe.ranks.procs] == pids and pipe.ranks.alive
        procs = pipe.ranks.procs
    assert all(p.exitcode is not None for p in procs) and not mp.active_children()
    assert torch.equal(read_latents(first.latents_path)[0], one[0])
    assert torch.equal(read_latents(second.latents_path)[0], one[1])


@pytest.mark.slow
@pytest.mark.parametrize("variant,par", [("wan2.1-t2v", {"devices": 2, "ulysses": 2}),
                                         ("wan2.2-t2v-a14b", {"devices": 2, "cfg": 2})], ids=["t2v-ulysses2", "a14b-cfg2"])
def test_sharded_weights_render_the_single_process_latents(base_cfg, tmp_path, variant, par):
    """memory.placement shard_blocks: each expert's blocks sharded over the ranks (FSDP2, read one rank at a
    time). Within 1e-5 of one process (not bit for bit: measured 2.0e-6 and 2.7e-6 here)."""
    one = vidgen.render(_cfg(base_cfg, tmp_path, variant, "one"))
    many = vidgen.render(_cfg(base_cfg, tmp_path, variant, "many", parallel=par, memory={"placement": "shard_blocks"}))
    a, b = read_latents(one.latents_path)[0], read_latents(many.latents_path)[0]
    assert (a - b).abs().max().item() <= 1e-5


def test_the_plan_is_per_device_and_shards_a14b_over_four_24gb_cards(capsys):
    """A14B 720p in bf16 on 4 x 24 GiB cards: sharded, no fp8, each figure one card's; on 2 cards the
    refusal names the fewest that fit."""
    preset = str(Path(__file__).resolve().parents[1] / "configs/wan2.2-t2v-a14b-720p.yaml")
    args = ["plan", preset, "prompt=x", "model.path=/nowhere", "model.device=cuda", "memory.device_budget=22GiB",
            "memory.host_budget=128GiB"]
    assert main([*args, "parallel.devices=4", "parallel.ulysses=4", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["placement"], plan["weights"], plan["devices"], plan["fits"]) == ("shard_blocks", "bf16", 4, True)
    assert plan["device_peak_bytes"] <= 22 * 2**30
    assert main([*args, "parallel.devices=2", "parallel.ulysses=2", "memory.placement=shard_blocks"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.endswith("4 GPUs fit it (parallel.devices=4 parallel.ulysses=4)"), err


@pytest.mark.slow
def test_a_hung_rank_stops_every_rank_after_the_timeout(base_cfg, tmp_path):
    """Rank 1 stopped (SIGSTOP) mid-sampling: rank 0 waits on it in a collective until parallel.timeout,
    then every rank is stopped, with one line saying so, and the checkpoint is kept."""
    sampling = {"steps": 60, "checkpoint_every": 1}
    cfg = _cfg(base_cfg, tmp_path, "wan2.1-t2v", "hung", sampling=sampling,
               parallel={"devices": 2, "ulysses": 2, "timeout": 5})
    checkpoint, t0 = tmp_path / "hung" / "clip.resume.safetensors", time.monotonic()
    errors = _stop_a_rank(cfg, tmp_path / "hung.yaml", checkpoint, signal.SIGSTOP)
    assert "waited on the others longer than parallel.timeout (5 s)" in errors[0] and "--resume" in errors[0]
    assert time.monotonic() - t0 < 300 and checkpoint.exists()


@pytest.mark.slow
def test_the_ray_backend_runs_a_parallel_job_in_a_placement_group(base_cfg, tmp_path):
    """A render asking for 2 devices, dispatched to Ray: two pool actors make way for one actor in a
    placement group, which runs it on 2 ranks (CPU here); the pool is whole again afterwards."""
    ray = pytest.importorskip("ray", reason="the Ray backend needs pip install 'vidgen[ray]'")
    from vidgen.queue.jobs import JobSpec
    from vidgen.queue.ledger import JobState, Ledger
    from vidgen.queue.ray_backend import run_ray_dispatcher

    db = tmp_path / "q.db"
    cfg = _cfg(base_cfg, tmp_path, "wan2.1-t2v", "ray", parallel={"devices": 2, "ulysses": 2})
    single = _cfg(base_cfg, tmp_path, "wan2.1-t2v", "ray-one")
    Ledger(db).submit([JobSpec(kind="render", payload=c, name=n, output=c["output"]["path"])
                       for c, n in ((cfg, "two"), (single, "one"))])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        counts = run_ray_dispatcher(db, num_actors=2, exit_when_idle=True, lease_s=30, poll_s=0.1)
    finally:
        ray.shutdown()
    jobs = Ledger(db).jobs()
    assert counts["succeeded"] == 2 and all(j.state == JobState.SUCCEEDED for j in jobs), [(j.state, j.error) for j in jobs]
    assert torch.equal(read_latents(tmp_path / "ray" / "clip.latents.safetensors")[0],
                       read_latents(tmp_path / "ray-one" / "clip.latents.safetensors")[0])
