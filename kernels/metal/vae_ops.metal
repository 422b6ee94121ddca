// Metal kernels for the VAE decoder's memory-bound ops; vidgen/ops/reference.py is the spec and
// vidgen/ops/metal.py the caller.
//
// torch.mps.compile_shader passes tensors as plain pointers (storage offset applied, no strides),
// so every kernel also takes `meta`, an int64 buffer of sizes and element strides (its layout is
// written above each kernel), and indexes through the strides: channels_last_3d tensors, slices
// such as buf[:, :, 2:] and stepped views need no copy. Offsets are 64-bit (`long`): a large
// activation has more than 2^31 elements. The grid is (W, H, the other outer dims), x fastest.
//
// tests/test_kernels_metal.py compiles this file unchanged as C++ (tests/metal/metal_compat.h)
// and runs every grid position on the CPU in shuffled order. That is why the kernels keep to one
// thread per output element (per location for the norm), use no threadgroup memory, barriers,
// simd functions, swizzles or textures, and write float literals with `f`. Keep the file ASCII:
// torch hands the source to Metal as an ASCII string.

#include <metal_stdlib>
using namespace metal;

#if __METAL_VERSION__ >= 320
// torch compiles in safe math mode unless PYTORCH_MPS_FAST_MATH=1; these pin the norm's rounding
// (no fused multiply-add, no reassociation) whatever the environment says.
#pragma METAL fp math_mode(safe)
#pragma METAL fp contract(off)
#endif

// Offset of element (n, c, t, y, x) of a 5-d tensor whose element strides are s[0..4].
inline long offset5(constant long* s, uint n, uint c, uint t, uint y, uint x) {
  return long(n) * s[0] + long(c) * s[1] + long(t) * s[2] + long(y) * s[3] + long(x) * s[4];
}

// exp(x) by the same float32 steps as reference.exp_f32 (and the Triton kernel), not Metal's
// exp, so SiLU gives the same bits on every backend: clamp to [-87, 88], k = floor(x log2e + 1/2),
// r = x - k ln2 (ln2 in two parts), degree-7 Taylor polynomial by Horner, times 2^k from its bits.
inline float exp_steps(const float x) {
  float t = x;
  if (t < -87.0f) {                  // comparisons with NaN are false: NaN stays NaN
    t = -87.0f;
  }
  if (t > 88.0f) {
    t = 88.0f;
  }
  float k = t * 1.4426950216293335f;
  k = metal::floor(k + 0.5f);
  if (k != k) {
    k = 0.0f;
  }
  float r = t - k * 0.693359375f;
  r = r - k * -0.00021219444170128554f;
  float p = r * 0.00019841270113829523f;
  p = p + 0.0013888889225199819f;
  p = p * r;
  p = p + 0.008333333767950535f;
  p = p * r;
  p = p + 0.0416666679084301f;
  p = p * r;
  p = p + 0.1666666716337204f;
  p = p * r;
  p = p + 0.5f;
  p = p * r;
  p = p + 1.0f;
  p = p * r;
  p = p + 1.0f;
  const float scale = as_type<float>((int(k) + 127) << 23);
  return p * scale;
}

// Index arithmetic is 32-bit (metal.py keeps every grid dimension below 2^32; 64-bit division is
// slow on Apple GPUs); only offsets are 64-bit.

// out = silu(x / max(||x||_2 over C, eps) * scale * gamma), one thread per (n, t, y, x).
// meta: N, C, T, H, W | x strides (5) | out strides (5) | silu. Grid: (W, H, N*T).
// gamma is C float32 values; scale is sqrt(C) rounded to float32 (reference.norm_scale).
// Every step is its own statement and rounds to float32 as the twin's tensor ops do: products
// then sums in channel order, correctly rounded sqrt and divisions, one rounding to T at the end.
template <typename T>
kernel void rms_norm_silu_into(device const T* x [[buffer(0)]],
                               device const float* gamma [[buffer(1)]],
                               device T* out [[buffer(2)]],
                               constant long* meta [[buffer(3)]],
                               constant float& eps [[buffer(4)]],
                               constant float& scale [[buffer(5)]],
                               uint3 gid [[thread_position_in_grid]]) {
  const uint C = uint(meta[1]), frames = uint(meta[2]);
  if (gid.x >= uint(meta[4]) || gid.y >= uint(meta[3]) || gid.z >= uint(meta[0]) * frames) {
    return;
  }
  constant long* sx = meta + 5;
  constant long* so = meta + 10;
  const uint n = gid.z / frames, t = gid.z % frames;
  const long xo = offset5(sx, n, 0, t, gid.y, gid.x);
  const long oo = offset5(so, n, 0, t, gid.y, gid.x);

  float ss = 0.0f;
  for (uint c = 0; c < C; ++c) {
    const float v = static_cast<float>(x[xo + long(c) * sx[1]]);
    const float sq = v * v;
    ss = ss + sq;
  }
  const float lo = eps;
  float nrm = precise::sqrt(ss);
  if (nrm < lo) {                    // clamp_min; a NaN passes through, as in torch
    nrm = lo;
  }

  const bool silu = meta[15] != 0;
  for (uint c = 0; c < C; ++c) {
    float y = precise::divide(static_cast<float>(x[xo + long(c) * sx[1]]), nrm);
    y = y * scale;
    y = y * gamma[c];
    if (silu) {
      const float e = exp_steps(-y);
      const float d = 1.0f + e;
      y = precise::divide(y, d);
    }
    out[oo + long(c) * so[1]] = static_cast<T>(y);
  }
}

// Hand a causal conv's last 2 input frames on: buf's head becomes the previous frames (zeros on
// the first chunk) and cache the last 2 frames of [head | chunk]. One thread per (n, c, y, x)
// does both frames, reading everything before writing, since with T = 1 one of the new cache
// frames is a head frame.
// meta: N, C, 2+T, H, W | buf strides (5) | cache strides (5) | first. Grid: (W, H, N*C).
template <typename T>
kernel void causal_cache_shift(device T* buf [[buffer(0)]],
                               device T* cache [[buffer(1)]],
                               constant long* meta [[buffer(2)]],
                               uint3 gid [[thread_position_in_grid]]) {
  const uint C = uint(meta[1]);
  if (gid.x >= uint(meta[4]) || gid.y >= uint(meta[3]) || gid.z >= uint(meta[0]) * C) {
    return;
  }
  constant long* sb = meta + 5;
  constant long* sc = meta + 10;
  const long bo = offset5(sb, gid.z / C, gid.z % C, 0, gid.y, gid.x);
  const long co = offset5(sc, gid.z / C, gid.z % C, 0, gid.y, gid.x);
  const long chunk = meta[2] - 2;    // this chunk's frames follow the 2 head frames in buf

  T h0 = T(0.0f);
  T h1 = T(0.0f);
  if (meta[15] == 0) {               // not the first chunk
    h0 = cache[co];
    h1 = cache[co + sc[2]];
  }
  // the new cache: frames `chunk` and `chunk + 1` of [h0, h1, buf[2], ..., buf[chunk + 1]]
  T k0 = chunk == 0 ? h0 : h1;
  if (chunk >= 2) {
    k0 = buf[bo + chunk * sb[2]];
  }
  T k1 = h1;
  if (chunk >= 1) {
    k1 = buf[bo + (chunk + 1) * sb[2]];
  }

  buf[bo] = h0;
  buf[bo + sb[2]] = h1;
  cache[co] = k0;
  cache[co + sc[2]] = k1;
}

// out[..., i, j] = src[..., y0 + i, x0 + j], zero outside src.
// meta: N, C, T, h, w (out) | H, W (src) | y0, x0 | src strides (5) | out strides (5).
// Grid: (w, h, N*C*T).
template <typename T>
kernel void window_gather(device const T* src [[buffer(0)]],
                          device T* out [[buffer(1)]],
                          constant long* meta [[buffer(2)]],
                          uint3 gid [[thread_position_in_grid]]) {
  const uint C = uint(meta[1]), frames = uint(meta[2]);
  if (gid.x >= uint(meta[4]) || gid.y >= uint(meta[3]) || gid.z >= uint(meta[0]) * C * frames) {
    return;
  }
  constant long* ss = meta + 9;
  constant long* so = meta + 14;
  const uint t = gid.z % frames, nc = gid.z / frames;
  const uint n = nc / C, c = nc % C;
  const long sy = meta[7] + long(gid.y), sx = meta[8] + long(gid.x);

  T v = T(0.0f);
  if (sy >= 0 && sy < meta[5] && sx >= 0 && sx < meta[6]) {
    v = src[offset5(ss, n, c, t, uint(sy), uint(sx))];
  }
  out[offset5(so, n, c, t, gid.y, gid.x)] = v;
}

// out[..., Y, X] = x[..., Y / 2, X / 2] (nearest-exact x2, as F.interpolate).
// meta: N, C, T, 2H, 2W (out) | x strides (5) | out strides (5). Grid: (2W, 2H, N*C*T).
template <typename T>
kernel void upsample_nearest2x_into(device const T* x [[buffer(0)]],
                                    device T* out [[buffer(1)]],
                                    constant long* meta [[buffer(2)]],
                                    uint3 gid [[thread_position_in_grid]]) {
  const uint C = uint(meta[1]), frames = uint(meta[2]);
  if (gid.x >= uint(meta[4]) || gid.y >= uint(meta[3]) || gid.z >= uint(meta[0]) * C * frames) {
    return;
  }
  constant long* sx = meta + 5;
  constant long* so = meta + 10;
  const uint t = gid.z % frames, nc = gid.z / frames;
  const uint n = nc / C, c = nc % C;
  out[offset5(so, n, c, t, gid.y, gid.x)] = x[offset5(sx, n, c, t, gid.y / 2, gid.x / 2)];
}

// y += DupUp3D(x), Wan2.2's channel repeat + time/space shuffle. After repeat_interleave(repeats)
// and view(n, Co, ft, fs, fs, t, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4), element
// (co, ti * ft + a, hi * fs + b, wi * fs + d) comes from channel (((co * ft + a) * fs + b) * fs + d)
// / repeats at (ti, hi, wi); the first chunk drops its first ft - 1 frames (`skip`). The sum is
// taken in float32 and rounded once, as torch's add_ does for half and bfloat16.
// meta: N, Co, T', Y, X (y) | ft, fs, repeats, skip | y strides (5) | x strides (5).
// Grid: (X, Y, N*Co*T').
template <typename T>
kernel void dup_up_add(device T* y [[buffer(0)]],
                       device const T* x [[buffer(1)]],
                       constant long* meta [[buffer(2)]],
                       uint3 gid [[thread_position_in_grid]]) {
  const uint C = uint(meta[1]), frames = uint(meta[2]);
  if (gid.x >= uint(meta[4]) || gid.y >= uint(meta[3]) || gid.z >= uint(meta[0]) * C * frames) {
    return;
  }
  const uint ft = uint(meta[5]), fs = uint(meta[6]), repeats = uint(meta[7]);
  constant long* sy = meta + 9;
  constant long* sx = meta + 14;
  const uint tp = gid.z % frames, nc = gid.z / frames;
  const uint n = nc / C, co = nc % C;
  const uint tt = tp + uint(meta[8]);
  const uint a = tt % ft, b = gid.y % fs, d = gid.x % fs;
  const uint src = (((co * ft + a) * fs + b) * fs + d) / repeats;

  const long yo = offset5(sy, n, co, tp, gid.y, gid.x);
  const float add = static_cast<float>(x[offset5(sx, n, src, tt / ft, gid.y / fs, gid.x / fs)]);
  const float sum = static_cast<float>(y[yo]) + add;
  y[yo] = static_cast<T>(sum);
}

// Host names are `<op>_<type>`; vidgen/ops/metal.py picks one by dtype.
#define VIDGEN_INSTANTIATE(T)                                                                      \
  template [[host_name("rms_norm_silu_into_" #T)]] kernel void rms_norm_silu_into<T>(              \
      device const T* x [[buffer(0)]], device const float* gamma [[buffer(1)]],                    \
      device T* out [[buffer(2)]], constant long* meta [[buffer(3)]],                              \
      constant float& eps [[buffer(4)]], constant float& scale [[buffer(5)]],                      \
      uint3 gid [[thread_position_in_grid]]);                                                      \
  template [[host_name("causal_cache_shift_" #T)]] kernel void causal_cache_shift<T>(              \
      device T* buf [[buffer(0)]], device T* cache [[buffer(1)]],                                  \
      constant long* meta [[buffer(2)]], uint3 gid [[thread_position_in_grid]]);                   \
  template [[host_name("window_gather_" #T)]] kernel void window_gather<T>(                        \
      device const T* src [[buffer(0)]], device T* out [[buffer(1)]],                              \
      constant long* meta [[buffer(2)]], uint3 gid [[thread_position_in_grid]]);                   \
  template [[host_name("upsample_nearest2x_into_" #T)]] kernel void upsample_nearest2x_into<T>(    \
      device const T* x [[buffer(0)]], device T* out [[buffer(1)]],                                \
      constant long* meta [[buffer(2)]], uint3 gid [[thread_position_in_grid]]);                   \
  template [[host_name("dup_up_add_" #T)]] kernel void dup_up_add<T>(                              \
      device T* y [[buffer(0)]], device const T* x [[buffer(1)]],                                  \
      constant long* meta [[buffer(2)]], uint3 gid [[thread_position_in_grid]]);

VIDGEN_INSTANTIATE(float)
VIDGEN_INSTANTIATE(half)
#if __METAL_VERSION__ >= 310
VIDGEN_INSTANTIATE(bfloat)   // bfloat arrived in Metal 3.1 (macOS 14)
#endif
