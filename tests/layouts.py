"""Writers for the weight layouts users actually download, built from a tiny diffusers Wan pipeline.

Tests use these to feed the loader the same key names, dtypes and folder shapes as the real files,
with tiny random weights. Every mapping here is derived from public sources (named per function) and
was checked against diffusers' own converters where one exists -- never against vidgen's loader.

Key facts (sources in each docstring):

* Wan original transformer keys: the inverse of diffusers' ``convert_wan_transformer_to_diffusers``
  (``diffusers/loaders/single_file_utils.py``). ``modulation`` / ``head.modulation`` have the same shape
  as diffusers' ``scale_shift_table`` ((1, 6, dim) / (1, 2, dim)); the converter only renames them.
  Wan's ``norm3`` (cross-attention norm, affine) is diffusers' ``norm2``; Wan's ``norm2`` has no weights.
* ComfyUI fp8_scaled: ``<layer>.weight`` float8_e4m3fn, ``<layer>.scale_weight`` and ``<layer>.scale_input``
  0-d float32, marker ``scaled_fp8`` = empty (shape [0]) float8_e4m3fn tensor (ComfyUI
  ``comfy/utils.py::convert_old_quants``; header of Comfy-Org ``wan2.2_t2v_low_noise_14B_fp8_scaled``).
  Every Linear weight is fp8 (blocks, text/time embedding, time_projection, head.head); the conv
  ``patch_embedding`` and the ``modulation`` parameters are not.
* GGUF (city96/ComfyUI-GGUF ``tools/convert.py``, ``tools/fix_5d_tensors.py``): ``general.architecture``
  = "wan", original Wan keys without prefix, 1-D tensors and ``*.modulation`` in F32, the 5-D
  ``patch_embedding.weight`` re-added as F32.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from vidgen.families import VARIANTS_DIR

FP8_MAX = 448.0  # largest finite torch.float8_e4m3fn

# --- helpers ----------------------------------------------------------------------------------------


def _load_component(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a diffusers component folder (single file or shards)."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors in {folder}")
    state = {}
    for f in files:
        state.update(load_file(f))
    return state


def _save(state: dict[str, torch.Tensor], out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone().contiguous() for k, v in state.items()}  # no shared storage
    if out.suffix == ".safetensors":
        save_file(state, out)
    elif out.suffix in (".pth", ".pt", ".bin"):
        torch.save(state, out)
    else:
        raise ValueError(f"{out}: suffix must be .safetensors or .pth")
    return out


def _rename(key: str, rules: list[tuple[str, str]]) -> str:
    for pattern, repl in rules:
        key = re.sub(pattern, repl, key)
    return key


# --- 1/2. transformer in Wan's original layout -------------------------------------------------------

# diffusers WanTransformer3DModel -> Wan-Video wan/modules/model.py WanModel (regexes, applied in order)
_TRANSFORMER_TO_WAN = [
    (r"^condition_embedder\.time_embedder\.linear_1\.", "time_embedding.0."),
    (r"^condition_embedder\.time_embedder\.linear_2\.", "time_embedding.2."),
    (r"^condition_embedder\.text_embedder\.linear_1\.", "text_embedding.0."),
    (r"^condition_embedder\.text_embedder\.linear_2\.", "text_embedding.2."),
    (r"^condition_embedder\.time_proj\.", "time_projection.1."),
    (r"^condition_embedder\.image_embedder\.norm1\.", "img_emb.proj.0."),        # Wan2.1 I2V only
    (r"^condition_embedder\.image_embedder\.ff\.net\.0\.proj\.", "img_emb.proj.1."),
    (r"^condition_embedder\.image_embedder\.ff\.net\.2\.", "img_emb.proj.3."),
    (r"^condition_embedder\.image_embedder\.norm2\.", "img_emb.proj.4."),
    (r"\.attn1\.", ".self_attn."),
    (r"\.attn2\.", ".cross_attn."),
    (r"\.to_q\.", ".q."), (r"\.to_k\.", ".k."), (r"\.to_v\.", ".v."), (r"\.to_out\.0\.", ".o."),
    (r"\.add_k_proj\.", ".k_img."), (r"\.add_v_proj\.", ".v_img."), (r"\.norm_added_k\.", ".norm_k_img."),
    (r"\.ffn\.net\.0\.proj\.", ".ffn.0."),
    (r"\.ffn\.net\.2\.", ".ffn.2."),
    (r"^(blocks\.\d+)\.norm2\.", r"\1.norm3."),   # diffusers norm2 = Wan norm3 (cross-attn norm)
    (r"^(blocks\.\d+)\.scale_shift_table$", r"\1.modulation"),
    (r"^scale_shift_table$", "head.modulation"),
    (r"^proj_out\.", "head.head."),
]


def wan_transformer_state_dict(folder) -> dict[str, torch.Tensor]:
    """The diffusers transformer in ``folder`` with Wan's original keys.

    Layout: Wan-Video/Wan2.1 ``wan/modules/model.py`` (WanModel); mapping = inverse of
    ``convert_wan_transformer_to_diffusers`` in diffusers ``loaders/single_file_utils.py``.
    """
    return {_rename(k, _TRANSFORMER_TO_WAN): v.contiguous() for k, v in _load_component(folder).items()}


def write_wan_transformer_file(folder, out, prefix: str = "") -> Path:
    """One safetensors in Wan's original layout, keys prefixed (``""``, ``"model.diffusion_model."``,
    ``"diffusion_model."``). Sources: as ``wan_transformer_state_dict``; ComfyUI checkpoints use
    ``model.diffusion_model.`` (diffusers ``infer_diffusers_model_type`` checks that prefix)."""
    return _save({prefix + k: v for k, v in wan_transformer_state_dict(folder).items()}, out)


# --- 3. ComfyUI fp8_scaled ---------------------------------------------------------------------------


# 2-D weights that are not nn.Linear (embedding tables, T5 position bias): ComfyUI leaves them unscaled.
_NOT_LINEAR = ("shared.weight", "embed_tokens.weight", "relative_attention_bias.weight")


def _is_linear_weight(key: str, t: torch.Tensor) -> bool:
    return key.endswith(".weight") and t.ndim == 2 and not key.endswith(_NOT_LINEAR)


def fp8_scaled_state_dict(state: dict[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    """ComfyUI "scaled fp8" form of a state dict (see ``write_fp8_scaled``)."""
    out = {}
    for key, t in state.items():
        if not _is_linear_weight(key, t):
            out[prefix + key] = t
            continue
        w = t.float()
        amax = w.abs().max()
        scale = (amax / FP8_MAX) if amax > 0 else torch.tensor(1.0)
        layer = prefix + key[: -len(".weight")]
        out[layer + ".weight"] = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        out[layer + ".scale_weight"] = scale.to(torch.float32).reshape(())
        out[layer + ".scale_input"] = torch.ones((), dtype=torch.float32)  # real files carry it (=1.0)
    out[prefix + "scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    return out


def fp8_dequantized_state_dict(scaled: dict[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    """Inverse view: un-prefixed state dict with every fp8 weight = fp8.float() * scale_weight (float32)."""
    out = {}
    for key, t in scaled.items():
        if key == prefix + "scaled_fp8" or key.endswith((".scale_weight", ".scale_input")):
            continue
        if t.dtype == torch.float8_e4m3fn:
            t = t.to(torch.float32) * scaled[key[: -len(".weight")] + ".scale_weight"]
        out[key[len(prefix):]] = t
    return out


def write_fp8_scaled(folder, out, prefix: str = "model.diffusion_model.") -> dict[str, torch.Tensor]:
    """A ComfyUI ``*_fp8_scaled.safetensors`` diffusion model; returns the dequantised original-layout
    state dict (un-prefixed) so tests can bound the quantisation error against
    ``wan_transformer_state_dict(folder)``.

    Sources: ComfyUI ``comfy/utils.py::convert_old_quants`` / ``comfy/model_detection.py`` (marker
    ``{prefix}scaled_fp8``, ``.scale_weight``/``.scale_input``, dequant = weight * scale_weight) and the
    header of Comfy-Org/Wan_2.2_ComfyUI_Repackaged ``wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors``
    (which itself has NO prefix; pass ``prefix=""`` for that exact shape).
    """
    scaled = fp8_scaled_state_dict(wan_transformer_state_dict(folder), prefix)
    _save(scaled, out)
    return fp8_dequantized_state_dict(scaled, prefix)


# --- 4. GGUF -----------------------------------------------------------------------------------------


def write_gguf(folder, out, qtype: str = "Q8_0", state: dict[str, torch.Tensor] | None = None) -> Path:
    """A city96-style Wan GGUF of the transformer (original keys, no prefix, arch "wan").

    Sources: city96/ComfyUI-GGUF ``tools/convert.py`` (ModelWan, keys_hiprec ".modulation", 1-D -> F32)
    and ``tools/fix_5d_tensors.py`` (5-D patch_embedding stored F32); read by diffusers
    ``models/model_loading_utils.py::load_gguf_checkpoint``. 2-D weights whose last dim is a multiple
    of the block size are quantised with ``gguf.quants.quantize``; gguf-py 0.19 only has Python
    quantisers for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (K-quants are dequantise-only), so ``qtype`` is one of
    those (or F16/BF16/F32). city96 keeps tensors of <= 1024 elements in F32; that rule is NOT applied
    here because every tiny weight would fall under it. `state`: Wan-named tensors to write instead of
    the folder's.
    """
    import gguf
    import numpy as np

    qt = gguf.GGMLQuantizationType[qtype]
    block = gguf.GGML_QUANT_SIZES[qt][0]
    try:  # K-quants (and most IQ types) only have dequantisers in gguf-py
        gguf.quants.quantize(np.zeros((1, block), np.float32), qt)
    except NotImplementedError as e:
        raise NotImplementedError(f"gguf-py has no Python quantiser for {qtype}") from e
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out), arch="wan")
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    file_type = getattr(gguf.LlamaFileType, f"MOSTLY_{qtype}", None)
    if file_type is not None:
        writer.add_file_type(file_type)
    for key, t in (state if state is not None else wan_transformer_state_dict(folder)).items():
        data = t.to(torch.float32).numpy()
        if data.ndim == 2 and ".modulation" not in key and data.shape[-1] % block == 0:
            writer.add_tensor(key, gguf.quants.quantize(data, qt), raw_dtype=qt)
            continue
        writer.add_tensor(key, np.ascontiguousarray(data))  # F32
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(out)


KQUANT_SCALES = {"Q4_K": ((0, 4),), "Q6_K": ((-2, None),)}     # where each block's float16 scale(s) sit


def write_gguf_kquant(folder, out, qtype: str = "Q4_K", seed: int = 0) -> dict[str, torch.Tensor]:
    """A Wan GGUF whose 2-D weights with rows of a multiple of 256 values are K-quant blocks
    (ggml's layout: Q4_K = d, dmin (float16), 12 bytes of 6-bit scales and mins, 128 bytes of 4-bit
    values per 256; Q6_K = 128 + 64 bytes of 6-bit values, 16 int8 scales, d). gguf-py cannot
    quantise to K-quants, so the blocks are random bits with small float16 scales: any such block is
    a valid K-quant tensor. Returns the Wan-named state dict the file stands for, dequantised by
    gguf-py's reference (numpy) dequantiser; other tensors stay float32 as in ``write_gguf``."""
    import gguf
    import numpy as np

    qt = gguf.GGMLQuantizationType[qtype]
    block, nbytes = gguf.GGML_QUANT_SIZES[qt]
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), arch="wan")
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    values = {}
    for key, t in wan_transformer_state_dict(folder).items():
        data = t.to(torch.float32).numpy()
        if data.ndim == 2 and ".modulation" not in key and data.shape[-1] % block == 0:
            rows, blocks = data.shape[0], data.shape[1] // block
            raw = rng.integers(0, 256, size=(rows * blocks, nbytes), dtype=np.uint8)
            for start, stop in KQUANT_SCALES[qtype]:
                width = (stop if stop is not None else nbytes) - (start % nbytes)
                scales = rng.uniform(0.5e-4, 1.5e-4, size=(rows * blocks, width // 2)).astype(np.float16)
                raw[:, start % nbytes:(start % nbytes) + width] = scales.view(np.uint8)
            raw = raw.reshape(rows, blocks * nbytes)
            writer.add_tensor(key, raw, raw_dtype=qt)
            values[key] = torch.from_numpy(gguf.quants.dequantize(raw, qt).astype(np.float32).reshape(data.shape))
            continue
        writer.add_tensor(key, np.ascontiguousarray(data))
        values[key] = t.to(torch.float32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return values


# --- 5/6. text encoder -------------------------------------------------------------------------------

# transformers UMT5EncoderModel -> Wan-Video/Wan2.1 wan/modules/t5.py T5Encoder (umt5_xxl: shared_pos=False,
# so every block owns its relative-position table). HF's gated FFN is wo(gelu_new(wi_0 x) * wi_1 x);
# Wan's is fc2(fc1(x) * gate(x)) with gate = Sequential(Linear, tanh-GELU), so wi_0 = gate.0, wi_1 = fc1.
#
#   HF UMT5EncoderModel                                              Wan T5Encoder
#   shared.weight (= encoder.embed_tokens.weight)                    token_embedding.weight
#   encoder.block.N.layer.0.layer_norm.weight                        blocks.N.norm1.weight
#   encoder.block.N.layer.0.SelfAttention.{q,k,v,o}.weight           blocks.N.attn.{q,k,v,o}.weight
#   encoder.block.N.layer.0.SelfAttention.relative_attention_bias    blocks.N.pos_embedding.embedding
#   encoder.block.N.layer.1.layer_norm.weight                        blocks.N.norm2.weight
#   encoder.block.N.layer.1.DenseReluDense.wi_0.weight               blocks.N.ffn.gate.0.weight
#   encoder.block.N.layer.1.DenseReluDense.wi_1.weight               blocks.N.ffn.fc1.weight
#   encoder.block.N.layer.1.DenseReluDense.wo.weight                 blocks.N.ffn.fc2.weight
#   encoder.final_layer_norm.weight                                  norm.weight
#
# Note: Wan's T5RelativeEmbedding hard-codes max_dist=128 (HF: relative_attention_max_distance, also 128
# for umt5-xxl; the tiny encoder uses 32, so a Wan-code forward matches HF only with max_dist patched).
_T5_TO_WAN = [
    (r"^shared\.", "token_embedding."),
    (r"^encoder\.final_layer_norm\.", "norm."),
    (r"^encoder\.block\.(\d+)\.layer\.0\.layer_norm\.", r"blocks.\1.norm1."),
    (r"^encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.relative_attention_bias\.",
     r"blocks.\1.pos_embedding.embedding."),
    (r"^encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.([qkvo])\.", r"blocks.\1.attn.\2."),
    (r"^encoder\.block\.(\d+)\.layer\.1\.layer_norm\.", r"blocks.\1.norm2."),
    (r"^encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.wi_0\.", r"blocks.\1.ffn.gate.0."),
    (r"^encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.wi_1\.", r"blocks.\1.ffn.fc1."),
    (r"^encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.wo\.", r"blocks.\1.ffn.fc2."),
]


def _hf_t5_state_dict(text_encoder_folder) -> dict[str, torch.Tensor]:
    state = _load_component(text_encoder_folder)
    if "shared.weight" not in state:  # tied embedding saved only once
        state["shared.weight"] = state["encoder.embed_tokens.weight"]
    state.setdefault("encoder.embed_tokens.weight", state["shared.weight"])
    return state


def wan_t5_state_dict(folder) -> dict[str, torch.Tensor]:
    """The UMT5 encoder in ``folder`` (a ``text_encoder/`` folder) with Wan's T5Encoder keys, as in
    ``models_t5_umt5-xxl-enc-bf16.pth``. Source: Wan-Video/Wan2.1 ``wan/modules/t5.py``; table above."""
    out = {}
    for k, v in _hf_t5_state_dict(folder).items():
        if k == "encoder.embed_tokens.weight":
            continue  # tied to shared.weight
        new = _rename(k, _T5_TO_WAN)
        if new == k:
            raise KeyError(f"unmapped UMT5 key {k}")
        out[new] = v.contiguous()
    return out


def write_wan_t5_pth(text_encoder_folder, out, dtype: torch.dtype | None = None) -> Path:
    """``torch.save`` of ``wan_t5_state_dict`` (plain dict; the real file is bf16 -- pass ``dtype``)."""
    state = wan_t5_state_dict(text_encoder_folder)
    if dtype is not None:
        state = {k: v.to(dtype) for k, v in state.items()}
    return _save(state, Path(out))


def write_comfy_text_encoder(text_encoder_folder, out, fp8_scaled: bool = False) -> Path:
    """ComfyUI ``umt5_xxl_fp16.safetensors`` / ``umt5_xxl_fp8_e4m3fn_scaled.safetensors``: plain HF
    UMT5 keys, no prefix (``shared.weight``, ``encoder.embed_tokens.weight``, ``encoder.block.N...``,
    ``encoder.final_layer_norm.weight``). Scaled variant: Linear weights fp8 + ``.scale_weight``
    (+ ``.scale_input``), marker ``scaled_fp8``; norms, relative_attention_bias and embeddings keep
    their dtype. Sources: ComfyUI ``comfy/sd.py`` (``t5xxl_detect`` on
    ``encoder.block.23.layer.1.DenseReluDense.wi_1.weight``), ``comfy/text_encoders/sd3_clip.py``
    (``t5_xxl_detect``: ``{prefix}scaled_fp8``). Real files also carry a ``spiece_model`` uint8 tensor
    (the SentencePiece model) that ComfyUI's Wan tokenizer reads; the tiny word-level tokenizer has
    none, so it is omitted.
    """
    state = _hf_t5_state_dict(text_encoder_folder)
    if fp8_scaled:
        state = fp8_scaled_state_dict(state)
    return _save(state, Path(out))


# --- 7. VAE ------------------------------------------------------------------------------------------

_RESNET_TO_WAN = {"norm1": "residual.0", "conv1": "residual.2", "norm2": "residual.3",
                  "conv2": "residual.6", "conv_shortcut": "shortcut"}


def _vae_key_to_wan(key: str, num_res_blocks: int) -> str:
    def resnet(tail: str) -> str:  # "norm1.gamma" -> "residual.0.gamma"
        head, _, rest = tail.partition(".")
        return f"{_RESNET_TO_WAN[head]}.{rest}" if head in _RESNET_TO_WAN else tail

    simple = {"quant_conv": "conv1", "post_quant_conv": "conv2"}
    first, _, rest = key.partition(".")
    if first in simple:
        return f"{simple[first]}.{rest}"
    side, _, rest = key.partition(".")  # encoder / decoder
    for name, wan in (("conv_in.", "conv1."), ("norm_out.", "head.0."), ("conv_out.", "head.2.")):
        if rest.startswith(name):
            return f"{side}.{wan}{rest[len(name):]}"
    m = re.match(r"mid_block\.(resnets|attentions)\.(\d+)\.(.*)", rest)
    if m:
        kind, i, tail = m.groups()
        idx = 1 if kind == "attentions" else 2 * int(i)        # middle = [res, attn, res]
        return f"{side}.middle.{idx}.{resnet(tail) if kind == 'resnets' else tail}"
    m = re.match(r"down_blocks\.(\d+)\.(.*)", rest)            # flat list, indices as in Wan
    if m:
        return f"encoder.downsamples.{m.group(1)}.{resnet(m.group(2))}"
    m = re.match(r"up_blocks\.(\d+)\.(resnets\.(\d+)|upsamplers\.0)\.(.*)", rest)
    if m:  # Wan: per stage (num_res_blocks + 1) ResidualBlocks then one Resample, flattened
        stage, _, j, tail = m.groups()
        base = int(stage) * (num_res_blocks + 2)
        if j is not None:
            return f"decoder.upsamples.{base + int(j)}.{resnet(tail)}"
        return f"decoder.upsamples.{base + num_res_blocks + 1}.{tail}"
    raise KeyError(f"unmapped Wan VAE key {key}")


def wan_vae_state_dict(vae_folder) -> dict[str, torch.Tensor]:
    """The diffusers AutoencoderKLWan in ``vae_folder`` with Wan2.1 VAE keys (``Wan2.1_VAE.pth``).

    Layout: Wan-Video/Wan2.1 ``wan/modules/vae.py`` (WanVAE_: encoder.downsamples, decoder.upsamples,
    middle, head, conv1/conv2); mapping = inverse of diffusers ``convert_wan_vae_to_diffusers``
    (``loaders/single_file_utils.py``), generalised from its hard-coded num_res_blocks=2 indices to the
    folder's ``num_res_blocks``. diffusers has no single-file converter for the Wan2.2 VAE
    (``vae2_2.py``: z_dim 48, residual up/down blocks), so that one is refused here.
    """
    config = json.loads((Path(vae_folder) / "config.json").read_text())
    if config.get("is_residual"):
        raise NotImplementedError("Wan2.2 VAE (is_residual): diffusers has no single-file converter to "
                                  "derive/verify its original layout against")
    nrb = config["num_res_blocks"]
    return {_vae_key_to_wan(k, nrb): v.contiguous() for k, v in _load_component(vae_folder).items()}


def write_wan_vae(vae_folder, out) -> Path:
    """``Wan2.1_VAE.pth`` (torch.save of a dict) or a ``.safetensors`` with the same keys."""
    return _save(wan_vae_state_dict(vae_folder), Path(out))


# --- 8. Wan's own checkpoint folder ------------------------------------------------------------------

WAN_T5_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
WAN_TOKENIZER_DIR = "google/umt5-xxl"


def wan_model_config(transformer_folder) -> dict:
    """Wan-format ``config.json`` (WanModel's ``register_to_config`` args, Wan2.2 ``wan/modules/model.py``)."""
    c = json.loads((Path(transformer_folder) / "config.json").read_text())
    model_type = "i2v" if c["in_channels"] == 36 else "ti2v" if c["out_channels"] == 48 else "t2v"
    return {"_class_name": "WanModel", "_diffusers_version": "0.30.0", "model_type": model_type,
            "patch_size": list(c["patch_size"]), "text_len": 512, "in_dim": c["in_channels"],
            "dim": c["num_attention_heads"] * c["attention_head_dim"], "ffn_dim": c["ffn_dim"],
            "freq_dim": c["freq_dim"], "text_dim": c["text_dim"], "out_dim": c["out_channels"],
            "num_heads": c["num_attention_heads"], "num_layers": c["num_layers"], "window_size": [-1, -1],
            "qk_norm": c["qk_norm"] is not None, "cross_attn_norm": c["cross_attn_norm"], "eps": c["eps"]}


def _write_wan_model_dir(transformer_folder, out_dir: Path, shards: int = 2) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    state = wan_transformer_state_dict(transformer_folder)
    keys = list(state)
    per = -(-len(keys) // shards)
    weight_map, total = {}, 0
    for i in range(shards):
        name = f"diffusion_pytorch_model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: state[k] for k in keys[i * per:(i + 1) * per]}
        _save(part, out_dir / name)
        weight_map.update(dict.fromkeys(part, name))
        total += sum(t.numel() * t.element_size() for t in part.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (out_dir / "config.json").write_text(json.dumps(wan_model_config(transformer_folder), indent=2))


def write_wan_folder(pipeline_folder, out_dir) -> Path:
    """A checkpoint dir as Wan's ``generate.py --ckpt_dir`` reads it (Wan-AI/Wan2.1-T2V-*, Wan2.2-*).

    File names from Wan-Video/Wan2.1 ``wan/configs/wan_t2v_1_3B.py`` and Wan-Video/Wan2.2
    ``wan/configs/wan_{t2v,i2v}_A14B.py`` / ``wan_ti2v_5B.py``: ``models_t5_umt5-xxl-enc-bf16.pth``,
    tokenizer ``google/umt5-xxl/``, ``Wan2.1_VAE.pth`` (``Wan2.2_VAE.pth`` for TI2V-5B), and
    ``WanModel.from_pretrained(ckpt_dir[, subfolder=high_noise_model|low_noise_model])``: sharded
    ``diffusion_pytorch_model-0000i-of-0000n.safetensors`` + ``.index.json`` + Wan ``config.json``.
    diffusers ``transformer`` is the high-noise expert, ``transformer_2`` the low-noise one.
    ``configuration.json`` is the ModelScope marker the Wan-AI repos ship. The TI2V-5B folder gets no
    ``Wan2.2_VAE.pth`` (see ``wan_vae_state_dict``). T5 stays in the tiny's dtype (real file: bf16).
    """
    src, out = Path(pipeline_folder), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if (src / "transformer_2").is_dir():
        _write_wan_model_dir(src / "transformer", out / "high_noise_model")
        _write_wan_model_dir(src / "transformer_2", out / "low_noise_model")
    else:
        _write_wan_model_dir(src / "transformer", out)
    write_wan_t5_pth(src / "text_encoder", out / WAN_T5_FILE)
    if not json.loads((src / "vae" / "config.json").read_text()).get("is_residual"):
        write_wan_vae(src / "vae", out / "Wan2.1_VAE.pth")
    tok = out / WAN_TOKENIZER_DIR
    tok.mkdir(parents=True, exist_ok=True)
    for f in (src / "tokenizer").iterdir():
        shutil.copy2(f, tok / f.name)
    in_channels = json.loads((src / "transformer" / "config.json").read_text())["in_channels"]
    task = "image-to-video" if in_channels == 36 else "text-to-video"
    (out / "configuration.json").write_text(json.dumps({"framework": "Pytorch", "task": task}))
    return out


# --- 9. Hugging Face hub cache -----------------------------------------------------------------------


def fake_hf_cache(cache_root, repo_id: str, pipeline_folder) -> Path:
    """A hub cache entry for ``repo_id`` holding ``pipeline_folder``; returns the snapshot dir.

    Layout (huggingface_hub ``file_download.py`` / ``utils/_cache_manager.py``): ``models--{org}--{name}/
    blobs/<hash>``, ``snapshots/<commit>/<path>`` as relative symlinks to ``../../blobs/<hash>`` and
    ``refs/main`` holding the commit. Blobs are named by sha256 (as the hub does for LFS files); the
    commit is a deterministic 40-hex digest of the content.
    """
    src = Path(pipeline_folder)
    repo_dir = Path(cache_root) / ("models--" + repo_id.replace("/", "--"))
    files = sorted(p for p in src.rglob("*") if p.is_file())
    digests = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    commit = hashlib.sha1("".join(f"{p.relative_to(src)}:{digests[p]}" for p in files).encode()).hexdigest()
    snapshot = repo_dir / "snapshots" / commit
    (repo_dir / "blobs").mkdir(parents=True, exist_ok=True)
    for p in files:
        blob = repo_dir / "blobs" / digests[p]
        if not blob.exists():
            shutil.copyfile(p, blob)
        link = snapshot / p.relative_to(src)
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        depth = len(p.relative_to(src).parts) + 1  # up to repo_dir from the link's directory
        link.symlink_to(Path(*[".."] * depth, "blobs", digests[p]))
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(commit)
    return snapshot


# --- 10. real-size files as sparse files (headers only) ------------------------------------------------
# True headers of the published models' layouts (names, dtypes, shapes, offsets), data all zeros and
# taking no disk space: for what reads headers only (vidgen info / models / plan, variant detection).


def _shapes(root, role):
    from vidgen.sources import expected_shapes

    return expected_shapes(root, role)


BITS = {"F32": 32, "F16": 16, "BF16": 16, "F8_E4M3": 8}


def write_sparse(path: Path, tensors: dict[str, tuple[tuple[int, ...], str]]) -> Path:
    """A safetensors file with this header and zero data (a sparse file: no disk blocks for the data)."""
    header, offset = {}, 0
    for name, (shape, dtype) in tensors.items():
        size = math.prod(shape) * BITS[dtype] // 8
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        f.truncate(8 + len(raw) + offset)
    return path


def transformer_fp8_scaled(variant: str, expert: str = "transformer") -> dict:
    """The transformer as Comfy-Org's *_fp8_scaled.safetensors: Wan's names, no prefix, every Linear
    weight float8 with a float32 scale_weight and scale_input, everything else float16, the marker."""
    out = {}
    for name, shape in _shapes(VARIANTS_DIR / variant, expert).items():
        wan = _rename(name, _TRANSFORMER_TO_WAN)
        if wan.endswith(".weight") and len(shape) == 2:
            out[wan] = (shape, "F8_E4M3")
            base = wan.removesuffix(".weight")
            out[base + ".scale_weight"] = ((), "F32")
            out[base + ".scale_input"] = ((), "F32")
        else:
            out[wan] = (shape, "F16")
    out["scaled_fp8"] = ((0,), "F8_E4M3")
    return out


def transformer_fp16(variant: str) -> dict:
    return {_rename(n, _TRANSFORMER_TO_WAN): (s, "F16")
            for n, s in _shapes(VARIANTS_DIR / variant, "transformer").items()}


def umt5_fp8_scaled() -> dict:
    out = {}
    for name, shape in _shapes(VARIANTS_DIR / "wan2.2-t2v-a14b", "text_encoder").items():
        if name.endswith(".weight") and len(shape) == 2 and name != "shared.weight" and "relative_attention" not in name:
            out[name] = (shape, "F8_E4M3")
            out[name.removesuffix(".weight") + ".scale_weight"] = ((), "F32")
        else:
            out[name] = (shape, "F16")
    out["scaled_fp8"] = ((0,), "F8_E4M3")
    return out


def wan21_vae() -> dict:
    return {_vae_key_to_wan(n, 2): (s, "F16")
            for n, s in _shapes(VARIANTS_DIR / "wan2.1-t2v-14b", "vae").items()}


def write_comfy_tree(root: Path) -> dict[str, Path]:
    m = Path(root) / "models"
    files = {
        "high": write_sparse(m / "diffusion_models" / "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors",
                             transformer_fp8_scaled("wan2.2-t2v-a14b", "transformer")),
        "low": write_sparse(m / "diffusion_models" / "wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors",
                            transformer_fp8_scaled("wan2.2-t2v-a14b", "transformer_2")),
        "5b": write_sparse(m / "diffusion_models" / "wan2.2_ti2v_5B_fp16.safetensors", transformer_fp16("wan2.2-ti2v-5b")),
        "te": write_sparse(m / "text_encoders" / "umt5_xxl_fp8_e4m3fn_scaled.safetensors", umt5_fp8_scaled()),
        "vae": write_sparse(m / "vae" / "wan_2.1_vae.safetensors", wan21_vae()),
    }
    return files
