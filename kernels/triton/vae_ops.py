"""Triton kernels for the VAE decoder's memory-bound ops (twins: vidgen/ops/reference.py).

Every kernel takes sizes and element strides, so channels_last_3d tensors and slices of a larger
buffer need no copy. Offsets are int64 (a Wan2.2 head activation at 720p has over 2^31 bytes).
Arithmetic follows the twins step by step: float32 throughout, IEEE division and sqrt
(div_rn/sqrt_rn; Triton's `/` on fp32 is approximate on GPUs), and launches pass
enable_fp_fusion=False so `acc + v * v` is not contracted into an FMA. SiLU's exp is spelled out
(`_exp_f32`, the twin's exp_f32 step by step) instead of the device's, so fp32 results are
bit-identical to the twin's and half results round the same float32 value.
"""

from __future__ import annotations

import triton
import triton.language as tl

BLOCK = 256          # locations / elements per program
_OPTS = {"enable_fp_fusion": False}


@triton.jit
def _split4(i, s1, s2, s3):
    """Flat index -> (i0, i1, i2, i3) for sizes [*, s1, s2, s3] (last fastest)."""
    i3 = i % s3
    i = i // s3
    i2 = i % s2
    i = i // s2
    return i // s1, i % s1, i2, i3


@triton.jit
def _split5(i, s1, s2, s3, s4):
    i4 = i % s4
    i = i // s4
    a, b, c, d = _split4(i, s1, s2, s3)
    return a, b, c, d, i4


@triton.jit
def _round_to(y, ty: tl.constexpr):
    """float32 -> `ty`, rounding to nearest even. Spelled out for bfloat16: Triton's interpreter
    truncates that cast (GPUs round), and the tests run the kernels in the interpreter."""
    if ty == tl.bfloat16:
        bits = y.to(tl.uint32, bitcast=True)
        r = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        r = tl.where(y != y, 0x7FC0, r)           # NaN stays NaN
        return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return y.to(ty)


@triton.jit
def _exp_f32(x):
    """reference.exp_f32: clamp, k = floor(x log2e + 1/2), r = x - k ln2 in two parts, Horner's
    degree-7 Taylor polynomial, times 2^k from its bits (the constants are reference.py's)."""
    t = tl.where(x < -87.0, -87.0, x)
    t = tl.where(t > 88.0, 88.0, t)
    k = tl.floor(t * 1.4426950216293335 + 0.5)
    k = tl.where(k != k, 0.0, k)
    r = t - k * 0.693359375
    r = r - k * -0.00021219444170128554
    p = r * 0.00019841270113829523 + 0.0013888889225199819
    p = p * r + 0.008333333767950535
    p = p * r + 0.0416666679084301
    p = p * r + 0.1666666716337204
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    scale = ((k.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    return p * scale


@triton.jit
def _rms_norm_silu_kernel(x_ptr, g_ptr, out_ptr, n_loc, C, T, H, W,
                          sxn, sxc, sxt, sxh, sxw, son, soc, sot, soh, sow,
                          eps, scale, SILU: tl.constexpr, BLOCK: tl.constexpr):
    # one lane per (n, t, h, w) location; loops over channels twice (sum of squares, then write)
    loc = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = loc < n_loc
    n, t, h, w = _split4(loc, T, H, W)
    xo = n * sxn + t * sxt + h * sxh + w * sxw
    oo = n * son + t * sot + h * soh + w * sow
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for c in range(0, C):
        v = tl.load(x_ptr + xo + c * sxc, mask=mask, other=0.0).to(tl.float32)
        acc = acc + v * v
    nrm = tl.maximum(tl.sqrt_rn(acc), eps)
    for c in range(0, C):
        v = tl.load(x_ptr + xo + c * sxc, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + c).to(tl.float32)
        y = tl.math.div_rn(v, nrm) * scale
        y = y * g
        if SILU:
            y = tl.math.div_rn(y, 1.0 + _exp_f32(-y))
        tl.store(out_ptr + oo + c * soc, _round_to(y, out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _cache_shift_kernel(buf_ptr, cache_ptr, n_loc, C, T, H, W,
                        sbn, sbc, sbt, sbh, sbw, scn, scc, sct, sch, scw,
                        FIRST: tl.constexpr, BLOCK: tl.constexpr):
    # one lane per (n, c, h, w) location, handling both frames: reads everything before writing
    loc = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = loc < n_loc
    n, c, h, w = _split4(loc, C, H, W)
    bo = n * sbn + c * sbc + h * sbh + w * sbw
    co = n * scn + c * scc + h * sch + w * scw
    if FIRST:
        p0 = tl.zeros([BLOCK], dtype=buf_ptr.dtype.element_ty)
        p1 = tl.zeros([BLOCK], dtype=buf_ptr.dtype.element_ty)
    else:
        p0 = tl.load(cache_ptr + co, mask=mask)
        p1 = tl.load(cache_ptr + co + sct, mask=mask)
    # the last two frames of [head | chunk] sit at buffer frames T and T+1 (T = chunk length);
    # for T == 1 the first of them is head frame 1, i.e. p1
    last1 = tl.load(buf_ptr + bo + (T + 1) * sbt, mask=mask)
    if T >= 2:
        last0 = tl.load(buf_ptr + bo + T * sbt, mask=mask)
    else:
        last0 = p1
    tl.store(buf_ptr + bo, p0, mask=mask)
    tl.store(buf_ptr + bo + sbt, p1, mask=mask)
    tl.store(cache_ptr + co, last0, mask=mask)
    tl.store(cache_ptr + co + sct, last1, mask=mask)


@triton.jit
def _window_gather_kernel(src_ptr, out_ptr, numel, C, T, h, w, H, W, y0, x0,
                          ssn, ssc, sst, ssh, ssw, son, soc, sot, soh, sow, BLOCK: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < numel
    n, c, t, i, j = _split5(idx, C, T, h, w)
    y = i + y0
    x = j + x0
    inside = mask & (y >= 0) & (y < H) & (x >= 0) & (x < W)
    v = tl.load(src_ptr + n * ssn + c * ssc + t * sst + y * ssh + x * ssw, mask=inside, other=0.0)
    tl.store(out_ptr + n * son + c * soc + t * sot + i * soh + j * sow, v, mask=mask)


@triton.jit
def _upsample2x_kernel(x_ptr, out_ptr, numel, C, T, H2, W2,
                       sxn, sxc, sxt, sxh, sxw, son, soc, sot, soh, sow, BLOCK: tl.constexpr):
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < numel
    n, c, t, i, j = _split5(idx, C, T, H2, W2)
    v = tl.load(x_ptr + n * sxn + c * sxc + t * sxt + (i // 2) * sxh + (j // 2) * sxw, mask=mask)
    tl.store(out_ptr + n * son + c * soc + t * sot + i * soh + j * sow, v, mask=mask)


@triton.jit
def _dup_up_add_kernel(y_ptr, x_ptr, numel, Co, Ty, Hy, Wy, ft, fs, repeats, t_skip,
                       syn, syc, syt, syh, syw, sxn, sxc, sxt, sxh, sxw, BLOCK: tl.constexpr):
    # DupUp3D: y frame (t * ft + a - t_skip), row (h * fs + b), col (w * fs + d) of out channel co
    # comes from input channel (((co * ft + a) * fs + b) * fs + d) // repeats at (t, h, w)
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < numel
    n, co, tt, yy, xx = _split5(idx, Co, Ty, Hy, Wy)
    tf = tt + t_skip
    t, a = tf // ft, tf % ft
    h, b = yy // fs, yy % fs
    w, d = xx // fs, xx % fs
    src = (((co * ft + a) * fs + b) * fs + d) // repeats
    yo = n * syn + co * syc + tt * syt + yy * syh + xx * syw
    v = tl.load(x_ptr + n * sxn + src * sxc + t * sxt + h * sxh + w * sxw, mask=mask).to(tl.float32)
    acc = tl.load(y_ptr + yo, mask=mask).to(tl.float32) + v
    tl.store(y_ptr + yo, _round_to(acc, y_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------------- launchers


def _grid(n: int):
    return (triton.cdiv(n, BLOCK),)


def rms_norm_silu_into(x, gamma, out, eps: float, scale: float, silu: bool) -> None:
    n, c, t, h, w = x.shape
    n_loc = n * t * h * w
    if n_loc:
        _rms_norm_silu_kernel[_grid(n_loc)](x, gamma, out, n_loc, c, t, h, w, *x.stride(), *out.stride(),
                                            eps, scale, SILU=silu, BLOCK=BLOCK, **_OPTS)


def causal_cache_shift(buf, cache, first: bool) -> None:
    n, c, t2, h, w = buf.shape
    n_loc = n * c * h * w
    if n_loc:
        _cache_shift_kernel[_grid(n_loc)](buf, cache, n_loc, c, t2 - 2, h, w, *buf.stride(), *cache.stride(),
                                          FIRST=first, BLOCK=BLOCK, **_OPTS)


def window_gather(src, out, y0: int, x0: int) -> None:
    n, c, t, h, w = out.shape
    if out.numel():
        _window_gather_kernel[_grid(out.numel())](src, out, out.numel(), c, t, h, w, src.shape[3], src.shape[4],
                                                  y0, x0, *src.stride(), *out.stride(), BLOCK=BLOCK, **_OPTS)


def upsample_nearest2x_into(x, out) -> None:
    n, c, t, h2, w2 = out.shape
    if out.numel():
        _upsample2x_kernel[_grid(out.numel())](x, out, out.numel(), c, t, h2, w2, *x.stride(), *out.stride(),
                                               BLOCK=BLOCK, **_OPTS)


def dup_up_add(y, x, factor_t: int, factor_s: int, repeats: int, t_skip: int) -> None:
    n, co, ty, hy, wy = y.shape
    if y.numel():
        _dup_up_add_kernel[_grid(y.numel())](y, x, y.numel(), co, ty, hy, wy, factor_t, factor_s, repeats, t_skip,
                                             *y.stride(), *x.stride(), BLOCK=BLOCK, **_OPTS)
