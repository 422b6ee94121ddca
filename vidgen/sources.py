"""Where a model's parts are: `model.path` (a diffusers folder, a Wan checkpoint folder or a Hugging
Face repo id already in the local cache) and the per-component files that override or complete it
(`model.transformer`, `model.transformer_2`, `model.text_encoder`, `model.vae`, `model.image_encoder`,
`model.tokenizer`; the CLIP image encoder's checks are vidgen.clip_files').

`resolve` finds every component's weights (vidgen.weights, headers only), tells the variant
from the transformer's tensor shapes, picks the JSON the model is built from — the diffusers
folder's own, or the published configs vidgen ships for the variant (vidgen/variants) — checks every
file against the model it must fit, and reports every problem at once, before any weight is read.
Nothing is downloaded: a repo id that is not in the cache is an error naming the command that
fetches it.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace

import torch

from . import schemas
from .config import REPO_ID
from .families import FAMILIES, PUBLISHED, TEXT_ENCODER_FOLDER, VARIANTS_DIR, by_shapes, size_named, transformer_class
from .weights import ROLES, Weights, clip_tower, meta_image_encoder, open_weights
from .clip_files import folder_problems, single_file_problems
from .records import path_problem
from .hub_cache import cached_repos, hub_cache
from .folders import Scan
from .loading import ModelInfo, inspect_model, library
from .lora import _split
from .errors import ModelLoadError

WAN_T5 = "models_t5_umt5-xxl-enc-bf16.pth"
WAN_VAES = ("Wan2.1_VAE.pth", "Wan2.2_VAE.pth")
WAN_TOKENIZER = "google/umt5-xxl"
TOKENIZER_FILES = ("tokenizer.json", "spiece.model")
TOKENIZER_HINT = ("set model.tokenizer to a folder with the UMT5 tokenizer (tokenizer.json or spiece.model): the "
                  "tokenizer/ folder of any Wan diffusers download, or `hf download google/umt5-xxl spiece.model "
                  "tokenizer.json tokenizer_config.json special_tokens_map.json`")


@dataclass
class Resolved:
    """What the model is made of: the JSON root it is built from and each component's weights."""

    root: Path                              # model_index.json, */config.json, scheduler/ (a folder or vidgen/variants/*)
    weights: dict[str, Weights]             # role -> weights (transformer, transformer_2 when two experts, text_encoder,
                                            # vae, image_encoder when a file names it)
    tokenizer: Path | None                  # None: the diffusers folder's own tokenizer/
    layout: str                             # diffusers folder | Wan checkpoint folder | single files
    variant: str = ""                       # the shipped name (wan2.2-t2v-a14b, wan2.1-t2v-1.3b, ...) when shapes tell it
    notes: list[str] = field(default_factory=list)
    scans: dict[Path, Scan] = field(default_factory=dict)    # folder -> what was read of it (loading.inspect_model reads on)


# --------------------------------------------------------------------------------------------
# Hugging Face cache


def cached_snapshot(repo_id: str) -> Path:
    """The local snapshot of a Hugging Face repo (never downloaded). Raises ModelLoadError."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True, cache_dir=hub_cache()))
    except LocalEntryNotFoundError:
        raise _not_there(repo_id) from None
    except Exception as e:  # noqa: BLE001 - a damaged cache raises OSError/ValueError variants
        raise ModelLoadError(f"model.path: cannot read {repo_id!r} from the Hugging Face cache ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''})") from None


def _cached_tokenizer() -> Path | None:
    """A UMT5 tokenizer already in the Hugging Face cache: a Wan diffusers repo's tokenizer/, or google/umt5-xxl."""
    for repo, snap in cached_repos():
        for folder in (snap / "tokenizer", snap / WAN_TOKENIZER, snap):
            if (repo.startswith("Wan-AI/") or repo == WAN_TOKENIZER) and _has_tokenizer(folder):
                return folder
    return None


def _has_tokenizer(folder: Path) -> bool:
    return folder.is_dir() and any((folder / f).is_file() for f in TOKENIZER_FILES)


# --------------------------------------------------------------------------------------------
# Variants from shapes


@lru_cache(maxsize=16)
def _shipped_shapes(name: str, role: str) -> dict[str, tuple[int, ...]]:
    return expected_shapes(VARIANTS_DIR / name, role)


def expected_shapes(root: Path, role: str, scan: Scan | None = None) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of `role` built from root/<role>/config.json on the meta device (`scan`:
    what was read of `root` already)."""
    file = root / role / "config.json"
    conf = json.loads(file.read_text()) if scan is None else scan.json(file, f"{role}/config.json", [])
    conf = {k: v for k, v in conf.items() if not k.startswith("_")}
    with torch.device("meta"):
        if role.startswith("transformer"):
            model = library(transformer_class(conf)).from_config(conf)
        elif role == "vae":
            model = library("AutoencoderKLWan").from_config(conf)
        elif role == "image_encoder":
            model = clip_tower(meta_image_encoder(conf, torch.float32))
        else:
            model = library("UMT5EncoderModel")(library("UMT5Config")(**conf))
    return {k: tuple(p.shape) for k, p in model.named_parameters()}


def transformer_family(w: Weights, experts: int) -> tuple[str, str]:
    """(family, what the shapes say) of a Wan transformer's weights; family "" when they are not a Wan
    transformer vidgen runs (the second item then says why)."""
    patch = w.shapes.get("patch_embedding.weight")
    if patch is None or len(patch) != 5:
        return "", "no patch_embedding.weight of a Wan transformer"
    dim, in_ch = patch[0], patch[1]
    layers = len({k.split(".")[1] for k in w.shapes if k.startswith("blocks.")})
    facts = f"width {dim}, {layers} blocks, {in_ch} input channels"
    animate = "pose_patch_embedding.weight" in w.shapes       # Wan2.2-Animate: its CLIP from model.image_encoder
    if not animate and any(k.startswith("condition_embedder.image_embedder.") or ".add_k_proj." in k for k in w.shapes):
        return "", (f"a Wan2.1 image-to-video transformer with a CLIP image embedder ({facts}); vidgen runs Wan2.1 I2V "
                    f"from a diffusers folder only (set model.path to it: it holds the image_encoder)")
    out_ch = _out_channels(w)
    control, forcing = "vace_patch_embedding.weight" in w.shapes, "fps_embedding.weight" in w.shapes
    facts += (f", {len({k.split('.')[1] for k in w.shapes if k.startswith('vace_blocks.')})} VACE blocks" * control
              + ", an fps embedding (diffusion forcing)" * forcing + ", a pose embedding and face encoder (Animate)" * animate)
    if family := by_shapes(in_ch, out_ch, experts, control, forcing, animate):
        return family.name, facts
    return "", f"{facts}, {out_ch} output channels: not a Wan layout vidgen knows"


def _out_channels(w: Weights) -> int:
    """A Wan transformer's output (latent) channels: its output projection maps each token to a patch."""
    return w.shapes.get("proj_out.weight", (0,))[0] // 4


def shipped_match(w: Weights, family: str, variant_hint: str) -> str:
    """The shipped variant whose transformer has exactly these shapes ("" for other widths)."""
    names = [size.folder for size in FAMILIES[family].sizes] if family in FAMILIES else []
    if variant_hint in names:
        names = [variant_hint]
    for name in names:
        if w.mismatch(_shipped_shapes(name, "transformer")) is None:
            return name
    return ""


def shipped_name(folder: str) -> str:
    """The display name of a shipped folder's model ("" for none)."""
    found = size_named(folder)
    return found[1].display if found else ""


# --------------------------------------------------------------------------------------------
# Layouts


def _wan_folder(root: Path) -> dict[str, Path] | None:
    """Component paths of a Wan checkpoint folder (as Wan's generate.py reads it), or None."""
    if (root / "high_noise_model").is_dir():
        parts = {"transformer": root / "high_noise_model", "transformer_2": root / "low_noise_model"}
    elif any(root.glob("diffusion_pytorch_model*.safetensors")):
        parts = {"transformer": root}
    else:
        return None
    if (root / WAN_T5).exists():
        parts["text_encoder"] = root / WAN_T5
    for name in WAN_VAES:
        if (root / name).exists():
            parts["vae"] = root / name
    return parts


def _given(model) -> dict[str, Path]:
    return {role: Path(str(getattr(model, role))).expanduser() for role in ROLES if getattr(model, role, None)}


def published(name: str) -> str | None:
    """The published Wan repo whose name is the last part of `name` (any case), or None."""
    tail = str(name).rstrip("/").rsplit("/", 1)[-1].lower()
    return next((repo for repo in PUBLISHED if repo.split("/")[1].lower() == tail), None)


def _not_there(path: str) -> ModelLoadError:
    """model.path names nothing here nor in the cache: say how to get it, naming only a repo that exists."""
    repo = published(path)
    if repo and repo.lower() == path.lower():
        hint = f"fetch it once with `hf download {repo}`"
    elif repo:          # a folder named after a published model (the presets' models/...): download it there
        hint = f"download {repo} into it with `hf download {repo} --local-dir {path}`, or point model.path at your copy"
    elif REPO_ID.fullmatch(path) and not path.startswith((".", "/", "~")):
        hint = (f"a relative folder starts at {os.getcwd()}; a Hub repo is fetched once with `hf download <repo id>` "
                "(Wan-AI's are named Wan-AI/Wan2.2-T2V-A14B-Diffusers and alike)")
    else:
        return ModelLoadError(f"model folder {path!r} does not exist; set model.path to a local diffusers or Wan "
                              f"model folder, or a Hugging Face repo id in the local cache (nothing is downloaded)")
    return ModelLoadError(f"model.path: {path!r} is neither a local folder nor a repo in the Hugging Face cache "
                          f"({hub_cache()}); vidgen never downloads: {hint}")


def locate(path: str | None) -> tuple[Path | None, str]:
    """(local folder, what it is) of model.path: a folder, or a repo id's cached snapshot."""
    if not path:
        return None, "single files"
    local = Path(str(path)).expanduser()
    problem = path_problem(local, "folder")
    if problem == "does not exist":
        if not (REPO_ID.fullmatch(str(path)) and not str(path).startswith((".", "/", "~"))):
            raise _not_there(str(path))
        local = cached_snapshot(str(path))
    elif problem:
        fix = ("; give a single weights file as model.transformer (or model.vae, model.text_encoder) with model.path "
               "null, or set model.path to the folder" if local.is_file() and local.suffix.lower() in WEIGHT_SUFFIXES
               else "; set model.path to a diffusers or Wan model folder")
        raise ModelLoadError(f"model.path: {str(local)!r} {problem}{fix}")
    if (local / "model_index.json").is_file():
        return local, "diffusers folder"
    if _wan_folder(local) is not None:
        return local, "Wan checkpoint folder"
    raise ModelLoadError(f"{local} is neither a diffusers pipeline folder (no model_index.json) nor a Wan checkpoint "
                         f"folder (no diffusion_pytorch_model*.safetensors, no high_noise_model/)")


def resolve(model, *, need_tokenizer: bool = True) -> Resolved:
    """Every component of `model` (a config.ModelConfig) located and checked from headers; all problems at once.
    `need_tokenizer=False` (memory planning): a missing tokenizer is not a problem.

    Raises ModelLoadError.
    """
    root, layout = locate(model.path)
    given = _given(model)
    problems: list[str] = []
    scans = {root: Scan(root)} if root is not None else {}
    if layout == "diffusers folder":      # the folder's own components are checked by loading.inspect_model
        return _resolve_folder(model, root, given, scans)
    paths = _wan_folder(root) if root is not None else {}
    paths.update(given)
    if "transformer" not in paths:
        raise ModelLoadError("model: no transformer; set model.path to a model folder or repo id, or model.transformer "
                             "to a transformer file")
    weights = _open_all(paths, problems)
    for role in ("text_encoder", "vae"):
        if role in weights and weights[role].kind == "gguf":
            problems.append(f"model.{role}: {weights.pop(role).source} is GGUF, which vidgen loads for transformers "
                            f"only; give the {role.replace('_', ' ')} as safetensors or Wan's .pth")
    if "transformer" not in weights:
        raise ModelLoadError("; ".join(problems))
    family, variant, facts = _transformers(model, weights, 2 if "transformer_2" in paths else 1, problems)

    # The JSON the model is built from.
    if not variant:
        if family:                      # else _transformers said what the file is
            problems.append(f"model.transformer: {facts} match no published Wan model; give model.path a diffusers "
                            f"folder with its config.json files")
        raise ModelLoadError(_joined(problems))
    json_root = VARIANTS_DIR / variant
    scans[json_root] = Scan(json_root)
    if wanted := _needs_second_expert(weights["transformer"], family, model.variant):
        problems.append(f"model.variant: {wanted} needs model.transformer_2 (the low-noise expert)")
    for role in ("text_encoder", "vae"):
        if role not in weights and not any(role in s for s in problems):
            problems.append(f"model.{role}: not found; give the {role.replace('_', ' ')} file "
                            f"({'umt5_xxl_*.safetensors or ' + WAN_T5 if role == 'text_encoder' else 'wan_2.1_vae.safetensors, Wan2.2_VAE.pth, ...'})")
    problems += single_file_problems(FAMILIES.get(family), weights, root, layout)
    _check_fits(weights, json_root, variant, scans[json_root], problems)
    tokenizer = _tokenizer(model, root, scans, problems if need_tokenizer else [])
    if problems:
        raise ModelLoadError(_joined(problems))
    return Resolved(json_root, weights, tokenizer, layout, variant, scans=scans)


def _resolve_folder(model, root: Path, given: dict[str, Path], scans: dict[Path, Scan]) -> Resolved:
    """A diffusers folder, some of whose components come from the files `given` (role -> path)."""
    problems: list[str] = []
    if given:                           # their shapes come from the folder's JSON: in range first
        schemas.check_folder(root, reader=scans[root].json)
    weights = _open_all(given, problems)
    for role, w in weights.items():
        if role == "image_encoder" and (bad := folder_problems(w, root)):
            problems += bad
        elif not (root / role / "config.json").is_file():
            problems.append(f"model.{role}: {root} has no {role}/config.json to build it from")
        elif bad := w.mismatch(expected_shapes(root, role, scans[root])):
            problems.append(f"model.{role}: {w.describe()} does not fit the {role.replace('_', ' ')} of {root}: {bad}")
    tokenizer = _tokenizer(model, root, scans, problems) if getattr(model, "tokenizer", None) else None
    if problems:
        raise ModelLoadError(_joined(problems))
    return Resolved(root, weights, tokenizer, "diffusers folder", scans=scans)


def _open_all(paths: dict[str, Path], problems: list[str]) -> dict[str, Weights]:
    """{role: its weights} of each path that opens; the others' problems appended."""
    weights: dict[str, Weights] = {}
    for role, p in paths.items():
        try:
            weights[role] = open_weights(role, p)
        except ModelLoadError as e:
            problems.append(str(e))
    return weights


def _transformers(model, weights: dict[str, Weights], experts: int, problems: list[str]) -> tuple[str, str, str]:
    """(family, shipped variant, what the shapes say) of the transformer files; problems appended."""
    family, facts = transformer_family(weights["transformer"], experts)
    if not family:
        problems.append(f"model.transformer: {weights['transformer'].describe()} is {facts}")
    variant = shipped_match(weights["transformer"], family, model.variant)
    if "transformer_2" in weights and family:
        other, _ = transformer_family(weights["transformer_2"], 2)
        if other != family or weights["transformer_2"].mismatch(weights["transformer"].shapes):
            problems.append(f"model.transformer_2: {weights['transformer_2'].describe()} is not an expert of the same "
                            f"model as model.transformer ({facts}); give the high- and low-noise files of one model")
    if family and FAMILIES[family].experts == 2 and experts == 1:
        problems.append(f"model.transformer_2: {family} has two experts; give the low-noise one as model.transformer_2 "
                        f"(model.transformer is the high-noise one)")
    return family, variant, facts


def _check_fits(weights: dict[str, Weights], json_root: Path, variant: str, scan: Scan, problems: list[str]) -> None:
    """Each file against the component of the shipped JSON it must fit (a file already refused is not)."""
    for role, w in weights.items():
        if any(p.startswith(f"model.{role}:") for p in problems) or not (json_root / role / "config.json").is_file():
            continue
        expected = expected_shapes(json_root, role, scan)
        if role == "vae" and (z := _vae_z_of(w.shapes)) and z != _vae_z_of(expected):
            problems.append(f"model.vae: {w.describe()} is the Wan{'2.2' if z == 48 else '2.1'} VAE ({z} latent channels); "
                            f"{variant or json_root.name} needs the Wan{'2.2' if z != 48 else '2.1'} VAE "
                            f"({_vae_z_of(expected)} latent channels)")
        elif bad := w.mismatch(expected):
            problems.append(f"model.{role}: {w.describe()} does not fit the {role.replace('_', ' ')} of "
                            f"{variant or json_root.name}: {bad}")


def _needs_second_expert(w: Weights, family: str, variant: str) -> str:
    """model.variant when it names a two-expert family that these one-expert shapes would be with a
    second expert given (Wan2.1 T2V-14B's shapes are one expert of Wan2.2 T2V-A14B), else ""."""
    wanted, patch = FAMILIES.get(variant), w.shapes.get("patch_embedding.weight", (0, 0))
    if wanted is None or wanted.experts != 2 or family == variant:
        return ""
    return variant if by_shapes(patch[1], _out_channels(w), 2, "vace_patch_embedding.weight" in w.shapes) is wanted else ""


def _vae_z_of(shapes: dict) -> int:
    """A VAE's latent channels: its post-quant conv maps z to z."""
    return int(shapes.get("post_quant_conv.weight", (0,))[0])


def _tokenizer(model, root: Path | None, scans: dict[Path, Scan], problems: list[str]) -> Path:
    """The tokenizer folder: model.tokenizer (checked, its scan kept in `scans`), else one beside the
    weights or in the Hugging Face cache."""
    if getattr(model, "tokenizer", None):
        tok = Path(str(model.tokenizer)).expanduser()
        scan = scans.setdefault(tok, Scan(tok))
        if problem := path_problem(tok, "folder"):
            problems.append(f"model.tokenizer: {str(tok)!r} {problem}; {TOKENIZER_HINT}")
        elif code := scan.custom_code():
            problems.append(f"model.tokenizer: {tok} holds custom code ({'; '.join(code[:3])}); vidgen never runs code "
                            "from a model folder: use a tokenizer folder without it (the tokenizer/ of a Wan download)")
        elif special := scan.special_files():
            problems.append(f"model.tokenizer: {tok} holds entries that are not regular files ({'; '.join(special[:3])}); "
                            "replace them with the real files")
        elif not _has_tokenizer(tok):
            problems.append(f"model.tokenizer: {tok} holds no tokenizer.json or spiece.model")
        return tok
    for candidate in ([root / "tokenizer", root / WAN_TOKENIZER] if root is not None else []):
        if _has_tokenizer(candidate):
            return candidate
    found = _cached_tokenizer()
    if found is None:
        problems.append(f"model.tokenizer: no UMT5 tokenizer beside the weights or in the Hugging Face cache; "
                        f"{TOKENIZER_HINT}")
        return Path()
    return found


def _joined(problems: list[str]) -> str:
    return problems[0] if len(problems) == 1 else f"the model has {len(problems)} problems: " + "; ".join(problems)


def inspect(model) -> ModelInfo:
    """loading.ModelInfo of `model` (a config.ModelConfig) wherever its parts are; raises ModelLoadError."""
    r = resolve(model)
    given = frozenset(r.weights) if r.layout == "diffusers folder" else frozenset(ROLES)
    info = inspect_model(r.root, given=given, tokenizer=r.tokenizer, scans=r.scans)
    info.weights.update(r.weights)
    info.layout, info.shipped = r.layout, r.variant
    if r.layout != "diffusers folder":
        info.path = r.root
    return info


# --------------------------------------------------------------------------------------------
# vidgen info MODEL / vidgen models


def _params(w: Weights) -> int:
    return sum(math.prod(s) for s in w.shapes.values())


_T5_KEY = re.compile(r"(encoder\.block\.\d+\.layer\.|blocks\.\d+\.(attn\.[qkvo]|ffn\.fc1|pos_embedding)\.)")


def _guess_role(path: Path) -> tuple[str, Weights]:
    """(the component a single file holds, its weights) from its tensor names: transformer, vae,
    text_encoder, image_encoder, lora, or "" for none of them."""
    w = open_weights("vae", path)           # identity names but for Wan's VAE: every key kept
    keys = [key for _, key in w.names.values()]
    stripped = [k.split("diffusion_model.", 1)[-1] for k in keys]
    if keys and sum(_split(k) is not None for k in stripped) * 2 >= len(keys):
        return "lora", w
    if "patch_embedding.weight" in w.shapes:
        return "transformer", open_weights("transformer", path)
    if any(k.startswith(("decoder.", "encoder.conv_in", "encoder.conv1")) for k in w.shapes):
        return "vae", w
    if any(k in w.shapes for k in ("shared.weight", "token_embedding.weight", "encoder.embed_tokens.weight")) or \
            any(_T5_KEY.match(k) for k in w.shapes):
        return "text_encoder", open_weights("text_encoder", path)
    if any(k.endswith("embeddings.class_embedding") for k in w.shapes):     # CLIP's vision tower
        return "image_encoder", open_weights("image_encoder", path)
    return "", w


def _lora_facts(w: Weights) -> str:
    """Layers, rank and target width of a LoRA file (from its down projections' shapes)."""
    downs = [w.shapes[name] for name, (_, key) in w.names.items()
             if (split := _split(key.split("diffusion_model.", 1)[-1])) and split[1] == "down" and len(w.shapes[name]) >= 2]
    ranks = sorted({int(s[0]) for s in downs})
    widths = sorted({int(s[1]) for s in downs})
    rank = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}..{ranks[-1]}" if ranks else "no low-rank pairs"
    width = f", inputs {widths[0]}{'..' + str(widths[-1]) if len(widths) > 1 else ''} wide" if widths else ""
    return f"{len(downs)} layers, {rank}{width}"


def _count(n: float, unit: str = "") -> str:
    for scale, name in ((1e9, "G" if unit else "B"), (1e6, "M"), (1e3, "K" if unit else "k")):
        if n >= scale:
            return f"{n / scale:.2f} {name}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def _weights_line(role: str, w: Weights, detail: str = "") -> str:
    return (f"  {role:<14}{w.describe()}, {_count(_params(w))} parameters, {_count(w.nbytes, 'B')}"
            + (f"; {detail}" if detail else ""))


def describe_model(target: str) -> str:
    """What `target` (a folder, a repo id in the cache, or one weights file) is: its layout, variant and,
    per component, its files, names, storage dtype, parameter count and size; what is missing."""
    path = Path(target).expanduser()
    if (problem := path_problem(path, "file or folder")) and problem != "does not exist":
        raise ModelLoadError(f"{target!r} {problem}; give a model folder, a repo id in the cache or a weights file")
    if path.is_file():
        role, w = _guess_role(path)
        detail = ""
        if role == "lora":
            style = "Wan's names" if any(".self_attn." in k or ".cross_attn." in k for _, k in w.names.values()) \
                else "diffusers' names"
            return (f"{path}: a LoRA file ({_lora_facts(w)}); apply it with 'loras=[{{path: {path}}}]'\n"
                    f"  {'lora':<14}{path} (safetensors, {style}, {w.storage()}), {_count(_params(w))} parameters, "
                    f"{_count(w.nbytes, 'B')}")
        if not role:
            names = ", ".join(list(w.shapes)[:3])
            return (f"{path}: not a Wan component file: its {len(w.shapes)} tensor(s) ({names}{', ...' if len(w.shapes) > 3 else ''}) "
                    "are not those of a Wan transformer, VAE, UMT5 text encoder or a LoRA")
        if role == "transformer":
            name, family, facts = _transformer_is(w)
            detail = f"one expert of {FAMILIES[family].display}: {facts}" if family and FAMILIES[family].experts == 2 \
                else f"{name}: {facts}"
        elif role == "vae":
            detail = "Wan2.2 VAE (48 latent channels)" if _vae_z_of(w.shapes) == 48 else "Wan2.1 VAE (16 latent channels)"
        return f"{path}: {'an' if role[0] in 'aeiou' else 'a'} {role.replace('_', ' ')} file\n" + _weights_line(role, w, detail)
    model = SimpleNamespace(path=target, variant="auto", **{r: None for r in (*ROLES, "tokenizer")})
    root, layout = locate(target)
    lines = [f"{target}: {layout}" + (f" ({root})" if str(root) != target else "")]
    missing: list[str] = []
    try:
        info = inspect(model)
    except ModelLoadError as e:
        lines.append(f"  not loadable as it is: {e}")
        return "\n".join(lines)
    lines[0] += f", {info.shipped or info.variant}"
    for role in (*info.experts, "text_encoder", "vae"):
        try:
            lines.append(_weights_line(role, info.weights_of(role)))
        except ModelLoadError as e:
            missing.append(f"{role} ({e})")
    lines.append(f"  {'tokenizer':<14}{info.tokenizer}")
    lines.append("  missing: " + ("; ".join(missing) if missing else "nothing"))
    return "\n".join(lines)


MODEL_DIRS_ENV = "VIDGEN_MODELS"
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".pth")


def list_models(extra: list[str] | None = None) -> list[tuple[str, str, str]]:
    """(where, what, variant) of each Wan model in the Hugging Face cache and in the folders of
    $VIDGEN_MODELS (os.pathsep-separated) and `extra`: model folders, and single weights files (as in
    ComfyUI's models/ tree). Headers only; an unreadable entry is listed with its problem."""
    out = []
    for repo, snap in cached_repos():
        if (snap / "model_index.json").is_file() or _wan_folder(snap) is not None:
            out.append((repo, *_what_is(snap)))
    dirs = [d for d in os.environ.get(MODEL_DIRS_ENV, "").split(os.pathsep) if d] + list(extra or [])
    for d in dirs:
        base = Path(d).expanduser()
        if problem := path_problem(base, "folder"):
            out.append((str(base), problem.removeprefix("is "), ""))
            continue
        if _is_model(base.parent) and base.name in (*ROLES, "high_noise_model", "low_noise_model"):
            out.append((str(base), f"part of the model folder {base.parent}", ""))
            continue
        if _is_model(base):         # a model folder itself: its component folders are part of it
            out.append((str(base), *_what_is(base)))
            continue
        for entry in sorted(base.rglob("*")):
            if len(entry.relative_to(base).parts) > 3 or _inside_model(entry, base):
                continue
            if entry.is_dir() and _is_model(entry):
                out.append((str(entry), *_what_is(entry)))
            elif entry.suffix in WEIGHT_SUFFIXES and not entry.is_dir():
                problem = path_problem(entry, "file")       # a FIFO named .safetensors is never opened
                out.append((str(entry), *((problem.removeprefix("is "), "") if problem else _file_is(entry))))
    return out


def _is_model(folder: Path) -> bool:
    return (folder / "model_index.json").is_file() or _wan_folder(folder) is not None


def _inside_model(entry: Path, base: Path) -> bool:
    """Whether `entry` lies inside a model folder below `base` (a component folder or file of it)."""
    return any(_is_model(p) for p in entry.parents if p != base and base in p.parents)


def _what_is(folder: Path) -> tuple[str, str]:
    try:
        info = inspect(SimpleNamespace(path=str(folder), variant="auto", **{r: None for r in (*ROLES, "tokenizer")}))
        return info.layout, info.shipped or info.variant
    except ModelLoadError as e:
        return "unusable", _short(str(e))


def _short(message: str, most: int = 160) -> str:
    """`message` cut to about `most` characters at a clause or word boundary, never inside a word or
    a path, saying that `vidgen info` tells the rest."""
    if len(message) <= most:
        return message
    cut = message.rfind("; ", 0, most)
    cut = cut if cut > most // 2 else message.rfind(" ", 0, most)
    return message[:cut if cut > 0 else most].rstrip(" ;:,") + " ... (vidgen info PATH says all)"


def _transformer_is(w: Weights) -> tuple[str, str, str]:
    """(what a single transformer file is called, its family, what its shapes say)."""
    family, facts = transformer_family(w, 1)
    shipped = shipped_match(w, family, "") if family else ""
    return shipped_name(shipped) or family or "not a supported Wan transformer", family, facts


def _file_is(file: Path) -> tuple[str, str]:
    try:
        role, w = _guess_role(file)
    except ModelLoadError as e:
        return "unusable", _short(str(e))
    if role == "lora":
        return f"LoRA file ({w.storage()})", f"LoRA: {_lora_facts(w)}"
    if not role:
        return "not a Wan component file", f"{len(w.shapes)} tensors of no Wan transformer, VAE, text encoder or LoRA"
    if role == "transformer":
        variant = _transformer_is(w)[0]
    elif role == "vae":
        variant = "Wan2.2 VAE" if _vae_z_of(w.shapes) == 48 else "Wan2.1 VAE"
    elif role == "image_encoder":
        variant = "CLIP vision encoder (model.image_encoder)"
    else:
        variant = ("UMT5-XXL (Wan's text encoder)" if w.mismatch(_shipped_shapes(TEXT_ENCODER_FOLDER, "text_encoder")) is None
                   else "a T5 encoder of other widths")
    return f"{role.replace('_', ' ')} file ({w.storage()})", variant
