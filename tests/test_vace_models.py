"""VACE weights as users have them: a Wan-named single file (bare, ComfyUI-prefixed, fp8_scaled) loads
through model.transformer into the VACE class, bit-identical to the diffusers folder (lossless ones)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import layouts
from vidgen import families, sources
from vidgen.pipeline import Pipeline
from vidgen.weights import open_weights


@pytest.fixture
def vace_shipped(tiny_model, tmp_path, monkeypatch):
    """The shipped wan2.1-vace-1.3b JSON replaced by the tiny VACE model's, so shapes identify the file."""
    root = tmp_path / "variants"
    shutil.copytree(Path(tiny_model("wan2.1-vace")), root / "wan2.1-vace-1.3b",
                    ignore=shutil.ignore_patterns("*.safetensors", "tokenizer"))
    monkeypatch.setattr(sources, "VARIANTS_DIR", root)
    sources._shipped_shapes.cache_clear()
    yield root
    sources._shipped_shapes.cache_clear()


def _wan_state(folder: Path) -> dict[str, torch.Tensor]:
    """The tiny VACE transformer with every key in Wan's original names (families.wan_name)."""
    own = layouts._load_component(folder / "transformer")
    return {families.wan_name("transformer", k): v.contiguous() for k, v in own.items()}


def _pipe(model: dict, out: Path) -> Pipeline:
    return Pipeline.from_config({"model": {"device": "cpu", **model}, "prompt": "a red circle", "size": "64x64",
                                 "num_frames": 5, "fps": 8, "seed": 7, "sampling": {"steps": 2},
                                 "output": {"path": str(out)}})


def _expert(pipe: Pipeline) -> dict[str, torch.Tensor]:
    return dict(pipe.components.experts[0].state_dict())


def _single(folder: Path, file: Path) -> dict:
    return {"transformer": str(file), "text_encoder": str(next((folder / "text_encoder").glob("*.safetensors"))),
            "vae": str(next((folder / "vae").glob("*.safetensors"))), "tokenizer": str(folder / "tokenizer")}


def test_wan_names_of_the_vace_parts():
    """Wan's VACE names come out of the adapter as Wan writes them (and back)."""
    pairs = {"vace_blocks.0.proj_in.weight": "vace_blocks.0.before_proj.weight",
             "vace_blocks.1.proj_out.bias": "vace_blocks.1.after_proj.bias",
             "vace_patch_embedding.weight": "vace_patch_embedding.weight"}
    for ours, wan in pairs.items():
        assert families.wan_name("transformer", ours) == wan
        assert families.diffusers_name("transformer", wan) == ours


@pytest.mark.parametrize("prefix", ["", "model.diffusion_model."])
def test_vace_single_file_equals_the_folder(tiny_model, vace_shipped, tmp_path, prefix):
    folder = Path(tiny_model("wan2.1-vace"))
    state = _wan_state(folder)
    assert any(".before_proj." in k for k in state) and any(".after_proj." in k for k in state)
    assert "vace_patch_embedding.weight" in state and not any(".proj_in." in k for k in state)
    file = tmp_path / "vace.safetensors"
    save_file({prefix + k: v for k, v in state.items()}, file)
    ref = _pipe({"path": str(folder)}, tmp_path / "r.mp4")
    pipe = _pipe(_single(folder, file), tmp_path / "a.mp4")
    assert pipe.target.info.variant == "wan2.1-vace"
    assert type(pipe.components.experts[0]).__name__ == "WanVACETransformer3DModel"
    a, b = _expert(pipe), _expert(ref)
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


def test_vace_fp8_scaled_file_loads_its_dequantised_weights(tiny_model, vace_shipped, tmp_path):
    folder = Path(tiny_model("wan2.1-vace"))
    prefix = "model.diffusion_model."
    scaled = layouts.fp8_scaled_state_dict(_wan_state(folder), prefix)
    save_file(scaled, tmp_path / "vace_fp8_scaled.safetensors")
    deq = layouts.fp8_dequantized_state_dict(scaled, prefix)
    w = open_weights("transformer", tmp_path / "vace_fp8_scaled.safetensors")
    assert w is not None
    pipe = _pipe(_single(folder, tmp_path / "vace_fp8_scaled.safetensors"), tmp_path / "a.mp4")
    assert pipe.target.info.variant == "wan2.1-vace"
    got = _expert(pipe)
    want = {families.diffusers_name("transformer", k): v for k, v in deq.items()}
    assert got.keys() == want.keys()
    assert [k for k in got if not torch.equal(got[k].float(), want[k].float())] == []


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_vace_gguf_loads_as_the_folder(tiny_model, vace_shipped, tmp_path, qtype):
    """A city96-style GGUF of a VACE transformer is told from its shapes and loads into the VACE class:
    F32 bit-identical to the folder, Q8_0 rendering within its quantisation error."""
    pytest.importorskip("gguf")
    from vidgen.resume import read_latents

    folder = Path(tiny_model("wan2.1-vace"))
    file = layouts.write_gguf(folder / "transformer", tmp_path / f"vace-{qtype}.gguf", qtype, state=_wan_state(folder))
    assert open_weights("transformer", file).kind == "gguf"
    pipe = _pipe(_single(folder, file), tmp_path / "a.mp4")
    assert pipe.target.info.variant == "wan2.1-vace"
    assert type(pipe.components.experts[0]).__name__ == "WanVACETransformer3DModel"
    ref = _pipe({"path": str(folder)}, tmp_path / "r.mp4")
    if qtype == "F32":
        got, want = _expert(pipe), _expert(ref)
        assert got.keys() == want.keys() and [k for k in got if not torch.equal(got[k], want[k])] == []
        return
    a, b = (read_latents(p.generate().latents_path)[0] for p in (pipe, ref))
    rel = ((a - b).norm() / b.norm()).item()
    assert 0 < rel < 0.05, rel


# --- the memory plan from the shipped JSON (no weights) ---------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def _plan(variant: str, path: str, *overrides: str):
    from vidgen.memory import plan_render
    from vidgen.presets import load_config

    cfg = load_config(ROOT / "configs/wan2.1-t2v-14b.yaml",
                      ["prompt=x", f"model.path=/nowhere/{path}", f"model.variant={variant}", "model.device=cuda",
                       "memory.host_budget=96GiB", "memory.device_budget=139GiB", *overrides])
    return plan_render(cfg).chosen


def test_vace_blocks_weights_are_counted():
    """The meta model is the VACE class: its context blocks add to the 14B's weights."""
    from vidgen.footprint import model_spec, transformer_weights
    from vidgen.presets import load_config

    def params(variant, path):
        cfg = load_config(ROOT / "configs/wan2.1-t2v-14b.yaml",
                          ["prompt=x", f"model.path=/nowhere/{path}", f"model.variant={variant}"])
        return transformer_weights(model_spec(cfg).transformer, torch.bfloat16, False).params

    t2v, vace = params("wan2.1-t2v", "Wan2.1-T2V-14B"), params("wan2.1-vace", "Wan2.1-VACE-14B")
    assert vace > t2v * 1.1          # 8 context blocks of the 40 (and the control patch embedding)


def test_vace_plan_peaks_at_least_the_t2v_one_and_grows_with_reference_images(tmp_path):
    t2v = _plan("wan2.1-t2v", "Wan2.1-T2V-14B")
    vace = _plan("wan2.1-vace", "Wan2.1-VACE-14B")
    assert (t2v.placement, t2v.weights) == (vace.placement, vace.weights)
    assert vace.device_peak_bytes >= t2v.device_peak_bytes

    def denoise(plan):
        return max(s.device_total for s in plan.stages if s.name.startswith("denoising"))

    assert denoise(vace) > denoise(t2v)
    refs = []
    for i in range(2):
        from PIL import Image
        Image.new("RGB", (64, 64)).save(tmp_path / f"r{i}.png")
        refs.append(str(tmp_path / f"r{i}.png"))
    with_refs = _plan("wan2.1-vace", "Wan2.1-VACE-14B", f"control.reference_images=[{','.join(refs)}]")
    assert denoise(with_refs) > denoise(vace)


def test_vace_refusal_names_a_minimum_that_is_accepted(capsys):
    from vidgen.cli import main

    args = [str(ROOT / "configs/wan2.1-t2v-14b.yaml"), "model.path=/nowhere/Wan2.1-VACE-14B", "model.variant=wan2.1-vace",
            "model.device=cuda", "memory.host_budget=96GiB"]
    assert main(["plan", *args, "memory.device_budget=2GiB"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err and "below the minimum for wan2.1-vace-14b" in err
    minimum = err.split("(")[1].split(" with")[0].replace(" ", "")
    assert main(["plan", *args, f"memory.device_budget={minimum}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"] is True
