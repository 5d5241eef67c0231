#include "schema/bf16.h"

#include "schema/vector_clones.h"

namespace tether {

// Integer operations only: every clone gives the same bits.
TETHER_VECTOR_CLONES void ToBf16(std::span<const float> in, uint16_t* out) {
  for (size_t i = 0; i < in.size(); ++i) out[i] = ToBf16(in[i]);
}

TETHER_VECTOR_CLONES void FromBf16(std::span<const uint16_t> in, float* out) {
  for (size_t i = 0; i < in.size(); ++i) out[i] = FromBf16(in[i]);
}

}  // namespace tether
