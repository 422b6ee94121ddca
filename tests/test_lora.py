"""LoRA files in the layouts people have: each equals a hand-merged copy of the model, per expert,
fused == adapter, warm swaps equal fresh loads bit for bit, and every bad file is refused in one line."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from hostile import assert_refused, untouched
from safetensors.torch import load_file, save_file

import vidgen
from vidgen.cli import main
from vidgen.paths import sidecar_path
from vidgen.pipeline import Pipeline
from vidgen.resume import read_latents

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# (diffusers module, Wan's name, kohya spelling of Wan's name) of the layers the test LoRAs touch
LAYERS = [("blocks.0.attn1.to_q", "blocks.0.self_attn.q"), ("blocks.1.attn2.to_out.0", "blocks.1.cross_attn.o"),
          ("blocks.0.ffn.net.0.proj", "blocks.0.ffn.0"), ("proj_out", "head.head"),
          ("condition_embedder.time_proj", "time_projection.1")]
RANK, ALPHA = 4, 2.0


def _pairs(shapes: dict, seed: int = 1) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for module, _ in LAYERS:
        o, i = shapes[module + ".weight"]
        out[module] = (torch.randn(RANK, i, generator=g) * 0.3, torch.randn(o, RANK, generator=g) * 0.3)
    return out


def _extras(shapes: dict, seed: int = 2) -> dict[str, torch.Tensor]:
    """LightX2V's extras: a bias delta of a LoRA'd layer, a norm's weight and bias deltas (diffusers names)."""
    g = torch.Generator().manual_seed(seed)
    return {"blocks.0.attn1.to_q.bias": torch.randn(shapes["blocks.0.attn1.to_q.bias"], generator=g) * 0.3,
            "blocks.0.norm2.weight": torch.randn(shapes["blocks.0.norm2.weight"], generator=g) * 0.3,
            "blocks.0.norm2.bias": torch.randn(shapes["blocks.0.norm2.bias"], generator=g) * 0.3}


def write_lora(path: Path, fmt: str, shapes: dict, seed: int = 1) -> tuple[dict, dict]:
    """A LoRA in layout `fmt`; returns (low-rank pairs, full deltas) it means, in diffusers' names,
    with alpha/rank already folded into the pairs."""
    pairs, sd = _pairs(shapes, seed), {}
    alpha = fmt in ("kijai", "lightx2v", "musubi")
    for module, wan in LAYERS:
        down, up = pairs[module]
        name = {"peft": f"transformer.{module}", "comfy": f"diffusion_model.{wan}", "bare": wan,
                "model-prefix": f"model.diffusion_model.{wan}", "kijai": f"diffusion_model.{wan}",
                "lightx2v": f"diffusion_model.{wan}", "musubi": "lora_unet_" + wan.replace(".", "_")}[fmt]
        a, b = ("lora_down", "lora_up") if alpha else ("lora_A", "lora_B")
        sd[f"{name}.{a}.weight"], sd[f"{name}.{b}.weight"] = down.clone(), up.clone()
        if alpha:
            sd[f"{name}.alpha"] = torch.tensor(ALPHA)
    scale = ALPHA / RANK if alpha else 1.0
    full = {}
    if fmt == "lightx2v":
        ex = _extras(shapes, seed + 1)
        sd["diffusion_model.blocks.0.self_attn.q.diff_b"] = ex["blocks.0.attn1.to_q.bias"]
        sd["diffusion_model.blocks.0.norm3.diff"] = ex["blocks.0.norm2.weight"]
        sd["diffusion_model.blocks.0.norm3.diff_b"] = ex["blocks.0.norm2.bias"]
        full = ex
    save_file(sd, str(path))
    return {m: (d * scale, u) for m, (d, u) in pairs.items()}, full


def merged_copy(model: Path, dest: Path, experts: dict[str, tuple[dict, dict, float]]) -> Path:
    """A copy of the model folder whose expert weights were merged by hand: W + s * up @ down, + s * deltas."""
    shutil.copytree(model, dest)
    for folder, (pairs, full, s) in experts.items():
        (f,) = (dest / folder).glob("*.safetensors")
        sd = load_file(str(f))
        for module, (down, up) in pairs.items():
            sd[module + ".weight"] = sd[module + ".weight"] + s * (up @ down)
        for name, delta in full.items():
            sd[name] = sd[name] + s * delta
        save_file(sd, str(f))
    return dest


def _shapes(model: Path, folder: str = "transformer") -> dict:
    from vidgen.lora import folder_shapes

    return folder_shapes(model / folder)


def _latents(result) -> torch.Tensor:
    return read_latents(result.latents_path)[0]


def _render(cfg: dict, out: Path, **extra) -> torch.Tensor:
    cfg = {**cfg, "output": {"path": str(out)}, **extra}
    return _latents(vidgen.render(cfg))


@pytest.mark.parametrize("fmt", ["peft", "comfy", "bare", "model-prefix", "kijai", "lightx2v", "musubi"])
def test_each_layout_equals_a_hand_merged_model(base_cfg, tiny_model, tmp_path, fmt):
    model = Path(tiny_model())
    pairs, full = write_lora(tmp_path / "l.safetensors", fmt, _shapes(model))
    merged = merged_copy(model, tmp_path / "merged", {"transformer": (pairs, full, 0.7)})
    cfg = base_cfg()
    with_lora = _render(cfg, tmp_path / "a.mp4", loras=[{"path": str(tmp_path / "l.safetensors"), "strength": 0.7}])
    by_hand = _render({**cfg, "model": {**cfg["model"], "path": str(merged)}}, tmp_path / "b.mp4")
    plain = _render(cfg, tmp_path / "c.mp4")
    assert (with_lora - by_hand).abs().max().item() <= 1e-5
    assert (with_lora - plain).abs().max().item() > 1e-3          # the LoRA does something


def test_fused_equals_adapter_and_strength_zero_is_none(base_cfg, tiny_model, tmp_path):
    write_lora(tmp_path / "l.safetensors", "lightx2v", _shapes(Path(tiny_model())))
    cfg = base_cfg()
    lora = [{"path": str(tmp_path / "l.safetensors"), "strength": 0.8}]
    fused = _render(cfg, tmp_path / "a.mp4", loras=lora, lora_mode="fuse")
    adapter = _render(cfg, tmp_path / "b.mp4", loras=lora, lora_mode="adapter")
    assert (fused - adapter).abs().max().item() <= 1e-5
    zero = _render(cfg, tmp_path / "c.mp4", loras=[{**lora[0], "strength": 0.0}], lora_mode="fuse")
    assert torch.equal(zero, _render(cfg, tmp_path / "d.mp4"))


def test_expert_high_changes_only_the_high_noise_expert(base_cfg, tiny_model, tmp_path):
    model = Path(tiny_model("wan2.2-t2v-a14b"))
    write_lora(tmp_path / "h.safetensors", "kijai", _shapes(model))
    cfg = base_cfg("wan2.2-t2v-a14b")
    cfg["output"] = {"path": str(tmp_path / "a.mp4")}
    fresh = Pipeline.from_config(cfg)
    for mode in ("fuse", "adapter"):
        pipe = Pipeline.from_config({**cfg, "lora_mode": mode,
                                     "loras": [{"path": str(tmp_path / "h.safetensors"), "expert": "high"}]})
        high, low = pipe.components.experts
        merged = dict(high.named_parameters()) if mode == "fuse" else None
        for (name, p), q in zip(low.state_dict().items(), fresh.components.experts[1].state_dict().values()):
            assert torch.equal(p, q), (mode, name)
        assert not getattr(low, "peft_config", None)
        if merged is not None:
            assert not torch.equal(merged["proj_out.weight"], dict(fresh.components.experts[0].named_parameters())["proj_out.weight"])
        else:
            assert "lora0" in high.peft_config


def test_swaps_in_a_warm_pipeline_equal_fresh_loads(base_cfg, tiny_model, tmp_path):
    shapes = _shapes(Path(tiny_model()))
    write_lora(tmp_path / "a.safetensors", "lightx2v", shapes, seed=1)
    write_lora(tmp_path / "b.safetensors", "musubi", shapes, seed=5)
    cfg = base_cfg()
    a = [{"path": str(tmp_path / "a.safetensors"), "strength": 0.9}]
    b = [{"path": str(tmp_path / "b.safetensors"), "strength": 1.2}]
    for mode in ("adapter", "fuse"):
        warm = Pipeline.from_config({**cfg, "lora_mode": mode, "output": {"path": str(tmp_path / mode / "w0.mp4")}})
        for i, loras in enumerate((a, b, [], a, b, [{**b[0], "strength": 0.4}])):   # the last: strength only
            job = {**cfg, "lora_mode": mode, "loras": loras}
            got = _latents(warm.generate({**job, "output": {"path": str(tmp_path / mode / f"w{i}.mp4")}}))
            fresh = Pipeline.from_config({**job, "output": {"path": str(tmp_path / mode / f"f{i}.mp4")}})
            want = _latents(fresh.generate())
            assert torch.equal(got, want), (mode, i)


def test_records_and_resume_know_the_file(base_cfg, tiny_model, tmp_path):
    write_lora(tmp_path / "l.safetensors", "comfy", _shapes(Path(tiny_model())))
    cfg = base_cfg(loras=[{"path": str(tmp_path / "l.safetensors"), "strength": 0.5}])
    result = vidgen.render(cfg)
    side = json.loads(sidecar_path(result.path).read_text())
    sha = hashlib.sha256((tmp_path / "l.safetensors").read_bytes()).hexdigest()
    assert side["loras"] == [{"path": str(tmp_path / "l.safetensors"), "sha256": sha, "strength": 0.5, "expert": "both"}]
    assert side["config"]["loras"][0]["sha256"] == sha        # the config (so its digest) holds the file's hash
    from vidgen.presets import load_config
    from vidgen.resume import _lora_diffs

    assert _lora_diffs(load_config(cfg), side["config"]) == []             # same file, strength, expert
    moved = tmp_path / "moved.safetensors"
    shutil.copy(tmp_path / "l.safetensors", moved)
    assert _lora_diffs(load_config({**cfg, "loras": [{"path": str(moved), "strength": 0.5}]}), side["config"]) == []
    for other in ({"path": str(moved), "strength": 0.6}, {"path": str(moved), "strength": 0.5, "sha256": "0" * 64}):
        assert _lora_diffs(load_config({**cfg, "loras": [other]}), side["config"])
    assert _lora_diffs(load_config({**cfg, "loras": []}), side["config"])


def test_modules_the_model_lacks_are_named_in_one_warning(base_cfg, tiny_model, tmp_path, caplog):
    shapes = _shapes(Path(tiny_model()))
    write_lora(tmp_path / "l.safetensors", "comfy", shapes)
    sd = load_file(str(tmp_path / "l.safetensors"))
    for o in ("k_img", "v_img"):       # a Wan2.1-I2V LoRA's image keys on a text-to-video model
        sd[f"diffusion_model.blocks.0.cross_attn.{o}.lora_A.weight"] = torch.zeros(RANK, 32)
        sd[f"diffusion_model.blocks.0.cross_attn.{o}.lora_B.weight"] = torch.zeros(32, RANK)
    save_file(sd, str(tmp_path / "l.safetensors"))
    with caplog.at_level(logging.WARNING, logger="vidgen"):
        vidgen.render(base_cfg(loras=[{"path": str(tmp_path / "l.safetensors")}]))
    lines = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(lines) == 1 and "blocks.0.cross_attn.k_img" in lines[0] and "blocks.0.cross_attn.v_img" in lines[0]
    caplog.clear()
    from vidgen.lora import plan_lora

    with caplog.at_level(logging.WARNING, logger="vidgen"):        # one file on two experts: one warning
        plans = plan_lora(tmp_path / "l.safetensors", 1.0, "both", [shapes, shapes])
    assert len(plans) == 2 and [p.skipped for p in plans] == [["blocks.0.cross_attn.k_img", "blocks.0.cross_attn.v_img"]] * 2
    assert len([r for r in caplog.records if "skipped" in r.getMessage()]) == 1


def _bad_files(tmp: Path, shapes: dict) -> dict[str, tuple[Path, str]]:
    out = {}
    out["missing"] = (tmp / "nope.safetensors", "does not exist")
    torch.save({"a": torch.zeros(1)}, tmp / "pickle.safetensors")
    out["pickle"] = (tmp / "pickle.safetensors", "pickle")
    (tmp / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    out["corrupt"] = (tmp / "junk.safetensors", "safetensors")
    save_file({"blocks.0.attn1.to_q.lora_A.weight": torch.zeros(RANK, 32),
               "blocks.0.attn1.to_q.lora_B.weight": torch.zeros(32, RANK)}, str(tmp / "none.safetensors"))
    save_file({"unet.down_blocks.0.attentions.0.to_q.lora_A.weight": torch.zeros(RANK, 32),
               "unet.down_blocks.0.attentions.0.to_q.lora_B.weight": torch.zeros(32, RANK)}, str(tmp / "sd.safetensors"))
    out["matches-nothing"] = (tmp / "sd.safetensors", "matches a layer")
    save_file({"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.zeros(RANK, 5120),
               "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.zeros(5120, RANK)},
              str(tmp / "big.safetensors"))
    out["other-size"] = (tmp / "big.safetensors", "another model size")
    save_file({"diffusion_model.blocks.0.self_attn.q.lokr_w1": torch.zeros(4, 4)}, str(tmp / "lokr.safetensors"))
    out["lokr"] = (tmp / "lokr.safetensors", "LoKr")
    save_file({"diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.full((RANK, 32), float("nan")),
               "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.zeros(32, RANK)}, str(tmp / "nan.safetensors"))
    out["nan"] = (tmp / "nan.safetensors", "NaN")
    return out


@pytest.mark.parametrize("case", ["missing", "pickle", "corrupt", "matches-nothing", "other-size", "lokr", "nan",
                                  "expert-high", "negative", "not-finite"])
def test_bad_loras_are_refused_in_one_line(capsys, base_cfg, tiny_model, tmp_path, case):
    files = tmp_path / "loras"
    files.mkdir()
    bad = _bad_files(files, _shapes(Path(tiny_model())))
    good = files / "good.safetensors"
    write_lora(good, "kijai", _shapes(Path(tiny_model())))
    lora, needle = ({"path": str(bad[case][0])}, bad[case][1]) if case in bad else {
        "expert-high": ({"path": str(good), "expert": "high"}, "two-expert"),
        "negative": ({"path": str(good), "strength": -0.5}, "strength"),
        "not-finite": ({"path": str(good), "strength": float("inf")}, "strength")}[case]
    cfg = base_cfg(loras=[lora])
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    with untouched(files, out if out.exists() else tmp_path / "c.yaml"):
        code = main(["render", str(tmp_path / "c.yaml"), "-q"])
    err = capsys.readouterr().err
    assert_refused(code, err, needle)
    assert not (out / "clip.mp4").exists()
