"""Our render path reproduces diffusers' Wan pipelines' latents (CPU, fp32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import vidgen
from vidgen.resume import read_latents

TOL = 1e-5


def _ours(cfg: dict) -> torch.Tensor:
    result = vidgen.render(cfg)
    latents, _ = read_latents(result.latents_path)
    return latents


def _reference(pipe_cls, folder, cfg: dict, **extra) -> torch.Tensor:
    pipe = pipe_cls.from_pretrained(folder, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    w, h = (int(v) for v in cfg["size"].split("x"))
    out = pipe(prompt=cfg["prompt"], negative_prompt=cfg["negative_prompt"], height=h, width=w,
               num_frames=cfg["num_frames"], num_inference_steps=cfg["sampling"]["steps"],
               guidance_scale=cfg["sampling"]["guidance_scale"],
               generator=torch.Generator().manual_seed(cfg["seed"]), output_type="latent",
               max_sequence_length=512, **extra)
    return out.frames


def test_t2v_single_expert_matches_wanpipeline(base_cfg, tiny_model):
    from diffusers import WanPipeline

    cfg = base_cfg("wan2.1-t2v")
    ours, ref = _ours(cfg), _reference(WanPipeline, tiny_model("wan2.1-t2v"), cfg)
    assert ours.shape == ref.shape == (1, 16, 3, 8, 8)
    assert (ours - ref).abs().max().item() <= TOL
    assert ref.abs().max() > 0.1      # a real trajectory, not zeros


def test_t2v_two_experts_matches_wanpipeline(base_cfg, tiny_model):
    from diffusers import WanPipeline

    cfg = base_cfg("wan2.2-t2v-a14b", sampling={"steps": 6, "guidance_scale": 4.0, "guidance_scale_2": 3.0})
    ours = _ours(cfg)
    ref = _reference(WanPipeline, tiny_model("wan2.2-t2v-a14b"), cfg, guidance_scale_2=3.0)
    assert (ours - ref).abs().max().item() <= TOL
    # Both experts ran: with the low-noise expert swapped for the high-noise one the result differs.
    cfg_one = base_cfg("wan2.2-t2v-a14b", sampling={"steps": 6, "guidance_scale": 4.0, "guidance_scale_2": 3.0,
                                                   "boundary": 0.0}, output={"path": cfg["output"]["path"] + ".b.mp4"})
    assert (_ours(cfg_one) - ref).abs().max().item() > 1e-3


def _image(path) -> str:
    yy, xx = np.mgrid[0:64, 0:64]
    rgb = np.stack([xx * 4, yy * 4, (xx + yy) * 2], -1).clip(0, 255).astype(np.uint8)
    Image.fromarray(rgb).save(path)
    return str(path)


def test_i2v_two_experts_matches_diffusers(base_cfg, tiny_model, tmp_path):
    from diffusers import WanImageToVideoPipeline

    image = _image(tmp_path / "first.png")
    cfg = base_cfg("wan2.2-i2v-a14b", image=image)
    ours = _ours(cfg)
    ref = _reference(WanImageToVideoPipeline, tiny_model("wan2.2-i2v-a14b"), cfg, image=Image.open(image))
    assert (ours - ref).abs().max().item() <= TOL


def test_i2v_first_last_frame_matches_diffusers(base_cfg, tiny_model, tmp_path):
    from diffusers import WanImageToVideoPipeline

    image = _image(tmp_path / "first.png")
    last = tmp_path / "last.png"
    Image.open(image).transpose(Image.Transpose.ROTATE_180).save(last)
    cfg = base_cfg("wan2.2-i2v-a14b", image=image, last_image=str(last))
    ours = _ours(cfg)
    ref = _reference(WanImageToVideoPipeline, tiny_model("wan2.2-i2v-a14b"), cfg, image=Image.open(image),
                     last_image=Image.open(last))
    assert (ours - ref).abs().max().item() <= TOL
    first_only = _reference(WanImageToVideoPipeline, tiny_model("wan2.2-i2v-a14b"), cfg, image=Image.open(image))
    assert (ours - first_only).abs().max().item() > 1e-3      # the last frame conditions the clip


@pytest.mark.parametrize("with_image", [False, True])
def test_ti2v_matches_diffusers(base_cfg, tiny_model, tmp_path, with_image):
    from diffusers import WanImageToVideoPipeline, WanPipeline

    extra = {"image": _image(tmp_path / "first.png")} if with_image else {}
    cfg = base_cfg("wan2.2-ti2v-5b", **extra)
    ours = _ours(cfg)
    if with_image:
        ref = _reference(WanImageToVideoPipeline, tiny_model("wan2.2-ti2v-5b"), cfg, image=Image.open(extra["image"]))
    else:
        ref = _reference(WanPipeline, tiny_model("wan2.2-ti2v-5b"), cfg)
    assert ours.shape == (1, 48, 3, 4, 4)
    assert (ours - ref).abs().max().item() <= TOL


def test_wan21_i2v_matches_diffusers(base_cfg, tiny_model, tmp_path, monkeypatch):
    """Wan2.1 I2V: the image's latents on channels and its CLIP tokens through the image cross-attention."""
    from diffusers import WanImageToVideoPipeline

    import vidgen.denoiser as denoiser

    image = _image(tmp_path / "first.png")
    cfg = base_cfg("wan2.1-i2v", image=image)
    ours = _ours(cfg)
    ref = _reference(WanImageToVideoPipeline, tiny_model("wan2.1-i2v"), cfg, image=Image.open(image))
    assert ours.shape == ref.shape == (1, 16, 3, 8, 8)
    assert (ours - ref).abs().max().item() <= TOL
    # The CLIP tokens count: with zeros in their place the clip differs.
    real = denoiser.image_embeds
    monkeypatch.setattr(denoiser, "image_embeds", lambda clip, plan, device: torch.zeros_like(real(clip, plan, device)))
    other = _ours({**cfg, "output": {**cfg["output"], "path": cfg["output"]["path"] + ".z.mp4"}})
    assert (other - ref).abs().max().item() > 1e-4


def test_wan21_flf2v_first_last_frame_matches_diffusers(base_cfg, tiny_model, tmp_path):
    from diffusers import WanImageToVideoPipeline

    image = _image(tmp_path / "first.png")
    last = tmp_path / "last.png"
    Image.open(image).transpose(Image.Transpose.ROTATE_180).save(last)
    folder = tiny_model("wan2.1-i2v", first_last=True)
    cfg = base_cfg("wan2.1-i2v", image=image, last_image=str(last))
    cfg["model"]["path"] = str(folder)
    ours = _ours(cfg)
    ref = _reference(WanImageToVideoPipeline, folder, cfg, image=Image.open(image), last_image=Image.open(last))
    assert (ours - ref).abs().max().item() <= TOL


def test_last_image_needs_a_model_that_takes_it(base_cfg, tiny_model, tmp_path, capsys):
    from vidgen.cli import main

    image = _image(tmp_path / "first.png")
    cfg = base_cfg("wan2.1-i2v", image=image, last_image=image)
    import json

    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert main(["render", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "last_image" in err[0] and "FLF2V" in err[0]
