"""Local diffusers-format Wan pipeline folders: inspect (JSON only), then load the weights.

`inspect_model` reads only JSON files, so a config can be checked against the model (variant,
size multiples, image input) before any weights are read. `load_components` then loads the
models with diffusers' and transformers' own classes, from safetensors only, never downloading.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import ModelLoadError

log = logging.getLogger("vidgen")

# Class names we accept in model_index.json, by role (registered names, never imported by path).
TEXT_ENCODERS = ("UMT5EncoderModel", "T5EncoderModel")
SCHEDULERS = ("UniPCMultistepScheduler", "FlowMatchEulerDiscreteScheduler")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


@dataclass
class ModelInfo:
    """What the folder's JSON files say about the model (no weights read)."""

    path: Path
    variant: str
    experts: list[str]                     # ["transformer"] or ["transformer", "transformer_2"]
    boundary_ratio: float | None           # two-expert switch, fraction of 1000 timesteps
    expand_timesteps: bool                 # per-token timesteps (TI2V-5B)
    in_channels: int                       # transformer input channels (z, or 2z+4 for I2V concat)
    z_dim: int
    patch_size: tuple[int, int, int]
    vae_scale_spatial: int
    vae_scale_temporal: int
    scheduler_class: str
    scheduler_config: dict[str, Any] = field(repr=False)

    @property
    def flow_shift(self) -> float:
        """The folder's flow shift (what `sampling.shift: null` means)."""
        return float(self.scheduler_config.get("flow_shift", self.scheduler_config.get("shift", 1.0)))

    @property
    def num_train_timesteps(self) -> int:
        return int(self.scheduler_config.get("num_train_timesteps", 1000))

    @property
    def needs_image(self) -> bool:
        return self.variant == "wan2.2-i2v-a14b"

    @property
    def accepts_image(self) -> bool:
        return self.variant in ("wan2.2-i2v-a14b", "wan2.2-ti2v-5b")

    @property
    def size_multiple(self) -> int:
        return self.vae_scale_spatial * self.patch_size[1]


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


def _read_json(path: Path, missing: list[str]) -> dict | None:
    if not path.is_file():
        missing.append(str(path))
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        missing.append(f"{path} (unreadable JSON: {e})")
        return None


def _check_weights(folder: Path, problems: list[str]) -> None:
    if not folder.is_dir():
        return
    files = [p.name for p in folder.iterdir()]
    if any(n.endswith(".safetensors") or n.endswith(".safetensors.index.json") for n in files):
        return
    pickles = [n for n in files if n.endswith(PICKLE_SUFFIXES)]
    if pickles:
        problems.append(f"{folder} has only pickle weights ({', '.join(sorted(pickles))}); vidgen loads "
                        f"safetensors only — convert them (e.g. save_pretrained(safe_serialization=True))")
    else:
        problems.append(f"{folder}/*.safetensors (no weights)")


def inspect_model(path: str | Path) -> ModelInfo:
    """Read and check a diffusers-format Wan folder's JSON files; list everything missing at once."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ModelLoadError(f"model folder {str(root)!r} does not exist; set model.path to a local "
                             f"diffusers-format Wan pipeline folder (nothing is downloaded)")
    missing: list[str] = []
    index = _read_json(root / "model_index.json", missing)
    if index is None:
        raise ModelLoadError(f"{root} is not a diffusers pipeline folder: missing {', '.join(missing)}")

    def declared(name: str) -> bool:
        entry = index.get(name)
        return isinstance(entry, list) and len(entry) == 2 and entry[1] is not None

    experts = [n for n in ("transformer", "transformer_2") if declared(n)]
    if not experts:
        missing.append("transformer (not declared in model_index.json)")
    problems: list[str] = []
    configs: dict[str, dict] = {}
    for name in experts + ["vae", "text_encoder"]:
        if not declared(name):
            missing.append(f"{name} (not declared in model_index.json)")
            continue
        conf = _read_json(root / name / "config.json", missing)
        if conf is not None:
            configs[name] = conf
        _check_weights(root / name, missing)
    tok = root / "tokenizer"
    if not tok.is_dir():
        missing.append(str(tok))
    elif not any((tok / f).is_file() for f in ("tokenizer.json", "spiece.model")):
        missing.append(f"{tok}/tokenizer.json or spiece.model")
    sched = _read_json(root / "scheduler" / "scheduler_config.json", missing) or {}
    if missing:
        raise ModelLoadError(f"model folder {root} is incomplete; missing: {', '.join(missing)}")

    text_cls = index["text_encoder"][1]
    if text_cls not in TEXT_ENCODERS:
        problems.append(f"text_encoder class {text_cls!r} is not supported (expected {' or '.join(TEXT_ENCODERS)})")
    sched_cls = sched.get("_class_name", "")
    if sched_cls not in SCHEDULERS:
        problems.append(f"scheduler class {sched_cls!r} is not supported (expected {' or '.join(SCHEDULERS)})")
    t_conf, vae_conf = configs[experts[0]], configs["vae"]
    if declared("image_encoder"):
        problems.append("this is a Wan2.1 I2V model (CLIP image encoder), which vidgen does not support yet")
    if problems:
        raise ModelLoadError(f"cannot use model folder {root}: {'; '.join(problems)}")

    z_dim = int(vae_conf.get("z_dim", 16))
    in_channels = int(t_conf.get("in_channels", 16))
    expand = bool(index.get("expand_timesteps", False))
    boundary = index.get("boundary_ratio")
    if len(experts) == 2:
        variant = "wan2.2-i2v-a14b" if in_channels == 2 * z_dim + 4 else "wan2.2-t2v-a14b"
    elif expand or z_dim == 48:
        variant = "wan2.2-ti2v-5b"
    elif in_channels != z_dim:
        raise ModelLoadError(f"cannot use model folder {root}: transformer in_channels {in_channels} with a "
                             f"z{z_dim} VAE is not a Wan layout vidgen supports")
    else:
        variant = "wan2.1-t2v"
    if len(experts) == 2 and boundary is None:
        raise ModelLoadError(f"{root}/model_index.json declares two transformers but no boundary_ratio")
    patch = tuple(t_conf.get("patch_size", (1, 2, 2)))
    return ModelInfo(
        path=root, variant=variant, experts=experts, boundary_ratio=boundary, expand_timesteps=expand,
        in_channels=in_channels, z_dim=z_dim, patch_size=patch,  # type: ignore[arg-type]
        vae_scale_spatial=int(vae_conf.get("scale_factor_spatial") or 8),
        vae_scale_temporal=int(vae_conf.get("scale_factor_temporal") or 4),
        scheduler_class=sched_cls, scheduler_config=sched,
    )


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("model.device=cuda but no CUDA device is available; use model.device=auto or cpu")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ModelLoadError("model.device=mps but MPS is not available; use model.device=auto or cpu")
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


def load_vae(info: ModelInfo, device: torch.device, dtype: torch.dtype):
    from diffusers import AutoencoderKLWan

    vae = _load(f"{info.path}/vae", AutoencoderKLWan.from_pretrained, info.path / "vae", dtype=dtype,
                use_safetensors=True, local_files_only=True)
    return vae.to(device).eval().requires_grad_(False)


def resolve_offload(mode: str, info: ModelInfo, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether to keep only the active expert on the device ("auto": when both would not fit)."""
    if len(info.experts) < 2 or device.type == "cpu" or mode == "none":
        return False
    if mode == "experts":
        return True
    size = 0
    for name in info.experts:
        for f in (info.path / name).glob("*.safetensors"):
            size += f.stat().st_size
    size = size * torch.finfo(dtype).bits // 32 if size else 0     # files are usually fp32 or bf16: a bound
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return size * 1.2 > free
    return True


def load_components(info: ModelInfo, device: torch.device, dtype: torch.dtype, vae_dtype: torch.dtype,
                    offload_experts: bool = False) -> Components:
    """Load tokenizer, text encoder, VAE and the expert(s) onto `device` (safetensors only).

    With `offload_experts`, only the first (high-noise) expert goes to the device; the other waits
    in CPU memory until the denoiser swaps them.
    """
    from diffusers import WanTransformer3DModel
    from transformers import AutoTokenizer, T5EncoderModel, UMT5EncoderModel

    root = info.path
    tokenizer = _load(f"{root}/tokenizer", AutoTokenizer.from_pretrained, root / "tokenizer", local_files_only=True)
    text_cls = {"UMT5EncoderModel": UMT5EncoderModel, "T5EncoderModel": T5EncoderModel}[
        json.loads((root / "model_index.json").read_text())["text_encoder"][1]]
    text_encoder = _load(f"{root}/text_encoder", text_cls.from_pretrained, root / "text_encoder", dtype=dtype,
                         use_safetensors=True, local_files_only=True)
    experts = []
    for name in info.experts:
        log.info("loading %s", name)
        experts.append(_load(f"{root}/{name}", WanTransformer3DModel.from_pretrained, root / name,
                             dtype=dtype, use_safetensors=True, local_files_only=True))
    vae = load_vae(info, device, vae_dtype)
    text_encoder = text_encoder.to(device).eval().requires_grad_(False)
    experts = [m.to(device if k == 0 or not offload_experts else "cpu").eval().requires_grad_(False)
               for k, m in enumerate(experts)]
    return Components(info=info, tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, experts=experts,
                      device=device, dtype=dtype, offload_experts=offload_experts)
