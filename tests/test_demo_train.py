"""The demo training stages run, checkpoint and resume (tiny sizes, a few steps)."""

from __future__ import annotations

import torch

from vidgen.demo.train import _load, train_vae

TINY = dict(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, temperal_downsample=[False, True, True],
            latents_mean=[0.0] * 4, latents_std=[1.0] * 4)


def test_vae_stage_checkpoints_and_resumes(tmp_path):
    first = train_vae(tmp_path, minutes=5, batch=2, size=32, frames=5, config=TINY, max_steps=2, save_every=1)
    state = _load(tmp_path / "vae.ckpt")
    assert first["step"] == 2 and state["step"] == 2 and first["psnr"] > 0
    weights = {k: v.clone() for k, v in state["model"].items()}
    second = train_vae(tmp_path, minutes=5, batch=2, size=32, frames=5, config=TINY, max_steps=3, save_every=1)
    after = _load(tmp_path / "vae.ckpt")
    assert second["step"] == 3 and after["step"] == 3
    assert any(not torch.equal(weights[k], v) for k, v in after["model"].items())   # it trained on


def test_vae_eval_reports_psnr_and_pixel_metrics(tmp_path):
    from vidgen.demo.train import eval_vae

    train_vae(tmp_path, minutes=5, batch=2, size=32, frames=5, config=TINY, max_steps=1)
    out = eval_vae(tmp_path, clips_per_combo=1, strip=tmp_path / "strip.png", limit=4)
    assert out["n"] == 4 and out["psnr_db"] > 0 and 0 <= out["colour"] <= 1 and (tmp_path / "strip.png").exists()
