"""Original Wan VAE checkpoints -> diffusers AutoencoderKLWan, checked against Wan's own code.

tests/data/wan_vae_reference.json holds facts taken from Wan's original vae2_1.py / vae2_2.py: every
state-dict name with its shape (tiny and real width) and the decode of a tiny random-weight model by
Wan's own WanVAE_.decode. Here we rebuild the same weights under the original names, load them
through our converter and must reproduce Wan's numbers — without importing Wan's code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vidgen.errors import ConfigError, ModelLoadError
from vidgen.vae import denormalize
from vidgen.vae.convert import (_expected_shapes, convert_wan_vae_state_dict, detect_version,
                                    load_wan_vae_checkpoint, wan_vae_config)

REF = json.loads((Path(__file__).parent / "data" / "wan_vae_reference.json").read_text())["versions"]
VERSIONS = sorted(REF)


def original_state_dict(version: str, width: str = "tiny") -> dict[str, torch.Tensor]:
    """Wan-named weights as the fixture describes them (random, deterministic); `real` gives meta tensors."""
    ref = REF[version]
    if width == "real":
        return {name: torch.empty(real, device="meta") for name, _, real in ref["keys"]}
    gen = torch.Generator().manual_seed(ref["weight_seed"])
    sd = {}
    for name, shape, _ in ref["keys"]:
        r = torch.randn(shape, generator=gen)
        fan_in = r[0].numel() if r.dim() >= 2 else 1
        sd[name] = 1 + 0.1 * r if name.endswith("gamma") else (r / fan_in ** 0.5 if r.dim() >= 2 else 0.05 * r)
    return sd


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("wan_vae")
    paths = {}
    for version in VERSIONS:
        paths[version] = root / f"Wan{version}_VAE.pth"
        torch.save(original_state_dict(version), paths[version])
    return paths


@pytest.mark.parametrize("version", VERSIONS)
def test_config_matches_wan(version):
    cfg = wan_vae_config(version)
    assert cfg["latents_mean"] == REF[version]["latents_mean"]
    assert cfg["latents_std"] == REF[version]["latents_std"]
    assert len(cfg["latents_mean"]) == cfg["z_dim"] == {"2.1": 16, "2.2": 48}[version]


@pytest.mark.parametrize("version", VERSIONS)
def test_real_width_keys_and_shapes(version):
    """Every original tensor of the real model lands on a diffusers parameter of the same shape."""
    sd = original_state_dict(version, "real")
    new, detected = convert_wan_vae_state_dict(sd)
    assert detected == version
    expected = _expected_shapes(wan_vae_config(version))
    assert set(new) == set(expected) and len(new) == len(sd)
    assert {k: v.shape for k, v in new.items()} == expected


@pytest.mark.parametrize("version", VERSIONS)
def test_decode_matches_wan_original(version, checkpoints):
    ref = REF[version]
    vae = load_wan_vae_checkpoint(checkpoints[version], config_overrides=ref["config_overrides"])
    assert not vae.training and not any(p.requires_grad for p in vae.parameters())

    # the renaming moves tensors, never changes them
    sd = original_state_dict(version)
    new, _ = convert_wan_vae_state_dict(sd, version, config=dict(wan_vae_config(version), **ref["config_overrides"]))
    assert {id(v) for v in new.values()} == {id(v) for v in sd.values()}
    params = vae.state_dict()
    assert all(torch.equal(params[k], v) for k, v in new.items())

    z = torch.randn(ref["latent_shape"], generator=torch.Generator().manual_seed(ref["latent_seed"]))
    with torch.no_grad():
        video = vae.decode(denormalize(vae, z), return_dict=False)[0]
    want = ref["decoded"]
    assert list(video.shape) == want["shape"]
    flat = video.flatten()
    sample = flat[torch.linspace(0, flat.numel() - 1, len(want["sample"])).long()]
    assert (sample - torch.tensor(want["sample"])).abs().max().item() <= 1e-5
    assert video.sum().item() == pytest.approx(want["sum"], rel=1e-5)
    assert video.abs().sum().item() == pytest.approx(want["abs_sum"], rel=1e-5)


def test_safetensors_dtype_and_device(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "wan22_vae.safetensors"
    save_file(original_state_dict("2.2"), str(path))
    vae = load_wan_vae_checkpoint(path, dtype=torch.bfloat16, device="cpu",
                                  config_overrides=REF["2.2"]["config_overrides"])
    assert {p.dtype for p in vae.parameters()} == {torch.bfloat16}
    assert vae.config.patch_size == 2 and vae.config.z_dim == 48


class _RunsCodeWhenUnpickled:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_pickled_objects_are_refused(tmp_path):
    path, marker = tmp_path / "evil.pth", tmp_path / "was_executed"
    torch.save({"decoder.conv1.weight": torch.zeros(1), "payload": _RunsCodeWhenUnpickled(marker)}, path)
    with pytest.raises(ModelLoadError, match=r"refusing to load .*evil\.pth: it holds Python objects"):
        load_wan_vae_checkpoint(path)
    assert not marker.exists()


def test_missing_and_unexpected_keys_are_listed():
    sd = original_state_dict("2.2")
    del sd["decoder.head.2.bias"]
    sd["decoder.upsamples.0.upsamples.0.extra.weight"] = torch.zeros(1)
    sd["ema.step"] = torch.zeros(1)
    with pytest.raises(ModelLoadError) as err:
        convert_wan_vae_state_dict(sd)
    msg = str(err.value)
    assert "\n" not in msg
    assert "2 unexpected keys (decoder.up_blocks.0.resnets.0.extra.weight, ema.step)" in msg
    assert "1 missing keys (decoder.conv_out.bias)" in msg


def test_version_detection_and_mismatches(tmp_path, checkpoints):
    assert [detect_version(original_state_dict(v)) for v in VERSIONS] == VERSIONS
    with pytest.raises(ModelLoadError, match="has the Wan2.2 VAE layout but version='2.1'"):
        convert_wan_vae_state_dict(original_state_dict("2.2"), "2.1")
    with pytest.raises(ModelLoadError, match="already in diffusers format"):
        detect_version({"decoder.up_blocks.0.resnets.0.conv1.weight": torch.zeros(1)})
    with pytest.raises(ModelLoadError, match="not an original Wan VAE checkpoint"):
        detect_version({"first_stage_model.weight": torch.zeros(1)})
    with pytest.raises(ConfigError, match="'2.3'"):
        wan_vae_config("2.3")
    # the tiny checkpoint against the real widths: every shape mismatch counted, a few named
    with pytest.raises(ModelLoadError, match=r"does not fit the config: \d+ tensors differ in shape"):
        load_wan_vae_checkpoint(checkpoints["2.1"])
    with pytest.raises(ConfigError, match="unknown AutoencoderKLWan keys basedim"):
        load_wan_vae_checkpoint(checkpoints["2.1"], config_overrides={"basedim": 8})
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_wan_vae_checkpoint(tmp_path / "nope.pth")
    (tmp_path / "half.pth").write_bytes(checkpoints["2.1"].read_bytes()[:5000])
    with pytest.raises(ModelLoadError, match=r"cannot read Wan VAE checkpoint .*half\.pth: "):
        load_wan_vae_checkpoint(tmp_path / "half.pth")
