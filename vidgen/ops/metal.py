"""The Metal backend: the ops of reference.py as Metal kernels (kernels/metal/vae_ops.metal).

Imported only when the metal backend is chosen; nothing touches MPS before the first call, which
compiles the shader library once with torch.mps.compile_shader. compile_shader binds positional
argument i to buffer i and passes tensors as bare pointers (storage offset applied, no strides),
so each call is planned as a `Launch`: the tensors, then one int64 `meta` tensor with sizes and
element strides (layouts documented above each kernel), then float scalars, and a 3-d grid.
tests/test_kernels_metal.py runs the same plans on the CPU through the .metal source compiled
as C++, so the argument packing here is tested without a Mac.
"""

from __future__ import annotations

import functools
import importlib.resources
from dataclasses import dataclass

import torch

from . import shapes
from .reference import NORM_EPS, norm_scale

# dtype -> the suffix of the kernels' host names in vae_ops.metal
KERNEL_TYPES = {torch.float32: "float", torch.float16: "half", torch.bfloat16: "bfloat"}

_GROUP_THREADS = 256     # threads per threadgroup to aim for (a multiple of Apple's SIMD width 32)
_GRID_LIMIT = 2 ** 32    # thread_position_in_grid is a uint3, and the kernels index in 32 bits


@dataclass(frozen=True)
class Launch:
    """One kernel call, in compile_shader's argument order: *tensors, meta, *scalars."""

    kernel: str                          # host name, e.g. "rms_norm_silu_into_half"
    tensors: tuple[torch.Tensor, ...]
    meta: tuple[int, ...]                # sizes and element strides, as the kernel reads them
    scalars: tuple[float, ...]           # bound as `constant float&`
    grid: tuple[int, int, int]           # threads along x (W), y (H), z (the other dims)


def _kernel(op: str, *tensors: torch.Tensor) -> str:
    """`<op>_<type>` for tensors of one supported dtype."""
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1 or tensors[0].dtype not in KERNEL_TYPES:
        names = ", ".join(sorted(str(d) for d in dtypes))
        raise ValueError(f"{op}: the metal kernels take tensors of one dtype among float32, float16 and bfloat16, "
                         f"got {names}")
    return f"{op}_{KERNEL_TYPES[tensors[0].dtype]}"


def _grid(op: str, x: int, y: int, z: int) -> tuple[int, int, int]:
    if max(x, y, z) >= _GRID_LIMIT:
        raise ValueError(f"{op}: a grid of {x} x {y} x {z} threads exceeds Metal's 2^32 per dimension; "
                         "split the tensor")
    return x, y, z


def _launch_rms_norm_silu_into(x: torch.Tensor, gamma: torch.Tensor, out: torch.Tensor, eps: float,
                               silu: bool) -> Launch:
    shapes.rms_norm_silu_into(x, gamma, out)
    kernel = _kernel("rms_norm_silu_into", x, out)
    n, c, t, h, w = x.shape
    g32 = gamma.reshape(c).float().contiguous()      # the twin multiplies by gamma in float32 too
    meta = (*x.shape, *x.stride(), *out.stride(), int(silu))
    return Launch(kernel, (x, g32, out), meta, (float(eps), norm_scale(c)),
                  _grid("rms_norm_silu_into", w, h, n * t))


def _launch_causal_cache_shift(buf: torch.Tensor, cache: torch.Tensor, first: bool) -> Launch:
    shapes.causal_cache_shift(buf, cache)
    kernel = _kernel("causal_cache_shift", buf, cache)
    n, c, _, h, w = buf.shape
    meta = (*buf.shape, *buf.stride(), *cache.stride(), int(first))
    return Launch(kernel, (buf, cache), meta, (), _grid("causal_cache_shift", w, h, n * c))


def _launch_window_gather(src: torch.Tensor, out: torch.Tensor, y0: int, x0: int) -> Launch:
    shapes.window_gather(src, out)
    kernel = _kernel("window_gather", src, out)
    n, c, t, h, w = out.shape
    meta = (*out.shape, src.shape[3], src.shape[4], int(y0), int(x0), *src.stride(), *out.stride())
    return Launch(kernel, (src, out), meta, (), _grid("window_gather", w, h, n * c * t))


def _launch_upsample_nearest2x_into(x: torch.Tensor, out: torch.Tensor) -> Launch:
    shapes.upsample_nearest2x_into(x, out)
    kernel = _kernel("upsample_nearest2x_into", x, out)
    n, c, t, h, w = out.shape
    meta = (*out.shape, *x.stride(), *out.stride())
    return Launch(kernel, (x, out), meta, (), _grid("upsample_nearest2x_into", w, h, n * c * t))


def _launch_dup_up_add(y: torch.Tensor, x: torch.Tensor, factor_t: int, factor_s: int, first: bool) -> Launch:
    repeats, skip = shapes.dup_up_add(y, x, factor_t, factor_s, first)
    kernel = _kernel("dup_up_add", y, x)
    n, co, t, h, w = y.shape
    if co * factor_t * factor_s * factor_s >= _GRID_LIMIT:
        raise ValueError(f"dup_up_add: Co * factor_t * factor_s^2 = {co * factor_t * factor_s ** 2} "
                         "repeated channels exceed the kernel's 32-bit index")
    meta = (*y.shape, factor_t, factor_s, repeats, skip, *y.stride(), *x.stride())
    return Launch(kernel, (y, x), meta, (), _grid("dup_up_add", w, h, n * co * t))


def group_size(grid: tuple[int, int, int], max_threads: int) -> tuple[int, int, int]:
    """Threadgroup shape for `grid`: up to _GROUP_THREADS threads, filling x, then y, then z.

    compile_shader's default for a 3-d grid is (max threads, 1, 1), which leaves most of each
    group idle when W is small (latent frames are tens of pixels wide).
    """
    budget = min(_GROUP_THREADS, max_threads)
    gx = max(1, min(grid[0], budget))
    gy = max(1, min(grid[1], budget // gx))
    gz = max(1, min(grid[2], budget // (gx * gy)))
    return gx, gy, gz


@functools.cache
def _library():
    source = (importlib.resources.files("vidgen._kernels.metal") / "vae_ops.metal").read_text(encoding="ascii")
    return torch.mps.compile_shader(source)


@functools.lru_cache(maxsize=512)
def _meta_tensor(meta: tuple[int, ...], device: torch.device) -> torch.Tensor:
    # The decoder calls each op with the same few shapes every chunk: upload each layout once.
    # Kernels only read it, so one tensor can serve calls still in flight.
    return torch.tensor(meta, dtype=torch.int64, device=device)


def _run(launch: Launch) -> None:
    devices = {t.device.type for t in launch.tensors}
    if devices != {"mps"}:
        raise ValueError(f"{launch.kernel}: the metal kernels run on mps tensors, got {', '.join(sorted(devices))}")
    if 0 in launch.grid:
        return
    fn = getattr(_library(), launch.kernel)
    meta = _meta_tensor(launch.meta, launch.tensors[0].device)
    fn(*launch.tensors, meta, *launch.scalars, threads=list(launch.grid),
       group_size=list(group_size(launch.grid, fn.max_threads_per_threadgroup)))


def rms_norm_silu_into(x: torch.Tensor, gamma: torch.Tensor, out: torch.Tensor, eps: float = NORM_EPS,
                       silu: bool = True) -> None:
    _run(_launch_rms_norm_silu_into(x, gamma, out, eps, silu))


def causal_cache_shift(buf: torch.Tensor, cache: torch.Tensor, first: bool) -> None:
    _run(_launch_causal_cache_shift(buf, cache, first))


def window_gather(src: torch.Tensor, out: torch.Tensor, y0: int, x0: int) -> None:
    _run(_launch_window_gather(src, out, y0, x0))


def upsample_nearest2x_into(x: torch.Tensor, out: torch.Tensor) -> None:
    _run(_launch_upsample_nearest2x_into(x, out))


def dup_up_add(y: torch.Tensor, x: torch.Tensor, factor_t: int, factor_s: int, first: bool) -> None:
    _run(_launch_dup_up_add(y, x, factor_t, factor_s, first))
