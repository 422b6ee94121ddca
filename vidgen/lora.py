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
import sys
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
    from .records import check_safetensors, path_problem

    if problem := path_problem(path, "file"):        # stat only: a FIFO or device is never opened
        return f"{problem}; give the path of a .safetensors LoRA file"
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
        if weight is None or len(weight) < 2:
            raise InputError(f"LoRA {name}: {e.module} is not a linear or conv layer of this model")
        if problem := _pair_problem(header[parts["down"]], header[parts["up"]], weight):
            part, why = problem
            raise InputError(f"LoRA {name}: key {parts[part]!r} {why}")
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


def _pair_problem(down: tuple, up: tuple, weight: tuple) -> tuple[str, str] | None:
    """(down or up, what is wrong with its shape) when a low-rank pair cannot be applied to a layer of
    shape `weight` ([out, in] linear, [out, in, k...] conv), or None. A linear layer takes down
    [rank, in] and up [out, rank]; a conv layer down [rank, in, k...] (or flattened [rank, in*k...])
    and up [out, rank] (or [out, rank, 1...]); rank >= 1. Every shape that reads, flattens or
    multiplies differently is refused here, before anything loads."""
    out, ins = weight[0], tuple(weight[1:])
    rank = down[0] if down else 0
    if rank == 0:
        return "down", f"has shape {list(down)}: rank 0, a layer that applies nothing; the file is damaged"
    downs = [(rank, *ins)] + ([(rank, math.prod(ins))] if len(ins) > 1 else [])
    ups = [(out, rank)] + ([(out, rank) + (1,) * (len(ins) - 1)] if len(ins) > 1 else [])
    takes = f"a {list(weight)} layer takes down [r, {', '.join(map(str, ins))}] and up [{out}, r]"
    if tuple(down) in downs and tuple(up) in ups:
        return None
    part, shape = ("down", down) if tuple(down) not in downs else ("up", up)
    if part == "up" and len(up) == 2 and up[0] == out:
        return "up", f"has shape {list(up)}: rank {up[1]}, but its lora_down has rank {rank}; the file is damaged"
    sized = math.prod(shape[1:]) == math.prod(ins) if part == "down" else shape[:1] == (out,)
    hint = "a LoRA of another layout, or damaged" if sized else "is it a LoRA for another model size?"
    return part, f"has shape {list(shape)}, which does not fit this model ({takes}); {hint}"


# --------------------------------------------------------------------------------------------
# Weights: every file is read and checked for all the experts (stage) before anything of the model
# changes; fuse / attach then only apply what was checked.

DWARFS = 10.0
"""An update this many times the (Frobenius) norm of the weight it changes replaces the layer rather
than tuning it: a warning line (typically a wrong alpha, which scales every pair by alpha / rank)."""


@dataclass
class Staged:
    """One LoRA's tensors for one expert, read and checked; nothing of the model has changed yet."""

    plan: LoraPlan
    deltas: dict[str, dict[str, torch.Tensor]]     # module -> down/up (alpha/rank in down), diff, diff_b: float32
    norms: dict[str, float]                        # parameter -> norm of its update at strength 1
    scales: dict[str, tuple[float, int]] = field(default_factory=dict)   # module -> (alpha, rank) of its pair


def read_deltas(plan: LoraPlan) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, tuple[float, int]]]:
    """(module -> {down, up (alpha/rank folded into down), diff, diff_b} as float32, strength not
    applied; module -> (alpha, rank) of its pair). The file's tensors are never modified."""
    from safetensors import safe_open

    out: dict[str, dict[str, torch.Tensor]] = {}
    scales: dict[str, tuple[float, int]] = {}
    with safe_open(str(plan.path), "pt") as f:
        for e in plan.entries:
            parts = {part: f.get_tensor(key).float() for part, key in e.keys.items()}
            for part, t in parts.items():
                if not torch.isfinite(t).all():
                    raise InputError(f"LoRA {plan.path.name}: {e.module}'s {part} holds NaN or infinite values")
            if "down" in parts:
                down = parts["down"].flatten(1)
                alpha = float(parts.pop("alpha").reshape(-1)[0]) if "alpha" in parts else float(down.shape[0])
                scales[e.module] = (alpha, down.shape[0])
                parts["down"] = down * (alpha / down.shape[0])
                parts["up"] = parts["up"].flatten(1)
            out[e.module] = parts
    return out, scales


def _update_norms(module: str, parts: dict) -> dict[str, float]:
    """Parameter -> Frobenius norm of the update `parts` make at strength 1, in float64, without
    forming up @ down: |U D|^2 = sum((U^T U) * (D D^T)), plus a weight delta's own and cross terms."""
    out = {}
    sq = 0.0
    if "down" in parts:
        u, d = parts["up"].double(), parts["down"].double()      # [out, r], [r, in]
        sq += float(((u.T @ u) * (d @ d.T)).sum())
    if "diff" in parts:
        f = parts["diff"].double()
        sq += float(f.square().sum())
        if "down" in parts:
            sq += 2 * float((u * (f.reshape(u.shape[0], -1) @ d.T)).sum())   # 2 <U D, diff>
    if "down" in parts or "diff" in parts:
        out[module + ".weight"] = math.sqrt(max(sq, 0.0))
    if "diff_b" in parts:
        out[module + ".bias"] = float(parts["diff_b"].double().norm())
    return out


def stage(plans: list[LoraPlan], dtype: torch.dtype = torch.float32) -> list[Staged]:
    """Read and check the LoRAs of one expert whose weights are in `dtype`. Refuses (InputError) NaN
    or infinite values in a file, and an update that is not finite — alone at its strength or summed
    over the LoRAs — in float32 or `dtype`. Changes nothing."""
    limit = float(torch.finfo(dtype if dtype.is_floating_point else torch.float32).max)
    limit = min(limit, float(torch.finfo(torch.float32).max))
    small = dtype.is_floating_point and torch.finfo(dtype).max < torch.finfo(torch.float32).max
    out, total = [], {}
    for plan in plans:
        deltas, scales = read_deltas(plan)
        norms: dict[str, float] = {}
        for module, parts in deltas.items():
            for name, n in _update_norms(module, parts).items():
                v = n * plan.strength
                pair = scales.get(module) if name.endswith(".weight") else None
                if not v < limit:
                    why = f"alpha {pair[0]:g} for rank {pair[1]}, " if pair else ""
                    raise InputError(f"LoRA {plan.path.name}: its update to {name} ({why}strength {plan.strength:g}) "
                                     f"is beyond {_dtype_name(dtype)}'s range; check the file's alpha or lower the strength")
                if small and pair and max(float(parts[k].abs().max()) for k in ("down", "up")) >= limit:
                    raise InputError(f"LoRA {plan.path.name}: its low-rank pair for {module} (alpha {pair[0]:g} for rank "
                                     f"{pair[1]}) holds values beyond {_dtype_name(dtype)}'s range; check the file's alpha")
                norms[name] = n
                total.setdefault(name, []).append((plan, v))
        out.append(Staged(plan, deltas, norms, scales))
    for name, parts in total.items():
        if len(parts) > 1 and not sum(v for _, v in parts) < limit:
            raise InputError(f"LoRAs {', '.join(p.path.name for p, _ in parts)}: their updates to {name} add up to beyond "
                             f"{_dtype_name(dtype)}'s range; lower their strengths")
    return out


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _param(model: torch.nn.Module, name: str) -> torch.Tensor:
    """Parameter `name` of `model`, also where a PEFT adapter wraps its layer (its base layer's)."""
    module, leaf = name.rsplit(".", 1)
    m = model.get_submodule(module)
    return getattr(getattr(m, "base_layer", m), leaf)


def warn_large(models: list, staged: list[list[Staged]]) -> None:
    """One warning line per LoRA file whose update at its strength dwarfs (DWARFS x) a weight it
    changes, over all the experts it applies to. Reads the weights, changes nothing; call it on the
    experts' base weights (no fused LoRA in them)."""
    found: dict[Path, list] = {}
    for model, per_file in zip(models, staged):
        if getattr(model, "is_quantized", False):
            continue
        for s in per_file:
            for name, n in s.norms.items():
                if not name.endswith(".weight") or n * s.plan.strength == 0:
                    continue
                w = _param(model, name)
                if not w.dtype.is_floating_point:
                    continue
                base = float(torch.linalg.vector_norm(w.detach(), dtype=torch.float32))
                if base > 0 and (ratio := n * s.plan.strength / base) > DWARFS:     # an all-zero weight: no scale to judge by
                    found.setdefault(s.plan.path, []).append((ratio, name.removesuffix(".weight"), s))
    for path, hits in found.items():
        ratio, module, s = max(hits, key=lambda h: h[0])
        alpha = s.scales.get(module)
        why = f"its alpha {alpha[0]:g} for rank {alpha[1]} scales the pairs by {alpha[0] / alpha[1]:g}; " if alpha else ""
        more = f" and {len(hits) - 1} more layer(s)" if len(hits) > 1 else ""
        log.warning("LoRA %s: at strength %g its update is %.0fx the size of the weight it changes at %s%s "
                    "(over %gx replaces the layer rather than tuning it); %scheck the file or lower the strength",
                    path.name, s.plan.strength, ratio, module, more, DWARFS, why)


def _as_staged(model: torch.nn.Module, items: list) -> list[Staged]:
    plans = [i for i in items if isinstance(i, LoraPlan)]
    if not plans:
        return list(items)
    return stage(plans, next(model.parameters()).dtype)


def fuse(model: torch.nn.Module, items: list, changed: list[str] | None = None) -> list[str]:
    """Add each LoRA's deltas (Staged, or LoraPlans to stage) into `model`'s weights (float32 sums,
    then the weights' dtype); returns the parameter names changed (to restore them from the model
    files). Each name is appended to `changed` before its weight changes, so a caller can restore
    what a failure midway left; a sum not finite in the weight's dtype is refused (InputError).

    One parameter's float32 delta is made at a time, from the low-rank pairs, and dropped once added:
    a LoRA on every linear layer of a 14B expert would otherwise hold 56 GB of deltas at once."""
    staged = _as_staged(model, items)
    params = dict(model.named_parameters())
    pending: dict[str, list] = {}           # parameter -> [(strength, a function making its delta, file)], in order
    for s in staged:
        for module, parts in s.deltas.items():
            for name, delta in _weight_deltas(module, parts, params):
                pending.setdefault(name, []).append((s.plan.strength, delta, s.plan.path.name))
    changed = [] if changed is None else changed
    with torch.no_grad():
        for name, contributions in pending.items():
            total = None
            for strength, delta, _ in contributions:
                d = delta() * strength
                total = d if total is None else total + d
            p = params[name]
            new = (p.float() + total.to(p.device)).to(p.dtype)
            del total
            if not torch.isfinite(new).all():
                files = dict.fromkeys(f for _, _, f in contributions)
                raise InputError(f"LoRA {', '.join(files)}: fused into {name} it gives values beyond "
                                 f"{_dtype_name(p.dtype)}'s range; lower the strength")
            changed.append(name)
            p.copy_(new)
    return sorted(pending)


def _weight_deltas(module: str, parts: dict, params: dict):
    """(parameter name, a function that makes its delta) for one module's LoRA parts."""
    w = params[module + ".weight"]
    if "down" in parts:
        yield module + ".weight", lambda: (parts["up"] @ parts["down"]).view(w.shape)
    if "diff" in parts:
        yield module + ".weight", lambda: parts["diff"]
    if "diff_b" in parts:
        yield module + ".bias", lambda: parts["diff_b"]


def has_pairs(plan: LoraPlan) -> bool:
    """Whether the LoRA has low-rank pairs (what `attach` makes an adapter of)."""
    return any("down" in e.keys for e in plan.entries)


def attach(model: torch.nn.Module, items: list, names: list[str], changed: list[str] | None = None) -> list[str]:
    """Attach each LoRA's (Staged, or LoraPlans to stage) low-rank pairs, with their bias deltas, as
    a PEFT adapter named names[i], active at its strength (diffusers' load_lora_adapter /
    set_adapters). Deltas with no low-rank form (`.diff`, and `.diff_b` without a pair) are fused;
    returns the parameter names fused (appended to `changed` as in `fuse`). A failure midway leaves
    adapters on: `detach` takes them off."""
    staged = _as_staged(model, items)
    dtype = next(model.parameters()).dtype
    params = dict(model.named_parameters())
    active, weights, rest = [], [], []
    for s, name in zip(staged, names):
        state, leftover = {}, {}
        for module, parts in s.deltas.items():
            if "down" in parts:
                w = params[module + ".weight"]
                down, up = parts["down"], parts["up"]
                if w.dim() > 2:         # a conv layer: PEFT's LoRA convs take conv-shaped A and B
                    down = down.view(down.shape[0], *w.shape[1:])
                    up = up.view(*up.shape, *([1] * (w.dim() - 2)))
                state[f"{module}.lora_A.weight"] = down.to(dtype)
                state[f"{module}.lora_B.weight"] = up.to(dtype)
                if "diff_b" in parts:
                    state[f"{module}.lora_B.bias"] = parts["diff_b"].to(dtype)
            if rest_parts := {k: v for k, v in parts.items() if k == "diff" or (k == "diff_b" and "down" not in parts)}:
                leftover[module] = rest_parts
        if state:
            model.load_lora_adapter(state, adapter_name=name, prefix=None)
            active.append(name)
            weights.append(s.plan.strength)
        if leftover:
            rest.append(Staged(s.plan, leftover, {}))
    if active:
        model.set_adapters(active, weights=weights)
    return fuse(model, rest, changed) if rest else []


def folder_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of the model whose safetensors files are in `folder` (headers only)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        shapes.update(_header(f))
    return shapes


def restore(model: torch.nn.Module, weights, names: list[str]) -> None:
    """Put back parameters `names` of `model` from its weights (a weights.Weights), cast to each
    parameter's dtype as loading did: bit-identical to a freshly loaded model. The files were checked
    for non-finite values when the model loaded; a swap does not sum them again."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in weights.read({n: params[n].dtype for n in names}, params[names[0]].device, check=False):
            params[name].copy_(tensor)


def detach(model: torch.nn.Module) -> None:
    """Remove every adapter and PEFT wrapper, leaving the base layers as they were — also the wrappers
    a failed load_lora_adapter leaves behind without a peft_config. Raises RuntimeError when some remain."""
    if getattr(model, "peft_config", None) or _wrapped(model):
        model.unload_lora()
        if _wrapped(model):
            raise RuntimeError("PEFT layers remain after unload_lora")


def _wrapped(model: torch.nn.Module) -> bool:
    if "peft" not in sys.modules:   # nothing imported PEFT: nothing can have wrapped a layer
        return False
    from peft.tuners.tuners_utils import BaseTunerLayer

    return any(isinstance(m, BaseTunerLayer) for m in model.modules())


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


def refuse_repeats(loras: list, experts: int) -> None:
    """Refuse one LoRA file (by SHA-256, whatever its path) listed twice for one expert: vidgen
    applies and records each LoRA once per expert, and two listings would mean the sum of their
    strengths, so the message says to list it once with that sum. `loras`: the config's LoraConfig
    entries with sha256 filled in; `experts`: the model's expert count."""
    names = ("high", "low") if experts == 2 else ("both",)
    on = lambda expert: set(range(experts)) if expert == "both" else {0 if expert == "high" else 1}  # noqa: E731
    by_file: dict[str, list[int]] = {}
    for i, entry in enumerate(loras):
        by_file.setdefault(entry.sha256, []).append(i)
    for idx in by_file.values():
        if sum(len(on(loras[i].expert)) for i in idx) == len(set().union(*(on(loras[i].expert) for i in idx))):
            continue                    # the same file on different experts (high / low): each applies once
        sums = [sum(loras[i].strength for i in idx if e in on(loras[i].expert)) for e in range(experts)]
        used = [e for e in range(experts) if any(e in on(loras[i].expert) for i in idx)]
        if len({loras[i].expert for i in idx}) == 1:
            fix = f"list it once, with strength {sums[used[0]]:g} (the strengths add)"
        else:
            fix = "list it once per expert, with the strengths added: " + "; ".join(
                f"expert: {names[e]}, strength: {sums[e]:g}" for e in used)
        raise InputError(f"LoRA {Path(loras[idx[0]].path).name}: listed more than once for one expert "
                         f"({', '.join(f'loras[{i}]' for i in idx)}, the same file by its SHA-256); {fix}")
