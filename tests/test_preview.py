"""Render previews: the latent-to-RGB maps are fitted from a VAE (recovering a known linear VAE
exactly), and a queue render writes `<output>.preview.png` while it runs, served by the API and
removed when the video is done."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vidgen.paths import preview_path
from vidgen.preview import fit, project, reduce, sample_clips
from vidgen.queue.executor import Executor
from vidgen.queue.ledger import JobSpec, Ledger


class LinearVAE(torch.nn.Module):
    """A stand-in VAE whose latents are a known linear function of the pooled colours: the first frame
    alone, then groups of 4 frames, averaged over 8x8 pixels, through A (first) or B (the rest)."""

    def __init__(self, z: int = 6):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.a, self.b = torch.randn(z, 3, generator=g), torch.randn(z, 3, generator=g)
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.config = SimpleNamespace(z_dim=z, latents_mean=[0.1] * z, latents_std=[2.0] * z)

    def encode(self, video):
        groups = [video[:, :, :1]] + [video[:, :, 1 + 4 * k:5 + 4 * k] for k in range((video.shape[2] - 1) // 4)]
        pooled = [F.avg_pool2d(g.mean(2), 8) for g in groups]                       # [n, 3, h, w]
        z = torch.stack([torch.einsum("zc,nchw->nzhw", self.a if k == 0 else self.b, p) for k, p in enumerate(pooled)], 2)
        return SimpleNamespace(latent_dist=SimpleNamespace(mode=lambda: z))


def test_fit_recovers_a_linear_vae_and_projects_colours():
    vae = LinearVAE()
    maps, rms = fit(vae)
    assert maps.shape == (2, 7, 3) and rms < 1e-4
    clip = sample_clips(n=2, frames=9, seed=5)[1:]                                          # a shape moving on a background
    from vidgen.vae import normalize

    latents = normalize(vae, vae.encode(clip).latent_dist.mode())                   # [1, z, 3, 8, 8]
    image = project(maps, latents, frames=3)
    assert image.shape == (8, 24, 3) and image.dtype == np.uint8
    want = ((F.avg_pool2d(clip[0, :, :1].mean(1), 8).permute(1, 2, 0).clamp(-1, 1) + 1) * 127.5).round()
    assert np.abs(image[:, :8].astype(int) - want.numpy().astype(int)).max() <= 1   # the first frame's colours


def test_reduce_keeps_previews_small():
    frame = np.zeros((720, 1280, 3), np.uint8)
    assert max(reduce(frame).shape[:2]) <= 256 and reduce(frame[:64, :64]).shape == (64, 64, 3)


def test_a_queue_render_writes_its_preview_while_it_runs(tiny_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out" / "clip.mp4"
    cfg = {"model": {"path": str(tiny_model()), "device": "cpu"}, "prompt": "a red circle", "size": "32x32",
           "num_frames": 5, "fps": 8, "sampling": {"steps": 4}, "output": {"path": str(out)}}
    ledger = Ledger(tmp_path / "q.db")
    ledger.submit([JobSpec(kind="render", payload=cfg, output=str(out))])
    ex = Executor(ledger, "w")
    seen: list[tuple[str, int, tuple]] = []
    report = ex.progress

    def watch(p):
        report(p)
        if preview_path(out).exists():
            from PIL import Image

            with Image.open(preview_path(out)) as im:
                seen.append((p.stage, p.step, im.size))
    monkeypatch.setattr(ex, "progress", watch)
    monkeypatch.setattr("vidgen.queue.executor.PREVIEW_EVERY_S", 0.0)
    job = ledger.claim("w", 60)
    assert ex.execute(job) == "succeeded"
    stages = {s for s, _, _ in seen}
    assert "denoise" in stages and "decode" in stages, seen
    assert {size[1] for s, _, size in seen if s == "denoise"} == {4}          # latent frames of 4x4, side by side
    assert any(size == (32, 32) for s, _, size in seen if s == "decode")     # a decoded frame
    assert not preview_path(out).exists() and out.exists()                    # done: the video is the preview


@pytest.mark.parametrize("stop", ["pause", "cancel"])
def test_the_preview_ends_with_its_render_and_a_resumed_one_draws_afresh(tiny_model, tmp_path, monkeypatch, stop):
    """The preview belongs to the render in progress: gone when the attempt ends in any way (pause and
    cancel too), and a stale one (a crashed worker's) is gone before a resumed job draws its own."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out" / "clip.mp4"
    cfg = {"model": {"path": str(tiny_model()), "device": "cpu"}, "prompt": "a red circle", "size": "32x32",
           "num_frames": 5, "fps": 8, "sampling": {"steps": 4, "checkpoint_every": 1}, "output": {"path": str(out)}}
    ledger = Ledger(tmp_path / "q.db")
    ledger.submit([JobSpec(kind="render", payload=cfg, output=str(out))])
    ex = Executor(ledger, "w")
    monkeypatch.setattr("vidgen.queue.executor.PREVIEW_EVERY_S", 0.0)
    report, seen = ex.progress, []

    def watch(p):
        seen.append((p.stage, p.step, preview_path(out).exists() and preview_path(out).read_bytes() == b"stale"))
        report(p)
        if p.stage == "denoise" and p.step == 2 and preview_path(out).exists():
            ex.control = lambda: stop          # asked while a preview is on show
    monkeypatch.setattr(ex, "progress", watch)
    job = ledger.claim("w", 60)
    outcome = ex.run(job)
    assert (outcome.status, outcome.stop) == ("stopped", stop), outcome
    assert not preview_path(out).exists() and not out.exists()
    if stop == "cancel":
        return
    ex.record(job, outcome)
    ex.control = lambda: None
    ledger.resume(job.id)
    preview_path(out).write_bytes(b"stale")       # as a worker that died mid-render would leave it
    seen.clear()
    assert ex.execute(ledger.claim("w", 60)) == "succeeded"
    assert not any(stale for _, _, stale in seen), seen
    assert not preview_path(out).exists() and out.exists()


def test_the_api_serves_a_running_jobs_preview(tiny_model, tmp_path, monkeypatch):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from vidgen.preview import write
    from vidgen.queue.service import create_app

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out" / "clip.mp4"
    cfg = {"model": {"path": str(tiny_model()), "device": "cpu"}, "prompt": "a red circle", "size": "32x32",
           "num_frames": 5, "fps": 8, "sampling": {"steps": 2}, "output": {"path": str(out)}}
    (tmp_path / "r.json").write_text(json.dumps(cfg))
    client = TestClient(create_app(tmp_path / "q.db", roots=[tmp_path, Path(tiny_model()).parent]),
                        base_url="http://127.0.0.1")      # a loopback name: no other Host is served without a token
    job_id = client.post("/api/jobs", json={"config": "r.json"}).json()["ids"][0]
    assert client.get(f"/api/jobs/{job_id}/preview").status_code == 404
    Ledger(tmp_path / "q.db").claim("w", 60)
    out.parent.mkdir()
    write(preview_path(out), np.full((4, 16, 3), 200, np.uint8))
    listed = client.get(f"/api/jobs/{job_id}").json()
    assert listed["state"] == "running" and isinstance(listed["preview"], int)
    r = client.get(f"/api/jobs/{job_id}/preview")
    assert r.status_code == 200 and r.content[:4] == b"\x89PNG" and len(r.content) < 4096


def test_a_shipped_table_is_used_and_a_bad_one_named(tiny_model, tmp_path, caplog):
    import shutil

    from diffusers import AutoencoderKLWan

    from vidgen.preview import sampling_preview, shipped_map, write_table

    folder = tmp_path / "vae"
    shutil.copytree(Path(tiny_model()) / "vae", folder)
    vae = AutoencoderKLWan.from_pretrained(folder)
    assert shipped_map(vae) is None                                  # none shipped: fitted on first use
    maps = torch.randn(2, vae.config.z_dim + 1, 3)
    write_table(folder, maps, 0.1, "a test")
    assert torch.allclose(shipped_map(vae), maps, atol=1e-6)
    x0 = torch.randn(1, vae.config.z_dim, 2, 4, 4)
    assert np.array_equal(sampling_preview(vae, lambda: x0)(), project(shipped_map(vae), x0))
    (folder / "preview.json").write_text('{"maps": [[1, 2]]}')
    with caplog.at_level("WARNING", logger="vidgen"):
        assert shipped_map(vae) is None
    assert "preview.json is unusable" in caplog.text
    # the demo's VAEs ship theirs, fitted on the demo's own clips
    demo = AutoencoderKLWan.from_pretrained(Path(__file__).parents[1] / "samples" / "demo-wan" / "vae")
    assert shipped_map(demo) is not None
