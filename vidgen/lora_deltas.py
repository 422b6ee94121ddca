"""A LoRA's tensors, for one expert: read and checked (`stage`) for every expert before anything
of the model changes, then fused into its weights (`fuse`) or attached as PEFT adapters (`attach`,
diffusers' `load_lora_adapter` / `set_adapters`), and taken off again (`detach` unloads adapters,
`restore` reads fused weights back from the model files). What to read comes from `lora.LoraPlan`
(the file checked against the model's shapes, headers only).

A low-rank pair applies `strength * alpha / rank * up @ down` to the weight (alpha = rank when the
file has none); `.diff_b` adds `strength * diff_b` to the bias, `.diff` `strength * diff` to the
weight.
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from .errors import InputError

log = logging.getLogger("vidgen")

DWARFS = 10.0
"""An update this many times the (Frobenius) norm of the weight it changes replaces the layer rather
than tuning it: a warning line (typically a wrong alpha, which scales every pair by alpha / rank)."""


@dataclass
class Staged:
    """One LoRA's tensors for one expert, read and checked; nothing of the model has changed yet."""

    plan: Any                                      # the lora.LoraPlan it was read for
    deltas: dict[str, dict[str, torch.Tensor]]     # module -> down/up (alpha/rank in down), diff, diff_b: float32
    norms: dict[str, float]                        # parameter -> norm of its update at strength 1
    scales: dict[str, tuple[float, int]] = field(default_factory=dict)   # module -> (alpha, rank) of its pair


def read_deltas(plan) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, tuple[float, int]]]:
    """(module -> {down, up (alpha/rank folded into down), diff, diff_b} as float32, strength not
    applied; module -> (alpha, rank) of its pair) of the file `plan` (a lora.LoraPlan) checked. The
    file's tensors are never modified."""
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


def stage(plans: list, dtype: torch.dtype = torch.float32) -> list[Staged]:
    """Read and check the LoRAs (lora.LoraPlans) of one expert whose weights are in `dtype`. Refuses (InputError) NaN
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
    plans = [i for i in items if not isinstance(i, Staged)]
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
