// bfloat16 on the wire: a float's sign, exponent and top 7 mantissa bits,
// half its bytes. Clients with wire dtype bf16 push gradients and pull
// weights so; shards widen pushes back to f32 on arrival and keep f32
// weights and optimizer state.
#pragma once

#include <bit>
#include <cstdint>
#include <span>

#include "schema/float_bits.h"

namespace tether {

// Rounded to nearest, ties to even; a NaN stays a (quiet) NaN, an infinity
// an infinity; a finite value may round to an infinity only past bf16's
// largest (about 3.39e38).
inline uint16_t ToBf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if (IsNan(value)) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN, quiet
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float FromBf16(uint16_t half) {
  return std::bit_cast<float>(uint32_t{half} << 16);
}

// out[i] = ToBf16(in[i]); the spans have the same length.
void ToBf16(std::span<const float> in, uint16_t* out);
// out[i] = FromBf16(in[i]).
void FromBf16(std::span<const uint16_t> in, float* out);

}  // namespace tether
