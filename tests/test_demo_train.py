"""The demo training stages run, checkpoint and resume (tiny sizes, a few steps)."""

from __future__ import annotations

import pytest
import torch

from vidgen.demo.training import _load
from vidgen.demo.train import train_vae

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


TINY_TRANSFORMER = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4,
                        out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=1, cross_attn_norm=True,
                        qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
TINY_TEXT = dict(d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=4, relative_attention_num_buckets=8,
                 relative_attention_max_distance=16, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                 dropout_rate=0.0)


def test_latents_dit_export_load_and_render(tmp_path):
    """All later stages at tiny widths: the exported folder loads through the public loader and renders."""
    import json

    from safetensors.torch import load_file

    import vidgen
    from vidgen.demo.train import cache_latents, export, train_dit
    from vidgen.loading import inspect_model

    run = tmp_path / "run"
    train_vae(run, minutes=5, batch=1, size=32, frames=5, config=TINY, max_steps=1)
    stats = cache_latents(run, clips_per_combo=2, batch=2, limit=6)
    cache = load_file(run / "latents.safetensors")
    assert stats["clips"] == 12 and cache["latents"].shape == (12, 4, 5, 8, 8) and cache["std"].min() > 0
    first = train_dit(run, minutes=5, batch=4, max_steps=2, save_every=1, transformer_config=TINY_TRANSFORMER,
                      text_config=TINY_TEXT)
    second = train_dit(run, minutes=5, batch=4, max_steps=3, transformer_config=TINY_TRANSFORMER,
                       text_config=TINY_TEXT, first_frame_weight=3.0)
    assert first["step"] == 2 and second["step"] == 3 and _load(run / "dit.ckpt")["step"] == 3
    folder = export(run, tmp_path / "demo")
    info = inspect_model(folder)
    assert info.variant == "wan2.1-t2v"
    vae_config = json.loads((folder / "vae" / "config.json").read_text())
    assert vae_config["latents_std"] == [pytest.approx(v) for v in cache["std"].tolist()]
    result = vidgen.render({"model": {"path": str(folder), "max_sequence_length": 16}, "size": "64x64",
                            "num_frames": 5, "fps": 8, "prompt": "a red circle moving right on a black background",
                            "sampling": {"steps": 2}, "output": {"path": str(tmp_path / "out.mp4")}})
    assert result.num_frames == 5 and result.path.is_file()
