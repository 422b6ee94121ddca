"""Weights as users have them: each layout (tests/layouts.py writes it from a tiny pipeline) loads
through the same model.* keys and renders; lossless ones bit-identical to the diffusers folder."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

import layouts
from vidgen import sources
from vidgen.weights import Weights, open_weights
from vidgen.cli import main
from vidgen.errors import install_hint
from vidgen.launch import render

IMAGE = Path(__file__).parent.parent / "samples" / "first-frame.png"
SHIPPED_NAME = {"wan2.1-t2v": "wan2.1-t2v-1.3b", "wan2.2-t2v-a14b": "wan2.2-t2v-a14b",
                "wan2.2-i2v-a14b": "wan2.2-i2v-a14b", "wan2.2-ti2v-5b": "wan2.2-ti2v-5b"}


@pytest.fixture
def tiny_shipped(tiny_model, tmp_path, monkeypatch):
    """vidgen's shipped configs replaced by the tiny models' JSON (same names), so that files with the
    tiny widths are told apart by their shapes as real files are by theirs."""
    root = tmp_path / "variants"
    for variant, name in SHIPPED_NAME.items():
        src = Path(tiny_model(variant))
        shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("*.safetensors", "tokenizer"))
    monkeypatch.setattr(sources, "VARIANTS_DIR", root)
    sources._shipped_shapes.cache_clear()
    yield root
    sources._shipped_shapes.cache_clear()


def _cfg(model: dict, out: Path, variant: str = "wan2.1-t2v", **extra) -> dict:
    cfg = {"model": {"device": "cpu", **model}, "prompt": "a red circle moving right on a black background",
           "negative_prompt": "blurry", "size": "64x64", "num_frames": 5, "fps": 8, "seed": 7,
           "sampling": {"steps": 3, "guidance_scale": 4.0},
           "output": {"path": str(out), "save_latents": True}, **extra}
    if variant == "wan2.2-i2v-a14b":
        cfg["image"] = str(IMAGE)
    return cfg


def _latents(model: dict, out: Path, variant: str = "wan2.1-t2v") -> torch.Tensor:
    return load_file(render(_cfg(model, out, variant)).latents_path)["latents"]


# A lossless layout reads the same weights bit for bit (compared directly, every tensor of every
# component). The latents then agree to float32 rounding, not always bit for bit: MKL's sgemm can
# round differently with a weight's memory alignment, and a memory-mapped file's tensors sit at other
# offsets than the folder's (measured: 4.8e-7 on one forward, 0 once both copies are re-allocated).
LOSSLESS = 1e-5


def _weights(model: dict, out: Path, variant: str = "wan2.1-t2v") -> dict[str, torch.Tensor]:
    import vidgen

    c = vidgen.Pipeline.from_config(_cfg(model, out, variant)).components
    parts = {"text_encoder": c.text_encoder, "vae": c.vae, **{f"expert{i}": m for i, m in enumerate(c.experts)}}
    return {f"{name}.{k}": v for name, m in parts.items() for k, v in m.state_dict().items()}


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


@pytest.mark.parametrize("variant", ["wan2.1-t2v", "wan2.2-t2v-a14b", "wan2.2-i2v-a14b", "wan2.2-ti2v-5b"])
def test_single_files_in_wans_names_equal_the_folder(tiny_model, tiny_shipped, tmp_path, variant):
    """ComfyUI-style config (no model.path): Wan-named transformer file(s) with each prefix, Wan's
    .pth T5, Wan's VAE .pth (Wan2.1 layout; the 5B's VAE as its diffusers file) — bit-identical."""
    folder = Path(tiny_model(variant))
    ref = _latents({"path": str(folder)}, tmp_path / "ref.mp4", variant)
    prefix = {"wan2.1-t2v": "model.diffusion_model.", "wan2.2-t2v-a14b": "", "wan2.2-i2v-a14b": "diffusion_model.",
              "wan2.2-ti2v-5b": ""}[variant]
    model = {"transformer": str(layouts.write_wan_transformer_file(folder / "transformer", tmp_path / "t.safetensors",
                                                                   prefix)),
             "text_encoder": str(layouts.write_wan_t5_pth(folder / "text_encoder", tmp_path / "t5.pth")),
             "tokenizer": str(folder / "tokenizer")}
    if (folder / "transformer_2").is_dir():
        model["transformer_2"] = str(layouts.write_wan_transformer_file(folder / "transformer_2",
                                                                       tmp_path / "t2.safetensors", prefix))
    if variant == "wan2.2-ti2v-5b":
        model["vae"] = str(next((folder / "vae").glob("*.safetensors")))
    else:
        model["vae"] = str(layouts.write_wan_vae(folder / "vae", tmp_path / "vae.pth"))
    _assert_same_weights(_weights(model, tmp_path / "w.mp4", variant), _weights({"path": str(folder)}, tmp_path / "v.mp4",
                                                                            variant))
    assert (_latents(model, tmp_path / "a.mp4", variant) - ref).abs().max().item() <= LOSSLESS


def test_wan_checkpoint_folder_and_comfy_text_encoder(tiny_model, tiny_shipped, tmp_path):
    folder = Path(tiny_model("wan2.2-t2v-a14b"))
    ref = _latents({"path": str(folder)}, tmp_path / "ref.mp4", "wan2.2-t2v-a14b")
    wan = layouts.write_wan_folder(folder, tmp_path / "Wan2.2-T2V-A14B")
    _assert_same_weights(_weights({"path": str(wan)}, tmp_path / "w.mp4", "wan2.2-t2v-a14b"),
                         _weights({"path": str(folder)}, tmp_path / "v.mp4", "wan2.2-t2v-a14b"))
    assert (_latents({"path": str(wan)}, tmp_path / "a.mp4", "wan2.2-t2v-a14b") - ref).abs().max().item() <= LOSSLESS
    comfy_te = layouts.write_comfy_text_encoder(folder / "text_encoder", tmp_path / "umt5_xxl_fp16.safetensors")
    got = _latents({"path": str(wan), "text_encoder": str(comfy_te)}, tmp_path / "b.mp4", "wan2.2-t2v-a14b")
    assert (got - ref).abs().max().item() <= LOSSLESS


def test_fp8_scaled_applies_its_scales(tiny_model, tiny_shipped, tmp_path):
    """ComfyUI fp8_scaled: weights x scale_weight, exactly the dequantised tensors; within the fp8
    rounding of the weights of the original, far closer than the same file read without its scales."""
    folder = Path(tiny_model())
    base = {"text_encoder": str(next((folder / "text_encoder").glob("*.safetensors"))),
            "vae": str(next((folder / "vae").glob("*.safetensors"))), "tokenizer": str(folder / "tokenizer")}
    ref = _latents({"path": str(folder)}, tmp_path / "ref.mp4")
    deq = layouts.write_fp8_scaled(folder / "transformer", tmp_path / "t_fp8_scaled.safetensors")
    save_file({k: v.contiguous() for k, v in deq.items()}, tmp_path / "deq.safetensors")
    w = open_weights("transformer", tmp_path / "t_fp8_scaled.safetensors")
    assert w.quant == "fp8_scaled" and "fp8_scaled" in w.describe()
    fp8 = _latents({**base, "transformer": str(tmp_path / "t_fp8_scaled.safetensors")}, tmp_path / "a.mp4")
    exact = _latents({**base, "transformer": str(tmp_path / "deq.safetensors")}, tmp_path / "b.mp4")
    assert torch.equal(fp8, exact)
    unscaled = {k: v for k, v in load_file(tmp_path / "t_fp8_scaled.safetensors").items()
                if not k.endswith((".scale_weight", ".scale_input")) and not k.endswith("scaled_fp8")}
    save_file(unscaled, tmp_path / "unscaled.safetensors")
    from vidgen.errors import NonFiniteOutput

    try:        # unscaled: far off, or not finite (the render then stops at the step that went wrong)
        wrong = _latents({**base, "transformer": str(tmp_path / "unscaled.safetensors")}, tmp_path / "c.mp4")
        err_wrong = (wrong - ref).abs().nan_to_num(float("inf")).max().item()
    except NonFiniteOutput:
        err_wrong = float("inf")
    err = (fp8 - ref).abs().max().item()
    assert 0 < err <= 0.25 * ref.abs().max().item() and err < err_wrong / 4


@pytest.mark.parametrize("qtype,bound", [("Q8_0", 0.05), ("Q4_0", 0.5)])
def test_gguf_renders_within_its_quantisation_error(tiny_model, tiny_shipped, tmp_path, qtype, bound):
    pytest.importorskip("gguf")
    folder = Path(tiny_model())
    ref = _latents({"path": str(folder)}, tmp_path / "ref.mp4")
    gguf_file = layouts.write_gguf(folder / "transformer", tmp_path / f"t-{qtype}.gguf", qtype)
    w = open_weights("transformer", gguf_file)
    assert w.kind == "gguf" and qtype in w.quant
    got = _latents({"path": str(folder), "transformer": str(gguf_file)}, tmp_path / "a.mp4")
    rel = ((got - ref).norm() / ref.norm()).item()
    assert 0 < rel < bound, rel


def test_hugging_face_cache_id(tiny_model, tmp_path, monkeypatch, capsys):
    folder = Path(tiny_model())
    cache = tmp_path / "hub"
    layouts.fake_hf_cache(cache, "Wan-AI/Tiny-T2V-Diffusers", folder)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    ref = _latents({"path": str(folder)}, tmp_path / "ref.mp4")
    assert torch.equal(_latents({"path": "Wan-AI/Tiny-T2V-Diffusers"}, tmp_path / "a.mp4"), ref)
    out = tmp_path / "b.mp4"
    code = main(["render", str(_write(tmp_path, _cfg({"path": "Wan-AI/Not-Downloaded"}, out)))])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "hf download <repo id>" in err
    assert "hf download Wan-AI/Not-Downloaded" not in err           # no download hint for an id not published
    assert not out.exists()
    assert main(["models"]) == 0
    assert "Wan-AI/Tiny-T2V-Diffusers" in capsys.readouterr().out
    # The tokenizer of a cached Wan repo serves single-file configs that name none.
    (cache / "models--Wan-AI--Tiny-T2V-Diffusers").rename(cache / "models--Wan-AI--Wan2.1-T2V-1.3B-Diffusers")
    assert sources._cached_tokenizer() is not None


def _write(tmp_path: Path, cfg: dict) -> Path:
    path = tmp_path / f"cfg{len(list(tmp_path.glob('cfg*.yaml')))}.yaml"
    path.write_text(json.dumps(cfg))
    return path


# --------------------------------------------------------------------------------------------
# The variant, told from the shapes of the real models (shipped configs, meta tensors)


def _real(name: str, role: str = "transformer", wan_names: bool = True) -> Weights:
    shapes = sources.expected_shapes(sources.VARIANTS_DIR / name, role)
    if wan_names:
        from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

        wan = {layouts._rename(k, layouts._TRANSFORMER_TO_WAN): k for k in shapes}
        assert set(convert_wan_transformer_to_diffusers(dict(wan))) == set(shapes)   # the inverse is exact
    return Weights(role, Path(f"{name}.safetensors"), (Path(f"{name}.safetensors"),), "safetensors",
                   "wan" if wan_names else "diffusers", {k: (0, k) for k in shapes}, shapes)


@pytest.mark.parametrize("name,experts,family", [
    ("wan2.1-t2v-1.3b", 1, "wan2.1-t2v"), ("wan2.1-t2v-14b", 1, "wan2.1-t2v"), ("wan2.2-t2v-a14b", 2, "wan2.2-t2v-a14b"),
    ("wan2.2-i2v-a14b", 2, "wan2.2-i2v-a14b"), ("wan2.2-ti2v-5b", 1, "wan2.2-ti2v-5b")])
def test_variant_told_from_the_real_shapes(name, experts, family):
    w = _real(name)
    got, facts = sources.transformer_family(w, experts)
    assert got == family, facts
    hint = name if name == "wan2.2-t2v-a14b" else ""
    assert sources.shipped_match(w, family, hint) == name
    if family == "wan2.1-t2v":      # 1.3B and 14B by width
        other = "wan2.1-t2v-14b" if name.endswith("1.3b") else "wan2.1-t2v-1.3b"
        assert sources.shipped_match(w, family, "") != other


def test_the_5b_vae_is_not_the_14bs():
    w14 = _real("wan2.2-t2v-a14b", "vae", wan_names=False)
    assert w14.mismatch(sources.expected_shapes(sources.VARIANTS_DIR / "wan2.2-ti2v-5b", "vae")) is not None
    assert w14.mismatch(sources.expected_shapes(sources.VARIANTS_DIR / "wan2.1-t2v-14b", "vae")) is None


# --------------------------------------------------------------------------------------------
# Bad input: exit 2, one line, no output file


def _refused(capsys, tmp_path, model: dict, *needles: str, variant: str = "wan2.1-t2v", **extra) -> str:
    out = tmp_path / "bad.mp4"
    code = main(["render", str(_write(tmp_path, _cfg(model, out, variant, **extra)))])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    assert not out.exists() and not list(tmp_path.glob("bad*.partial*"))
    return err


def test_mismatched_parts_are_refused_at_once(tiny_model, tiny_shipped, tmp_path, capsys):
    t2v, i2v, ti2v = (Path(tiny_model(v)) for v in ("wan2.2-t2v-a14b", "wan2.2-i2v-a14b", "wan2.2-ti2v-5b"))
    high = layouts.write_wan_transformer_file(t2v / "transformer", tmp_path / "high.safetensors")
    low_i2v = layouts.write_wan_transformer_file(i2v / "transformer_2", tmp_path / "low_i2v.safetensors")
    vae5b = next((ti2v / "vae").glob("*.safetensors"))
    te = next((t2v / "text_encoder").glob("*.safetensors"))
    err = _refused(capsys, tmp_path, {"transformer": str(high), "transformer_2": str(low_i2v), "text_encoder": str(te),
                                      "vae": str(vae5b), "tokenizer": str(t2v / "tokenizer")},
                   "model.transformer_2", "model.vae", variant="wan2.2-t2v-a14b")
    assert "problems" in err
    # A T2V model where the config expects I2V.
    _refused(capsys, tmp_path, {"path": str(t2v), "variant": "wan2.2-i2v-a14b"}, "model.variant", "wan2.2-t2v-a14b")
    # An A14B high-noise file alone.
    _refused(capsys, tmp_path, {"transformer": str(high), "text_encoder": str(te), "vae": str(vae5b),
                                "tokenizer": str(t2v / "tokenizer"), "variant": "wan2.2-t2v-a14b"}, "transformer_2")


def test_damaged_and_foreign_files(tiny_model, tiny_shipped, tmp_path, capsys, monkeypatch):
    folder = Path(tiny_model())
    good = layouts.write_wan_transformer_file(folder / "transformer", tmp_path / "t.safetensors")
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[:-100])
    _refused(capsys, tmp_path, {"path": str(folder), "transformer": str(truncated)}, "truncated.safetensors")
    bad_gguf = tmp_path / "broken.gguf"
    bad_gguf.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 40)
    if pytest.importorskip("gguf"):
        _refused(capsys, tmp_path, {"path": str(folder), "transformer": str(bad_gguf)}, "broken.gguf")
    import builtins

    real_import = builtins.__import__

    def no_gguf(name, *a, **k):
        if name == "gguf":
            raise ImportError("no gguf")
        return real_import(name, *a, **k)
    with monkeypatch.context() as m:
        m.setattr(builtins, "__import__", no_gguf)
        _refused(capsys, tmp_path, {"path": str(folder), "transformer": str(bad_gguf)}, install_hint("gguf"))
    evil = tmp_path / "evil.pth"
    torch.save({"w": torch.zeros(1), "x": Path("/etc")}, evil)
    _refused(capsys, tmp_path, {"path": str(folder), "text_encoder": str(evil)}, "weights_only")
    _refused(capsys, tmp_path, {"transformer": str(good), "vae": str(next((folder / "vae").glob("*.safetensors"))),
                                "tokenizer": str(folder / "tokenizer")}, "model.text_encoder")
    monkeypatch.setattr(sources, "_cached_tokenizer", lambda: None)
    _refused(capsys, tmp_path, {"transformer": str(good), "vae": str(next((folder / "vae").glob("*.safetensors"))),
                                "text_encoder": str(next((folder / "text_encoder").glob("*.safetensors")))},
             "model.tokenizer", "spiece.model")
    _refused(capsys, tmp_path, {"path": str(folder), "transformer": str(tmp_path / "nothere.safetensors")}, "does not exist")
    _refused(capsys, tmp_path, {"path": str(folder), "vae": str(good)}, "model.vae", "does not fit")


def test_newer_comfy_quant_formats(tiny_model, tmp_path):
    folder = Path(tiny_model())
    sd = layouts.wan_transformer_state_dict(folder / "transformer")
    key = next(k for k in sd if k.endswith("ffn.0.weight"))
    w = sd[key]
    scale = w.abs().max() / 448
    sd[key] = (w / scale).to(torch.float8_e4m3fn)
    sd[key.removesuffix(".weight") + ".weight_scale"] = scale.float()
    sd[key.removesuffix(".weight") + ".comfy_quant"] = torch.tensor(list(b'{"format": "float8_e4m3fn"}'), dtype=torch.uint8)
    save_file(sd, tmp_path / "q.safetensors")
    got = open_weights("transformer", tmp_path / "q.safetensors")
    name = next(n for n, (_, k) in got.names.items() if k == key)
    (_, t), = got.read({name: torch.float32})
    assert torch.equal(t, sd[key].float() * scale.float())
    sd[key.removesuffix(".weight") + ".comfy_quant"] = torch.tensor(list(b'{"format": "nvfp4"}'), dtype=torch.uint8)
    save_file(sd, tmp_path / "nv.safetensors")
    with pytest.raises(Exception, match="nvfp4"):
        open_weights("transformer", tmp_path / "nv.safetensors")


def test_info_describes_files_and_folders(tiny_model, tiny_shipped, tmp_path, capsys, monkeypatch):
    folder = Path(tiny_model("wan2.2-t2v-a14b"))
    wan = layouts.write_wan_folder(folder, tmp_path / "Wan2.2-T2V-A14B")
    assert main(["info", str(wan)]) == 0
    out = capsys.readouterr().out
    assert "Wan checkpoint folder" in out and "wan2.2-t2v-a14b" in out and "missing: nothing" in out
    assert "models_t5_umt5-xxl-enc-bf16.pth" in out and "Wan's original names" in out
    fp8 = tmp_path / "high_fp8_scaled.safetensors"
    layouts.write_fp8_scaled(folder / "transformer", fp8, prefix="")
    assert main(["info", str(fp8)]) == 0
    out = capsys.readouterr().out
    assert "transformer file" in out and "fp8_scaled" in out and "float8_e4m3fn" in out
    monkeypatch.setenv("VIDGEN_MODELS", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "Wan2.2-T2V-A14B" in out and "high_fp8_scaled.safetensors" in out


def test_info_and_models_on_the_shipped_samples(tiny_model, tmp_path, capsys, monkeypatch):
    """The demo LoRA is a LoRA, not a text encoder; a model folder is one row, its transformer/ and vae/
    are part of it; a message too long for a row is cut at a boundary, never inside a word."""
    from vidgen.errors import ModelLoadError

    samples = Path(__file__).resolve().parents[1] / "samples"
    assert main(["info", str(samples / "demo-outline-lora.safetensors")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{samples / 'demo-outline-lora.safetensors'}: a LoRA file (40 layers, rank 8, ")
    assert "text encoder" not in out and "loras=[{path: " in out and "Wan's names" in out
    other = tmp_path / "other.safetensors"
    save_file({"conv.weight": torch.zeros(4, 4), "fc.bias": torch.zeros(4)}, str(other))
    assert main(["info", str(other)]) == 0
    assert capsys.readouterr().out.startswith(f"{other}: not a Wan component file: its 2 tensor(s) (conv.weight, fc.bias)")
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    assert main(["info", str(fifo)]) == 2           # named for what it is, never opened
    assert capsys.readouterr().err.strip() == (f"vidgen: error: {str(fifo)!r} is a named pipe (FIFO), not a regular "
                                               "file; give a model folder, a repo id in the cache or a weights file")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    assert sources.list_models([str(tmp_path)]) == [(str(fifo), "a named pipe (FIFO), not a regular file", ""),
                                                    (str(other), "not a Wan component file",
                                                     "2 tensors of no Wan transformer, VAE, text encoder or LoRA")]
    fifo.unlink()
    rows = {Path(where).name: (what, variant) for where, what, variant in sources.list_models([str(samples)])}
    assert rows == {"demo-outline-lora.safetensors": ("LoRA file (float32)", "LoRA: 40 layers, rank 8, inputs 128..256 wide"),
                    "demo-wan": ("diffusers folder", "wan2.1-t2v"), "demo-wan-i2v": ("diffusers folder", "wan2.2-ti2v-5b"),
                    "demo-wan-control": ("diffusers folder", "wan2.1-vace"),
                    "tiny-wan": ("diffusers folder", "wan2.1-t2v")}
    assert sources.list_models([str(samples / "demo-wan" / "vae")]) == [
        (str(samples / "demo-wan" / "vae"), f"part of the model folder {samples / 'demo-wan'}", "")]
    # An unusable folder's message: whole words and clauses, and where to read the rest.
    broken = tmp_path / "models" / "broken"
    shutil.copytree(tiny_model(), broken)
    for part in ("vae", "text_encoder", "scheduler"):
        shutil.rmtree(broken / part)
    ((_, what, message),) = sources.list_models([str(tmp_path / "models")])
    with pytest.raises(ModelLoadError) as full:
        sources.inspect(SimpleNamespace(path=str(broken), variant="auto",
                                                **{r: None for r in (*sources.ROLES, "tokenizer")}))
    assert what == "unusable" and len(str(full.value)) > 160 and message.endswith(" ... (vidgen info PATH says all)")
    kept = message.removesuffix(" ... (vidgen info PATH says all)")
    assert str(full.value).startswith(kept) and str(full.value)[len(kept)] in " ;:,"


@pytest.mark.slow
def test_real_size_comfy_files(tmp_path, capsys, monkeypatch):
    """The published A14B as ComfyUI ships it (true headers, sparse data): the variant told from the
    files, the memory plan made from them; the I2V low-noise file and the 5B VAE refused by name."""
    files = layouts.write_comfy_tree(tmp_path / "comfy")
    model = {"transformer": str(files["high"]), "transformer_2": str(files["low"]), "text_encoder": str(files["te"]),
             "vae": str(files["vae"])}
    resolved = sources.resolve(SimpleNamespace(path=None, variant="auto", tokenizer=None, **model), need_tokenizer=False)
    assert resolved.variant == "wan2.2-t2v-a14b" and resolved.weights["transformer"].quant == "fp8_scaled"
    cfg = _write(tmp_path, {**_cfg(model, tmp_path / "x.mp4"), "size": "1280x720", "num_frames": 81})
    assert main(["plan", str(cfg), "model.device=cuda", "memory.device_budget=22GiB", "memory.host_budget=64GiB",
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["fits"] and plan["device_peak_bytes"] <= 22 * 2**30
    monkeypatch.setattr(sources, "_cached_tokenizer", lambda: None)
    low_i2v = layouts.write_sparse(tmp_path / "i2v_low.safetensors",
                                   layouts.transformer_fp8_scaled("wan2.2-i2v-a14b", "transformer_2"))
    err = _refused(capsys, tmp_path, {**model, "transformer_2": str(low_i2v)}, "model.transformer_2",
                   "not an expert of the same model")
    assert "model.tokenizer" in err       # every problem at once


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_gguf_k_quants_render_as_their_dequantised_weights(tiny_model, tmp_path, qtype):
    """K-quant blocks (random, valid) in a transformer 256 wide, so its rows hold whole K blocks: the
    render from the GGUF file equals the render from the same weights dequantised by gguf-py's
    reference dequantiser and stored as float32, up to float rounding of the two dequantisers."""
    pytest.importorskip("gguf")
    from diffusers import WanTransformer3DModel
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    folder = tmp_path / "wide"
    shutil.copytree(tiny_model(), folder)
    torch.manual_seed(0)
    wide = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=128, in_channels=16,
                                 out_channels=16, text_dim=32, freq_dim=256, ffn_dim=512, num_layers=1,
                                 cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
    shutil.rmtree(folder / "transformer")
    wide.save_pretrained(folder / "transformer")
    values = layouts.write_gguf_kquant(folder / "transformer", tmp_path / f"t-{qtype}.gguf", qtype)
    wide.load_state_dict(convert_wan_transformer_to_diffusers(dict(values)))
    wide.save_pretrained(folder / "transformer")
    assert qtype in open_weights("transformer", tmp_path / f"t-{qtype}.gguf").quant
    ref = _latents({"path": str(folder)}, tmp_path / "ref.mp4")
    got = _latents({"path": str(folder), "transformer": str(tmp_path / f"t-{qtype}.gguf")}, tmp_path / "a.mp4")
    assert ((got - ref).norm() / ref.norm()).item() < 1e-3


@pytest.mark.slow
def test_loras_on_single_files_and_gguf(tiny_model, tiny_shipped, tmp_path, capsys):
    """A LoRA fused into a Wan-named single file equals it fused into the folder, and is taken back
    from that file between renders; on a GGUF expert it goes on as an adapter (fuse is refused)."""
    from test_lora import write_lora

    import vidgen

    folder = Path(tiny_model())
    write_lora(tmp_path / "l.safetensors", "kijai", sources.expected_shapes(folder, "transformer"))
    lora = [{"path": str(tmp_path / "l.safetensors"), "strength": 0.8}]
    single = layouts.write_wan_transformer_file(folder / "transformer", tmp_path / "t.safetensors", "diffusion_model.")
    ref = load_file(render({**_cfg({"path": str(folder)}, tmp_path / "a.mp4"), "loras": lora}).latents_path)["latents"]
    cfg = {**_cfg({"path": str(folder), "transformer": str(single)}, tmp_path / "b.mp4"), "loras": lora}
    assert (load_file(render(cfg).latents_path)["latents"] - ref).abs().max().item() <= LOSSLESS
    pipe = vidgen.Pipeline.from_config({**cfg, "lora_mode": "fuse", "output": {"path": str(tmp_path / "c.mp4")}})
    pipe.generate()
    plain = pipe.generate(loras=[], output={"path": str(tmp_path / "d.mp4"), "save_latents": True})
    fresh = _weights({"path": str(folder), "transformer": str(single)}, tmp_path / "x.mp4")
    _assert_same_weights({f"expert0.{k}": v for k, v in pipe.components.experts[0].state_dict().items()},
                         {k: v for k, v in fresh.items() if k.startswith("expert0.")})   # the fused LoRA taken back out
    assert (load_file(plain.latents_path)["latents"] - _latents({"path": str(folder)}, tmp_path / "e.mp4")).abs().max() \
        <= LOSSLESS
    pytest.importorskip("gguf")
    gguf_file = layouts.write_gguf(folder / "transformer", tmp_path / "t.gguf", "Q8_0")
    model = {"path": str(folder), "transformer": str(gguf_file)}
    with_lora = load_file(render({**_cfg(model, tmp_path / "f.mp4"), "loras": lora}).latents_path)["latents"]
    without = _latents(model, tmp_path / "g.mp4")
    assert (with_lora - ref).abs().max() < (without - ref).abs().max() / 2       # the LoRA is on
    _refused(capsys, tmp_path, model, "lora_mode", loras=lora, lora_mode="fuse")
