"""An Animate render through vidgen's own path (config -> preflight -> load -> segments -> writer) against
diffusers' WanAnimatePipeline on the tiny Animate model, its refusals, and resume from a checkpoint."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from test_animate import frames as _noise, masks
from vidgen import animate as A
from vidgen.errors import ConfigError, InputError
from vidgen.io import read_frames
from vidgen.pipeline import Renderer, StopRender
from vidgen.presets import load_config
from vidgen.preflight import check
from vidgen.tiny import TINY_FACE

SIZE, STEPS, SEED = 32, 3, 7
VARIANT = "wan2.2-animate-14b"


def _pngs(folder: Path, frames: list[Image.Image]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for i, im in enumerate(frames):
        im.save(folder / f"frame_{i:04d}.png")
    return str(folder)


def _masks(n: int) -> list[Image.Image]:
    """test_animate's moving character box, as RGB frames (as a user's mask video decodes)."""
    return [m.convert("RGB") for m in masks(n)]


@pytest.fixture
def inputs(tmp_path):
    """(PIL inputs, their files): a reference, 8 pose and face frames, a background and a mask."""
    n = 8
    pil = {"image": _noise(1, 40, 1)[0].resize((48, 40)), "pose": _noise(n, SIZE, 2), "face": _noise(n, TINY_FACE, 3),
           "background": _noise(n, SIZE, 4), "mask": _masks(n)}
    pil["image"].save(tmp_path / "ref.png")
    files = {"image": str(tmp_path / "ref.png"), "pose": _pngs(tmp_path / "pose", pil["pose"]),
             "face": _pngs(tmp_path / "face", pil["face"]), "background": _pngs(tmp_path / "bg", pil["background"]),
             "mask": _pngs(tmp_path / "mask", pil["mask"])}
    return pil, files


def _config(tiny_model, tmp_path, files, *, mode="animate", guidance=1.0, out="out/", **extra):
    animate = {"mode": mode, "pose_video": files["pose"], "face_video": files["face"], "segment_frames": 5,
               "overlap_frames": 1}
    if mode == "replace":
        animate.update(background_video=files["background"], mask_video=files["mask"])
    cfg = {"model": {"path": str(tiny_model(VARIANT)), "device": "cpu"}, "prompt": "a fox walking on the grass",
           "negative_prompt": "blurry low quality", "image": files["image"], "size": f"{SIZE}x{SIZE}", "fps": 8,
           "seed": SEED, "animate": animate,
           "sampling": {"steps": STEPS, "guidance_scale": guidance, "schedule": "diffusers"},
           "output": {"path": str(tmp_path / out), "save_latents": False}}
    cfg.update(extra)
    return load_config(cfg)


def _diffusers(folder, pil, *, mode, guidance) -> np.ndarray:
    from diffusers import WanAnimatePipeline

    pipe = WanAnimatePipeline.from_pretrained(folder)
    replace = mode == "replace"
    video = pipe(image=pil["image"], pose_video=pil["pose"], face_video=pil["face"],
                 background_video=pil["background"] if replace else None,
                 mask_video=[m.convert("L") for m in pil["mask"]] if replace else None,
                 prompt="a fox walking on the grass", negative_prompt="blurry low quality", height=SIZE, width=SIZE,
                 segment_frame_length=5, prev_segment_conditioning_frames=1, num_inference_steps=STEPS,
                 guidance_scale=guidance, mode=mode, generator=torch.Generator().manual_seed(SEED),
                 output_type="np").frames[0]                   # [F, H, W, 3] in [0, 1]
    return video


@pytest.mark.parametrize("mode, guidance", [("animate", 1.0), ("replace", 2.0)])
def test_a_render_matches_diffusers(tiny_model, tmp_path, inputs, mode, guidance):
    """Two segments of 5 frames (8 driving frames), through vidgen's loader, decoder and PNG writer: every
    pixel is WanAnimatePipeline's value rounded to 8 bits (measured: at most 0.500 levels apart)."""
    pil, files = inputs
    cfg = _config(tiny_model, tmp_path, files, mode=mode, guidance=guidance)
    result = Renderer().render(cfg)
    assert result.num_frames == 8
    ours = np.stack([np.asarray(f) for f in read_frames(result.path)]).astype(np.float64)
    ref = _diffusers(tiny_model(VARIANT), pil, mode=mode, guidance=guidance) * 255
    assert ours.shape == ref.shape == (8, SIZE, SIZE, 3)
    diff = np.abs(ours - ref)
    assert diff.max() <= 0.5 + 1e-3, diff.max()        # every value is diffusers' own, rounded to 8 bits


def test_lazy_segments_equal_whole_preprocessing(inputs):
    pil, _ = inputs
    segs = A.plan_segments(8, 5, 1)
    kw = dict(height=SIZE, width=SIZE, face_size=TINY_FACE, background_video=pil["background"],
              mask_video=[m.convert("L") for m in pil["mask"]])
    whole = A.prepare_pixels(pil["image"], pil["pose"], pil["face"], segs, **kw)
    lazy = A.prepare_pixels(pil["image"], pil["pose"], pil["face"], segs, lazy=True, **kw)
    for k in range(segs.num_segments):
        s, e = segs.window(k)
        for name in ("pose", "face", "background", "mask"):
            assert torch.equal(getattr(whole, name)[:, :, s:e], getattr(lazy, name)[:, :, s:e]), (name, k)


def test_stopped_mid_segment_and_resumed_equals_the_uninterrupted_render(tiny_model, tmp_path, inputs):
    """A render stopped at step 2 of its second segment leaves a checkpoint (the first segment's latents and
    the sampler state); --resume from it writes the same frames as an uninterrupted render."""
    from vidgen.resume import resume_from

    _, files = inputs
    whole = Renderer().render(_config(tiny_model, tmp_path, files, out="whole/"))
    cfg = _config(tiny_model, tmp_path, files, out="part/")
    seen = []

    def stop(p):
        if p.stage == "denoise":
            seen.append(p.step)
            if p.step == STEPS + 2:
                raise StopRender
    with pytest.raises(StopRender):
        Renderer().render(cfg, stop)
    checkpoint = tmp_path / "part.resume.safetensors"
    assert checkpoint.is_file() and not any((tmp_path / "part").glob("*.png"))
    cfg2, state = resume_from(cfg, checkpoint)
    assert state.step == 2 and len(state.segments) == 1
    steps = []
    resumed = Renderer().render(cfg2, lambda p: steps.append(p.step) if p.stage == "denoise" else None,
                                resume_state=state, own=(checkpoint,))
    assert steps[0] == STEPS + 2 and steps[-1] == 2 * STEPS and len(steps) == 2   # only the last step ran
    a, b = list(read_frames(whole.path)), list(read_frames(resumed.path))
    assert len(a) == len(b) == 8 and all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not checkpoint.exists()


@pytest.mark.parametrize("change, needle", [
    ({"animate": {"face_video": "FACE_WRONG"}}, "animate.face_video: frames are 32x32; face crops must be 16x16"),
    ({"animate": {"pose_video": "POSE_SHORT"}}, "animate.face_video: 8 frames, animate.pose_video has 6"),
    ({"animate": {"mode": "replace", "background_video": "BG", "mask_video": "MASK_GREY"}}, "animate.mask_video: not binary"),
    ({"size": "48x32"}, "animate.pose_video: frames are 32x32 (aspect 1.000), the render is 48x32"),
])
def test_bad_inputs_are_refused_before_weights(tiny_model, tmp_path, inputs, monkeypatch, change, needle):
    _, files = inputs
    files = dict(files)
    _pngs(tmp_path / "face_wrong", _noise(8, SIZE, 5))
    _pngs(tmp_path / "pose_short", _noise(6, SIZE, 6))
    grey = [Image.fromarray(np.full((SIZE, SIZE, 3), 128, np.uint8)) for _ in range(8)]
    _pngs(tmp_path / "mask_grey", grey)
    named = {"FACE_WRONG": str(tmp_path / "face_wrong"), "POSE_SHORT": str(tmp_path / "pose_short"),
             "BG": files["background"], "MASK_GREY": str(tmp_path / "mask_grey")}
    cfg = _config(tiny_model, tmp_path, files)
    raw = {k: v for k, v in change.items() if k != "animate"}
    animate = {k: named.get(v, v) for k, v in change.get("animate", {}).items()}
    cfg = load_config(cfg, {**raw, **({"animate": animate} if animate else {})})
    import vidgen.loading as loading
    monkeypatch.setattr(loading, "load_components", lambda *a, **k: pytest.fail("weights loaded"))
    with pytest.raises((ConfigError, InputError)) as e:
        Renderer().render(cfg)
    assert needle in str(e.value), str(e.value)


def test_every_problem_at_once_and_the_wrong_model(tiny_model, tmp_path, inputs):
    _, files = inputs
    _pngs(tmp_path / "face_wrong", _noise(8, SIZE, 5))
    _pngs(tmp_path / "pose_short", _noise(6, SIZE, 6))
    (tmp_path / "not-an-image.png").write_bytes(b"nope")
    cfg = load_config(_config(tiny_model, tmp_path, files),
                      {"image": str(tmp_path / "not-an-image.png"),
                       "animate": {"face_video": str(tmp_path / "face_wrong"), "pose_video": str(tmp_path / "pose_short")}})
    with pytest.raises(ConfigError) as e:
        check(cfg)
    text = str(e.value)
    assert len(e.value.problems) == 3, text
    assert "face crops must be 16x16" in text and "animate.face_video: 8 frames, animate.pose_video has 6" in text
    assert "image: cannot read" in text
    t2v = load_config(cfg, {"model": {"path": str(tiny_model("wan2.1-t2v"))}, "image": None})
    with pytest.raises(ConfigError, match="animate: wan2.1-t2v has no pose or face inputs"):
        check(t2v)
    bare = load_config(cfg, {"animate": {"pose_video": None, "face_video": None}})
    with pytest.raises(ConfigError, match="animate.pose_video: wan2.2-animate-14b is driven by a pose video"):
        check(bare)
    control = load_config(cfg, {"control": {"reference_images": [files["image"]]}})
    with pytest.raises(ConfigError, match="control: an Animate render does not take it"):
        check(control)


def test_preflight_sets_the_clip_length_and_segments(tiny_model, tmp_path, inputs):
    _, files = inputs
    plan = check(_config(tiny_model, tmp_path, files))
    assert plan.config.num_frames == 8 and plan.animate.segments.num_segments == 2


def test_the_cli_refuses_with_exit_2_and_no_traceback(tiny_model, tmp_path, inputs, capsys):
    """`vidgen render` on bad driving videos: exit 2, each problem said, no traceback, nothing written."""
    import yaml

    from vidgen.cli import main

    _, files = inputs
    _pngs(tmp_path / "face_wrong", _noise(8, SIZE, 5))
    cfg = {"model": {"path": str(tiny_model(VARIANT)), "device": "cpu"}, "prompt": "a fox", "image": files["image"],
           "size": f"{SIZE}x{SIZE}", "animate": {"pose_video": files["pose"], "face_video": str(tmp_path / "face_wrong"),
                                                 "mode": "replace", "background_video": files["background"],
                                                 "mask_video": str(tmp_path / "nowhere")},
           "output": {"path": str(tmp_path / "cli.mp4")}}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(cfg))
    code = main(["render", str(tmp_path / "bad.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert "face crops must be 16x16" in err and "animate.mask_video" in err
    assert not any(tmp_path.glob("cli*"))


def test_the_latents_file_decodes_to_the_same_frames(tiny_model, tmp_path, inputs):
    """An Animate render's latents file holds every segment's latents; `vidgen decode` (and a reviewed take's
    full decode) turns it into the render's very frames, segment by segment, with no transformer."""
    from vidgen.pipeline import decode_latents

    _, files = inputs
    cfg = load_config(_config(tiny_model, tmp_path, files, out="kept/"), {"output": {"save_latents": True}})
    result = Renderer().render(cfg)
    assert result.latents_path is not None and result.latents_path.is_file()
    again = decode_latents(result.latents_path, overrides={"output.path": str(tmp_path / "again/")})
    a, b = list(read_frames(result.path)), list(read_frames(again.path))
    assert len(a) == len(b) == 8 and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_the_animate_section_is_checked_when_the_config_loads(tiny_model, tmp_path, inputs):
    """Before any file is read: replace without its videos, animate given them, the segment rule."""
    _, files = inputs
    base = _config(tiny_model, tmp_path, files)
    with pytest.raises(ConfigError) as e:
        load_config(base, {"animate": {"mode": "replace", "segment_frames": 76, "overlap_frames": 3}})
    text = str(e.value)
    assert len(e.value.problems) == 4, text
    for needle in ("animate.background_video: is not set", "animate.mask_video: is not set",
                   "animate.segment_frames: 76 must be 4n + 1", "animate.overlap_frames: 3; use 1 or 5"):
        assert needle in text
    with pytest.raises(ConfigError, match="animate.mask_video: is set, but mode animate does not use it"):
        load_config(base, {"animate": {"mask_video": files["mask"]}})
    with pytest.raises(ConfigError, match="animate.segment_frames: 9 must exceed twice animate.overlap_frames"):
        load_config(base, {"animate": {"segment_frames": 9, "overlap_frames": 5}})
