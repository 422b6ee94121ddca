"""Speed knobs on the transformer experts: torch.compile, the SDPA backend, step caching.

Each knob takes the library's own route, applied once at load by `apply_speed`:

- compile=blocks: diffusers' `ModelMixin.compile_repeated_blocks()` -- torch.compile of every
  `WanTransformerBlock` (the class `WanTransformer3DModel._repeated_blocks` names), so one block's
  graph is compiled and reused by all of them (fast cold start). compile=full: `torch.compile` of the
  whole model's call, as `nn.Module.compile` does. Compilation is lazy, so failures (no C compiler,
  a Python torch cannot compile for) surface either at setup or at the first call; both fall back
  to eager with one warning. A genuine error (wrong shapes, out of memory) still raises: the eager
  retry raises it.
- attention_backend: `torch.nn.attention.sdpa_kernel` around each expert's forward. diffusers'
  Wan attention calls torch's SDPA through its dispatcher (backend "native"), so the context picks
  the kernel. diffusers' own `set_attention_backend("_native_math")` would end in the same call,
  but it is marked experimental, uses private backend names and changes a process-wide default;
  the torch context is public, stable and scoped to our experts. A backend this device cannot run
  (probed with the experts' dtype and head size) gives a warning and stays on auto.
- attention_backend=sage: SageAttention (quantised QK^T, the `sageattention` package, Triton/CUDA)
  through diffusers' attention dispatcher, `ModelMixin.set_attention_backend("sage")`: the local
  package only (never the dispatcher's hub variants, which download kernels). NVIDIA GPUs only;
  refused before loading elsewhere or without the package.
- fp8_matmul: torchao's float8 dynamic quantisation of the blocks' linears (Hopper/Ada). With the
  memory plan's fp8 weight storage on, those linears trade diffusers' per-layer cast for torchao's
  float8 weights with per-row scales: the storage stays float8, and the matmuls become float8 too.
- step_cache: diffusers' cache hooks through `CacheMixin.enable_cache`: first_block ->
  `FirstBlockCacheConfig(threshold)`; sea -> `SeaCacheConfig(threshold)`, the TeaCache-style cache
  diffusers 0.42 ships (TeaCache itself is not in diffusers: SeaCache keeps TeaCache's accumulated
  relative-L1 gate on the model input, with a spectrally filtered latent as the indicator); mag is
  refused: diffusers' MagCache needs per-model magnitude ratios (it ships Flux's only) and a step
  count fixed at load.

The cache hooks keep one state per cache context: the denoiser must run every expert call inside
`cache_context(model, "cond" | "uncond", ...)` and each render must start with `reset_step_cache`.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Iterable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from .config import STEP_CACHES, SpeedConfig
from .errors import ConfigError
from .weights import stream_blocks, streamed, unstream_blocks

log = logging.getLogger("vidgen")

SDPA_BACKENDS = {"sdpa_math": SDPBackend.MATH, "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
                 "sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}


def unsupported(speed: SpeedConfig, device: torch.device | None = None, dtype: torch.dtype | None = None) -> list[str]:
    """What in `speed` this install (diffusers, optional packages), `device` and the model's compute
    `dtype` cannot do (no weights needed), one line per problem."""
    out = _attention_problems(speed, device) + _fp8_problems(speed, device, dtype)
    if speed.step_cache == "none":
        return out
    return out + _cache_problems(speed)


def _attention_problems(speed: SpeedConfig, device: torch.device | None) -> list[str]:
    if speed.attention_backend != "sage":
        return []
    import importlib.util

    if device is None or device.type != "cuda":
        return [f"speed.attention_backend: sage runs on NVIDIA GPUs only (SageAttention's CUDA and Triton kernels); "
                f"this render's device is {device.type if device is not None else 'not a GPU'}: use auto"]
    if importlib.util.find_spec("sageattention") is None:
        return ["speed.attention_backend: sage needs the sageattention package (pip install sageattention); "
                "or use auto"]
    from diffusers.models.attention_dispatch import AttentionBackendName

    if "SAGE" not in AttentionBackendName.__members__:
        return ["speed.attention_backend: this diffusers has no sage backend; upgrade diffusers or use auto"]
    return []


def _fp8_problems(speed: SpeedConfig, device: torch.device | None, dtype: torch.dtype | None = None) -> list[str]:
    if not speed.fp8_matmul:
        return []
    import importlib.util

    if device is None or device.type != "cuda":
        return ["speed.fp8_matmul: float8 matmuls run on NVIDIA GPUs only (Hopper or Ada); "
                f"this render's device is {device.type if device is not None else 'not a GPU'}: set it to false"]
    if torch.cuda.get_device_capability(device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(device)
        return [f"speed.fp8_matmul: needs compute capability 8.9 or newer (Ada, Hopper); this GPU has {major}.{minor}"]
    if importlib.util.find_spec("torchao") is None:
        return ["speed.fp8_matmul: needs the torchao package (pip install torchao, a release built for this torch)"]
    if dtype not in (None, torch.bfloat16):     # torchao's per-row float8 takes bfloat16 weights only
        return [f"speed.fp8_matmul: needs model.dtype: bfloat16 (this render computes in "
                f"{str(dtype).removeprefix('torch.')}); set model.dtype: bfloat16 or speed.fp8_matmul: false"]
    return []


def _cache_problems(speed: SpeedConfig) -> list[str]:
    import diffusers.hooks

    available = [name for name, cls in STEP_CACHES.items() if cls and hasattr(diffusers.hooks, cls)]
    cls = STEP_CACHES.get(speed.step_cache)
    if cls and hasattr(diffusers.hooks, cls):
        return []
    why = ("diffusers' MagCache needs magnitude ratios measured per model (it ships Flux's only) and a "
           "step count fixed at load" if speed.step_cache == "mag" else f"diffusers has no {cls}")
    return [f"speed.step_cache: {speed.step_cache!r} is not available ({why}); "
            f"available: none, {', '.join(available)}"]


def apply_speed(components, speed: SpeedConfig) -> None:
    """Engage `speed`'s knobs on every expert of `components` (a vidgen.loading.Components), in place.

    Order matters: cache hooks first, then the attention context, then compilation, so the
    compiled call includes both.
    """
    problems = unsupported(speed, components.device, components.dtype)
    if problems:
        raise ConfigError(problems)
    experts, done = components.experts, []
    if speed.step_cache != "none":
        for model in experts:
            model.enable_cache(_cache_config(speed, model))
        done.append(f"step_cache={speed.step_cache} (diffusers {STEP_CACHES[speed.step_cache]}, "
                    f"threshold {speed.cache_threshold})")
    if speed.attention_backend == "sage":          # through diffusers' dispatcher (the local package, no download)
        for model in experts:
            model.set_attention_backend("sage")
        done.append("attention=sage (diffusers' dispatcher, sageattention)")
    elif speed.attention_backend != "auto":
        backend = SDPA_BACKENDS[speed.attention_backend]
        reason = _backend_problem(backend, experts[0], components.device)
        if reason:
            log.warning("speed.attention_backend=%s is not available on %s (%s); using auto",
                        speed.attention_backend, components.device.type, reason)
        else:
            for model in experts:
                _run_forward_under(model, backend)
            done.append(f"attention={speed.attention_backend} (torch sdpa_kernel {backend.name})")
    if speed.fp8_matmul:
        for model in experts:
            _fp8_matmuls(model, components.device)
        done.append("fp8 matmul (torchao float8 dynamic activations and weights, per row, on the blocks' linears)")
    if speed.compile != "none":
        notice = _Notice()
        for model in experts:
            _compile(model, speed.compile, notice)
        if not notice.warned:
            how = "diffusers compile_repeated_blocks" if speed.compile == "blocks" else "torch.compile"
            done.append(f"compile={speed.compile} ({how}; compiles on the first call)")
    if done:
        log.info("speed: %s on %d expert(s)", "; ".join(done), len(experts))


# ------------------------------------------------------------------------------------- fp8 matmuls

def _fp8_matmuls(model: torch.nn.Module, device: torch.device) -> None:
    """torchao's float8 dynamic-activation, float8-weight quantisation (per-row scales) of the linears
    inside the transformer blocks; the embeddings, norms and output projection stay in bf16.

    It composes with the memory plan: under fp8 storage (diffusers' layerwise casting) each block
    linear's casting hook comes off and its float8 weight returns to the compute dtype — exactly, as
    every float8_e4m3fn value is a bf16 value — one layer at a time (so never more than one layer in
    bf16), then torchao re-quantises it with a scale per row: the weights stay float8, the matmuls
    become float8. Streamed experts (group offload holds each block's host tensors) are re-streamed
    after. A GGUF expert keeps its own quantised layers (one warning)."""
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_

    if getattr(model, "is_quantized", False):
        log.warning("speed.fp8_matmul: not applied to a GGUF expert (it keeps its own quantised layers)")
        return
    if next(model.parameters()).is_meta:
        raise ConfigError("speed.fp8_matmul: this expert waits in its files (the memory plan's idle expert), "
                          "which fp8 matmuls cannot quantise ahead; raise memory.host_budget")
    was_streamed = streamed(model)
    if was_streamed:
        unstream_blocks(model)
    config = Float8DynamicActivationFloat8WeightConfig(granularity=PerRow())
    for name, layer in model.named_modules():
        if not (isinstance(layer, torch.nn.Linear) and name.startswith("blocks.")):
            continue
        registry = getattr(layer, "_diffusers_hook", None)      # diffusers' hooks on this layer, if any
        cast = registry.get_hook("layerwise_casting") if registry is not None else None
        if cast is not None:            # fp8 storage: back to the compute dtype (exact), then float8 per row
            # diffusers cannot remove a casting hook (its deinit raises): make it inert where it is called
            cast.fn_ref.pre_forward = lambda module, *args, **kwargs: (args, kwargs)
            cast.fn_ref.post_forward = lambda module, output: output
            layer.to(cast.compute_dtype)
        quantize_(layer, config)
    if was_streamed:
        stream_blocks(model, device)


# ------------------------------------------------------------------------------------- step cache

def _cache_config(speed: SpeedConfig, model: torch.nn.Module):
    import diffusers.hooks

    if speed.step_cache == "first_block":
        return diffusers.hooks.FirstBlockCacheConfig(threshold=speed.cache_threshold)
    # sea: diffusers' Wan adapter covers models whose input is the noisy latent alone (T2V, TI2V);
    # I2V feeds [latents, mask + image condition] on channels, so point the indicator at the latents.
    cfg = model.config
    callback = None
    if cfg.in_channels != cfg.out_channels:
        def callback(module, args, kwargs, _c=cfg.out_channels):
            hidden = kwargs.get("hidden_states", args[0] if args else None)     # [B, C, F, H, W]
            return list(hidden[:, :_c].unbind(0)) if hidden is not None and hidden.ndim == 5 else None
    return diffusers.hooks.SeaCacheConfig(threshold=speed.cache_threshold, raw_vision_callback=callback)


def cache_context(model: torch.nn.Module, name: str, *, step_index: int | None = None,
                  num_steps: int | None = None, sigma: float | torch.Tensor | None = None):
    """`model.cache_context(name, ...)` when a step cache is on, else a no-op context.

    Args:
        name: "cond" or "uncond" -- each keeps its own cached residuals (first_block needs only this).
        step_index: the sampling step (0-based, from the start of the render, also when resumed);
        num_steps: the render's step count; sigma: the step's sigma. sea (SeaCache) needs all three
            and otherwise runs every step in full.
    """
    if not getattr(model, "is_cache_enabled", False):
        return contextlib.nullcontext()
    where = {"step_index": step_index, "num_inference_steps": num_steps,
             "sigma": None if sigma is None else float(sigma)}
    return model.cache_context(name, **{k: v for k, v in where.items() if v is not None})


def reset_step_cache(models: Iterable[torch.nn.Module]) -> None:
    """Forget cached residuals (call at the start of each render: a cache must not cross renders)."""
    for model in models:
        if getattr(model, "is_cache_enabled", False):
            model._reset_stateful_cache()    # what diffusers' pipelines call after each run


# -------------------------------------------------------------------------------- attention backend

def _backend_problem(backend: SDPBackend, model: torch.nn.Module, device: torch.device) -> str | None:
    """Why `backend` cannot run this model's attention on `device` (None: it can)."""
    cfg = model.config
    q = torch.randn(1, cfg.num_attention_heads, 16, cfg.attention_head_dim, device=device, dtype=model.dtype)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, q, q)
            return None
        except RuntimeError:
            reasons = [str(w.message).splitlines()[0] for w in caught]
    return (f"{model.dtype}, head dim {cfg.attention_head_dim}: "
            + ("; ".join(reasons) if reasons else "PyTorch has no such kernel for this device"))


def _run_forward_under(model: torch.nn.Module, backend: SDPBackend) -> None:
    forward = model.forward

    def forward_with_backend(*args, **kwargs):
        with sdpa_kernel(backend):
            return forward(*args, **kwargs)

    model.forward = forward_with_backend


# ----------------------------------------------------------------------------------------- compile

class _Notice:
    """Warns once per apply_speed call, however many experts fall back."""

    warned = False

    def warn(self, what: str, error: BaseException) -> None:
        if not self.warned:
            self.warned = True
            first = (str(error).strip().splitlines() or [""])[0][:300]
            log.warning("speed.compile: torch.compile %s (%s: %s); running eagerly", what,
                        type(error).__name__, first)


def _uncompile(model: torch.nn.Module) -> None:
    # nn.Module.compile keeps the compiled call in `_compiled_call_impl`; None restores eager.
    for module in model.modules():
        module._compiled_call_impl = None


class _CompileGuard:
    """Stands in for the model's call: runs the compiled path; when that raises, reverts the model to
    eager and reruns the call eagerly. Eager success: the compiler was at fault, warn once and stay
    eager. Eager failure: the error is the call's own (shapes, memory), so re-arm and raise it."""

    def __init__(self, model: torch.nn.Module, mode: str, notice: _Notice):
        self.model, self.mode, self.notice = model, mode, notice
        if mode == "blocks":
            model.compile_repeated_blocks()
            self.compiled = model._call_impl           # eager shell; the blocks inside are compiled
        else:
            self.compiled = torch.compile(model._call_impl)
        model._compiled_call_impl = self

    def __call__(self, *args, **kwargs):
        try:
            return self.compiled(*args, **kwargs)
        except Exception as error:          # dynamo / inductor raise many types; the eager rerun sorts them
            _uncompile(self.model)
            _forget_partial_step(self.model)
            try:
                out = self.model._call_impl(*args, **kwargs)
            except Exception:
                _CompileGuard(self.model, self.mode, self.notice)
                raise
            self.notice.warn("failed when the model ran", error)
            return out


def _compile(model: torch.nn.Module, mode: str, notice: _Notice) -> None:
    try:
        _CompileGuard(model, mode, notice)
    except Exception as error:               # e.g. "torch.compile is not supported on Python 3.x"
        _uncompile(model)
        notice.warn("is unavailable", error)


def _forget_partial_step(model: torch.nn.Module) -> None:
    """A compiled call that failed midway may have stored half a step in the cache hooks: clear them,
    keeping the cache context the denoiser set for this call."""
    if not getattr(model, "is_cache_enabled", False):
        return
    from diffusers.hooks.hooks import HookRegistry, StateManager, _set_cache_context

    registry = HookRegistry.check_if_exists_or_initialize(model)
    contexts = [attr._context for reg in (registry, *registry._get_child_registries())
                for hook in reg.hooks.values() for attr in vars(hook).values()
                if isinstance(attr, StateManager) and attr._context is not None]
    model._reset_stateful_cache()
    if contexts:
        _set_cache_context(model, contexts[0])
