"""Wan2.2-Animate from the files people have: Wan's original transformer (one file, with or without
ComfyUI's prefix, fp8_scaled; Wan's checkpoint folder) and a CLIPVisionModel safetensors for the image
encoder (ComfyUI's clip_vision_h) load bit-identical to the diffusers folder; what vidgen cannot read is
refused in one line naming the key to set.

The Wan names are written here from Wan's own modules (Wan2.2 wan/modules/animate: LIA's motion encoder
`enc.net_app.convs` of ConvLayer Sequentials [Blur, EqualConv2d, FusedLeakyReLU] with [1, C, 1, 1]
biases, `enc.fc`, `dec.direction`; CausalConv1d's `.conv`; FaceAdapter's `fuser_blocks` with a fused
`linear1_kv`), never from vidgen's rules, and checked against diffusers' own single-file converter at
the published motion-encoder depth (it hard-codes the last conv as convs.8)."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

import layouts
from vidgen import loading, sources
from vidgen.clip_files import WAN_CLIP
from vidgen.errors import ModelLoadError
from vidgen.residency import Residency
from vidgen.weights import expert_shell, load_weights, open_weights

ANIMATE = ("motion_encoder.", "face_encoder.", "face_adapter.", "pose_patch_embedding.")
CONVS = "motion_encoder.enc.net_app.convs."
FACE_LAYERS = {"to_q": "linear1_q", "to_out": "linear2", "norm_q": "q_norm", "norm_k": "k_norm"}
PREFIX = "model.diffusion_model."


def _blur() -> torch.Tensor:
    """LIA's Blur kernel (make_kernel([1, 3, 3, 1])): the buffer Wan's files carry."""
    k = torch.tensor([1.0, 3.0, 3.0, 1.0])
    k = k[:, None] * k[None, :]
    return k / k.sum()


def to_wan(diffusers: dict[str, torch.Tensor], kernels: bool = True) -> dict[str, torch.Tensor]:
    """Wan's names of diffusers' WanAnimateTransformer3DModel tensors (works on meta tensors too)."""
    out = {layouts._rename(k, layouts._TRANSFORMER_TO_WAN): t for k, t in diffusers.items() if not k.startswith(ANIMATE)}
    blocks = {int(m.group(1)) for k in diffusers if (m := re.match(r"motion_encoder\.res_blocks\.(\d+)\.", k))}
    kv: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for k, t in diffusers.items():
        if not k.startswith(ANIMATE):
            continue
        if k.endswith(".act_fn.bias"):                  # FusedLeakyReLU's bias: [1, C, 1, 1] in Wan's files
            t = t.reshape(1, -1, 1, 1)
        if m := re.match(r"motion_encoder\.res_blocks\.(\d+)\.(conv1|conv2|conv_skip)\.(weight|act_fn\.bias)$", k):
            i, conv, leaf = int(m.group(1)) + 1, m.group(2), m.group(3)
            # ResBlock: conv1 = [EqualConv2d, FusedLeakyReLU], conv2 = [Blur, EqualConv2d, FusedLeakyReLU], skip = [Blur, EqualConv2d]
            name, first = {"conv1": ("conv1", 0), "conv2": ("conv2", 1), "conv_skip": ("skip", 1)}[conv]
            out[f"{CONVS}{i}.{name}.{first + (leaf != 'weight')}.{leaf.rsplit('.', 1)[-1]}"] = t
            if kernels and first == 1 and leaf == "weight":
                out[f"{CONVS}{i}.{name}.0.kernel"] = _blur().to(t.device)
            continue
        if m := re.match(r"face_adapter\.(\d+)\.(to_k|to_v)\.(\w+)$", k):
            kv.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = t
            continue
        new = {"motion_encoder.conv_in.weight": CONVS + "0.0.weight", "motion_encoder.conv_in.act_fn.bias": CONVS + "0.1.bias",
               "motion_encoder.conv_out.weight": f"{CONVS}{len(blocks) + 1}.weight",
               "motion_encoder.motion_synthesis_weight": "motion_encoder.dec.direction.weight"}.get(k)
        if new is None:
            new = re.sub(r"^motion_encoder\.motion_network\.", "motion_encoder.enc.fc.", k)
            new = re.sub(r"^face_encoder\.(conv1_local|conv2|conv3)\.", r"face_encoder.\1.conv.", new)
            new = re.sub(r"^face_adapter\.(\d+)\.(\w+)\.",
                         lambda m: f"face_adapter.fuser_blocks.{m.group(1)}.{FACE_LAYERS[m.group(2)]}.", new)
        out[new] = t
    for (n, leaf), parts in kv.items():
        out[f"face_adapter.fuser_blocks.{n}.linear1_kv.{leaf}"] = torch.cat([parts["to_k"], parts["to_v"]])
    return out


def write_wan_animate(transformer_folder: Path, out: Path, prefix: str = "", **kw) -> Path:
    state = to_wan(layouts._load_component(transformer_folder), **kw)
    return layouts._save({prefix + k: v for k, v in state.items()}, out)


def write_clip_vision_h(image_encoder_folder: Path, out: Path) -> Path:
    """The encoder as ComfyUI's clip_vision_h.safetensors: transformers 4's CLIPVisionModelWithProjection
    names (`vision_model.*`, and the projection Wan never uses)."""
    state = {"vision_model." + k.removeprefix("vision_model."): v for k, v in layouts._load_component(image_encoder_folder).items()}
    width = state["vision_model.post_layernorm.weight"].shape[0]
    state["visual_projection.weight"] = torch.randn(8, width)
    return layouts._save(state, out)


def _model(**parts) -> SimpleNamespace:
    return SimpleNamespace(**{"path": None, "variant": "auto", "transformer": None, "transformer_2": None,
                              "text_encoder": None, "vae": None, "image_encoder": None, "tokenizer": None, **parts})


def _load(**parts):
    info = sources.inspect(_model(**parts))
    return info, loading.load_components(info, Residency(None, torch.device("cpu")), torch.float32, torch.float32)


def _tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def _assert_same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    ta, tb = _tensors(a), _tensors(b)
    assert ta.keys() == tb.keys()
    assert [k for k in ta if ta[k].dtype != tb[k].dtype or not torch.equal(ta[k], tb[k])] == []


def _refused(*matches: str, **parts) -> str:
    with pytest.raises(ModelLoadError) as e:
        sources.resolve(_model(**parts))
    message = str(e.value)
    assert "\n" not in message
    for m in matches:
        assert m in message, message
    return message


@pytest.fixture
def animate(tiny_model):
    return Path(tiny_model("wan2.2-animate-14b"))


@pytest.fixture
def shipped(animate, tiny_model, tmp_path, monkeypatch):
    """The shipped JSON replaced by the tiny models' (same names), so tiny files are told by their shapes."""
    root = tmp_path / "variants"
    for folder, name in ((animate, "wan2.2-animate-14b"), (Path(tiny_model()), "wan2.1-t2v-1.3b")):
        shutil.copytree(folder, root / name, ignore=shutil.ignore_patterns("*.safetensors", "tokenizer"))
    monkeypatch.setattr(sources, "VARIANTS_DIR", root)
    sources._shipped_shapes.cache_clear()
    yield root
    sources._shipped_shapes.cache_clear()


@pytest.fixture
def reference(animate):
    return _load(path=str(animate))[1]


def _files(folder: Path) -> dict[str, str]:
    """The tiny folder's text encoder, VAE and tokenizer as the files of a single-files config."""
    return {"text_encoder": str(folder / "text_encoder" / "model.safetensors"),
            "vae": str(folder / "vae" / "diffusion_pytorch_model.safetensors"), "tokenizer": str(folder / "tokenizer")}


def test_names_agree_with_diffusers_converter_at_the_published_depth(tmp_path):
    """At the published motion encoder (512 px faces: 7 residual blocks, its last conv convs.8) diffusers'
    own single-file converter and vidgen read the same Wan-named file as the original model."""
    import diffusers

    torch.manual_seed(0)
    model = diffusers.WanAnimateTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=36, out_channels=16,
        latent_channels=16, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", image_dim=16, added_kv_proj_dim=16, rope_max_seq_len=32,
        motion_encoder_channel_sizes={str(2 ** i): 4 for i in range(2, 10)}, motion_encoder_size=512,
        motion_style_dim=8, motion_dim=4, motion_encoder_dim=8, face_encoder_hidden_dim=8, face_encoder_num_heads=2,
        inject_face_latents_blocks=1).eval()
    model.save_pretrained(tmp_path / "transformer")
    file = write_wan_animate(tmp_path / "transformer", tmp_path / "wan.safetensors")
    assert f"{CONVS}8.weight" in load_file(file)
    theirs = diffusers.WanAnimateTransformer3DModel.from_single_file(str(file), config=str(tmp_path / "transformer"),
                                                                      local_files_only=True)
    _assert_same(model, theirs)
    w = open_weights("transformer", file)
    assert w.layout == "wan"
    ours = load_weights(expert_shell(dict(model.config), torch.float32), w, "cpu")
    _assert_same(model, ours)


@pytest.mark.parametrize("prefix", ["", PREFIX])
def test_wan_file_beside_the_folder_and_a_clip_file(animate, reference, tmp_path, prefix, caplog):
    """model.path = the folder, model.transformer = Wan's original file, model.image_encoder = a
    clip_vision_h-style file (its projection left unread, said once)."""
    file = write_wan_animate(animate / "transformer", tmp_path / "animate.safetensors", prefix)
    clip = write_clip_vision_h(animate / "image_encoder", tmp_path / "clip_vision_h.safetensors")
    with caplog.at_level(logging.INFO, logger="vidgen"):
        info, got = _load(path=str(animate), transformer=str(file), image_encoder=str(clip))
    assert info.variant == "wan2.2-animate-14b" and info.weights["transformer"].layout == "wan"
    _assert_same(reference.experts[0], got.experts[0])
    _assert_same(reference.image_encoder[0], got.image_encoder[0])
    said = [r.getMessage() for r in caplog.records if "visual_projection" in r.getMessage()]
    assert len(said) == 1 and "left unread" in said[0]


def test_single_files(animate, shipped, reference, tmp_path):
    """model.path null: the transformer, text encoder, VAE and CLIP files alone, built from the shipped JSON."""
    file = write_wan_animate(animate / "transformer", tmp_path / "animate.safetensors", PREFIX)
    clip = write_clip_vision_h(animate / "image_encoder", tmp_path / "clip_vision_h.safetensors")
    info, got = _load(transformer=str(file), image_encoder=str(clip), **_files(animate))
    assert (info.layout, info.shipped, info.variant) == ("single files", "wan2.2-animate-14b", "wan2.2-animate-14b")
    _assert_same(reference.experts[0], got.experts[0])
    _assert_same(reference.image_encoder[0], got.image_encoder[0])
    _assert_same(reference.text_encoder, got.text_encoder)


def test_wan_checkpoint_folder(animate, shipped, reference, tmp_path):
    """Wan's own folder: its open_clip CLIP .pth is refused by name; with model.image_encoder it loads."""
    wan = tmp_path / "Wan2.2-Animate-14B"
    write_wan_animate(animate / "transformer", wan / "diffusion_pytorch_model-00001-of-00001.safetensors")
    layouts.write_wan_vae(animate / "vae", wan / "Wan2.1_VAE.pth")
    layouts.write_wan_t5_pth(animate / "text_encoder", wan / "models_t5_umt5-xxl-enc-bf16.pth")
    torch.save({"visual.conv1.weight": torch.zeros(4, 3, 2, 2), "textual.head.weight": torch.zeros(4, 4)}, wan / WAN_CLIP)
    _refused("model.image_encoder", WAN_CLIP, "clip_vision_h", path=str(wan), tokenizer=str(animate / "tokenizer"))
    clip = write_clip_vision_h(animate / "image_encoder", tmp_path / "clip_vision_h.safetensors")
    info, got = _load(path=str(wan), image_encoder=str(clip), tokenizer=str(animate / "tokenizer"))
    assert info.layout == "Wan checkpoint folder"
    _assert_same(reference.experts[0], got.experts[0])
    _assert_same(reference.image_encoder[0], got.image_encoder[0])


def test_fp8_scaled_animate(animate, tmp_path):
    """ComfyUI's fp8_scaled form: the fused key/value weight is dequantised whole, then halved."""
    state = to_wan(layouts._load_component(animate / "transformer"))
    scaled = layouts.fp8_scaled_state_dict(state, PREFIX)
    layouts._save(scaled, tmp_path / "fp8.safetensors")
    exact = layouts.fp8_dequantized_state_dict(scaled, PREFIX)
    w = open_weights("transformer", tmp_path / "fp8.safetensors")
    assert w.quant == "fp8_scaled"
    got = dict(w.read({n: torch.float32 for n in w.names}))
    kv = exact["face_adapter.fuser_blocks.0.linear1_kv.weight"]
    assert torch.equal(got["face_adapter.0.to_k.weight"], kv[: kv.shape[0] // 2])
    assert torch.equal(got["face_adapter.0.to_v.weight"], kv[kv.shape[0] // 2:])
    assert torch.equal(got["motion_encoder.conv_in.act_fn.bias"], exact[CONVS + "0.1.bias"].flatten())


def test_real_animate_shapes_are_told(tmp_path):
    """The published model's shapes in Wan's names (ComfyUI's prefix, fp16; no data read) are
    Wan2.2-Animate-14B, and fit its shipped JSON whole."""
    shapes = sources.expected_shapes(sources.VARIANTS_DIR / "wan2.2-animate-14b", "transformer")
    wan = to_wan({k: torch.empty(s, device="meta") for k, s in shapes.items()})
    file = layouts.write_sparse(tmp_path / "wan2.2_animate_14B_fp16.safetensors",
                                {PREFIX + k: (tuple(t.shape), "F16" if t.ndim != 2 or k.endswith("kernel") else "BF16")
                                 for k, t in wan.items()})
    w = open_weights("transformer", file)
    family, facts = sources.transformer_family(w, 1)
    assert family == "wan2.2-animate-14b" and "Animate" in facts
    assert sources.shipped_match(w, family, "") == "wan2.2-animate-14b"
    assert w.mismatch(shapes) is None


def test_refusals(animate, shipped, tiny_model, tmp_path):
    file = write_wan_animate(animate / "transformer", tmp_path / "animate.safetensors")
    clip = write_clip_vision_h(animate / "image_encoder", tmp_path / "clip_vision_h.safetensors")
    files = _files(animate)
    # Animate from single files needs its CLIP.
    _refused("model.image_encoder", "not set", "clip_vision_h", transformer=str(file), **files)
    # Wan2.1 I2V files are still run from a diffusers folder only.
    i2v = Path(tiny_model("wan2.1-i2v"))
    i2v_file = layouts.write_wan_transformer_file(i2v / "transformer", tmp_path / "i2v.safetensors")
    _refused("model.transformer", "Wan2.1 image-to-video", transformer=str(i2v_file), image_encoder=str(clip), **files)
    # A CLIP on a model that takes none: single files, and beside a diffusers folder.
    t2v = Path(tiny_model())
    t2v_file = layouts.write_wan_transformer_file(t2v / "transformer", tmp_path / "t2v.safetensors")
    _refused("model.image_encoder", "takes no CLIP image encoder", transformer=str(t2v_file), image_encoder=str(clip),
             **_files(t2v))
    _refused("model.image_encoder", "without a CLIP image encoder", path=str(t2v), image_encoder=str(clip))
    # An unknown tensor in an Animate file is reported, not dropped.
    state = load_file(file)
    state["face_adapter.fuser_blocks.0.extra.weight"] = torch.zeros(2)
    save_file(state, tmp_path / "extra.safetensors")
    _refused("model.transformer", "unexpected", "face_adapter.0.extra.weight", path=str(animate),
             transformer=str(tmp_path / "extra.safetensors"))
    # The CLIP as a .pth, or in open_clip's names.
    torch.save(load_file(clip), tmp_path / "clip.pth")
    _refused("model.image_encoder", "not safetensors", path=str(animate), image_encoder=str(tmp_path / "clip.pth"))
    save_file({"visual.conv1.weight": torch.zeros(4, 3, 2, 2)}, tmp_path / "open_clip.safetensors")
    _refused("model.image_encoder", "open_clip", path=str(animate), image_encoder=str(tmp_path / "open_clip.safetensors"))
    # A CLIP of other widths does not fit.
    small = {k: v for k, v in load_file(clip).items() if "layers.2." not in k}
    save_file(small, tmp_path / "small.safetensors")
    _refused("model.image_encoder", "does not fit", "missing", path=str(animate), image_encoder=str(tmp_path / "small.safetensors"))
