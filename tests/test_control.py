"""VACE control, reference images and video-to-video: our render path against diffusers' WanVACEPipeline
and WanVideoToVideoPipeline on tiny models (CPU, fp32), and the refusals before any weight loads."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vidgen
from vidgen.cli import main
from vidgen.control import fit_clip, preprocess, read_clip
from vidgen.resume import read_latents

TOL = 1e-5


def _ours(cfg: dict) -> torch.Tensor:
    return read_latents(vidgen.render(cfg).latents_path)[0]


def _frames(n: int, w: int = 64, h: int = 64, seed: int = 0, mask: bool = False) -> np.ndarray:
    """A moving square (or a mask that opens on its right half), uint8 [n, h, w, 3]."""
    out = np.zeros((n, h, w, 3), dtype=np.uint8)
    for i in range(n):
        if mask:
            out[i, :, w // 2:] = 255
        else:
            out[i] = (seed * 40) % 255
            x = 4 + 4 * i
            out[i, 20:40, x:x + 16] = (220, 60 + 10 * seed, 30)
    return out


def _folder(path, frames: np.ndarray) -> str:
    path.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(frames):
        Image.fromarray(f).save(path / f"frame_{i:05d}.png")
    return str(path)


def _pil(frames: np.ndarray) -> list:
    return [Image.fromarray(f) for f in frames]


def _image(path, colour=(200, 40, 90)) -> str:
    yy, xx = np.mgrid[0:48, 0:32]
    rgb = np.stack([xx * 6, yy * 4, np.full_like(xx, colour[2])], -1).clip(0, 255).astype(np.uint8)
    Image.fromarray(rgb).save(path)
    return str(path)


def _vace_reference(folder, cfg: dict, **extra) -> torch.Tensor:
    from diffusers import WanVACEPipeline

    pipe = WanVACEPipeline.from_pretrained(folder, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    s = cfg["sampling"]
    out = pipe(prompt=cfg["prompt"], negative_prompt=cfg["negative_prompt"], height=64, width=64,
               num_frames=cfg["num_frames"], num_inference_steps=s["steps"], guidance_scale=s["guidance_scale"],
               generator=torch.Generator().manual_seed(cfg["seed"]), output_type="latent", max_sequence_length=512,
               **extra)
    return out.frames


@pytest.mark.parametrize("case", ["video", "video+mask", "one reference", "two references"])
def test_vace_matches_diffusers(base_cfg, tiny_model, tmp_path, case):
    video = _frames(9)
    control: dict = {"video": _folder(tmp_path / "control", video), "scale": 0.8}
    extra: dict = {"video": _pil(video), "conditioning_scale": 0.8}
    if case == "video+mask":
        control["mask"] = _folder(tmp_path / "mask", _frames(9, mask=True))
        extra["mask"] = _pil(_frames(9, mask=True))
    refs = [_image(tmp_path / f"ref{i}.png", (0, 0, 60 * i)) for i in range(case.count("two") + 1)] \
        if "reference" in case else []
    if refs:
        control["reference_images"] = refs
        extra["reference_images"] = [Image.open(r).convert("RGB") for r in refs]
    cfg = base_cfg("wan2.1-vace", control=control)
    ours = _ours(cfg)
    ref = _vace_reference(tiny_model("wan2.1-vace"), cfg, **extra)
    assert ours.shape == (1, 16, 3, 8, 8) and ref.shape[2] == 3 + len(refs)
    assert (ours - ref[:, :, len(refs):]).abs().max().item() <= TOL
    assert ref.abs().max() > 0.1


def test_vace_two_experts_matches_diffusers(base_cfg, tiny_model, tmp_path):
    video = _frames(9, seed=2)
    cfg = base_cfg("wan2.2-vace-a14b", control={"video": _folder(tmp_path / "c", video)},
                   sampling={"steps": 6, "guidance_scale": 4.0, "guidance_scale_2": 3.0})
    ours = _ours(cfg)
    ref = _vace_reference(tiny_model("wan2.2-vace-a14b"), cfg, video=_pil(video), guidance_scale_2=3.0)
    assert (ours - ref).abs().max().item() <= TOL


def test_the_control_steers_and_no_control_is_plain_vace(base_cfg, tiny_model, tmp_path):
    a = _ours(base_cfg("wan2.1-vace", control={"video": _folder(tmp_path / "a", _frames(9, seed=0))}))
    cfg = base_cfg("wan2.1-vace", control={"video": _folder(tmp_path / "b", _frames(9, seed=3))})
    cfg["output"]["path"] += ".b.mp4"
    assert (a - _ours(cfg)).abs().max().item() > 1e-3
    plain = base_cfg("wan2.1-vace")
    plain["output"]["path"] += ".c.mp4"
    assert (_ours(plain) - _vace_reference(tiny_model("wan2.1-vace"), plain)).abs().max().item() <= TOL


def test_video2video_matches_diffusers(base_cfg, tiny_model, tmp_path):
    from diffusers import WanPipeline, WanVideoToVideoPipeline

    source = _frames(9, seed=1)
    cfg = base_cfg("wan2.1-t2v", video2video={"video": _folder(tmp_path / "src", source), "strength": 0.7},
                   sampling={"steps": 10, "guidance_scale": 4.0, "schedule": "diffusers"})
    ours = _ours(cfg)
    base = WanPipeline.from_pretrained(tiny_model("wan2.1-t2v"), dtype=torch.float32)
    pipe = WanVideoToVideoPipeline(**{k: v for k, v in base.components.items() if k != "transformer_2"})
    pipe.set_progress_bar_config(disable=True)
    ref = pipe(video=_pil(source), prompt=cfg["prompt"], negative_prompt=cfg["negative_prompt"], height=64, width=64,
               num_inference_steps=10, guidance_scale=4.0, strength=0.7, output_type="latent",
               generator=torch.Generator().manual_seed(cfg["seed"]), max_sequence_length=512).frames
    assert (ours - ref).abs().max().item() <= TOL


def test_keep_first_writes_the_source_frames_bit_for_bit(base_cfg, tmp_path):
    from vidgen.io import read_frames

    video = _frames(5)
    cfg = base_cfg("wan2.1-vace", control={"video": _folder(tmp_path / "c", video), "keep_first": 5},
                   output={"path": str(tmp_path / "out" / "frames")})      # PNG frames: lossless
    result = vidgen.render(cfg)
    written = list(read_frames(result.path))
    assert len(written) == 9 and all((written[i] == video[i]).all() for i in range(5))


def test_fitting_and_preprocessors(tmp_path):
    frames, fps = read_clip(_folder(tmp_path / "f", _frames(12, w=96, h=64)), "control.video")
    fitted, own = fit_clip(frames, 24.0, 8, 4, 0, 64, 64, "control.video")       # 24 -> 8 fps: every third frame
    assert fitted.shape == (4, 64, 64, 3) and own == 4
    with pytest.raises(vidgen.errors.InputError, match="has 4 frames"):
        fit_clip(frames, 24.0, 8, 9, 0, 64, 64, "control.video")
    edges = preprocess(fitted, "canny")
    assert set(np.unique(edges)) <= {0, 255} and edges.max() == 255
    grey = preprocess(fitted, "grey")
    assert (grey[..., 0] == grey[..., 2]).all()


def _refused(cfg: dict, tmp_path, capsys, *words) -> None:
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert main(["render", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for w in words:
        assert w in err[0], err[0]
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_bad_control_input_is_refused_before_loading(base_cfg, tmp_path, capsys):
    (tmp_path / "bad.mp4").write_bytes(b"not a video at all")
    _refused(base_cfg("wan2.1-vace", control={"video": str(tmp_path / "bad.mp4")}), tmp_path, capsys, "control.video")
    (tmp_path / "empty").mkdir()
    _refused(base_cfg("wan2.1-vace", control={"video": str(tmp_path / "empty")}), tmp_path, capsys, "no frames")
    tiny = _folder(tmp_path / "tiny", _frames(9, w=8, h=8))
    _refused(base_cfg("wan2.1-vace", control={"video": tiny}), tmp_path, capsys, "cannot be fitted")
    video = _folder(tmp_path / "v", _frames(9))
    mask = _folder(tmp_path / "m", _frames(3, mask=True))
    _refused(base_cfg("wan2.1-vace", control={"video": video, "mask": mask}), tmp_path, capsys, "control.mask")
    _refused(base_cfg("wan2.1-t2v", control={"video": video}), tmp_path, capsys, "wan2.1-vace", "wan2.2-vace-a14b")
    for strength in (1.5, 0.0):
        _refused(base_cfg("wan2.1-t2v", video2video={"video": video, "strength": strength}), tmp_path, capsys,
                 "video2video.strength")


def test_a_reference_image_bomb_is_refused(base_cfg, tmp_path, capsys):
    bomb = tmp_path / "bomb.png"
    Image.new("1", (20000, 20000)).save(bomb)          # 50 MB of pixels in a few KB of PNG
    _refused(base_cfg("wan2.1-vace", control={"reference_images": [str(bomb)]}), tmp_path, capsys,
             "control.reference_images[0]")
