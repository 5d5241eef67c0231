// bfloat16 on the wire: a float's sign, exponent and top 7 mantissa bits,
// half its bytes. Clients with wire dtype bf16 push gradients and pull
// weights so; shards widen pushes back to f32 on arrival and keep f32
// weights and optimizer state.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>

namespace tether {

// Rounded to nearest, ties to even; a NaN stays a (quiet) NaN, an infinity
// an infinity; a finite value may round to an infinity only past bf16's
// largest (about 3.39e38).
inline uint16_t ToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN, quiet
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float FromBf16(uint16_t half) {
  const uint32_t bits = uint32_t{half} << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// out[i] = ToBf16(in[i]); the spans have the same length.
void ToBf16(std::span<const float> in, uint16_t* out);
// out[i] = FromBf16(in[i]).
void FromBf16(std::span<const uint16_t> in, float* out);

}  // namespace tether
