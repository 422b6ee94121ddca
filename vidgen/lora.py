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
with a one-line error. Wan's module names go to diffusers' through the families' name adapter
(`families.diffusers_name` / `wan_name`, the one weight loading uses). The adapters themselves are
diffusers' (`load_lora_adapter`, `set_adapters`, `unload_lora`, on PEFT).

Everything here reads only safetensors headers; the tensors are `lora_deltas`' (read, checked, fused
or attached, taken off). `LoraState` is what a loaded pipeline's experts carry, and the swap between
renders.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from safetensors import safe_open

from .errors import InputError
from .families import diffusers_name, wan_name
from .lora_deltas import attach, detach, fuse, restore, stage, warn_large
from .records import check_safetensors, path_problem

log = logging.getLogger("vidgen")

PREFIXES = ("model.diffusion_model.", "diffusion_model.", "base_model.model.", "transformer.", "unet.")
KOHYA_PREFIX = "lora_unet_"
# key suffix -> (part, weight or bias)
SUFFIXES = {".lora_A.weight": "down", ".lora_B.weight": "up", ".lora_down.weight": "down", ".lora_up.weight": "up",
            ".lora_A.default.weight": "down", ".lora_B.default.weight": "up", ".alpha": "alpha",
            ".diff_b": "diff_b", ".diff": "diff", ".lora_B.bias": "diff_b"}
UNSUPPORTED = {"lokr_": "LoKr", "hada_": "LoHa", "dora_scale": "DoRA", ".lora_mid.": "LoCon (lora_mid)",
               "oft_": "OFT", "boft_": "BOFT"}


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
    with safe_open(str(path), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


def _module_index(shapes: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """The model's module paths, and their kohya spellings (dots as underscores), -> module path."""
    modules = {k.rsplit(".", 1)[0] for k in shapes if k.endswith((".weight", ".bias"))}
    index = {m: m for m in modules}
    for m in modules:
        index.setdefault(m.replace(".", "_"), m)
    for m in sorted(modules):                # Wan's names spelled the kohya way
        if (wan := wan_name("transformer", m)) != m:
            index.setdefault(wan.replace(".", "_"), m)
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
            target = index.get(diffusers_name("transformer", mod)) or index.get(mod)
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


def folder_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape of the model whose safetensors files are in `folder` (headers only)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        shapes.update(_header(f))
    return shapes


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


# --------------------------------------------------------------------------------------------
# What a loaded pipeline's experts carry, and the swap between renders.

class LoraState:
    """The LoRAs one pipeline's experts carry now (`now`: (mode, per-expert LoRA records), or ()), and
    the swap between renders: a warm pipeline (the queue's worker, `Pipeline.generate`) takes off what
    the last render applied and puts on what the next asks for, or changes nothing when the next asks
    for the same. Fused weights are read back from the model files, adapters unloaded, so the experts
    are bit-identical to a fresh load between LoRA sets; a swap that fails leaves them as they were,
    or with no LoRA, or marks them broken. `components`: the pipeline's loading.Components."""

    def __init__(self, components):
        self.components = components
        self.now: tuple = ()
        self._fused: list[list[str]] = [[] for _ in components.experts]   # parameters changed, per expert
        self.broken = False             # a failed swap left the experts in an unknown state

    def apply(self, plan, auto: str = "adapter") -> None:
        """Apply the LoRAs of `plan` (a preflight.Plan; lora_mode auto -> `auto`), taking off what the
        last render applied: fused weights are read back from the model files, adapters unloaded, so
        the experts are bit-identical to a fresh load before the new LoRAs go on.

        Every file is read and checked for every expert first: a list that fails there leaves the
        experts exactly as they were. A failure while applying (out of memory, a PEFT error, a fused
        weight beyond its dtype) takes every LoRA off again (the experts as freshly loaded, `now`
        empty); if even that fails, `broken` is set and a Renderer loads a fresh pipeline."""
        mode = plan.config.lora_mode if plan.config.lora_mode != "auto" else auto
        if any(getattr(m, "is_quantized", False) for m in self.components.experts):
            mode = "adapter"            # GGUF weights cannot take a fused delta (preflight refuses lora_mode: fuse)
        want = (mode, tuple(tuple(p.record for p in plans) for plans in plan.loras)) if plan.loras else ()
        if want == self.now:
            return
        t0 = time.perf_counter()
        experts = self.components.experts
        staged = [stage(list(plans), next(m.parameters()).dtype) if plans else []
                  for m, plans in zip(experts, plan.loras or [()] * len(experts))]   # raises with nothing changed
        try:
            if self._strengths_only(want, plan):
                warn_large(experts, staged)
                self.now = want
                log.info("LoRA strengths: %s in %.2f s", ", ".join(f"{p.path.name} x{p.strength:g}" for p in unique(plan.loras)),
                         time.perf_counter() - t0)
                return
            self._take_off()
            warn_large(experts, staged)
            for e, model in enumerate(experts):
                if staged[e] and mode == "fuse":
                    fuse(model, staged[e], self._fused[e])
                elif staged[e]:
                    attach(model, staged[e], [_adapter_name(i) for i in range(len(staged[e]))], self._fused[e])
            self.now = want
        except BaseException:
            try:
                self._take_off()
            except BaseException:
                self.broken = True
                log.warning("LoRA: the experts could not be put back after a failed swap; the next render loads the model afresh")
            raise
        if want:
            log.info("LoRA (%s): %s in %.2f s", mode, ", ".join(f"{p.path.name} x{p.strength:g} ({p.expert})"
                                                           for p in unique(plan.loras)), time.perf_counter() - t0)

    def _take_off(self) -> None:
        """Every LoRA off: adapters (and PEFT wrappers) unloaded, fused weights read back from the model files."""
        self.now = ()
        info = self.components.info
        for e, model in enumerate(self.components.experts):
            detach(model)
            if self._fused[e]:
                restore(model, info.weights_of(info.experts[e]), self._fused[e])
                self._fused[e] = []

    def _strengths_only(self, want: tuple, plan) -> bool:
        """When only the strengths of the attached adapters change: set them (diffusers' set_adapters),
        with no unload, load or recompile. Not with fused deltas, which hold their strength."""
        if not (want and self.now and want[0] == self.now[0] == "adapter") or any(self._fused):
            return False
        strip = lambda per_expert: [[{k: v for k, v in r.items() if k != "strength"} for r in rows]  # noqa: E731
                                    for rows in per_expert]
        if strip(want[1]) != strip(self.now[1]):
            return False
        for model, plans in zip(self.components.experts, plan.loras):
            names = [(_adapter_name(i), p.strength) for i, p in enumerate(plans) if has_pairs(p)]
            if names:
                model.set_adapters([n for n, _ in names], weights=[w for _, w in names])
        return True


def has_pairs(plan: LoraPlan) -> bool:
    """Whether the LoRA has low-rank pairs (what `attach` makes an adapter of)."""
    return any("down" in e.keys for e in plan.entries)


def _adapter_name(i: int) -> str:
    """The PEFT adapter name of an expert's i-th LoRA."""
    return f"lora{i}"
