"""LoRA files as people have them, checked against the model before any weight loads, then fused
into the experts or attached as PEFT adapters.

Formats (keys after an optional `diffusion_model.` / `model.diffusion_model.` / `transformer.` /
`base_model.model.` prefix):

- diffusers / PEFT: `blocks.0.attn1.to_q.lora_A.weight` / `lora_B.weight` (diffusers' module names)
- ComfyUI, diffusion-pipe, ai-toolkit: `blocks.0.self_attn.q.lora_A.weight` (Wan's own names)
- Kijai / Lightning: `lora_down.weight` / `lora_up.weight` + `.alpha`, either naming
- LightX2V extras: `.diff_b` (a bias delta), `.diff` (a full weight delta, e.g. a norm's)
- musubi / kohya: `lora_unet_blocks_0_self_attn_q.lora_down.weight` + `.alpha`

Why our own key mapping rather than diffusers' `WanLoraLoaderMixin.lora_state_dict` converters:
those drop norm `.diff` keys at debug level, pop `time_projection` keys, scale the caller's tensors
in place, raise KeyError / ValueError on mixed kohya keys and `head.head.alpha`, and return what
they did not match without saying so — a LoRA whose keys match no layer then loads as a silent
no-op. Here every key is accounted for: applied, or named in one warning line (modules the model
does not have, such as a Wan2.1-I2V LoRA's `k_img`/`v_img` on a text-to-video model), or refused
with a one-line error. The adapters themselves are diffusers' (`load_lora_adapter`, `set_adapters`,
`unload_lora`, on PEFT).

A low-rank pair applies `strength * alpha / rank * up @ down` to the weight (alpha = rank when the
file has none); `.diff_b` adds `strength * diff_b` to the bias, `.diff` `strength * diff` to the
weight. Everything here up to `read_deltas` reads only safetensors headers.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .errors import InputError

log = logging.getLogger("vidgen")

PREFIXES = ("model.diffusion_model.", "diffusion_model.", "base_model.model.", "transformer.", "unet.")
KOHYA_PREFIX = "lora_unet_"
WAN_TO_DIFFUSERS = (
    # Wan's own module names (ComfyUI, Kijai, musubi) -> diffusers' WanTransformer3DModel names.
    ("self_attn.q", "attn1.to_q"), ("self_attn.k", "attn1.to_k"), ("self_attn.v", "attn1.to_v"),
    ("self_attn.o", "attn1.to_out.0"), ("self_attn.norm_q", "attn1.norm_q"), ("self_attn.norm_k", "attn1.norm_k"),
    ("cross_attn.q", "attn2.to_q"), ("cross_attn.k", "attn2.to_k"), ("cross_attn.v", "attn2.to_v"),
    ("cross_attn.o", "attn2.to_out.0"), ("cross_attn.norm_q", "attn2.norm_q"), ("cross_attn.norm_k", "attn2.norm_k"),
    ("cross_attn.k_img", "attn2.add_k_proj"), ("cross_attn.v_img", "attn2.add_v_proj"),
    ("cross_attn.norm_k_img", "attn2.norm_added_k"),
    ("ffn.0", "ffn.net.0.proj"), ("ffn.2", "ffn.net.2"), ("norm3", "norm2"),
    ("time_embedding.0", "condition_embedder.time_embedder.linear_1"),
    ("time_embedding.2", "condition_embedder.time_embedder.linear_2"),
    ("text_embedding.0", "condition_embedder.text_embedder.linear_1"),
    ("text_embedding.2", "condition_embedder.text_embedder.linear_2"),
    ("time_projection.1", "condition_embedder.time_proj"), ("head.head", "proj_out"),
    ("img_emb.proj.0", "condition_embedder.image_embedder.norm1"),
    ("img_emb.proj.1", "condition_embedder.image_embedder.ff.net.0.proj"),
    ("img_emb.proj.3", "condition_embedder.image_embedder.ff.net.2"),
    ("img_emb.proj.4", "condition_embedder.image_embedder.norm2"),
)
# key suffix -> (part, weight or bias)
SUFFIXES = {".lora_A.weight": "down", ".lora_B.weight": "up", ".lora_down.weight": "down", ".lora_up.weight": "up",
            ".lora_A.default.weight": "down", ".lora_B.default.weight": "up", ".alpha": "alpha",
            ".diff_b": "diff_b", ".diff": "diff", ".lora_B.bias": "diff_b"}
UNSUPPORTED = {"lokr_": "LoKr", "hada_": "LoHa", "dora_scale": "DoRA", ".lora_mid.": "LoCon (lora_mid)",
               "oft_": "OFT", "boft_": "BOFT"}


def _rename(name: str, to_wan: bool = False) -> str:
    """A Wan-named module path in diffusers' names, or with `to_wan` the other way (unchanged when
    it has no counterpart)."""
    m = re.match(r"(blocks\.\d+\.)?(.*)", name)
    block, rest = m.group(1) or "", m.group(2)
    for wan, diff in WAN_TO_DIFFUSERS:
        src, dst = (diff, wan) if to_wan else (wan, diff)
        if rest == src:
            return block + dst
    return name


def to_wan_name(name: str) -> str:
    """A diffusers-named module path in Wan's own names."""
    return _rename(name, to_wan=True)


@dataclass
class Entry:
    """What one LoRA file does to one module of the model (diffusers' name)."""

    module: str
    keys: dict[str, str] = field(default_factory=dict)    # part (down/up/alpha/diff/diff_b) -> file key


@dataclass
class LoraPlan:
    """A LoRA file checked against one expert's parameter shapes (headers only)."""

    path: Path
    strength: float
    expert: str                      # high | low | both
    sha256: str
    entries: list[Entry]
    skipped: list[str]               # modules in the file the model lacks (warned once)

    @property
    def record(self) -> dict:
        """What the sidecar and the container metadata say of this LoRA."""
        return {"path": str(self.path), "sha256": self.sha256, "strength": self.strength, "expert": self.expert}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def check_file(path: Path) -> str | None:
    """What is wrong with `path` as a LoRA file (a clause after its name), or None."""
    from .records import check_safetensors

    if not path.exists():
        return "does not exist; give the path of a .safetensors LoRA file"
    if not path.is_file():
        return "is not a file; give the path of a .safetensors LoRA file"
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        return f"cannot be read ({e.strerror or type(e).__name__})"
    if head[:2] == b"PK" or head[:1] == b"\x80":
        return "is a pickle (a torch .pt/.ckpt file), which vidgen never loads; convert it to .safetensors"
    return check_safetensors(path)


def _header(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def _module_index(shapes: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """The model's module paths, and their kohya spellings (dots as underscores), -> module path."""
    modules = {k.rsplit(".", 1)[0] for k in shapes if k.endswith((".weight", ".bias"))}
    index = {m: m for m in modules}
    for m in modules:
        index.setdefault(m.replace(".", "_"), m)
    for wan, diff in WAN_TO_DIFFUSERS:       # Wan's names spelled the kohya way
        for m in modules:
            if m.endswith(diff) and (m == diff or m[-len(diff) - 1] == "."):
                index.setdefault((m[:len(m) - len(diff)] + wan).replace(".", "_"), m)
    return index


def _split(key: str) -> tuple[str, str] | None:
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if key.endswith(suffix):
            return key[:-len(suffix)], SUFFIXES[suffix]
    return None


def plan_lora(path: str | Path, strength: float, expert: str, shapes: list[dict[str, tuple[int, ...]]],
              sha256: str | None = None) -> list[LoraPlan]:
    """Check the LoRA at `path` against the parameter `shapes` (name -> shape, diffusers' names) of
    each expert it applies to; one LoraPlan per expert. The file and its header are read once, and
    modules the model lacks are named in one warning. Raises InputError naming the file and what
    to fix. `sha256`: the file's, when already known."""
    path = Path(path).expanduser()
    name = path.name
    if problem := check_file(path):
        raise InputError(f"LoRA {path}: {problem}")
    header = _header(path)
    if not header:
        raise InputError(f"LoRA {name}: holds no tensors; is it a LoRA file?")
    for key in header:
        for mark, kind in UNSUPPORTED.items():
            if mark in key:
                raise InputError(f"LoRA {name}: is a {kind} file (key {key!r}); vidgen applies LoRA "
                                 "(lora_A/B, lora_down/up, diff, diff_b) only")
    sha256 = sha256 or sha256_of(path)
    matched = [_match(name, header, s) for s in shapes]
    skipped = sorted(set().union(*(m[1] for m in matched)))
    if skipped:
        more = f" and {len(skipped) - 8} more" if len(skipped) > 8 else ""
        log.warning("LoRA %s: skipped %d module(s) this model does not have: %s%s", name, len(skipped),
                    ", ".join(skipped[:8]), more)
    return [LoraPlan(path, float(strength), expert, sha256, entries, sorted(lacks)) for entries, lacks in matched]


def _match(name: str, header: dict[str, tuple[int, ...]], shapes: dict[str, tuple[int, ...]]) -> tuple[list[Entry], set[str]]:
    """(what the file does to each of the model's modules, the file's modules the model lacks)."""
    index = _module_index(shapes)
    entries: dict[str, Entry] = {}
    skipped: set[str] = set()
    unknown: list[str] = []
    for key in header:
        stem = key
        for p in PREFIXES:
            if stem.startswith(p):
                stem = stem[len(p):]
                break
        split = _split(stem)
        if split is None:
            unknown.append(key)
            continue
        mod, part = split
        if mod.startswith(KOHYA_PREFIX):
            target = index.get(mod[len(KOHYA_PREFIX):])
        else:
            target = index.get(_rename(mod)) or index.get(mod)
        if target is None:
            skipped.add(mod[len(KOHYA_PREFIX):] if mod.startswith(KOHYA_PREFIX) else mod)
            continue
        entry = entries.setdefault(target, Entry(target))
        if part in entry.keys:
            raise InputError(f"LoRA {name}: two keys for the {part} of {target} ({entry.keys[part]!r}, {key!r})")
        entry.keys[part] = key
    if unknown:
        raise InputError(f"LoRA {name}: {len(unknown)} key(s) of no LoRA layout, e.g. {unknown[0]!r}; "
                         "expected lora_A/lora_B, lora_down/lora_up (+ alpha), diff or diff_b keys")
    if not entries:
        raise InputError(f"LoRA {name}: none of its {len(header)} keys matches a layer of this model "
                         f"(e.g. {next(iter(header))!r}); is it a LoRA for another model?")
    for e in entries.values():
        _check_entry(name, e, header, shapes)
    return list(entries.values()), skipped


def _check_entry(name: str, e: Entry, header: dict, shapes: dict) -> None:
    parts = e.keys
    weight = shapes.get(e.module + ".weight")
    if ("down" in parts) != ("up" in parts):
        have, miss = ("down", "up") if "down" in parts else ("up", "down")
        raise InputError(f"LoRA {name}: {e.module} has a {have} matrix but no {miss} matrix; the file is incomplete")
    if "alpha" in parts and "down" not in parts:
        raise InputError(f"LoRA {name}: {e.module} has an alpha but no lora_down/lora_up pair")
    if "down" in parts:
        down, up = header[parts["down"]], header[parts["up"]]
        if weight is None or len(weight) < 2:
            raise InputError(f"LoRA {name}: {e.module} is not a linear or conv layer of this model")
        rank = down[0]
        fits = (len(down) >= 2 and len(up) >= 2 and up[1] == rank and up[0] == weight[0]
                and math.prod(down[1:]) == math.prod(weight[1:]))
        if not fits:
            raise InputError(f"LoRA {name}: does not fit this model at {e.module} (layer {list(weight)}, LoRA down "
                             f"{list(down)} / up {list(up)}); is it a LoRA for another model size?")
        if "alpha" in parts and math.prod(header[parts["alpha"]]) != 1:
            raise InputError(f"LoRA {name}: {e.module}'s alpha is not a single number")
    if "diff" in parts and header[parts["diff"]] != weight:
        raise InputError(f"LoRA {name}: its weight delta for {e.module} has shape {list(header[parts['diff']])}, "
                         f"the layer {list(weight or ())}; is it a LoRA for another model?")
    if "diff_b" in parts:
        bias = shapes.get(e.module + ".bias")
        if bias is None or header[parts["diff_b"]] != bias:
            raise InputError(f"LoRA {name}: its bias delta for {e.module} does not fit the layer "
                             f"({list(header[parts['diff_b']])} vs {list(bias or ())}); a LoRA for another model?")


# --------------------------------------------------------------------------------------------
# Weights


def read_deltas(plan: LoraPlan) -> dict[str, dict[str, torch.Tensor]]:
    """module -> {down, up (alpha/rank folded into down), diff, diff_b} as float32, strength not applied.
    The file's tensors are never modified."""
    from safetensors import safe_open

    out: dict[str, dict[str, torch.Tensor]] = {}
    with safe_open(str(plan.path), "pt") as f:
        for e in plan.entries:
            parts = {part: f.get_tensor(key).float() for part, key in e.keys.items()}
            if "down" in parts:
                down = parts["down"].flatten(1)
                alpha = float(parts.pop("alpha").reshape(-1)[0]) if "alpha" in parts else float(down.shape[0])
                if not math.isfinite(alpha):
                    raise InputError(f"LoRA {plan.path.name}: {e.module}'s alpha is {alpha}")
                parts["down"] = down * (alpha / down.shape[0])
                parts["up"] = parts["up"].flatten(1)
            for part, t in parts.items():
                if not torch.isfinite(t).all():
                    raise InputError(f"LoRA {plan.path.name}: {e.module}'s {part} holds NaN or infinite values")
            out[e.module] = parts
    return out


def fuse(model: torch.nn.Module, plans: list[LoraPlan]) -> list[str]:
    """Add each LoRA's deltas into `model`'s weights (float32 sums, then the weights' dtype);
    returns the parameter names changed (to restore them from the model files)."""
    params = dict(model.named_parameters())
    total: dict[str, torch.Tensor] = {}
    for plan in plans:
        for module, parts in read_deltas(plan).items():
            for name, delta in _weight_deltas(module, parts, params):
                d = delta * plan.strength
                total[name] = total[name] + d if name in total else d
    with torch.no_grad():
        for name, d in total.items():
            p = params[name]
            p.copy_((p.float() + d.to(p.device)).to(p.dtype))
    return sorted(total)


def _weight_deltas(module: str, parts: dict, params: dict):
    w = params[module + ".weight"]
    if "down" in parts:
        yield module + ".weight", (parts["up"] @ parts["down"]).view(w.shape)
    if "diff" in parts:
        yield module + ".weight", parts["diff"]
    if "diff_b" in parts:
        yield module + ".bias", parts["diff_b"]


def has_pairs(plan: LoraPlan) -> bool:
    """Whether the LoRA has low-rank pairs (what `attach` makes an adapter of)."""
    return any("down" in e.keys for e in plan.entries)


def attach(model: torch.nn.Module, plans: list[LoraPlan], names: list[str]) -> list[str]:
    """Attach each LoRA's low-rank pairs (with their bias deltas) as a PEFT adapter named names[i],
    active at its strength (diffusers' load_lora_adapter / set_adapters). Deltas with no low-rank
    form (`.diff`, and `.diff_b` without a pair) are fused; returns the parameter names fused."""
    dtype = next(model.parameters()).dtype
    params = dict(model.named_parameters())
    active, weights, rest = [], [], []
    for plan, name in zip(plans, names):
        state = {}
        for module, parts in read_deltas(plan).items():
            if "down" in parts:
                w = params[module + ".weight"]
                down, up = parts.pop("down"), parts.pop("up")
                if w.dim() > 2:         # a conv layer: PEFT's LoRA convs take conv-shaped A and B
                    down = down.view(down.shape[0], *w.shape[1:])
                    up = up.view(*up.shape, *([1] * (w.dim() - 2)))
                state[f"{module}.lora_A.weight"] = down.to(dtype)
                state[f"{module}.lora_B.weight"] = up.to(dtype)
                if "diff_b" in parts:
                    state[f"{module}.lora_B.bias"] = parts.pop("diff_b").to(dtype)
        if state:
            model.load_lora_adapter(state, adapter_name=name, prefix=None)
            active.append(name)
            weights.append(plan.strength)
        leftover = [Entry(e.module, {k: v for k, v in e.keys.items() if k == "diff" or (k == "diff_b" and "down" not in e.keys)})
                    for e in plan.entries]
        leftover = [e for e in leftover if e.keys]
        if leftover:
            rest.append(LoraPlan(plan.path, plan.strength, plan.expert, plan.sha256, leftover, []))
    if active:
        model.set_adapters(active, weights=weights)
    return fuse(model, rest) if rest else []


def folder_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of the model whose safetensors files are in `folder` (headers only)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        shapes.update(_header(f))
    return shapes


def restore(model: torch.nn.Module, weights, names: list[str]) -> None:
    """Put back parameters `names` of `model` from its weights (a checkpoints.Weights), cast to each
    parameter's dtype as loading did: bit-identical to a freshly loaded model."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in weights.read({n: params[n].dtype for n in names}, params[names[0]].device):
            params[name].copy_(tensor)


def detach(model: torch.nn.Module) -> None:
    """Remove every adapter (and the PEFT wrappers), leaving the base layers as they were."""
    if getattr(model, "peft_config", None):
        model.unload_lora()


def unique(per_expert: tuple) -> list:
    """The LoRA plans of all experts, one per file and setting (a `both` LoRA is planned per expert)."""
    seen: dict = {}
    for plans in per_expert:
        for p in plans:
            seen.setdefault((p.sha256, p.strength, p.expert), p)
    return list(seen.values())


def records(per_expert: tuple) -> list[dict]:
    """What the sidecar and the container metadata say of a render's LoRAs."""
    return [p.record for p in unique(per_expert)]
