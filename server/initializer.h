// Initial parameter values as a pure function of (run seed, tensor id,
// element index), from a counter-based generator: the same value whatever
// the number of shards, the block size or the order blocks are touched in.
// Thread-safe (no state).
#pragma once

#include <cstdint>
#include <span>

namespace tether {

struct InitSpec {
  // kProvided: no values of its own; a worker provides them
  // (ParamStore::ProvideBlock), e.g. a PyTorch module's initialization.
  enum class Kind { kZeros, kUniform, kNormal, kConstant, kProvided };
  Kind kind = Kind::kZeros;
  // kUniform: values in [-scale, scale); kNormal: standard deviation;
  // kConstant: the value; kProvided: unused (0).
  float scale = 0.0f;
  bool operator==(const InitSpec&) const = default;
};

// The initial value of element `index` of tensor or table `id`.
float InitialValue(const InitSpec& spec, uint64_t seed, uint32_t id,
                   uint64_t index);

// out[k] = InitialValue(spec, seed, id, first_index + k) for every k.
void FillInitial(const InitSpec& spec, uint64_t seed, uint32_t id,
                 uint64_t first_index, std::span<float> out);

}  // namespace tether
