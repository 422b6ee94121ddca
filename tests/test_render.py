"""End to end: config -> tiny model -> playable video, through the real loader and writer."""

from __future__ import annotations

import json

import pytest
import torch

import vidgen
from vidgen.io import read_video_info
from vidgen.resume import read_latents


def test_render_writes_playable_video(base_cfg, tmp_path):
    events = []
    result = vidgen.render(base_cfg(num_frames=17, fps=12, size="96x64"), callback=events.append)
    info = read_video_info(result.path)
    assert (info["frames"], info["width"], info["height"]) == (17, 96, 64)
    assert info["fps"] == pytest.approx(12)
    assert json.loads(info["metadata"]["comment"])["seed"] == 7
    assert result.num_frames == 17 and result.seed == 7 and result.path.name == "clip.mp4"
    sidecar = json.loads(result.path.with_name("clip.mp4.json").read_text())
    assert sidecar["prompt"].startswith("a red circle") and sidecar["config_digest"] == result.config_digest
    assert set(result.timings) == {"encode", "denoise", "decode_write"} and result.peak_memory_bytes > 0
    stages = [e.stage for e in events]
    assert stages.index("encode") < stages.index("denoise") < stages.index("decode")
    assert events[-1].stage == "decode" and events[-1].step == events[-1].total == 17
    assert not list(result.path.parent.glob(".*partial*"))


@pytest.mark.parametrize("ext,codec", [(".webm", "vp9"), (".gif", "gif"), ("", "png"), (".mp4", "h265")])
def test_other_outputs(base_cfg, tmp_path, ext, codec):
    out = tmp_path / f"clip{ext}"
    result = vidgen.render(base_cfg(output={"path": str(out), "codec": "auto" if codec != "h265" else codec}))
    info = read_video_info(out)
    assert info["frames"] == 9 and (info["width"], info["height"]) == (64, 64)
    assert result.path == out


def test_pipeline_stays_loaded_and_seeds_reproduce(base_cfg, tmp_path):
    pipe = vidgen.Pipeline.from_config(base_cfg())
    model = pipe.components.experts[0]
    a = pipe.generate(seed=1, output={"path": str(tmp_path / "a.mp4")})
    b = pipe.generate(seed=1, output={"path": str(tmp_path / "b.mp4")}, prompt="a blue square moving up")
    c = pipe.generate(**{"seed": 1, "output.path": str(tmp_path / "c.mp4")})
    assert pipe.components.experts[0] is model
    la, lb, lc = (read_latents(r.latents_path)[0] for r in (a, b, c))
    assert torch.equal(la, lc) and not torch.equal(la, lb)
    with pytest.raises(vidgen.ConfigError, match="differ from the loaded pipeline"):
        pipe.generate(model={"dtype": "bfloat16"})


def test_random_seed_is_reported(base_cfg):
    result = vidgen.render(base_cfg(seed=None, output={"path": base_cfg()["output"]["path"].replace("clip", "{seed}")}))
    assert result.path.name == f"{result.seed}.mp4"
    assert json.loads(result.path.with_name(result.path.name + ".json").read_text())["seed"] == result.seed


def test_decode_finishes_a_render_from_latents(base_cfg, tmp_path):
    from vidgen.io import read_frames

    # PNG frames: lossless, so the comparison checks vidgen's pixels, not the video encoder's.
    first = vidgen.render(base_cfg(output={"path": str(tmp_path / "first")}))
    again = vidgen.decode_latents(first.latents_path, **{"output.path": str(tmp_path / "again")})
    a, b = list(read_frames(first.path)), list(read_frames(again.path))
    assert len(a) == len(b) == 9 and all((x == y).all() for x, y in zip(a, b))
    assert first.latents_path.exists()      # the user's latents are never removed by decode
    mp4 = vidgen.decode_latents(first.latents_path, **{"output.path": str(tmp_path / "again.mp4")})
    assert read_video_info(mp4.path)["frames"] == 9


def test_failed_decode_keeps_latents_and_leaves_no_video(base_cfg, monkeypatch):
    import vidgen.pipeline as pl

    def boom(*a, **k):
        raise RuntimeError("decoder exploded")
        yield

    monkeypatch.setattr(pl, "decode_frames", boom)
    cfg = base_cfg()
    with pytest.raises(RuntimeError):
        vidgen.render(cfg)
    out = pl.Path(cfg["output"]["path"])
    assert not out.exists() and out.with_name("clip.latents.safetensors").exists()
    assert not list(out.parent.glob(".*partial*"))


def test_save_latents_false_removes_them(base_cfg):
    result = vidgen.render(base_cfg(output={"save_latents": False}))
    assert result.latents_path is None and not list(result.path.parent.glob("*.safetensors"))


def test_half_precision_model_on_cpu(base_cfg):
    """bf16 transformer and text encoder (diffusers keeps some modules in fp32): the denoiser feeds the
    model its compute dtype, as on a GPU."""
    result = vidgen.render(base_cfg(model={"dtype": "bfloat16"}))
    assert read_video_info(result.path)["frames"] == 9


def test_prompt_slug_cuts_between_words():
    from vidgen.io import slug as _slug

    assert _slug("a red circle moving right on a black background") == "a-red-circle-moving-right-on-a-black-background"
    assert _slug("a yellow triangle moving down on a gray background") == "a-yellow-triangle-moving-down-on-a-gray"
    assert _slug("x" * 60) == "x" * 48 and _slug("  ...  ") == "render"


def test_safetensors_outputs_follow_the_umask(tmp_path):
    # latents and checkpoints sit next to the video in shared output folders: same permissions
    import os

    from vidgen.resume import write_safetensors

    old = os.umask(0o022)
    try:
        path = tmp_path / "x.latents.safetensors"
        write_safetensors(path, {"a": torch.arange(3.0)}, {"format": "test"}, "cannot write")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == [path.name]       # no temporary file left
