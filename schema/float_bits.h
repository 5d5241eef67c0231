// A float's bits read as an integer: the finiteness and magnitude tests the
// wire codecs (bf16, int8) and the shard's update loops share. Integer
// operations only, so every vector clone of a loop that uses them gives
// the same answer.
#pragma once

#include <bit>
#include <cstdint>

namespace tether {

// The bits of +infinity: every exponent bit set, no mantissa.
inline constexpr uint32_t kInfinityBits = 0x7f800000u;

// |x|'s bits. For magnitudes, unsigned order is the order of the floats,
// and infinities and NaNs come above every finite value.
[[gnu::always_inline]] inline uint32_t AbsBits(float x) {
  return std::bit_cast<uint32_t>(x) & 0x7fffffffu;
}

// Whether `x` is an infinity or a NaN.
[[gnu::always_inline]] inline bool NonFinite(float x) {
  return AbsBits(x) >= kInfinityBits;
}

// Whether `x` is a NaN.
[[gnu::always_inline]] inline bool IsNan(float x) {
  return AbsBits(x) > kInfinityBits;
}

}  // namespace tether
