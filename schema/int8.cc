#include "schema/int8.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "schema/vector_clones.h"

namespace tether {
namespace {

constexpr uint32_t kInfinityBits = 0x7f800000u;

// Whether a float's bits are those of an infinity or a NaN.
inline bool NonFiniteBits(uint32_t bits) {
  return (bits & 0x7fffffffu) >= kInfinityBits;
}

inline uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// The largest finite magnitude of `in`, as the bits of a non-negative float
// (whose integer order is the float order).
TETHER_VECTOR_CLONES uint32_t MaxFiniteMagnitudeBits(const float* in,
                                                     size_t n) {
  uint32_t most = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t magnitude = Bits(in[i]) & 0x7fffffffu;
    most = std::max(most, magnitude < kInfinityBits ? magnitude : 0u);
  }
  return most;
}

// The group's scale, and the factor that maps its finite values onto
// [-127, 127]; 0 for a group whose finite values are all zero, or too
// small to scale (below about 1e-36).
float GroupScale(const float* in, size_t n, float* to_steps) {
  const uint32_t bits = MaxFiniteMagnitudeBits(in, n);
  float most;
  std::memcpy(&most, &bits, sizeof most);
  // Below this, 127 / most would overflow: such a group goes as zeros.
  if (most < std::numeric_limits<float>::min() * 128.0f) {
    *to_steps = 0.0f;
    return 0.0f;
  }
  *to_steps = 127.0f / most;
  return most / 127.0f;
}

// A uniform float in [0, 1) from a 32-bit hash of (seed, index).
inline float Dither(uint32_t seed, uint32_t index) {
  uint32_t h = seed ^ (index * 0x9e3779b1u);
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
}

// Steps are in [-127, 127] before rounding; 128 is added so that the
// truncating conversion rounds down (floor) on positive values only. A
// NaN or an infinity becomes kInt8NonFinite.
inline int8_t Step(float value, float to_steps, float offset) {
  const bool bad = NonFiniteBits(Bits(value));
  const float shifted = (bad ? 0.0f : value) * to_steps + offset;
  const int q = std::clamp(static_cast<int>(shifted) - 128, -127, 127);
  return bad ? kInt8NonFinite : static_cast<int8_t>(q);
}

TETHER_VECTOR_CLONES void Nearest(const float* in, size_t n, float to_steps,
                                  int8_t* out) {
  for (size_t i = 0; i < n; ++i) {
    out[i] = Step(in[i], to_steps, 128.5f);
  }
}

TETHER_VECTOR_CLONES void Dithered(const float* in, size_t n, float to_steps,
                                   uint32_t seed, uint32_t first, int8_t* out) {
  for (size_t i = 0; i < n; ++i) {
    const float u = Dither(seed, first + static_cast<uint32_t>(i));
    out[i] = Step(in[i], to_steps, 128.0f + u);
  }
}

template <typename Round>
void Quantize(std::span<const float> in, int8_t* out, float* scales,
              Round round) {
  for (size_t g = 0; g * kInt8Group < in.size(); ++g) {
    const size_t first = g * kInt8Group;
    const size_t n = std::min(kInt8Group, in.size() - first);
    float to_steps = 0.0f;
    scales[g] = GroupScale(in.data() + first, n, &to_steps);
    round(in.data() + first, n, to_steps, first, out + first);
  }
}

}  // namespace

void ToInt8(std::span<const float> in, int8_t* out, float* scales) {
  Quantize(in, out, scales,
           [](const float* from, size_t n, float to_steps, size_t, int8_t* to) {
             Nearest(from, n, to_steps, to);
           });
}

void ToInt8Dithered(std::span<const float> in, uint32_t seed, int8_t* out,
                    float* scales) {
  Quantize(in, out, scales,
           [seed](const float* from, size_t n, float to_steps, size_t first,
                  int8_t* to) {
             Dithered(from, n, to_steps, seed, static_cast<uint32_t>(first),
                      to);
           });
}

TETHER_VECTOR_CLONES void FromInt8(std::span<const int8_t> in,
                                   const float* scales, float* out) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t i = 0; i < in.size(); ++i) {
    out[i] = in[i] == kInt8NonFinite
                 ? nan
                 : static_cast<float>(in[i]) * scales[i / kInt8Group];
  }
}

uint32_t Int8Seed(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = a * 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 31) ^ b) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 29) ^ c) * 0x94d049bb133111ebull;
  return static_cast<uint32_t>(h ^ (h >> 32));
}

}  // namespace tether
