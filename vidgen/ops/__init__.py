"""The VAE decoder's memory-bound ops, as torch custom ops with one backend per device.

Backends (`vae.kernels`): "torch" (fast.py: vectorised PyTorch, the CPU path), "reference"
(reference.py: the plain-PyTorch twin that computes the kernels' exact bits, the oracle of their
tests), "triton" (CUDA; also CPU under TRITON_INTERPRET=1 for tests), "metal" (Apple GPUs, via
torch.mps.compile_shader). "auto" picks triton on CUDA when Triton imports, metal on MPS, torch
elsewhere. The decoder gets a `VaeOps` table from `op_table(kernels, device)` once per decode and
calls every op through it, so the same loop runs on every backend. Kernel libraries are imported
only when their backend is chosen.

Each op is registered as `vidgen::<op>` (torch) and `vidgen::<op>_<backend>` with a fake
implementation, so torch.compile can trace a decode and torch.library.opcheck can check each one.
"""

from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass
from typing import Callable

import torch

from ..config import KERNELS
from ..errors import ConfigError, MissingExtra, install_hint
from . import fast, reference

log = logging.getLogger("vidgen")

BACKENDS = KERNELS      # the registered names live in config.py

# op name -> the arguments it writes (all ops return nothing)
OPS = {
    "rms_norm_silu_into": ("out",),
    "causal_cache_shift": ("buf", "cache"),
    "window_gather": ("out",),
    "upsample_nearest2x_into": ("out",),
    "dup_up_add": ("y",),
}

# backend -> module that defines one function per op with reference.py's signatures
_MODULES = {"torch": "vidgen.ops.fast", "reference": "vidgen.ops.reference", "triton": "vidgen.ops.triton",
            "metal": "vidgen.ops.metal"}


@dataclass(frozen=True)
class VaeOps:
    """One backend's ops; attribute names are the op names in OPS."""

    backend: str
    rms_norm_silu_into: Callable
    causal_cache_shift: Callable
    window_gather: Callable
    upsample_nearest2x_into: Callable
    dup_up_add: Callable


def _no_output(*args, **kwargs) -> None:
    return None


def _register(backend: str) -> VaeOps:
    module = importlib.import_module(_MODULES[backend])
    suffix = "" if backend == "torch" else "_" + backend
    ops = {}
    for name, mutates in OPS.items():
        op = torch.library.custom_op(f"vidgen::{name}{suffix}", getattr(module, name), mutates_args=mutates)
        op.register_fake(_no_output)
        ops[name] = op
    return VaeOps(backend, **ops)


_REGISTERED: dict[str, VaeOps] = {}
_LOGGED: set[tuple[str, str]] = set()


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:      # an ImportError, or a broken install that fails while importing
        return False
    return True


def metal_available() -> bool:
    return torch.backends.mps.is_available() and hasattr(torch.mps, "compile_shader")


def resolve_backend(kernels: str, device: torch.device | str) -> str:
    """The backend that `kernels` means on `device`.

    Raises:
        ConfigError: an unknown name, or a backend that cannot run on this device.
    """
    dev = torch.device(device).type
    if kernels not in BACKENDS:
        raise ConfigError(f"vae.kernels: {kernels!r} is not one of {', '.join(BACKENDS)}")
    if kernels == "auto":
        if dev == "cuda" and triton_available():
            return "triton"
        if dev == "mps" and metal_available():
            return "metal"
        if dev in ("cuda", "mps") and (dev, "auto") not in _LOGGED:
            _LOGGED.add((dev, "auto"))
            why = f"Triton does not import ({install_hint('triton')})" if dev == "cuda" else \
                "this torch has no torch.mps.compile_shader (needs torch >= 2.7)"
            log.warning("vae.kernels auto: %s; the VAE decode uses the plain PyTorch ops on %s", why, dev)
        return "torch"
    if kernels == "triton":
        if not triton_available():
            raise MissingExtra(f"vae.kernels: triton needs Triton installed ({install_hint('triton')}); "
                              "or use auto")
        if dev != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ConfigError(f"vae.kernels: triton runs on CUDA devices, not {dev} "
                              "(TRITON_INTERPRET=1 runs it on the CPU, slowly, for tests); use auto")
    if kernels == "metal" and not (dev == "mps" and metal_available()):
        raise ConfigError(f"vae.kernels: metal runs on Apple GPUs (mps) with torch >= 2.7, not {dev}; use auto")
    return kernels


def op_table(kernels: str = "auto", device: torch.device | str = "cpu") -> VaeOps:
    """The op table for `kernels` on `device` (registering that backend's custom ops on first use)."""
    backend = resolve_backend(kernels, device)
    if backend not in _REGISTERED:
        _REGISTERED[backend] = _register(backend)
    return _REGISTERED[backend]


def workspace_bytes(op: str, args: tuple) -> int:
    """Transient bytes the PyTorch backend of `op` allocates with these arguments: the fast torch
    backend's for `vidgen::<op>` (what the memory planner simulates with; the kernels allocate
    nothing), the reference twin's for `vidgen::<op>_reference`."""
    base = op.split("::")[-1].split(".")[0]
    reference_twin = base.endswith("_reference")
    for backend in ("_triton", "_metal", "_reference"):
        base = base.removesuffix(backend)
    if base == "rms_norm_silu_into" and not reference_twin:
        x = args[0]
        n, c, t, h, w = x.shape
        # the squared band of rows, gamma in float32 times sqrt(C), and the allocator's rounding of those
        small = 4 * min(fast.SQUARES_ELEMENTS, x.numel()) + 2 * c * 4 + 2048
        if x.dtype == torch.float32:
            return n * t * h * w * 4 + small            # the norm over channels
        return (c + 1) * n * h * w * 4 + small          # one frame in float32 and its norm
    if base == "rms_norm_silu_into":
        x = args[0]
        n, c, t, h, w = x.shape
        if x.dtype == torch.float32:
            # the sum of squares, a product and the norm in float64; then the norm and SiLU's scratch
            scratch = 4 * reference.silu_group(c, n * t * h * w)       # channels of exp_f32's scratch
            return max(3, 1 + scratch) * n * t * h * w * 4
        scratch = 4 * reference.silu_group(c, n * h * w)
        return (2 * c + scratch) * n * h * w * 4          # one frame in float32, its result, SiLU's scratch
    if base == "dup_up_add":
        y = args[0]
        n, co, _, hy, wy = y.shape
        t = args[1].shape[2] * args[2]
        return 2 * n * co * t * hy * wy * y.element_size()   # the repeated and the shuffled copies
    return 0
