"""Original Wan VAE checkpoints (`Wan2.1_VAE.pth`, `Wan2.2_VAE.pth`) -> diffusers' `AutoencoderKLWan`.

Wan ships its VAEs as plain state dicts named after its own modules (`decoder.upsamples.4.residual.2`);
diffusers names the same tensors after its blocks (`decoder.up_blocks.1.resnets.0.conv1`). No tensor
is reshaped or transposed: conversion is renaming only (vidgen.families' VAE name rules), so a
converted model decodes exactly as Wan's.

    vae = load_wan_vae_checkpoint("Wan2.2_VAE.pth", dtype=torch.bfloat16, device="cuda")

Files are read with `torch.load(weights_only=True)` (tensors only, never arbitrary pickled objects) or
as .safetensors holding the same original key names.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from diffusers import AutoencoderKLWan

from ..errors import ConfigError, ModelLoadError
from ..families import wan21_vae_names, wan22_vae_name, wan_vae_version
from ..records import path_problem

VERSIONS = ("2.1", "2.2")

# Per-channel latent statistics the transformer's latent space is normalised with
# (Wan's vae2_1.py / vae2_2.py; the same values as diffusers' converted vae/config.json).
WAN21_LATENTS_MEAN = [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                      0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921]
WAN21_LATENTS_STD = [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                     3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160]
WAN22_LATENTS_MEAN = [-0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557,
                      -0.1382, 0.0542, 0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825,
                      -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
                      -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230,
                      -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
                      0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667]
WAN22_LATENTS_STD = [0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013,
                     0.8158, 1.0344, 0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978,
                     0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
                     0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093,
                     0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
                     0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744]


def wan_vae_config(version: str) -> dict:
    """The `AutoencoderKLWan(**kwargs)` of the real Wan VAE: "2.1" (z16, 8x) or "2.2" (TI2V-5B, z48, 16x)."""
    common = dict(dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[], temperal_downsample=[False, True, True],
                  dropout=0.0, scale_factor_temporal=4)
    if version == "2.1":
        return dict(common, base_dim=96, decoder_base_dim=None, z_dim=16, is_residual=False, in_channels=3,
                    out_channels=3, patch_size=None, scale_factor_spatial=8,
                    latents_mean=list(WAN21_LATENTS_MEAN), latents_std=list(WAN21_LATENTS_STD))
    if version == "2.2":
        # 12 = 3 colours x 2x2 pixels: the decoder works on patchified frames (patch size 2).
        return dict(common, base_dim=160, decoder_base_dim=256, z_dim=48, is_residual=True, in_channels=12,
                    out_channels=12, patch_size=2, scale_factor_spatial=16,
                    latents_mean=list(WAN22_LATENTS_MEAN), latents_std=list(WAN22_LATENTS_STD))
    raise ConfigError(f"Wan VAE version {version!r}: choose one of {', '.join(VERSIONS)}")


def detect_version(sd: dict) -> str:
    """"2.2" if the up/down stages are nested residual blocks (`decoder.upsamples.0.upsamples.0...`), else "2.1"."""
    try:
        return wan_vae_version(sd.keys())
    except ValueError as e:
        raise ModelLoadError(str(e)) from None


def _expected_shapes(config: dict) -> dict[str, torch.Size]:
    """Parameter names and shapes of AutoencoderKLWan(**config), built on the meta device (no memory)."""
    with torch.device("meta"):
        model = AutoencoderKLWan(**config)
    return {k: v.shape for k, v in model.state_dict().items()}


def _listing(what: str, keys: list[str], limit: int = 8) -> str:
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return f"{len(keys)} {what} ({', '.join(sorted(keys)[:limit])}{more})"


def convert_wan_vae_state_dict(sd: dict, version: str | None = None, *,
                               config: dict | None = None) -> tuple[dict, str]:
    """Rename an original Wan VAE state dict to diffusers' `AutoencoderKLWan` names.

    Args:
        sd: original Wan state dict (`encoder.*`, `decoder.*`, `conv1.*`, `conv2.*`).
        version: "2.1" or "2.2"; detected from the key layout when None.
        config: AutoencoderKLWan kwargs whose key set must be matched (default: the real model's).
    Returns:
        (diffusers state dict with the same tensors, version).
    Raises:
        ModelLoadError listing unexpected and missing keys.
    """
    detected = detect_version(sd)
    if version is None:
        version = detected
    elif version not in VERSIONS:
        raise ConfigError(f"Wan VAE version {version!r}: choose one of {', '.join(VERSIONS)}")
    elif version != detected:
        raise ModelLoadError(f"checkpoint has the Wan{detected} VAE layout but version={version!r} was requested")

    if version == "2.1":
        new, unknown = {wan21_vae_names(sd)[k]: v for k, v in sd.items()}, []
    else:
        new, unknown = {}, []
        for key, value in sd.items():
            name = wan22_vae_name(key)
            if name is None:
                unknown.append(key)
            else:
                new[name] = value
    if len(new) != len(sd) - len(unknown):
        raise ModelLoadError(f"Wan{version} VAE key mapping is not one-to-one ({len(sd)} keys -> {len(new)})")

    expected = _expected_shapes(config or wan_vae_config(version))
    unexpected = unknown + [k for k in new if k not in expected]
    missing = [k for k in expected if k not in new]
    if unexpected or missing:
        parts = ([_listing("unexpected keys", unexpected)] if unexpected else []) + \
                ([_listing("missing keys", missing)] if missing else [])
        raise ModelLoadError(f"Wan{version} VAE checkpoint does not match the model: " + "; ".join(parts))
    return new, version


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a .safetensors file or of a tensors-only torch pickle (.pth/.pt), on the CPU."""
    path = Path(path)
    if problem := path_problem(path, "file"):
        raise ModelLoadError(f"Wan VAE checkpoint {str(path)!r} {problem}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            sd = load_file(str(path), device="cpu")
        else:
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "Weights only load failed" not in str(e):
            raise ModelLoadError(f"cannot read Wan VAE checkpoint {path}: not a torch or safetensors file") from e
        # Say so in one line, without the multi-line advice torch adds (to turn weights_only off).
        raise ModelLoadError(f"refusing to load {path}: it holds Python objects other than tensors "
                             f"(read with weights_only=True; re-save it as a plain state dict or safetensors)") from e
    except Exception as e:  # noqa: BLE001 - torch/safetensors raise many types (KeyError, RuntimeError, ...)
        first = str(e).strip().splitlines()[0].split(". ")[0] if str(e).strip() else ""
        raise ModelLoadError(f"cannot read Wan VAE checkpoint {path}: {type(e).__name__}: {first}") from e
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ModelLoadError(f"{path} is not a state dict (a mapping of names to tensors)")
    return sd


def load_wan_vae_checkpoint(path: str | Path, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                            config_overrides: dict | None = None):
    """Build diffusers' `AutoencoderKLWan` from an original Wan VAE checkpoint (version detected).

    Args:
        path: `Wan2.1_VAE.pth`, `Wan2.2_VAE.pth`, or a .safetensors file with the same key names.
        dtype, device: where the weights end up.
        config_overrides: AutoencoderKLWan kwargs replacing the real model's (tests: narrow widths).
    Returns:
        the model in eval mode with requires_grad False.
    """
    sd = read_state_dict(path)
    version = detect_version(sd)
    config = wan_vae_config(version)
    unknown = sorted(set(config_overrides or {}) - set(config))
    if unknown:
        raise ConfigError(f"config_overrides: unknown AutoencoderKLWan keys {', '.join(unknown)} "
                          f"(allowed: {', '.join(sorted(config))})")
    config.update(config_overrides or {})
    new, _ = convert_wan_vae_state_dict(sd, version, config=config)

    with torch.device("meta"):   # no random init of weights that are replaced at once
        model = AutoencoderKLWan(**config)
    expected = {k: v.shape for k, v in model.state_dict().items()}
    wrong = [f"{k} {tuple(v.shape)} vs {tuple(expected[k])}" for k, v in new.items() if v.shape != expected[k]]
    if wrong:
        raise ModelLoadError(f"Wan{version} VAE checkpoint {path} does not fit the config: "
                             + _listing("tensors differ in shape (checkpoint vs model)", wrong, limit=4))
    model.load_state_dict({k: v.to(dtype) for k, v in new.items()}, strict=True, assign=True)
    return model.to(device).eval().requires_grad_(False)
