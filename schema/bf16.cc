#include "schema/bf16.h"

namespace tether {

void ToBf16(std::span<const float> in, uint16_t* out) {
  for (size_t i = 0; i < in.size(); ++i) out[i] = ToBf16(in[i]);
}

void FromBf16(std::span<const uint16_t> in, float* out) {
  for (size_t i = 0; i < in.size(); ++i) out[i] = FromBf16(in[i]);
}

}  // namespace tether
