// Just enough of Metal for g++ 12 to compile kernels/metal/*.metal unchanged as C++, so that
// tests/test_kernels_metal.py can run the kernels on the CPU (there is no Mac in CI). It checks
// the kernels' logic, not that Apple's compiler accepts them; the MPS tests in the same file do
// that where MPS exists.
//
// Mapping: address-space qualifiers and `kernel` vanish; Metal attributes ([[buffer(i)]],
// [[thread_position_in_grid]], [[host_name(..)]]) are unknown to g++, which ignores them with a
// -Wattributes warning silenced below; half is _Float16 (rounds to nearest even on conversion,
// like the GPU); bfloat is a struct that rounds to nearest even from float. Kernels only convert
// half/bfloat to float and back, so neither type needs arithmetic here.
#pragma once

// Every standard header comes before the macros: `thread`, `device` and `constant` are ordinary
// names in the standard library (std::thread).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#pragma GCC diagnostic ignored "-Wattributes"

#define __METAL_VERSION__ 310
#define kernel
#define device
#define constant
#define thread

typedef unsigned int uint;

struct uint2 {
  uint x, y;
};

struct uint3 {
  uint x, y, z;
};

typedef _Float16 half;

struct bfloat {
  uint16_t bits;

  bfloat() = default;

  bfloat(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = static_cast<uint16_t>((u >> 16) | 0x0040u);     // NaN stays a (quiet) NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);                        // round to nearest, ties to even
      bits = static_cast<uint16_t>(u >> 16);
    }
  }

  operator float() const {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  }
};

namespace metal {
namespace precise {

// IEEE single precision, correctly rounded (SSE), as Metal's precise:: variants promise.
inline float sqrt(float x) { return std::sqrt(x); }
inline float divide(float x, float y) { return x / y; }
}  // namespace precise

inline float floor(float x) { return std::floor(x); }

}  // namespace metal

// Metal's bit cast between same-size types.
template <typename To, typename From>
inline To as_type(From v) {
  static_assert(sizeof(To) == sizeof(From), "as_type needs types of one size");
  To out;
  std::memcpy(&out, &v, sizeof out);
  return out;
}
