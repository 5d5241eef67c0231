#include "schema/int8.h"

#include <algorithm>
#include <bit>
#include <limits>

#include "schema/float_bits.h"
#include "schema/vector_clones.h"

namespace tether {
namespace {

// The largest finite magnitude of `in`, as the bits of a non-negative float
// (whose integer order is the float order).
TETHER_VECTOR_CLONES uint32_t MaxFiniteMagnitudeBits(const float* in,
                                                     size_t n) {
  uint32_t most = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t magnitude = AbsBits(in[i]);
    most = std::max(most, magnitude < kInfinityBits ? magnitude : 0u);
  }
  return most;
}

// The group's scale, and the factor that maps its finite values onto
// [-127, 127]; 0 for a group whose finite values are all zero, or too
// small to scale (below about 1e-36).
float GroupScale(const float* in, size_t n, float* to_steps) {
  const float most = std::bit_cast<float>(MaxFiniteMagnitudeBits(in, n));
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
  const bool bad = NonFinite(value);
  const float shifted = (bad ? 0.0f : value) * to_steps + offset;
  const int q = std::clamp(static_cast<int>(shifted) - 128, -127, 127);
  return bad ? kInt8NonFinite : static_cast<int8_t>(q);
}

// Rounds each value of `in` to one of the two steps around it: to the
// nearest (an offset of half a step) or, with `dithered`, stochastically,
// by the dither of its index in the whole sequence (`first` + i).
TETHER_VECTOR_CLONES void Round(const float* in, size_t n, float to_steps,
                                bool dithered, uint32_t seed, uint32_t first,
                                int8_t* out) {
  for (size_t i = 0; i < n; ++i) {
    const float u =
        dithered ? Dither(seed, first + static_cast<uint32_t>(i)) : 0.5f;
    out[i] = Step(in[i], to_steps, 128.0f + u);
  }
}

void Quantize(std::span<const float> in, bool dithered, uint32_t seed,
              int8_t* out, float* scales) {
  for (size_t g = 0; g * kInt8Group < in.size(); ++g) {
    const size_t first = g * kInt8Group;
    const size_t n = std::min(kInt8Group, in.size() - first);
    float to_steps = 0.0f;
    scales[g] = GroupScale(in.data() + first, n, &to_steps);
    Round(in.data() + first, n, to_steps, dithered, seed,
          static_cast<uint32_t>(first), out + first);
  }
}

}  // namespace

void ToInt8(std::span<const float> in, int8_t* out, float* scales) {
  Quantize(in, false, 0, out, scales);
}

void ToInt8Dithered(std::span<const float> in, uint32_t seed, int8_t* out,
                    float* scales) {
  Quantize(in, true, seed, out, scales);
}

TETHER_VECTOR_CLONES void FromInt8(std::span<const int8_t> in,
                                   const float* scales, float* out,
                                   size_t first) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (size_t i = 0; i < in.size(); ++i) {
    out[i] = in[i] == kInt8NonFinite
                 ? nan
                 : static_cast<float>(in[i]) * scales[(first + i) / kInt8Group];
  }
}

uint32_t Int8Seed(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = a * 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 31) ^ b) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 29) ^ c) * 0x94d049bb133111ebull;
  return static_cast<uint32_t>(h ^ (h >> 32));
}

}  // namespace tether
