"""The family registry (vidgen.families): the one place that names a variant, its detection from a
folder's JSON and a file's shapes, its shipped JSON folders, and the one Wan <-> diffusers name
adapter per role that weight loading and LoRA keys share."""

from __future__ import annotations

import ast
import builtins
import collections
import io
import json
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from vidgen import families, folders
from vidgen.families import FAMILIES, VARIANTS_DIR, by_config, by_shapes, diffusers_name, diffusers_names, wan_name
from vidgen.loading import CONFIG_ROLES, inspect_model
from vidgen.sources import expected_shapes, inspect

PACKAGE = Path(families.__file__).resolve().parent
SHIPPED = {size.folder: family for family in FAMILIES.values() for size in family.sizes}


def _docstrings(tree: ast.AST) -> set[int]:
    """The string constants that are docstrings or bare expressions (as bench/layout_counts.py counts)."""
    return {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}


def test_variant_names_appear_only_in_the_registry():
    """No module but vidgen/families.py spells a variant's name in its code (docstrings aside): every
    other module asks the records."""
    pattern = re.compile("|".join(re.escape(name) for name in FAMILIES))
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "families.py":
            continue
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        found += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {node.value[:60]!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                  and pattern.search(node.value)]
    assert not found, "variant names outside vidgen/families.py:\n" + "\n".join(found)


@pytest.mark.parametrize("folder", sorted(SHIPPED))
def test_each_shipped_folder_is_told_as_its_family_from_its_json(folder):
    """inspect_model(json_only=True) reads a shipped JSON folder (no weights, no tokenizer) and tells
    its family; its configs come back as fresh copies of the files."""
    info = inspect_model(VARIANTS_DIR / folder, json_only=True)
    assert info.variant == SHIPPED[folder].name and info.tokenizer is None and info.weights == {}
    on_disk = json.loads((VARIANTS_DIR / folder / "transformer" / "config.json").read_text())
    conf = info.config("transformer")
    assert conf == on_disk
    conf["num_layers"] = -1                                 # a copy: the model description does not change
    assert info.config("transformer") == on_disk
    assert info.config("model_index") == json.loads((VARIANTS_DIR / folder / "model_index.json").read_text())
    assert set(info.configs) <= set(CONFIG_ROLES)
    assert info.z_dim == SHIPPED[folder].z_dim
    assert info.experts == ["transformer", "transformer_2"][:SHIPPED[folder].experts]


@pytest.mark.parametrize("variant", ["wan2.1-t2v", "wan2.1-i2v", "wan2.2-t2v-a14b"])
def test_inspecting_a_folder_opens_each_file_once(tiny_model, monkeypatch, variant):
    """sources.inspect (resolve, then loading.inspect_model) opens each JSON file of the folder once,
    and weights_of reads no header again: what one reader read, the next one is handed."""
    folder = tiny_model(variant).resolve()
    model = SimpleNamespace(path=str(folder), variant="auto", transformer=None, transformer_2=None, text_encoder=None,
                            vae=None, tokenizer=None)
    opened: collections.Counter = collections.Counter()
    real_open = builtins.open

    def counting(file, *a, **k):
        if isinstance(file, (str, Path)) and folder in Path(file).resolve().parents:
            opened[str(Path(file).resolve().relative_to(folder))] += 1
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", counting)
    monkeypatch.setattr(io, "open", counting)
    info = inspect(model)
    for role in info.experts + ["text_encoder", "vae"]:
        info.weights_of(role)
    monkeypatch.undo()
    json_files = {k: n for k, n in opened.items() if k.endswith(".json")}
    assert json_files and all(n == 1 for n in json_files.values()), json_files
    headers = {k: n for k, n in opened.items() if k.endswith(".safetensors")}
    assert headers and all(n == 1 for n in headers.values()), headers
    assert info.variant == variant and info.config("model_index")["_class_name"] == info.family.pipeline_class


def test_a_tokenizer_folder_of_its_own_is_scanned_once(tiny_model, tmp_path, monkeypatch):
    """model.tokenizer elsewhere: sources checks it (no code, files only) and inspect_model takes its scan."""
    folder = tiny_model()
    tok = tmp_path / "umt5"
    shutil.copytree(folder / "tokenizer", tok)
    model = SimpleNamespace(path=str(folder), variant="auto", transformer=None, transformer_2=None, text_encoder=None,
                            vae=None, tokenizer=str(tok))
    walks: collections.Counter = collections.Counter()
    real_walk = os.walk
    monkeypatch.setattr(folders.os, "walk", lambda top, *a, **k: walks.update([Path(top)]) or real_walk(top, *a, **k))
    info = inspect(model)
    assert info.tokenizer == tok and walks[tok] == 2          # once for code, once for entries that are not files


def test_detection_rules():
    """From the JSON: the per-token family by its timesteps or its VAE, the others by their input
    channels (and the CLIP image encoder Wan2.1 I2V needs); from a file's shapes: the same rules
    without an image encoder, the experts given picking between equal layouts."""
    for family in FAMILIES.values():
        z = family.z_dim
        told = by_config(family.experts, family.in_channels(z), z, family.per_token_timesteps, family.image_encoder,
                         family.control, family.forcing, family.animate)
        assert told is family
        if not family.image_encoder or family.animate:     # Animate's file holds its pose and face modules
            assert by_shapes(family.in_channels(z), z, family.experts, family.control, family.forcing,
                             family.animate) is family
    assert by_config(1, 16, 16, False, False) is not by_config(1, 36, 16, False, True)
    assert by_config(1, 36, 16, False, False) is None        # image channels without the CLIP encoder
    assert by_config(2, 7, 16, False, False) is None
    assert by_shapes(7, 16, 1) is None
    # VACE context blocks tell VACE from the T2V layout it shares its input channels with
    assert by_config(1, 16, 16, False, False, True).control and not by_config(1, 16, 16, False, False).control
    assert by_shapes(16, 16, 2, True).name == "wan2.2-vace-a14b" and by_shapes(16, 16, 1, True).name == "wan2.1-vace"
    # diffusion forcing (SkyReels-V2 DF: num_frame_per_block in its config, an fps embedding in the 1.3B's file)
    assert by_config(1, 16, 16, False, False, False, True).forcing and not by_config(1, 16, 16, False, False).forcing
    assert by_shapes(16, 16, 1, False, True).forcing
    # Wan2.2-Animate (motion_encoder_size in its config) shares Wan2.1 I2V's channels and CLIP encoder
    assert by_config(1, 36, 16, False, True, animate=True).animate and not by_config(1, 36, 16, False, True).animate
    assert by_shapes(36, 16, 1, animate=True).animate and not by_shapes(36, 16, 1).animate


def test_shipped_folders_and_sizes():
    several = [f for f in FAMILIES.values() if len(f.sizes) > 1]
    for family in FAMILIES.values():
        for size in family.sizes:
            assert (VARIANTS_DIR / size.folder / "model_index.json").is_file()
            hint = f"models/{size.display.split(' or ')[0].replace(' ', '-')}-Diffusers" if size.path_hint else ""
            assert families.shipped_folder(family.name, hint) == VARIANTS_DIR / size.folder
    assert several and all(families.shipped_folder(f.name, "models/my-model") is None for f in several)
    assert families.shipped_folder("auto") is None
    assert all(repo.count("/") == 1 for repo in families.PUBLISHED)


# --------------------------------------------------------------------------------------------
# The name adapters


@pytest.mark.parametrize("folder", sorted(SHIPPED))
def test_transformer_names_go_both_ways(folder):
    """Every diffusers parameter of a shipped transformer has a Wan name that comes back to it, and a
    file of those Wan names is named as the model names its parameters; LoRA module paths too."""
    names = list(expected_shapes(VARIANTS_DIR / folder, "transformer"))
    wan = [wan_name("transformer", n) for n in names]
    assert [diffusers_name("transformer_2", w) for w in wan] == names
    layout, mapping = diffusers_names("transformer", wan)
    assert layout == "wan" and sorted(mapping.values()) == sorted(names)
    assert diffusers_names("transformer", names) == ("diffusers", {n: n for n in names})
    assert "blocks.0.self_attn.q.weight" in wan and "head.modulation" in wan and "blocks.0.modulation" in wan
    modules = {n.rsplit(".", 1)[0] for n in names if n.endswith((".weight", ".bias"))}
    assert all(diffusers_name("transformer", wan_name("transformer", m)) == m for m in modules)


def test_text_encoder_names_go_both_ways():
    names = list(expected_shapes(VARIANTS_DIR / families.TEXT_ENCODER_FOLDER, "text_encoder"))
    wan = [wan_name("text_encoder", n) for n in names]
    assert "token_embedding.weight" in wan and "blocks.0.attn.q.weight" in wan and "norm.weight" in wan
    layout, mapping = diffusers_names("text_encoder", wan)
    assert layout == "wan" and [mapping[w] for w in wan] == names
    layout, mapping = diffusers_names("text_encoder", [*names, "encoder.embed_tokens.weight"])
    assert layout == "diffusers" and "encoder.embed_tokens.weight" not in mapping    # tied to shared.weight


def test_vae_names_of_the_published_layouts():
    """A Wan VAE file's keys are named by their own layout (any depth); one key alone by the published
    one; a key list of both layouts, or of neither, is refused."""
    ref = json.loads((Path(__file__).parent / "data" / "wan_vae_reference.json").read_text())["versions"]
    for version, facts in ref.items():
        keys = [name for name, _, _ in facts["keys"]]
        assert families.wan_vae_version(keys) == version
        layout, mapping = diffusers_names("vae", keys)
        assert layout == "wan" and len(set(mapping.values())) == len(keys)
        if version == "2.2" or facts["config_overrides"].get("num_res_blocks", 2) == 2:
            assert all(diffusers_name("vae", k) == mapping[k] for k in keys)
    with pytest.raises(ValueError, match="already in diffusers format"):
        families.wan_vae_version(["decoder.up_blocks.0.resnets.0.conv1.weight", "decoder.upsamples.0.residual.0.gamma"])
    with pytest.raises(ValueError, match="not an original Wan VAE checkpoint"):
        families.wan_vae_version(["encoder.downsamples.0.weight"])
    with pytest.raises(ValueError):
        wan_name("vae", "decoder.conv_in.weight")
