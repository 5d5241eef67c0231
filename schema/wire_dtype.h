// How values travel between a client and the shards (ClientOptions,
// tether-worker --wire-dtype). Whatever travels, the shards keep f32
// weights and optimizer state, and initial values a worker provides travel
// as f32.
#pragma once

namespace tether {

enum class WireDtype {
  kF32,   // 4 bytes a value, exact
  kBf16,  // 2 bytes: the float's top 16 bits, rounded to nearest even
  // About 1 byte: groups of 256 values, each a float scale and one signed
  // byte a value. Gradients are rounded stochastically (unbiased), weights
  // to nearest (schema/int8.h).
  kInt8,
};

}  // namespace tether
