"""Local diffusers-format Wan pipeline folders: inspect (JSON and headers only), then load the weights.

`inspect_model` reads only JSON files and the headers of the safetensors files, so a config can be
checked against the model (variant, size multiples, image input, rotary table) and a damaged or
hostile folder refused — every problem at once — before any weights are read; the model it
describes (`ModelInfo`) keeps each component's validated config, so nothing later reads them
again. `load_components` then loads the models with diffusers' and transformers' own classes or
from their single files, from safetensors only, never downloading and never running code from the
folder, each where the render's Residency keeps it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import torch

from . import schemas
from .errors import DeviceUnavailable, ModelLoadError
from .families import FAMILIES, Family, by_config
from .folders import Scan, check_weights, refuse_custom_code, refuse_special_files
from .records import bool_field, describe, float_field, path_problem, safe_name
from .residency import EXPERTS
from .weights import (Weights, check_finite, clip_tower, expert_shell, load_weights, meta_image_encoder, meta_text_encoder,
                      meta_vae, open_weights)

log = logging.getLogger("vidgen")

# Class names we accept in model_index.json, by role (registered names, never imported by path).
TEXT_ENCODERS = ("UMT5EncoderModel", "T5EncoderModel")
SCHEDULERS = ("UniPCMultistepScheduler", "FlowMatchEulerDiscreteScheduler")
TRANSFORMERS = ("WanTransformer3DModel", "WanVACETransformer3DModel", "SkyReelsV2Transformer3DModel",
                "WanAnimateTransformer3DModel")
ROLES = {"transformer": ("diffusers", TRANSFORMERS), "transformer_2": ("diffusers", TRANSFORMERS),
         "vae": ("diffusers", ("AutoencoderKLWan",)), "text_encoder": ("transformers", TEXT_ENCODERS),
         "scheduler": ("diffusers", None), "tokenizer": ("transformers", None)}   # scheduler: its config names it
CONFIG_ROLES = ("transformer", "transformer_2", "text_encoder", "vae", "image_encoder", "scheduler", "model_index")
"""The roles whose JSON a ModelInfo keeps (`config(role)`)."""
DIFFUSERS_ROPE_MAX_SEQ_LEN = 1024   # WanTransformer3DModel's default for rope_max_seq_len
BUILDERS = {"transformer": expert_shell, "transformer_2": expert_shell, "vae": meta_vae}
"""Role -> its structure on the meta device from its config; the class whose from_pretrained reads a
diffusers component folder is the family's for an expert, AutoencoderKLWan for the VAE and the
folder's (TEXT_ENCODERS) for the text encoder (`_class_of`)."""


@dataclass
class ModelInfo:
    """What the folder's JSON files say about the model (no weights read), and its validated configs."""

    path: Path
    variant: str
    experts: list[str]                     # ["transformer"] or ["transformer", "transformer_2"]
    boundary_ratio: float | None           # two-expert switch, fraction of 1000 timesteps
    expand_timesteps: bool                 # per-token timesteps (TI2V-5B)
    z_dim: int
    patch_size: tuple[int, int, int]
    vae_scale_spatial: int
    vae_scale_temporal: int
    configs: Mapping[str, str] = field(default_factory=dict, repr=False)   # role -> its JSON text (CONFIG_ROLES): frozen
    rope_max_seq_len: int = DIFFUSERS_ROPE_MAX_SEQ_LEN   # rotary positions per axis (frames, height, width)
    text_encoder_class: str = "UMT5EncoderModel"
    weights: dict = field(default_factory=dict, repr=False)     # role -> weights.Weights (sources.resolve, or opened)
    tokenizer: Path | None = None           # the tokenizer folder (default: path/tokenizer)
    layout: str = "diffusers folder"        # what model.path is: diffusers folder, Wan checkpoint folder, single files
    shipped: str = ""                       # the published variant the shapes match (wan2.2-t2v-a14b, ...), if any
    image_pairs: bool = False               # Wan2.1 I2V whose image embedder takes two images (FLF2V: last_image)
    headers: dict = field(default_factory=dict, repr=False)     # safetensors file -> its checked header (inspect_model)

    def config(self, role: str) -> dict:
        """A fresh copy of `role`'s validated JSON (CONFIG_ROLES; {} for a role the model lacks), safe to
        change or hand to from_config."""
        if role not in CONFIG_ROLES:
            raise ValueError(f"no config for {role!r} (roles: {', '.join(CONFIG_ROLES)})")
        return json.loads(self.configs.get(role, "{}"))

    def weights_of(self, role: str) -> Weights:
        """The weights of `role` (opened from the folder, from the headers inspect_model read, when
        sources.resolve did not give them)."""
        if role not in self.weights:
            self.weights[role] = open_weights(role, self.path / role, self.headers)
        return self.weights[role]

    @property
    def scheduler_config(self) -> dict:
        """The scheduler's config (a copy; sampling's schedule="diffusers" steps exactly like it)."""
        return self.config("scheduler")

    @property
    def flow_shift(self) -> float:
        """The folder's flow shift (what `sampling.shift: null` means)."""
        sched = self.scheduler_config
        return float(sched.get("flow_shift", sched.get("shift", 1.0)))

    @property
    def num_train_timesteps(self) -> int:
        return int(self.scheduler_config.get("num_train_timesteps", 1000))

    @property
    def family(self) -> Family:
        """The registered variant's rules (vidgen.families)."""
        return FAMILIES[self.variant]

    @property
    def first_last(self) -> bool:
        """Whether it takes a last frame too: I2V-A14B (on channels), Wan2.1 FLF2V (two CLIP images)."""
        return self.family.takes_last_frame(self.image_pairs)

    @property
    def needs_image(self) -> bool:
        return self.family.needs_image

    @property
    def accepts_image(self) -> bool:
        return self.family.accepts_image

    @property
    def size_multiple(self) -> int:
        return self.vae_scale_spatial * self.patch_size[1]

    def latent_grid(self, width: int, height: int, num_frames: int) -> tuple[int, int, int]:
        """(frames, height, width) of the latents of a clip: the VAE keeps the first frame and
        compresses the rest `vae_scale_temporal`x in time, and `vae_scale_spatial`x in space."""
        return ((num_frames - 1) // self.vae_scale_temporal + 1, height // self.vae_scale_spatial,
                width // self.vae_scale_spatial)

    def latent_shape(self, width: int, height: int, num_frames: int) -> tuple[int, int, int, int, int]:
        """[1, z, frames, height, width] of one clip's latents (see latent_grid)."""
        return (1, self.z_dim, *self.latent_grid(width, height, num_frames))

    def limit_problems(self, width: int, height: int, num_frames: int) -> list[str]:
        """Problems when a clip's latent grid is longer, on some axis, than the transformer's rotary table.

        diffusers' WanRotaryPosEmbed builds `rope_max_seq_len` positions per axis and takes the first
        frames // p_t, height // p_h and width // p_w of them (latent grid over patch size); more than
        that fails deep inside the first denoising step. Each problem names the largest valid value.
        """
        r, (p_t, p_h, p_w), s = self.rope_max_seq_len, self.patch_size, self.vae_scale_spatial
        frames, h, w = self.latent_grid(width, height, num_frames)
        problems = []
        if frames // p_t > r:
            most = (r * p_t + p_t - 2) * self.vae_scale_temporal + 1     # latent frames r*p_t + p_t - 1
            problems.append(f"num_frames: {num_frames} is more than this model's rotary table allows "
                            f"(rope_max_seq_len {r} -> at most {most} frames)")
        if h // p_h > r or w // p_w > r:
            problems.append(f"size: {width}x{height} is more than this model's rotary table allows "
                            f"(rope_max_seq_len {r} -> at most {r * p_w * s}x{r * p_h * s})")
        return problems


@dataclass
class Components:
    """Loaded modules of one Wan pipeline."""

    info: ModelInfo
    tokenizer: Any
    text_encoder: torch.nn.Module
    vae: torch.nn.Module
    experts: list[torch.nn.Module]         # [high-noise (or only), low-noise]
    device: torch.device
    dtype: torch.dtype
    image_encoder: Any = None               # Wan2.1 I2V: (CLIP vision model, its image processor)


# --------------------------------------------------------------------------------------------
# Inspecting a folder


def _components(index: dict, problems: list[str]) -> dict[str, str]:
    """{role: class name} of the components model_index.json declares; entries of the wrong shape are
    problems, and map to None (declared, but unusable: not reported again as missing)."""
    if not isinstance(index.get("_class_name", ""), str):
        problems.append("model_index.json: _class_name is not a class name (a custom pipeline?), not a diffusers "
                        "pipeline such as \"WanPipeline\"")
    declared = {}
    for name, entry in index.items():
        if name.startswith("_") or (not isinstance(entry, list) and name not in ROLES):
            continue                    # pipeline settings (boundary_ratio, expand_timesteps, ...)
        library, classes = ROLES.get(name, ("diffusers", None))
        if (not isinstance(entry, list) or len(entry) != 2 or not all(v is None or isinstance(v, str) for v in entry)
                or (entry[0] is None) != (entry[1] is None)):
            example = f'["{library}", "{classes[0]}"]' if classes else "[library, class]"
            problems.append(f"model_index.json: {name} is {describe(entry)} (expected {example}, or [null, null] "
                            f"for none)")
            declared[name] = None
            continue
        if entry[1] is None:
            continue
        declared[name] = entry[1]
        if name in ROLES and entry[0] != library:
            problems.append(f"model_index.json: {name} comes from {safe_name(entry[0], 'another library')}, "
                            f"not {library}, which vidgen loads it with")
        elif classes is not None and entry[1] not in classes:
            problems.append(f"{name} class {safe_name(entry[1], '(a long name)')} is not supported "
                            f"(expected {' or '.join(classes)})")
    return declared


def _raise_invalid(root: Path, missing: list[str], problems: list[str]) -> None:
    if problems:
        items = ([f"missing {', '.join(missing)}"] if missing else []) + problems
        count = f" ({len(items)} problems)" if len(items) > 1 else ""
        raise ModelLoadError(f"model folder {root} is invalid{count}: {'; '.join(items)}")
    if missing:
        raise ModelLoadError(f"model folder {root} is incomplete; missing: {', '.join(missing)}")


def inspect_model(path: str | Path, *, given: frozenset[str] = frozenset(), tokenizer: Path | None = None,
                  json_only: bool = False, scans: dict[Path, Scan] | None = None) -> ModelInfo:
    """Read and check a diffusers-format Wan folder's JSON files and weight headers; list every problem at once.

    `given`: components whose weights come from elsewhere (sources.resolve checked them), so the folder
    may hold only their JSON; `tokenizer`: the tokenizer folder when it is not path/tokenizer;
    `json_only`: read the JSON files only, no weights and no tokenizer (`vidgen plan` of a shipped
    JSON folder, or of a folder whose weights are absent); `scans`: folder -> what sources.resolve
    read of it already (folders.Scan), not read again.
    Raises ModelLoadError: the folder is missing, incomplete, damaged, holds custom code, or is a
    layout vidgen does not support.
    """
    root = Path(path).expanduser()
    scans = scans or {}
    scan = scans.get(root) or Scan(root)
    _open_folder(root, scan, json_only)
    missing: list[str] = []
    problems: list[str] = []
    headers: dict[Path, dict] = {}
    index = scan.json(root / "model_index.json", "model_index.json", problems)
    if index is None:
        _raise_invalid(root, missing, problems)
    classes = _components(index, problems)
    experts = ["transformer"] + (["transformer_2"] if classes.get("transformer_2") else [])
    weightless = frozenset(ROLES) if json_only else given
    configs = _component_configs(scan, classes, experts, weightless, missing, problems, headers)
    tok = None if json_only else _check_tokenizer(scan, tokenizer, scans, missing, problems)
    sched = _scheduler_config(scan, missing, problems)
    if classes.get("image_encoder"):        # Wan2.1 I2V, Animate: a CLIP image encoder and its image processor
        _image_encoder_files(scan, json_only, "image_encoder" in given, missing, problems, configs, headers)
    values = _checked(index, configs, sched, experts, problems)
    text_cls = classes.get("text_encoder") or TEXT_ENCODERS[0]
    family = None
    if not problems and not missing:
        control = "vace_layers" in configs.get("transformer", {})
        forcing = "num_frame_per_block" in configs.get("transformer", {})
        animate = "motion_encoder_size" in configs.get("transformer", {})
        family = by_config(len(experts), values["in_channels"], values["z_dim"], values["expand"],
                           bool(classes.get("image_encoder")), control, forcing, animate)
        if family is None:
            problems.append(f"transformer in_channels {values['in_channels']} with a z{values['z_dim']} VAE"
                            f"{' and VACE context blocks' if control else ''} is not a Wan layout vidgen supports")
        problems += [f"model_index.json: {name} is {classes[name]}, but its config.json describes a "
                     f"{family.transformer_class}" for name in experts
                     if family and classes.get(name) and classes[name] != family.transformer_class]
    _raise_invalid(root, missing, problems)
    frozen = {"model_index": index, "scheduler": sched, **configs}
    return ModelInfo(
        path=root, variant=family.name, experts=experts, boundary_ratio=values["boundary"],
        expand_timesteps=values["expand"], z_dim=values["z_dim"], patch_size=values["patch"],
        vae_scale_spatial=values["scale_spatial"], vae_scale_temporal=values["scale_temporal"],
        configs=MappingProxyType({role: json.dumps(conf) for role, conf in frozen.items()}),
        rope_max_seq_len=values["rope"], text_encoder_class=text_cls, tokenizer=tok, headers=headers,
        image_pairs=family.last_frame == "image_pairs" and bool(configs.get("transformer", {}).get("pos_embed_seq_len")),
    )


def _open_folder(root: Path, scan: Scan, json_only: bool) -> None:
    """A pipeline folder vidgen may read: a folder, with model_index.json, and (but for its JSON alone)
    neither code nor entries that are not files."""
    if problem := path_problem(root, "folder"):
        raise ModelLoadError(f"model folder {str(root)!r} {problem}; set model.path to a local "
                             f"diffusers-format Wan pipeline folder (nothing is downloaded)")
    if not (root / "model_index.json").is_file():
        raise ModelLoadError(f"{root} is not a diffusers pipeline folder: missing {root / 'model_index.json'}")
    if not json_only:
        refuse_custom_code(scan)
        refuse_special_files(scan)


def _component_configs(scan: Scan, classes: dict, experts: list[str], weightless: frozenset[str],
                       missing: list[str], problems: list[str], headers: dict[Path, dict]) -> dict[str, dict]:
    """{role: config.json object} of the experts, the VAE and the text encoder; the weights of those not
    `weightless` checked from their headers."""
    root, configs = scan.root, {}
    for name in experts + ["vae", "text_encoder"]:
        if not classes.get(name):
            if name not in classes:
                missing.append(f"{name} (not declared in model_index.json)")
            continue
        if not (root / name / "config.json").is_file():
            missing.append(str(root / name / "config.json"))
        elif (conf := scan.json(root / name / "config.json", f"{name}/config.json", problems)) is not None:
            configs[name] = conf
        if name not in weightless:
            check_weights(scan, root / name, name, missing, problems, headers)
    return configs


def _check_tokenizer(folder: Scan, tokenizer: Path | None, scans: dict[Path, Scan], missing: list[str],
                     problems: list[str]) -> Path:
    """The tokenizer folder (`tokenizer`, else root/tokenizer), checked: no code, files only, a vocabulary."""
    root = folder.root
    tok = tokenizer or root / "tokenizer"
    scan = scans.get(tok) or (folder if root in tok.parents else Scan(tok))
    if tokenizer is not None and root not in tok.parents and tok.is_dir():
        if code := scan.custom_code():
            problems.append(f"tokenizer folder {tok} holds custom code ({'; '.join(code[:3])}); vidgen never runs "
                            "code from a model folder: use a tokenizer folder without it")
        refuse_special_files(scan, "tokenizer folder")
    if not tok.is_dir():
        missing.append(str(tok))
    elif not any((tok / f).is_file() for f in ("tokenizer.json", "spiece.model")):
        missing.append(f"{tok}/tokenizer.json or spiece.model")
    elif (tok / "tokenizer_config.json").exists():
        scan.json(tok / "tokenizer_config.json", "tokenizer/tokenizer_config.json", problems)
    return tok


def _scheduler_config(scan: Scan, missing: list[str], problems: list[str]) -> dict:
    file = scan.root / "scheduler" / "scheduler_config.json"
    if not file.is_file():
        missing.append(str(file))
        return {}
    return scan.json(file, "scheduler/scheduler_config.json", problems) or {}


def _image_encoder_files(scan: Scan, json_only: bool, given: bool, missing: list[str], problems: list[str],
                         configs: dict, headers: dict[Path, dict]) -> None:
    """The CLIP image encoder (its config, and but for the JSON alone its image processor and, unless
    model.image_encoder `given` them, its weights)."""
    root = scan.root
    if not json_only and not given:
        check_weights(scan, root / "image_encoder", "image_encoder", missing, problems, headers)
    for f in ("image_encoder/config.json",) + (() if json_only else ("image_processor/preprocessor_config.json",)):
        if not (root / f).is_file():
            missing.append(str(root / f))
    if (root / "image_encoder/config.json").is_file() and (conf := scan.json(
            root / "image_encoder/config.json", "image_encoder/config.json", problems)) is not None:
        configs["image_encoder"] = conf


def _checked(index: dict, configs: dict, sched: dict, experts: list[str], problems: list[str]) -> dict[str, Any]:
    """The values the model is described by, each in range (vidgen.schemas; absent ones at their
    defaults): a bad value is reported and replaced by its default, so every problem shows at once."""
    where = "model_index.json"
    boundary = float_field(index, "boundary_ratio", None, where, problems, above=0.0, below=1.0)
    expand = bool_field(index, "expand_timesteps", False, where, problems)
    if len(experts) == 2 and index.get("boundary_ratio") is None:
        problems.append("model_index.json declares two transformers but no boundary_ratio")
    checked = schemas.check({"transformer": {}, "vae": {}, **configs, "scheduler": sched}, problems)
    t = checked["transformer"]
    if "transformer_2" in checked:
        other = checked["transformer_2"]
        for key in ("in_channels", "patch_size", "rope_max_seq_len"):
            if other[key] != t[key]:
                problems.append(f"transformer_2/config.json: {key} {other[key]} differs from transformer's {t[key]}; "
                                f"both experts must share one layout")
    sched_cls = sched.get("_class_name", "")
    if sched and sched_cls not in SCHEDULERS:
        problems.append(f"scheduler class {safe_name(sched_cls, '(a long name)')} is not supported "
                        f"(expected {' or '.join(SCHEDULERS)})")
    vae = checked["vae"]
    return {"boundary": boundary, "expand": expand, "in_channels": t["in_channels"], "patch": t["patch_size"],
            "rope": t["rope_max_seq_len"], "z_dim": vae["z_dim"], "scale_spatial": vae["scale_factor_spatial"],
            "scale_temporal": vae["scale_factor_temporal"]}


# --------------------------------------------------------------------------------------------
# Loading

def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable("model.device=cuda but no CUDA device is available; use model.device=auto or cpu")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise DeviceUnavailable("model.device=mps but MPS is not available; use model.device=auto or cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return getattr(torch, name)


def _load(what: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelLoadError(f"cannot load {what}: {first}") from e


# Every from_pretrained gets these. trust_remote_code=False: transformers then refuses (ValueError)
# a folder whose auto_map names code instead of asking "run the custom code? [y/N]" on stdin.
# diffusers' concrete model classes have no remote-code path and ignore the flag; it is passed
# anyway so that switching to an Auto class cannot silently start trusting a folder.
_LOCAL_ONLY = {"use_safetensors": True, "local_files_only": True, "trust_remote_code": False}


def library(name: str):
    """A model library's class by its registered name (model_index.json's, or ours), imported when it is
    first needed: diffusers and transformers take seconds to import, and a queue worker starts, and
    reports a broken install per job, without them."""
    if name in (*TRANSFORMERS, "AutoencoderKLWan", "GGUFQuantizationConfig"):
        import diffusers

        return getattr(diffusers, name)
    import transformers

    return getattr(transformers, name)


def load_vae(info: ModelInfo, device: torch.device, dtype: torch.dtype):
    vae = _load(f"{info.path}/vae", library("AutoencoderKLWan").from_pretrained, info.path / "vae", dtype=dtype, **_LOCAL_ONLY)
    check_finite(vae, info.weights_of("vae"), info.path / "vae")
    return vae.to(device).eval().requires_grad_(False)


def load_components(info: ModelInfo, residency, dtype: torch.dtype, vae_dtype: torch.dtype, *,
                    cast_late: bool = False) -> Components:
    """Load tokenizer, text encoder, VAE and the expert(s), each where `residency` (a
    residency.Residency) keeps it once loaded (safetensors only).

    Each role is built as its library builds it or as a shell filled from its files, and read to its
    load home; a role the residency keeps in its files stays a shell (read when it runs). fp8
    storage is applied as an expert's weights are read (no model.dtype copy on the device or in
    host memory), or with `cast_late` (LoRAs to apply in model.dtype first) by residency.apply, the
    experts waiting in host memory until then; a text encoder that encodes on the device is cast
    in host memory, before it moves there.
    """
    tok = info.tokenizer or info.path / "tokenizer"
    tokenizer = _load(str(tok), library("AutoTokenizer").from_pretrained, tok, local_files_only=True, trust_remote_code=False)
    models = {role: _load_role(info, residency, role, vae_dtype if role == "vae" else dtype, cast_late)
              for role in ("text_encoder", *info.experts, "vae")}
    text_encoder = residency.store("text_encoder", models["text_encoder"], dtype)
    if not residency.in_files("text_encoder"):
        text_encoder = text_encoder.to(residency.home("text_encoder", "load"))
    return Components(info=info, tokenizer=tokenizer, text_encoder=text_encoder.eval().requires_grad_(False),
                      vae=models["vae"], experts=[models[n] for n in info.experts], device=residency.device,
                      dtype=dtype, image_encoder=_image_encoder(info, dtype) if info.family.image_encoder else None)


def _load_role(info: ModelInfo, residency, role: str, dtype: torch.dtype, cast_late: bool) -> torch.nn.Module:
    """`role`'s model, read to its load home (a text encoder: to host memory, moved by load_components).
    An expert in float8 is cast as it is read, unless `cast_late` (it waits in host memory instead)."""
    w = info.weights_of(role)
    shell, name = BUILDERS.get(role, meta_text_encoder), _class_of(info, role)
    if residency.in_files(role):        # a shell: read from its files when it runs (residency)
        _refuse_in_files(info, role, w)
        return shell(info.config(role), dtype)
    expert = role in EXPERTS
    if expert:
        log.info("loading %s from %s", role, w.describe())
    elif role == "text_encoder" and not _folder(w):
        log.info("loading the text encoder from %s", w.describe())
    home = torch.device("cpu") if role == "text_encoder" else residency.home(role, "load")
    if w.kind == "gguf":
        return _gguf_expert(info, role, w, dtype).to(home)
    cast_now = expert and residency.fp8 and not cast_late
    to = torch.device("cpu") if expert and residency.fp8 and cast_late else home
    if _folder(w) and not cast_now:
        model = _load(str(w.source), library(name).from_pretrained, w.source, dtype=dtype, **_LOCAL_ONLY)
        check_finite(model, w, w.source)
        return model.to(to).eval().requires_grad_(False)
    # Stored in float8 from the start: the shell is cast on the meta device, then each tensor is read
    # from its file straight to where the expert waits, in its storage dtype.
    model = residency.store(role, shell(info.config(role), dtype), dtype) if cast_now else shell(info.config(role), dtype)
    return load_weights(model, w, to)


def _class_of(info: ModelInfo, role: str) -> str:
    """The class whose from_pretrained reads `role`'s diffusers folder (by its registered name)."""
    if role in EXPERTS:
        return info.family.transformer_class
    return "AutoencoderKLWan" if role == "vae" else info.text_encoder_class


def _refuse_in_files(info: ModelInfo, role: str, w: Weights) -> None:
    """A role the residency keeps in its files must be readable back from them for each turn."""
    if role in EXPERTS and w.kind == "gguf":
        raise ModelLoadError(f"{w.describe()}: a GGUF expert cannot be read back from its file between its "
                             "turns; raise memory.host_budget so both experts fit in host memory")
    if role == "text_encoder" and (info.text_encoder_class != "UMT5EncoderModel" or w.kind == "gguf"):
        raise ModelLoadError(f"{w.describe()}: this text encoder cannot be read back from its files for each "
                             "encode; raise memory.host_budget so it can stay in host memory")


def _image_encoder(info: ModelInfo, dtype: torch.dtype) -> tuple:
    """The CLIP image encoder (Wan2.1 I2V, Animate) and its image processor; in host memory until it
    encodes (once per render, before sampling). The folder's own, or model.image_encoder's file built
    from the JSON root's image_encoder/config.json and read as every other file is (finite checked)."""
    root, w = info.path, info.weights.get("image_encoder")
    processor = _load(str(root / "image_processor"), library("CLIPImageProcessor").from_pretrained,
                      root / "image_processor", local_files_only=True)
    if w is None:
        model = _load(str(root / "image_encoder"), library("CLIPVisionModel").from_pretrained, root / "image_encoder",
                      dtype=dtype, **_LOCAL_ONLY).eval().requires_grad_(False)
        check_finite(model, None, root / "image_encoder")
        return model, processor
    log.info("loading the image encoder from %s", w.describe())
    if w.unused:
        log.info("image encoder: %s left unread (not the vision tower's: Wan takes CLIP's hidden states)",
                 ", ".join(w.unused))
    model = meta_image_encoder(info.config("image_encoder"), dtype)
    load_weights(clip_tower(model), w, "cpu")
    return model, processor


def _folder(w: Weights) -> bool:
    """Weights in a diffusers component folder (loaded with the libraries' from_pretrained)."""
    return w.source.is_dir() and w.layout == "diffusers" and w.kind == "safetensors" and not w.quant


def _gguf_expert(info: ModelInfo, name: str, w: Weights, dtype: torch.dtype) -> torch.nn.Module:
    """A GGUF expert through diffusers' GGUF quantizer: the weights stay quantised and each layer is
    dequantised in PyTorch as it runs (never the Hub-downloaded CUDA kernels: the CLI sets
    DIFFUSERS_GGUF_CUDA_KERNELS=false)."""
    model = _load(str(w.source), library(info.family.transformer_class).from_single_file, str(w.files[0]), config=str(info.path),
                  subfolder=name, quantization_config=library("GGUFQuantizationConfig")(compute_dtype=dtype), torch_dtype=dtype,
                  local_files_only=True)
    return model.eval().requires_grad_(False)
