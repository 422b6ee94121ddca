"""Local diffusers-format Wan pipeline folders: inspect (JSON and headers only), then load the weights.

`inspect_model` reads only JSON files and the headers of the safetensors files, so a config can be
checked against the model (variant, size multiples, image input, rotary table) and a damaged or
hostile folder refused — every problem at once — before any weights are read. `load_components`
then loads the models with diffusers' and transformers' own classes, from safetensors only, never
downloading and never running code from the folder.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import schemas
from .folders import _refuse_custom_code, _refuse_special_files, _shown, custom_code
from .families import FAMILIES, Family
from .weights import check_finite, checked_header, integer_problem, integer_tensors
from .errors import DeviceUnavailable, ModelLoadError
from .records import bool_field, check_safetensors, describe, float_field, path_problem, read_json_object, safe_name

log = logging.getLogger("vidgen")

# Class names we accept in model_index.json, by role (registered names, never imported by path).
TEXT_ENCODERS = ("UMT5EncoderModel", "T5EncoderModel")
SCHEDULERS = ("UniPCMultistepScheduler", "FlowMatchEulerDiscreteScheduler")
ROLES = {"transformer": ("diffusers", ("WanTransformer3DModel",)), "transformer_2": ("diffusers", ("WanTransformer3DModel",)),
         "vae": ("diffusers", ("AutoencoderKLWan",)), "text_encoder": ("transformers", TEXT_ENCODERS),
         "scheduler": ("diffusers", None), "tokenizer": ("transformers", None)}   # scheduler: its config names it
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
DIFFUSERS_ROPE_MAX_SEQ_LEN = 1024   # WanTransformer3DModel's default for rope_max_seq_len
TEXT_FP8_SKIP = ("norm", r"DenseReluDense\.wo$")
"""Text-encoder layers fp8 storage leaves in model.dtype: norms, and T5's feed-forward output, whose
forward casts its input to the weight's dtype (float8 activations)."""


@dataclass
class ModelInfo:
    """What the folder's JSON files say about the model (no weights read)."""

    path: Path
    variant: str
    experts: list[str]                     # ["transformer"] or ["transformer", "transformer_2"]
    boundary_ratio: float | None           # two-expert switch, fraction of 1000 timesteps
    expand_timesteps: bool                 # per-token timesteps (TI2V-5B)
    z_dim: int
    patch_size: tuple[int, int, int]
    vae_scale_spatial: int
    vae_scale_temporal: int
    scheduler_config: dict[str, Any] = field(repr=False)
    rope_max_seq_len: int = DIFFUSERS_ROPE_MAX_SEQ_LEN   # rotary positions per axis (frames, height, width)
    text_encoder_class: str = "UMT5EncoderModel"
    weights: dict = field(default_factory=dict, repr=False)     # role -> weights.Weights (sources.resolve)
    tokenizer: Path | None = None           # the tokenizer folder (default: path/tokenizer)
    layout: str = "diffusers folder"        # what model.path is: diffusers folder, Wan checkpoint folder, single files
    shipped: str = ""                       # the published variant the shapes match (wan2.2-t2v-a14b, ...), if any
    image_pairs: bool = False               # Wan2.1 I2V whose image embedder takes two images (FLF2V: last_image)

    def weights_of(self, role: str):
        """The weights of `role` (opened from the folder when sources.resolve did not)."""
        if role not in self.weights:
            from .weights import open_weights

            self.weights[role] = open_weights(role, self.path / role)
        return self.weights[role]

    @property
    def flow_shift(self) -> float:
        """The folder's flow shift (what `sampling.shift: null` means)."""
        return float(self.scheduler_config.get("flow_shift", self.scheduler_config.get("shift", 1.0)))

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
        return self.variant == "wan2.2-i2v-a14b" or self.image_pairs

    @property
    def needs_image(self) -> bool:
        return self.family.image == "required"

    @property
    def accepts_image(self) -> bool:
        return self.family.image != "none"

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
    offload_experts: bool = False
    expert_files: list[Path] | None = None  # the idle expert in its files (swap or stream): each expert's weights
    image_encoder: Any = None               # Wan2.1 I2V: (CLIP vision model, its image processor)
    text_file: Any = None                   # the text encoder waits in its files between encodes: its weights


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


def _check_weights(folder: Path, name: str, missing: list[str], problems: list[str]) -> None:
    """Safetensors weights in `folder`: each file's header, and any shard index and the files it names."""
    if not folder.is_dir():
        return                          # reported as a missing config.json
    files = sorted(p.name for p in folder.iterdir())
    weights = [n for n in files if n.endswith(".safetensors")]
    indexes = [n for n in files if n.endswith(".safetensors.index.json")]
    if not weights and not indexes:
        pickles = [n for n in files if n.endswith(PICKLE_SUFFIXES)]
        if pickles:
            problems.append(f"{folder} has only pickle weights ({', '.join(_shown(n) for n in pickles)}); vidgen "
                            f"loads safetensors only — convert them (e.g. save_pretrained(safe_serialization=True))")
        else:
            missing.append(f"{folder}/*.safetensors (no weights)")
        return
    for n in weights:
        if problem := check_safetensors(folder / n):
            problems.append(f"{name}/{_shown(n)} {problem}; replace it with the original file")
        elif found := integer_tensors(checked_header(folder / n)):
            problems.append(integer_problem(f"{name}/{_shown(n)}", found))
    for n in indexes:
        _check_shard_index(folder, f"{name}/{_shown(n)}", n, set(weights), problems)


def _check_shard_index(folder: Path, what: str, file: str, present: set[str], problems: list[str]) -> None:
    """A sharded checkpoint's index: an object whose weight_map maps tensor names to shard files here."""
    index = read_json_object(folder / file, what, problems)
    if index is None:
        return
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        problems.append(f"{what}: weight_map is {describe(weight_map)} (expected an object mapping tensor names "
                        f"to shard files)")
        return
    shards = set(weight_map.values())
    # A shard is a file beside the index: diffusers and transformers join the name to the folder,
    # so "../x" would read outside the model.
    outside = sorted(n for n in shards if Path(n).name != n or n in ("", ".", ".."))
    absent = sorted(n for n in shards - set(outside) if n not in present)
    if outside:
        problems.append(f"{what}: weight_map names {len(outside)} file(s) outside the folder "
                        f"({', '.join(_shown(n) for n in outside[:3])}); shards must sit beside the index")
    if absent:
        problems.append(f"{what}: weight_map names {len(absent)} safetensors file(s) that are not in the folder "
                        f"({', '.join(_shown(n) for n in absent[:3])}{', ...' if len(absent) > 3 else ''}); "
                        f"download the missing shards")


def _raise_invalid(root: Path, missing: list[str], problems: list[str]) -> None:
    if problems:
        items = ([f"missing {', '.join(missing)}"] if missing else []) + problems
        count = f" ({len(items)} problems)" if len(items) > 1 else ""
        raise ModelLoadError(f"model folder {root} is invalid{count}: {'; '.join(items)}")
    if missing:
        raise ModelLoadError(f"model folder {root} is incomplete; missing: {', '.join(missing)}")


def inspect_model(path: str | Path, *, given: frozenset[str] = frozenset(), tokenizer: Path | None = None) -> ModelInfo:
    """Read and check a diffusers-format Wan folder's JSON files and weight headers; list every problem at once.

    `given`: components whose weights come from elsewhere (sources.resolve checked them), so the folder
    may hold only their JSON; `tokenizer`: the tokenizer folder when it is not path/tokenizer.
    Raises ModelLoadError: the folder is missing, incomplete, damaged, holds custom code, or is a
    layout vidgen does not support.
    """
    root = Path(path).expanduser()
    if problem := path_problem(root, "folder"):
        raise ModelLoadError(f"model folder {str(root)!r} {problem}; set model.path to a local "
                             f"diffusers-format Wan pipeline folder (nothing is downloaded)")
    if not (root / "model_index.json").is_file():
        raise ModelLoadError(f"{root} is not a diffusers pipeline folder: missing {root / 'model_index.json'}")
    _refuse_custom_code(root)
    _refuse_special_files(root)
    missing: list[str] = []
    problems: list[str] = []
    index = read_json_object(root / "model_index.json", "model_index.json", problems)
    if index is None:
        _raise_invalid(root, missing, problems)
    classes = _components(index, problems)
    experts = ["transformer"] + (["transformer_2"] if classes.get("transformer_2") else [])
    configs: dict[str, dict] = {}
    for name in experts + ["vae", "text_encoder"]:
        if not classes.get(name):
            if name not in classes:
                missing.append(f"{name} (not declared in model_index.json)")
            continue
        if not (root / name / "config.json").is_file():
            missing.append(str(root / name / "config.json"))
        elif (conf := read_json_object(root / name / "config.json", f"{name}/config.json", problems)) is not None:
            configs[name] = conf
        if name not in given:
            _check_weights(root / name, name, missing, problems)
    tok = tokenizer or root / "tokenizer"
    if tokenizer is not None and root not in tok.parents and tok.is_dir():
        if code := custom_code(tok):
            problems.append(f"tokenizer folder {tok} holds custom code ({'; '.join(code[:3])}); vidgen never runs "
                            "code from a model folder: use a tokenizer folder without it")
        _refuse_special_files(tok, "tokenizer folder")
    if not tok.is_dir():
        missing.append(str(tok))
    elif not any((tok / f).is_file() for f in ("tokenizer.json", "spiece.model")):
        missing.append(f"{tok}/tokenizer.json or spiece.model")
    elif (tok / "tokenizer_config.json").exists():
        read_json_object(tok / "tokenizer_config.json", "tokenizer/tokenizer_config.json", problems)
    sched: dict = {}
    if not (root / "scheduler" / "scheduler_config.json").is_file():
        missing.append(str(root / "scheduler" / "scheduler_config.json"))
    else:
        sched = read_json_object(root / "scheduler" / "scheduler_config.json", "scheduler/scheduler_config.json",
                                 problems) or {}
    if classes.get("image_encoder"):        # Wan2.1 I2V: a CLIP image encoder and its image processor
        _check_weights(root / "image_encoder", "image_encoder", missing, problems)
        for f in ("image_encoder/config.json", "image_processor/preprocessor_config.json"):
            if not (root / f).is_file():
                missing.append(str(root / f))
        if (root / "image_encoder/config.json").is_file() and (conf := read_json_object(
                root / "image_encoder/config.json", "image_encoder/config.json", problems)) is not None:
            configs["image_encoder"] = conf

    # Field checks: a bad value is reported and replaced by its default, so every problem shows at once.
    where = "model_index.json"
    boundary = float_field(index, "boundary_ratio", None, where, problems, above=0.0, below=1.0)
    expand = bool_field(index, "expand_timesteps", False, where, problems)
    if len(experts) == 2 and index.get("boundary_ratio") is None:
        problems.append("model_index.json declares two transformers but no boundary_ratio")
    # Every count and size of every component in range (vidgen.schemas), absent ones at their defaults.
    checked = schemas.check({"transformer": {}, "vae": {}, **configs, "scheduler": sched}, problems)
    t_conf, t = configs.get("transformer", {}), checked["transformer"]
    in_channels, patch, rope = t["in_channels"], t["patch_size"], t["rope_max_seq_len"]
    if "transformer_2" in checked:
        other = checked["transformer_2"]
        for key in ("in_channels", "patch_size", "rope_max_seq_len"):
            if other[key] != t[key]:
                problems.append(f"transformer_2/config.json: {key} {other[key]} differs from transformer's {t[key]}; "
                                f"both experts must share one layout")
    z_dim = checked["vae"]["z_dim"]
    scale_spatial, scale_temporal = checked["vae"]["scale_factor_spatial"], checked["vae"]["scale_factor_temporal"]
    sched_cls = sched.get("_class_name", "")
    if sched and sched_cls not in SCHEDULERS:
        problems.append(f"scheduler class {safe_name(sched_cls, '(a long name)')} is not supported "
                        f"(expected {' or '.join(SCHEDULERS)})")
    text_cls = classes.get("text_encoder") or TEXT_ENCODERS[0]
    variant = ""
    if not problems and not missing:
        if len(experts) == 2:
            variant = "wan2.2-i2v-a14b" if in_channels == 2 * z_dim + 4 else "wan2.2-t2v-a14b"
        elif expand or z_dim == 48:
            variant = "wan2.2-ti2v-5b"
        elif classes.get("image_encoder") and in_channels == 2 * z_dim + 4:
            variant = "wan2.1-i2v"
        elif in_channels != z_dim:
            problems.append(f"transformer in_channels {in_channels} with a z{z_dim} VAE is not a Wan layout vidgen "
                            f"supports")
        else:
            variant = "wan2.1-t2v"
    _raise_invalid(root, missing, problems)
    return ModelInfo(
        path=root, variant=variant, experts=experts, boundary_ratio=boundary, expand_timesteps=expand,
        z_dim=z_dim, patch_size=patch, vae_scale_spatial=scale_spatial,
        vae_scale_temporal=scale_temporal, scheduler_config=sched,
        rope_max_seq_len=rope, text_encoder_class=text_cls, tokenizer=tok,
        image_pairs=variant == "wan2.1-i2v" and bool(t_conf.get("pos_embed_seq_len")),
    )


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


def load_vae(info: ModelInfo, device: torch.device, dtype: torch.dtype):
    from diffusers import AutoencoderKLWan

    vae = _load(f"{info.path}/vae", AutoencoderKLWan.from_pretrained, info.path / "vae", dtype=dtype, **_LOCAL_ONLY)
    check_finite(vae, info.weights_of("vae"), info.path / "vae")
    return vae.to(device).eval().requires_grad_(False)


def load_components(info: ModelInfo, device: torch.device, dtype: torch.dtype, vae_dtype: torch.dtype,
                    offload_experts: bool = False, memory=None, cast_late: bool = False) -> Components:
    """Load tokenizer, text encoder, VAE and the expert(s) onto `device` (safetensors only).

    With `offload_experts`, only the first (high-noise) expert goes to the device; the other waits
    in CPU memory until the denoiser swaps them. `memory` (a memory.MemoryPlan): with
    stream_blocks the experts stay in CPU memory (apply_memory_plan streams their blocks), and a
    text encoder planned for the CPU stays there. fp8 storage is applied as the weights are read
    (no model.dtype copy on the device or in host memory), or with `cast_late` (LoRAs to apply in
    model.dtype first) by apply_memory_plan, the experts waiting in host memory until then.
    """
    from diffusers import WanTransformer3DModel
    from transformers import AutoTokenizer, T5EncoderModel, UMT5EncoderModel

    from .weights import expert_shell, load_weights, meta_text_encoder, meta_vae

    root = info.path
    tok = info.tokenizer or root / "tokenizer"
    tokenizer = _load(str(tok), AutoTokenizer.from_pretrained, tok, local_files_only=True, trust_remote_code=False)
    te = info.weights_of("text_encoder")
    text_file = memory is not None and memory.idle_text == "file"
    if text_file:       # a shell: read from its files for each encode and dropped after (vidgen.prompt.encoder_ready)
        if info.text_encoder_class != "UMT5EncoderModel" or te.kind == "gguf":
            raise ModelLoadError(f"{te.describe()}: this text encoder cannot be read back from its files for each "
                                 "encode; raise memory.host_budget so it can stay in host memory")
        text_encoder = meta_text_encoder(_config(root, "text_encoder"), dtype)
    elif _folder(te):
        text_cls = {"UMT5EncoderModel": UMT5EncoderModel, "T5EncoderModel": T5EncoderModel}[info.text_encoder_class]
        text_encoder = _load(str(te.source), text_cls.from_pretrained, te.source, dtype=dtype, **_LOCAL_ONLY)
        check_finite(text_encoder, te, te.source)
    else:
        log.info("loading the text encoder from %s", te.describe())
        text_encoder = load_weights(meta_text_encoder(_config(root, "text_encoder"), dtype), te, "cpu")
    streamed = memory is not None and memory.placement == "stream_blocks"
    fp8 = memory is not None and memory.weights == "fp8"
    experts = []
    for k, name in enumerate(info.experts):
        home = torch.device(device if (k == 0 or not offload_experts) and not streamed else "cpu")
        w = info.weights_of(name)
        if memory is not None and memory.idle_expert == "file":
            if w.kind == "gguf":
                raise ModelLoadError(f"{w.describe()}: a GGUF expert cannot be read back from its file between its "
                                     "turns; raise memory.host_budget so both experts fit in host memory")
            experts.append(expert_shell(_config(root, name), dtype))      # read from its files when it runs
            continue
        log.info("loading %s from %s", name, w.describe())
        if w.kind == "gguf":
            experts.append(_gguf_expert(info, name, w, dtype).to(home))
        elif fp8 and not cast_late:
            # Stored in float8 from the start: the shell is cast on the meta device, then each tensor
            # is read from its file straight to where the expert waits, in its storage dtype.
            model = expert_shell(_config(root, name), dtype)
            model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=dtype)
            experts.append(load_weights(model, w, home))
        elif _folder(w):
            model = _load(str(w.source), WanTransformer3DModel.from_pretrained, w.source, dtype=dtype, **_LOCAL_ONLY)
            check_finite(model, w, w.source)
            # fp8 with LoRAs: the LoRAs go on in model.dtype first, on the host (memory-mapped until
            # written), and apply_memory_plan casts before the expert reaches the device.
            experts.append(model.to("cpu" if fp8 else home).eval().requires_grad_(False))
        else:
            experts.append(load_weights(expert_shell(_config(root, name), dtype), w, "cpu" if fp8 else home))
    vae_home = torch.device("cpu") if vae_parked(memory, device) else device
    vw = info.weights_of("vae")
    vae = load_vae(info, vae_home, vae_dtype) if _folder(vw) else load_weights(meta_vae(_config(root, "vae"), vae_dtype),
                                                                              vw, vae_home)
    te_device = "cpu" if memory is not None and memory.text_encoder == "cpu" else device
    if fp8 and te_device != "cpu":          # cast in host memory: the bf16 encoder never reaches the device
        from diffusers.hooks import apply_layerwise_casting

        apply_layerwise_casting(text_encoder, storage_dtype=torch.float8_e4m3fn, compute_dtype=dtype,
                                skip_modules_pattern=TEXT_FP8_SKIP)
    text_encoder = (text_encoder if text_file else text_encoder.to(te_device)).eval().requires_grad_(False)
    clip = None
    if info.variant == "wan2.1-i2v":        # CLIP: it runs once per render, before sampling
        from transformers import CLIPImageProcessor, CLIPVisionModel

        clip = (_load(str(root / "image_encoder"), CLIPVisionModel.from_pretrained, root / "image_encoder", dtype=dtype,
                      **_LOCAL_ONLY).eval().requires_grad_(False),        # host memory until it encodes
                _load(str(root / "image_processor"), CLIPImageProcessor.from_pretrained, root / "image_processor",
                      local_files_only=True))
        check_finite(clip[0], None, root / "image_encoder")
    return Components(info=info, tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, experts=experts,
                      device=device, dtype=dtype, offload_experts=offload_experts, image_encoder=clip,
                      expert_files=[info.weights_of(n) for n in info.experts]
                      if memory is not None and memory.idle_expert == "file" else None, text_file=te if text_file else None)


def _folder(w) -> bool:
    """Weights in a diffusers component folder (loaded with the libraries' from_pretrained)."""
    return w.source.is_dir() and w.layout == "diffusers" and w.kind == "safetensors" and not w.quant


def _config(root: Path, role: str) -> dict:
    problems: list[str] = []
    conf = read_json_object(root / role / "config.json", f"{role}/config.json", problems)
    if conf is None:
        raise ModelLoadError(f"{root / role / 'config.json'}: {problems[0]}")
    return conf


def _gguf_expert(info: ModelInfo, name: str, w, dtype: torch.dtype) -> torch.nn.Module:
    """A GGUF expert through diffusers' GGUF quantizer: the weights stay quantised and each layer is
    dequantised in PyTorch as it runs (never the Hub-downloaded CUDA kernels: the CLI sets
    DIFFUSERS_GGUF_CUDA_KERNELS=false)."""
    from diffusers import GGUFQuantizationConfig, WanTransformer3DModel

    model = _load(str(w.source), WanTransformer3DModel.from_single_file, str(w.files[0]), config=str(info.path),
                  subfolder=name, quantization_config=GGUFQuantizationConfig(compute_dtype=dtype), torch_dtype=dtype,
                  local_files_only=True)
    return model.eval().requires_grad_(False)


def vae_parked(memory, device: torch.device) -> bool:
    """Outside residency the VAE waits in host memory until it encodes an image or decodes."""
    return memory is not None and memory.placement != "resident" and device.type != "cpu"


@contextlib.contextmanager
def on_device(module: torch.nn.Module, device: torch.device, move: bool):
    """With `move`, `module` on `device` for the block and back in host memory after."""
    if not move:
        yield
        return
    module.to(device)
    try:
        yield
    finally:
        module.to("cpu")
        if device.type == "cuda":
            torch.cuda.empty_cache()


def apply_memory_plan(components: Components, memory) -> None:
    """The memory plan's storage dtype and streaming on the loaded experts (and fp8 on a text encoder
    that encodes on the device), after any LoRA is applied: layerwise casting and group offload
    wrap the weights as they are. diffusers' hooks: `enable_layerwise_casting` stores each linear
    and conv in float8_e4m3fn and casts it to the compute dtype for its forward (norms, embeddings
    and the patch embedding stay); `enable_group_offload` (block level, one block a group, on a CUDA
    stream) moves each block onto the device just before it runs and back after."""
    if memory is None:
        return
    device, dtype = components.device, components.dtype
    if memory.weights == "fp8":
        streamed = memory.placement == "stream_blocks"
        for k, model in enumerate(components.experts):
            if getattr(model, "is_quantized", False):
                log.info("a GGUF expert keeps its own quantised storage (fp8 storage applies to the rest)")
                continue
            if any(p.dtype == torch.float8_e4m3fn for p in model.parameters()):
                continue                    # cast as it was read (load_components)
            model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=dtype)
            if (k == 0 or not components.offload_experts) and not streamed and not next(model.parameters()).is_meta:
                model.to(device)
        log.info("weights stored in float8_e4m3fn, computed in %s", str(dtype).removeprefix("torch."))
    if memory.placement == "stream_blocks":
        from .weights import stream_blocks

        for model in components.experts:
            if not next(model.parameters()).is_meta:    # an expert in its files streams once read (ExpertPlacement)
                stream_blocks(model, device)
        log.info("transformer blocks streamed onto %s one at a time", device)
