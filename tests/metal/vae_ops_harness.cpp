// CPU launchers for the Metal kernels of kernels/metal/vae_ops.metal, for
// tests/test_kernels_metal.py (built with g++ -I tests/metal -I kernels/metal, loaded with ctypes).
//
// Every launcher has one C signature:
//   launch_<op>_<type>(void** tensors, long* meta, const float* scalars, const unsigned* grid,
//                      unsigned seed)
// taking the arguments in the order vidgen/ops/metal.py binds them to buffers. It calls the kernel
// once per position of the (x, y, z) grid, in an order shuffled by `seed`: a kernel whose threads
// depend on one another's writes, or on running in order, gives wrong results here as on a GPU.
#include "metal_compat.h"
#include "vae_ops.metal"

namespace {

template <typename Body>
void for_each_thread(const unsigned* grid, unsigned seed, Body body) {
  std::vector<uint3> ids;
  ids.reserve(static_cast<size_t>(grid[0]) * grid[1] * grid[2]);
  for (uint z = 0; z < grid[2]; ++z) {
    for (uint y = 0; y < grid[1]; ++y) {
      for (uint x = 0; x < grid[0]; ++x) {
        ids.push_back(uint3{x, y, z});
      }
    }
  }
  std::mt19937 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  for (const uint3& id : ids) {
    body(id);
  }
}

}  // namespace

#define VIDGEN_LAUNCHERS(T)                                                                       \
  extern "C" void launch_rms_norm_silu_into_##T(void** p, long* meta, const float* f,             \
                                                const unsigned* grid, unsigned seed) {            \
    float eps = f[0], scale = f[1];                                                               \
    for_each_thread(grid, seed, [&](uint3 id) {                                                   \
      rms_norm_silu_into<T>(static_cast<const T*>(p[0]), static_cast<const float*>(p[1]),         \
                            static_cast<T*>(p[2]), meta, eps, scale, id);                         \
    });                                                                                           \
  }                                                                                               \
  extern "C" void launch_causal_cache_shift_##T(void** p, long* meta, const float*,               \
                                                const unsigned* grid, unsigned seed) {            \
    for_each_thread(grid, seed, [&](uint3 id) {                                                   \
      causal_cache_shift<T>(static_cast<T*>(p[0]), static_cast<T*>(p[1]), meta, id);              \
    });                                                                                           \
  }                                                                                               \
  extern "C" void launch_window_gather_##T(void** p, long* meta, const float*,                    \
                                           const unsigned* grid, unsigned seed) {                 \
    for_each_thread(grid, seed, [&](uint3 id) {                                                   \
      window_gather<T>(static_cast<const T*>(p[0]), static_cast<T*>(p[1]), meta, id);             \
    });                                                                                           \
  }                                                                                               \
  extern "C" void launch_upsample_nearest2x_into_##T(void** p, long* meta, const float*,          \
                                                     const unsigned* grid, unsigned seed) {       \
    for_each_thread(grid, seed, [&](uint3 id) {                                                   \
      upsample_nearest2x_into<T>(static_cast<const T*>(p[0]), static_cast<T*>(p[1]), meta, id);   \
    });                                                                                           \
  }                                                                                               \
  extern "C" void launch_dup_up_add_##T(void** p, long* meta, const float*, const unsigned* grid, \
                                        unsigned seed) {                                          \
    for_each_thread(grid, seed, [&](uint3 id) {                                                   \
      dup_up_add<T>(static_cast<T*>(p[0]), static_cast<const T*>(p[1]), meta, id);                \
    });                                                                                           \
  }

VIDGEN_LAUNCHERS(float)
VIDGEN_LAUNCHERS(half)
VIDGEN_LAUNCHERS(bfloat)
