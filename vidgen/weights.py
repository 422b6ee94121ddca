"""One component's weights in the layouts users have them, read from headers first and tensors later.

A component (a transformer expert, the text encoder, the VAE) is a diffusers folder of safetensors
shards, or a single file: safetensors in diffusers' or Wan's original naming (ComfyUI and Kijai
repacks, optionally `model.diffusion_model.`-prefixed), ComfyUI `fp8_scaled` safetensors (float8
weights with a per-tensor scale), a GGUF quantisation, or one of Wan's original `.pth` files (read
with `torch.load(weights_only=True)`, tensors only). `open_weights` reads only headers — safetensors
JSON headers (bounds-checked, vidgen.records), GGUF tensor tables (the gguf package), a `.pth`'s
tensor table (memory-mapped) — and names every tensor the way the model names its parameter, so a
file can be checked against the model (`mismatch`) and its variant told (vidgen.sources) before any
weight is read. `Weights.read` then yields each tensor once, on its device, in the dtype asked for,
fp8_scaled weights multiplied by their scale.

Names: Wan's original transformer, T5 (`wan/modules/t5.py`: `blocks.N.attn.q` ...) and VAE names map
to diffusers' and transformers' by the one name adapter of vidgen.families (`diffusers_names`). GGUF
experts load through diffusers' `from_single_file` with its GGUF quantizer (dequantised in PyTorch
layer by layer).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch

from .errors import ModelLoadError, install_hint
from .families import FUSED, diffusers_names, transformer_class
from .records import SAFETENSORS_DTYPES, integer_problem, integer_tensors, path_problem, safe_name, safetensors_header

ROLES = ("transformer", "transformer_2", "text_encoder", "vae", "image_encoder")
PREFIXES = ("model.diffusion_model.", "diffusion_model.", "model.")
"""Key prefixes single files carry (ComfyUI saves, Kijai, merges); stripped when every key has one."""
SCALED_MARKER = "scaled_fp8"
SIDE_SUFFIXES = (".scale_weight", ".scale_input", ".weight_scale", ".input_scale", ".comfy_quant")
"""ComfyUI's per-layer quantisation tensors: a scale (`.scale_weight` in the scaled_fp8 files,
`.weight_scale` in the newer comfy_quant files), the input scale of fp8 matmuls (unused here), and the
comfy_quant JSON. Not weights of the model: consumed while reading, never loaded as parameters."""
IGNORED = ("spiece_model",)     # a tokenizer model some text-encoder files carry: not a weight
UNUSED = {"image_encoder": ("visual_projection.weight", "position_ids")}
"""Tensors of a role's files that are not its model's and are left unread, said in one log line when it
loads (`Weights.unused`): CLIPVisionModelWithProjection's projection (ComfyUI's clip_vision_h.safetensors;
Wan takes CLIP's penultimate hidden states, never the projected embedding) and the position ids older
transformers saved (an arange it builds itself)."""
BLUR_KERNEL = ".blur_kernel"
"""Wan2.2-Animate's motion encoder keeps its blur (FIR) kernels as buffers in its files; diffusers builds
them itself, as non-persistent buffers (expert_shell too), so a file's copies are not read."""

@dataclass
class Weights:
    """One component's weights as the headers describe them (no tensor read yet)."""

    role: str
    source: Path                            # what was named: a component folder or a file
    files: tuple[Path, ...]
    kind: str                               # safetensors | gguf | pth
    layout: str                             # diffusers (the model's own names) | wan (Wan's original names)
    names: dict[str, tuple[int, str]]       # model name -> (file index, key in that file)
    shapes: dict[str, tuple[int, ...]]      # model name -> shape
    dtypes: Counter = field(default_factory=Counter)    # storage dtype -> bytes
    scales: dict[str, tuple[int, str]] = field(default_factory=dict)   # model name -> its fp8 scale's (file, key)
    quant: str = ""                         # "" | "fp8_scaled" | "gguf Q8_0, ..."
    cuts: dict[str, tuple[int, int]] = field(default_factory=dict)     # model name -> (part, parts) of its file tensor
    unused: tuple[str, ...] = ()            # keys of the files that are not the model's (UNUSED)

    @property
    def nbytes(self) -> int:
        return sum(self.dtypes.values())

    def storage(self) -> str:
        """The dtypes the weights are stored in, largest share first ("bfloat16", "float8_e4m3fn 96% + ...")."""
        if self.quant.startswith("gguf"):
            return self.quant
        total = max(1, self.nbytes)
        parts = [f"{d} {100 * n / total:.0f}%" for d, n in self.dtypes.most_common(3) if n / total >= 0.01]
        text = parts[0].rsplit(" ", 1)[0] if len(parts) == 1 else " + ".join(parts)
        return f"{text} ({self.quant})" if self.quant else text

    def describe(self) -> str:
        where = self.source
        layout = ("Wan's original names" if self.layout == "wan" else
                  "transformers' names" if self.role in ("text_encoder", "image_encoder") else "diffusers' names")
        return f"{where} ({self.kind}, {layout}, {self.storage()})"

    def mismatch(self, expected: dict[str, tuple[int, ...]]) -> str | None:
        """What differs between these weights and a model's parameters (name -> shape), or None."""
        missing = sorted(set(expected) - set(self.shapes))
        unexpected = sorted(set(self.shapes) - set(expected))
        wrong = sorted(n for n in set(expected) & set(self.shapes)
                       if tuple(expected[n]) != tuple(self.shapes[n]) and not self.quant.startswith("gguf"))
        parts = []
        for what, names in (("missing", missing), ("unexpected", unexpected), ("of another shape", wrong)):
            if names:
                shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
                parts.append(f"{len(names)} tensor(s) {what} ({shown})")
        return "; ".join(parts) or None

    def where(self, name: str) -> str:
        """The file holding the model's parameter `name` (the source, for a name the files do not hold)."""
        return str(self.files[self.names[name][0]]) if name in self.names else str(self.source)

    def read(self, want: dict[str, torch.dtype], device: torch.device | str = "cpu", *,
             check: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """(model name, tensor) for each name in `want`, on `device`, in the dtype asked for; a scaled
        float8 weight comes out as weight x scale (computed in float32), a cut one as its part of the
        file's tensor, a [1, C, 1, 1] bias as [C] (`shapes` holds the model's). Raises ModelLoadError for a
        name the files do not hold, and (`check`) for a NaN or infinite value; check=False where the
        same tensors were checked when the model loaded (a LoRA swap reads them back)."""
        if self.kind == "gguf":
            raise ModelLoadError(f"{self.describe()}: GGUF weights load through diffusers' GGUF quantizer, not "
                                 "tensor by tensor")
        absent = sorted(set(want) - set(self.names))
        if absent:
            raise ModelLoadError(f"{self.describe()}: no weights for {len(absent)} parameter(s) "
                                 f"({', '.join(absent[:3])}); replace the file with the original one")
        by_file: dict[int, list[str]] = {}
        for name in want:
            by_file.setdefault(self.names[name][0], []).append(name)
        for index, names in sorted(by_file.items()):
            with _open(self, index, device) as get:
                for name in names:
                    t = get(self.names[name][1])
                    if name in self.scales:
                        s_index, s_key = self.scales[name]
                        if s_index == index:
                            scale = get(s_key)
                        else:
                            with _open(self, s_index, device) as get_scale:
                                scale = get_scale(s_key)
                        t = t.to(torch.float32) * scale.to(device=t.device, dtype=torch.float32)
                    if name in self.cuts:
                        part, parts = self.cuts[name]
                        t = t.chunk(parts, dim=0)[part].clone()       # its own storage, not the whole
                    if t.shape != self.shapes[name]:
                        t = t.reshape(self.shapes[name])
                    if check and nonfinite(t):
                        raise nonfinite_error(str(self.files[index]), self.names[name][1])
                    yield name, t.to(want[name])


class _open:
    """A context giving `get(key) -> tensor` for one file of `w`, on `device`."""

    def __init__(self, w: Weights, index: int, device):
        self.w, self.path, self.device = w, w.files[index], torch.device(device)

    def __enter__(self):
        if self.w.kind == "pth":
            sd = _torch_load(self.path)
            return lambda key: sd[key].to(self.device)
        from safetensors import safe_open

        self.f = safe_open(str(self.path), framework="pt", device=str(self.device))
        self.f.__enter__()
        return self.f.get_tensor

    def __exit__(self, *exc):
        if self.w.kind != "pth":
            self.f.__exit__(*exc)


# --------------------------------------------------------------------------------------------
# Headers


def _torch_load(path: Path) -> dict:
    """A tensors-only `.pth` (memory-mapped: tensors are read when used)."""
    import pickle

    try:
        sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        if "Weights only load failed" in str(e):
            raise ModelLoadError(f"refusing to load {path}: it holds Python objects other than tensors (vidgen reads "
                                 ".pth files with weights_only=True); use the original file or a safetensors one") from e
        raise ModelLoadError(f"{path} is damaged or not a PyTorch file; replace it with the original one") from e
    except Exception as e:  # noqa: BLE001 - torch raises many types for a truncated or foreign file
        raise ModelLoadError(f"{path} cannot be read as a PyTorch file ({type(e).__name__}); replace it with the "
                             "original one") from e
    if not isinstance(sd, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in sd.items()):
        raise ModelLoadError(f"{path} is not a state dict (a mapping of names to tensors)")
    return sd


def _safetensors_header(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    header, problem = safetensors_header(path)
    if problem:
        raise ModelLoadError(f"{path} {problem}; replace it with the original file")
    return header


def nonfinite(t: torch.Tensor) -> bool:
    """Whether a weight holds NaN or infinity. One sum per tensor, where it already is (a NaN or an
    infinity anywhere makes it non-finite, and +inf + -inf is NaN; PyTorch accumulates half types in
    float32): 9 GB/s of bfloat16 on one CPU core, 6x faster than isfinite().all(). Only a sum that
    overflowed on its own (float16's range is small) is checked element by element."""
    if t.is_meta or not t.is_floating_point() or t.numel() == 0:
        return False
    if t.element_size() == 1:        # float8: no sum (nor isfinite) of its own; in float32 it cannot overflow
        return not bool(torch.isfinite(t.sum(dtype=torch.float32)))
    return not bool(torch.isfinite(t.sum())) and not bool(torch.isfinite(t).all())


def nonfinite_error(what: str, name: str) -> ModelLoadError:
    return ModelLoadError(f"{what}: tensor {safe_name(name, 'with an odd name')} holds NaN or infinite values, so "
                          "every frame would come out broken; the file is damaged or a bad conversion: replace it "
                          "with the original one")


def check_finite(model: torch.nn.Module, weights: "Weights | None", source: Path | str) -> None:
    """Raise ModelLoadError naming the file and tensor of the first parameter of a loaded `model`
    holding NaN or infinity (`weights`: where each parameter came from; else `source` is named)."""
    for name, p in model.named_parameters():
        if nonfinite(p.detach()):
            known = weights is not None and name in weights.names
            raise nonfinite_error(weights.where(name) if known else str(source),
                                  weights.names[name][1] if known else name)


def _gguf_header(path: Path) -> tuple[dict[str, tuple[tuple[int, ...], str]], dict[str, int]]:
    """(key -> (torch-order shape, quant type), quant type -> bytes) of a GGUF file, from its tensor table."""
    try:
        import gguf
    except ImportError:
        raise ModelLoadError(f"{path} is a GGUF file and the gguf package is not installed: "
                             f"{install_hint('gguf')}") from None
    try:
        reader = gguf.GGUFReader(str(path))
        out, sizes = {}, Counter()
        for t in reader.tensors:
            out[t.name] = (tuple(int(d) for d in reversed(t.shape.tolist())), t.tensor_type.name)
            sizes[t.tensor_type.name] += int(t.n_bytes)
    except Exception as e:  # noqa: BLE001 - the reader raises ValueError/IndexError/struct errors on damage
        raise ModelLoadError(f"{path} is not a readable GGUF file ({type(e).__name__}); replace it with the "
                             "original one") from None
    return out, sizes


def _strip_prefix(keys: list[str]) -> str:
    for prefix in PREFIXES:
        if keys and all(k.startswith(prefix) for k in keys):
            return prefix
    return ""


def open_weights(role: str, path: Path, headers: dict[Path, dict] | None = None) -> Weights:
    """The weights of component `role` at `path` — a diffusers component folder (its *.safetensors), a
    single .safetensors / .gguf / .pth file — described from headers only. Raises ModelLoadError
    (one line naming the file) for a missing, damaged, pickled-object or unsupported file.
    `headers`: safetensors file -> header (key -> (shape, dtype)) already read and checked, integer
    tensors refused (loading.inspect_model): not read again."""
    headers = headers or {}
    path = Path(path).expanduser()
    files, kind = _files(role, path)
    raw, sizes = _tables(files, kind, headers)
    marker = next((k for k in raw if k.rsplit(".", 1)[-1] == SCALED_MARKER), None)
    side = {k for k in raw if k.endswith(SIDE_SUFFIXES) or k == marker or k in IGNORED}
    if any(k.endswith(".comfy_quant") for k in raw):
        _check_comfy_quant(path, files, raw)
    unused = tuple(k for k in raw if k not in side and k.endswith(UNUSED.get(role, ())))
    keys = [k for k in raw if k not in side and k not in unused]
    if kind != "gguf":
        for i, f in enumerate(files):
            if f not in headers and (found := integer_tensors({k: ((), raw[k][3]) for k in keys if raw[k][0] == i})):
                raise ModelLoadError(integer_problem(f, found))
    prefix = _strip_prefix(keys)
    try:
        layout, names = diffusers_names(role, [k[len(prefix):] for k in keys])
    except ValueError as e:         # a VAE of no Wan layout, or of both
        raise ModelLoadError(str(e)) from None
    w = Weights(role, path, files, kind, layout, {}, {}, unused=unused)
    for k in keys:
        name = names.get(k[len(prefix):])
        if name is None:
            continue
        i, key, shape, dt = raw[k]
        if layout == "wan" and name.endswith(BLUR_KERNEL):
            continue                    # built by the model itself (BLUR_KERNEL); every other key is kept
        if kind != "gguf":
            sizes[dt] += _bytes(shape, dt)
        base = k.removesuffix(".weight")
        scale = next((raw[s][:2] for s in (base + ".scale_weight", base + ".weight_scale")
                      if s in raw and dt.startswith("float8")), None)
        for part, part_shape, cut in (_parts(name, shape) if layout == "wan" else [(name, shape, None)]):
            w.names[part], w.shapes[part] = (i, key), part_shape
            if cut:
                w.cuts[part] = cut
            if scale:
                w.scales[part] = scale
    w.dtypes = sizes
    if kind == "gguf":
        quants = sorted({dt for *_, dt in raw.values()} - {"F32", "F16", "BF16"})
        w.quant = "gguf " + (", ".join(quants) or "unquantised")
    elif w.scales:
        w.quant = "fp8_scaled"
    elif any(dt.startswith("float8") for *_, dt in raw.values()):
        w.quant = "fp8 (unscaled)"
    return w


def _parts(name: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...], tuple[int, int] | None]]:
    """(model name, shape, (part, parts) or None) of each parameter one tensor of Wan's names holds: the
    halves of a FUSED layer's weight or bias (Wan2.2-Animate's face adapter), a fused leaky ReLU's bias
    Wan keeps as [1, C, 1, 1] (Animate's motion encoder, LIA's layout) as diffusers' [C], else itself."""
    owner, _, leaf = name.rpartition(".")
    path, _, layer = owner.rpartition(".")
    if layer in FUSED and shape and shape[0] % len(FUSED[layer]) == 0:
        n = len(FUSED[layer])
        return [(f"{path}.{module}.{leaf}", (shape[0] // n, *shape[1:]), (j, n)) for j, module in enumerate(FUSED[layer])]
    if name.endswith(".act_fn.bias") and len(shape) == 4 and shape[0] == shape[2] == shape[3] == 1:
        return [(name, (shape[1],), None)]
    return [(name, shape, None)]


def _files(role: str, path: Path) -> tuple[tuple[Path, ...], str]:
    """(the weights files of `role` at `path`, their kind: safetensors | gguf | pth)."""
    if problem := path_problem(path, "file or folder"):
        raise ModelLoadError(f"model.{role}: {str(path)!r} {problem}; give its weights file or component folder")
    if path.is_dir():
        files = tuple(sorted(path.glob("*.safetensors")))
        for f in files:
            if problem := path_problem(f, "file"):      # a FIFO among the shards is never opened
                raise ModelLoadError(f"model.{role}: {str(f)!r} {problem}; replace it with the weights file")
        if not files:
            raise ModelLoadError(f"{path} holds no .safetensors weights for {role}")
    else:
        files = (path,)
    suffix = files[0].suffix.lower()
    kind = {".safetensors": "safetensors", ".gguf": "gguf", ".pth": "pth", ".pt": "pth"}.get(suffix)
    if kind is None:
        raise ModelLoadError(f"{path}: vidgen reads .safetensors, .gguf or tensors-only .pth weights, not {suffix or 'this file'}")
    return files, kind


def _tables(files: tuple[Path, ...], kind: str, headers: dict[Path, dict]) -> tuple[dict, Counter]:
    """(key -> (file index, key, shape, dtype) of every tensor of `files`, GGUF quant type -> bytes),
    from their headers (a safetensors file's from `headers` when read already)."""
    raw: dict[str, tuple[int, str, tuple[int, ...], str]] = {}
    sizes: Counter = Counter()
    for i, f in enumerate(files):
        if kind == "safetensors":
            header = headers[f] if f in headers else _safetensors_header(f)
            for k, (shape, dt) in header.items():
                raw[k] = (i, k, shape, SAFETENSORS_DTYPES.get(dt, dt))
        elif kind == "gguf":
            header, gsizes = _gguf_header(f)
            sizes.update(gsizes)
            for k, (shape, qt) in header.items():
                raw[k] = (i, k, shape, qt)
        else:
            for k, t in _torch_load(f).items():
                raw[k] = (i, k, tuple(t.shape), str(t.dtype).removeprefix("torch."))
    return raw, sizes


def _bytes(shape: tuple[int, ...], dtype: str) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * (1 if dtype.startswith(("float8", "int8", "uint8", "bool")) else
                8 if dtype in ("float64", "int64") else 4 if dtype in ("float32", "int32") else 2)


def _check_comfy_quant(path: Path, files, raw) -> None:
    """The newer ComfyUI per-layer quantisation: each `<layer>.comfy_quant` (uint8 JSON) names a format;
    vidgen dequantises float8 ones (weight x weight_scale) and refuses the rest by name."""
    import json

    from safetensors import safe_open

    formats = set()
    for k, (i, key, _, _) in raw.items():
        if k.endswith(".comfy_quant"):
            with safe_open(str(files[i]), "pt") as f:
                try:
                    formats.add(str(json.loads(bytes(f.get_tensor(key).tolist()).decode()).get("format")))
                except (ValueError, UnicodeDecodeError, AttributeError):
                    formats.add("(unreadable)")
    other = sorted(f for f in formats if f not in ("float8_e4m3fn", "float8_e5m2"))
    if other:
        raise ModelLoadError(f"{path} is quantised as {', '.join(other)} (ComfyUI comfy_quant), which vidgen cannot "
                             "dequantise; use the fp8_scaled, fp16/bf16 or GGUF file of this model")


# --------------------------------------------------------------------------------------------
# Models built without memory, then filled from their weights


def meta_transformer(conf: dict, dtype: torch.dtype) -> torch.nn.Module:
    """The Wan transformer of `conf` (families.transformer_class: with VACE blocks or without) on the
    meta device (no memory), in the dtypes from_pretrained(dtype=...) gives it: diffusers'
    _keep_in_fp32_modules stay float32, modules and parameters so named alike (diffusers matches the
    parts of each parameter's name: `scale_shift_table`, Animate's `motion_synthesis_weight`)."""
    import diffusers

    from .vae.memsim import default_dtype

    cls = getattr(diffusers, transformer_class(conf))
    with torch.device("meta"), default_dtype(dtype):
        model = cls.from_config({k: v for k, v in conf.items() if not k.startswith("_")})
    if dtype != torch.float32:
        keep = cls._keep_in_fp32_modules or ()
        for name, module in model.named_modules():
            if any(p in name.split(".") for p in keep):
                module.float()
        for name, p in list(model.named_parameters()):
            if p.dtype != torch.float32 and any(k in name.split(".") for k in keep):
                owner, _, attr = name.rpartition(".")
                model.get_submodule(owner)._parameters[attr] = torch.nn.Parameter(p.float(), requires_grad=False)
    return model.eval().requires_grad_(False)


def expert_shell(conf: dict, dtype: torch.dtype) -> torch.nn.Module:
    """An expert's structure from its config with parameters on the meta device (no memory), in the
    dtypes from_pretrained gives them; the rotary tables built for real. Its weights are read from
    its files by load_weights (when it runs, with the idle expert in its files)."""
    shell = meta_transformer(conf, dtype)
    rope = shell.rope
    shell.rope = type(rope)(rope.attention_head_dim, rope.patch_size, rope.max_seq_len)
    _blur_kernels(shell, dtype)
    return shell


def _blur_kernels(shell: torch.nn.Module, dtype: torch.dtype) -> None:
    """Wan2.2-Animate's motion encoder: its residual blocks' blur kernels are buffers diffusers computes
    as it builds them (no file holds them, BLUR_KERNEL), so on the meta device they have no value. One
    block of the same class is built for real with one channel (the kernels do not depend on the
    width; the encoder builds its blocks with their defaults, as here) and its kernels copied, in the
    model's dtype as from_pretrained leaves them."""
    blocks = getattr(getattr(shell, "motion_encoder", None), "res_blocks", None)
    if not blocks:
        return
    with torch.device("cpu"):
        real = dict(type(blocks[0])(1, 1).named_buffers())
    for block in blocks:
        for name, buffer in block.named_buffers():
            if buffer.is_meta and name in real:
                owner, _, attr = name.rpartition(".")
                block.get_submodule(owner)._buffers[attr] = real[name].to(dtype, copy=True)   # one each


def meta_text_encoder(conf: dict, dtype: torch.dtype) -> torch.nn.Module:
    """transformers' UMT5 encoder of `conf` on the meta device, in the dtypes from_pretrained(dtype=...)
    gives it (its _keep_in_fp32_modules, T5's feed-forward output, stay float32 under float16)."""
    from transformers import UMT5Config, UMT5EncoderModel

    from .vae.memsim import default_dtype

    with torch.device("meta"), default_dtype(dtype):
        model = UMT5EncoderModel(UMT5Config(**{k: v for k, v in conf.items() if not k.startswith("_")}))
    if dtype == torch.float16:
        for name, module in model.named_modules():
            if any(p in name.split(".") for p in UMT5EncoderModel._keep_in_fp32_modules or ()):
                module.float()
    return model.eval().requires_grad_(False)


def meta_image_encoder(conf: dict, dtype: torch.dtype) -> torch.nn.Module:
    """transformers' CLIPVisionModel of `conf` (an image_encoder/config.json) with its parameters on the
    meta device, in `dtype` as from_pretrained(dtype=...) gives them; its position ids (a buffer it
    builds, not a weight) built for real. load_weights fills `clip_tower` of it."""
    from transformers import CLIPVisionConfig, CLIPVisionModel

    from .vae.memsim import default_dtype

    config = CLIPVisionConfig(**{k: v for k, v in conf.items() if not k.startswith("_")})
    with torch.device("meta"), default_dtype(dtype):
        model = CLIPVisionModel(config)
    embeddings = clip_tower(model).embeddings
    with torch.device("cpu"), default_dtype(dtype):
        real = type(embeddings)(config)
    for name, buffer in list(embeddings.named_buffers(recurse=False)):
        embeddings._buffers[name] = getattr(real, name) if buffer.is_meta else buffer
    return model.eval().requires_grad_(False)


def clip_tower(model: torch.nn.Module) -> torch.nn.Module:
    """The vision tower of a CLIPVisionModel, whose names a file's are (families.CLIP_TOWER): the model
    itself in transformers 5, its `vision_model` in transformers 4."""
    return getattr(model, "vision_model", model)


def meta_vae(conf: dict, dtype: torch.dtype) -> torch.nn.Module:
    from diffusers import AutoencoderKLWan

    from .vae.memsim import default_dtype

    with torch.device("meta"), default_dtype(dtype):
        model = AutoencoderKLWan.from_config({k: v for k, v in conf.items() if not k.startswith("_")})
    return model.eval().requires_grad_(False)


def stream_blocks(model: torch.nn.Module, device: torch.device) -> None:
    """diffusers' block-level group offload: each transformer block moves onto `device` just before it
    runs and back to host memory after, on a CUDA stream (the next block's copy overlapping this one's
    compute); `low_cpu_mem_usage` keeps no pinned second copy of the weights."""
    model.enable_group_offload(onload_device=device, offload_device=torch.device("cpu"), offload_type="block_level",
                               num_blocks_per_group=1, use_stream=device.type == "cuda", low_cpu_mem_usage=True)


def streamed(model: torch.nn.Module) -> bool:
    """Whether stream_blocks' group offload is on `model` (diffusers' own test)."""
    from diffusers.hooks.group_offloading import _is_group_offload_enabled

    return _is_group_offload_enabled(model)


def unstream_blocks(model: torch.nn.Module) -> None:
    """Remove stream_blocks' hooks (which hold each block's host tensors), so the weights can be dropped."""
    from diffusers.hooks import HookRegistry
    from diffusers.hooks.group_offloading import (_GROUP_OFFLOADING, _LAYER_EXECUTION_TRACKER,
                                                  _LAZY_PREFETCH_GROUP_OFFLOADING)

    registry = HookRegistry.check_if_exists_or_initialize(model)
    for name in (_GROUP_OFFLOADING, _LAYER_EXECUTION_TRACKER, _LAZY_PREFETCH_GROUP_OFFLOADING):
        registry.remove_hook(name, recurse=True)


def unload_weights(model: torch.nn.Module) -> None:
    """Drop an expert's parameters (to meta, same shapes and dtypes): its files hold them. On glibc the
    freed host memory goes back to the system (malloc_trim), not only to malloc's free lists: measured
    on two streamed fp8 1.3B experts, 1.56 GB of 1.79 GB that would otherwise stay with the process."""
    unstream_blocks(model)
    shells: dict[int, torch.nn.Parameter] = {}      # tied parameters (UMT5's shared and embed_tokens) stay tied
    for name, p in list(model.named_parameters(remove_duplicate=False)):
        if id(p) not in shells:
            shells[id(p)] = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"), requires_grad=False)
        owner, _, attr = name.rpartition(".")
        model.get_submodule(owner)._parameters[attr] = shells[id(p)]
    _trim_host_heap()


def _trim_host_heap() -> None:
    import ctypes
    import sys

    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):       # not glibc (musl): nothing to ask
            pass


def load_weights(model: torch.nn.Module, weights: Weights, device: torch.device | str) -> torch.nn.Module:
    """Read a model's parameters from its weights straight onto `device`, each in the dtype the model
    holds it in (float8 where fp8 storage applies), without a copy in host memory; its buffers
    follow. Raises ModelLoadError for a parameter the weights do not hold, or one left unread."""
    device = torch.device(device)
    want = {name: p.dtype for name, p in model.named_parameters()}
    aliases: dict[int, list[str]] = {}          # tied parameters (UMT5's shared and embed_tokens): set together
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
    first = {names[0]: names for names in aliases.values()}
    for name, tensor in weights.read(want, device):
        value = torch.nn.Parameter(tensor, requires_grad=False)
        for alias in first.get(name, [name]):
            owner, _, attr = alias.rpartition(".")
            model.get_submodule(owner)._parameters[attr] = value
    for name, b in list(model.named_buffers()):
        if b.is_meta:
            raise ModelLoadError(f"{weights.describe()}: buffer {name} has no value after loading")
        if b.device != device:
            owner, _, attr = name.rpartition(".")
            model.get_submodule(owner)._buffers[attr] = b.to(device)
    return model
