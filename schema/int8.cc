#include "schema/int8.h"

#include <algorithm>
#include <bit>
#include <limits>

#include "schema/float_bits.h"
#include "schema/vector_clones.h"

namespace tether {
namespace {

// The loops below are written so that GCC vectorizes them: selects are
// masks on the bits, not branches (a branch around float arithmetic keeps
// a loop scalar), and each group's scale is a constant of its own loop.

// All ones when `value` is finite, else zero.
[[gnu::always_inline]] inline uint32_t FiniteMask(float value) {
  return 0u - static_cast<uint32_t>(!NonFinite(value));
}

// The largest finite magnitude of `in`, as the bits of a non-negative float
// (whose integer order is the float order).
TETHER_VECTOR_CLONES uint32_t MaxFiniteMagnitudeBits(const float* in,
                                                     size_t n) {
  uint32_t most = 0;
  for (size_t i = 0; i < n; ++i) {
    most = std::max(most, AbsBits(in[i]) & FiniteMask(in[i]));
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
[[gnu::always_inline]] inline float Dither(uint32_t seed, uint32_t index) {
  uint32_t h = seed ^ (index * 0x9e3779b1u);
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  // Below 2^24: exact as a signed int, which converts in vector registers.
  return static_cast<float>(static_cast<int32_t>(h >> 8)) *
         (1.0f / 16777216.0f);
}

// Rounds each value of `in` to one of the two steps around it: to the
// nearest (an offset of half a step) or, with `dithered`, stochastically,
// by the dither of its index in the whole sequence (`first` + i). Steps
// are in [-127, 127] before rounding; 128 is added so that the truncating
// conversion rounds down (floor) on positive values only. A NaN or an
// infinity becomes kInt8NonFinite.
TETHER_VECTOR_CLONES void Round(const float* __restrict in, size_t n,
                                float to_steps, bool dithered, uint32_t seed,
                                uint32_t first, int8_t* __restrict out) {
  for (size_t i = 0; i < n; ++i) {
    const float u =
        dithered ? Dither(seed, first + static_cast<uint32_t>(i)) : 0.5f;
    const uint32_t finite = FiniteMask(in[i]);
    const float value = std::bit_cast<float>(std::bit_cast<uint32_t>(in[i]) &
                                             finite);  // 0 if not finite
    const int q = std::clamp(
        static_cast<int>(value * to_steps + (128.0f + u)) - 128, -127, 127);
    out[i] =
        static_cast<int8_t>((static_cast<uint32_t>(q) & finite) |
                            (static_cast<uint32_t>(kInt8NonFinite) & ~finite));
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

namespace {

// out[i] = in[i] * scale, NaN for kInt8NonFinite.
TETHER_VECTOR_CLONES void Scale(const int8_t* __restrict in, size_t n,
                                float scale, float* __restrict out) {
  const uint32_t nan =
      std::bit_cast<uint32_t>(std::numeric_limits<float>::quiet_NaN());
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bad = 0u - static_cast<uint32_t>(in[i] == kInt8NonFinite);
    const float value = static_cast<float>(in[i]) * scale;
    out[i] = std::bit_cast<float>((std::bit_cast<uint32_t>(value) & ~bad) |
                                  (nan & bad));
  }
}

}  // namespace

void FromInt8(std::span<const int8_t> in, const float* scales, float* out,
              size_t first) {
  for (size_t i = 0; i < in.size();) {
    const size_t group = (first + i) / kInt8Group;
    const size_t end = std::min(in.size(), (group + 1) * kInt8Group - first);
    Scale(in.data() + i, end - i, scales[group], out + i);
    i = end;
  }
}

uint32_t Int8Seed(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = a * 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 31) ^ b) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 29) ^ c) * 0x94d049bb133111ebull;
  return static_cast<uint32_t>(h ^ (h >> 32));
}

}  // namespace tether
