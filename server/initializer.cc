#include "server/initializer.h"

#include <cmath>
#include <numbers>

#include "schema/shuffle.h"

namespace tether {
namespace {

// Separate streams so the uniform draw and the two Box-Muller draws of the
// same element never share a counter.
constexpr uint64_t kUniformStream = 0;
constexpr uint64_t kRadiusStream = 1;
constexpr uint64_t kAngleStream = 2;

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

// Absorbs one word per round, mixing fully in between, so every input bit
// reaches every output bit and (seed, id, stream, index) tuples that differ
// anywhere give unrelated outputs.
inline uint64_t Hash(uint64_t seed, uint32_t id, uint64_t stream,
                     uint64_t index) {
  uint64_t h = MixBits(seed + kGolden);
  h = MixBits(h ^ ((uint64_t{id} << 32 | stream) + kGolden));
  return MixBits(h ^ (index + kGolden));
}

// The top 24 bits as a float in [-1, 1): exact, since floats carry 24.
inline float UniformSigned(uint64_t bits) {
  const int32_t k = static_cast<int32_t>(bits >> 40) - (1 << 23);
  return static_cast<float>(k) * 0x1p-23f;
}

// The top 53 bits as a double in (0, 1], safe for log().
inline double UniformOpenZero(uint64_t bits) {
  return static_cast<double>((bits >> 11) + 1) * 0x1p-53;
}

// The top 53 bits as a double in [0, 1).
inline double UniformUnit(uint64_t bits) {
  return static_cast<double>(bits >> 11) * 0x1p-53;
}

inline float Uniform(float scale, uint64_t seed, uint32_t id, uint64_t index) {
  return UniformSigned(Hash(seed, id, kUniformStream, index)) * scale;
}

// Box-Muller, keeping only the cosine half so each element depends on its
// own index alone. Done in double: the tails come from log() of values near
// zero, where float would clip them.
inline float Normal(float stddev, uint64_t seed, uint32_t id, uint64_t index) {
  const double u1 = UniformOpenZero(Hash(seed, id, kRadiusStream, index));
  const double u2 = UniformUnit(Hash(seed, id, kAngleStream, index));
  const double r = std::sqrt(-2.0 * std::log(u1));
  return static_cast<float>(r * std::cos(2.0 * std::numbers::pi * u2) * stddev);
}

}  // namespace

float InitialValue(const InitSpec& spec, uint64_t seed, uint32_t id,
                   uint64_t index) {
  switch (spec.kind) {
    case InitSpec::Kind::kZeros:
    case InitSpec::Kind::kProvided:  // never filled: see ParamStore
      return 0.0f;
    case InitSpec::Kind::kUniform:
      return Uniform(spec.scale, seed, id, index);
    case InitSpec::Kind::kNormal:
      return Normal(spec.scale, seed, id, index);
    case InitSpec::Kind::kConstant:
      return spec.scale;
  }
  return 0.0f;
}

void FillInitial(const InitSpec& spec, uint64_t seed, uint32_t id,
                 uint64_t first_index, std::span<float> out) {
  // The kind is switched on once, outside the loops; each loop calls the
  // same helper InitialValue does, so the values are bit-identical.
  // Indices wrap like InitialValue's u64 argument would.
  const size_t n = out.size();
  switch (spec.kind) {
    case InitSpec::Kind::kUniform:
      for (size_t k = 0; k < n; ++k) {
        out[k] = Uniform(spec.scale, seed, id, first_index + k);
      }
      return;
    case InitSpec::Kind::kNormal:
      for (size_t k = 0; k < n; ++k) {
        out[k] = Normal(spec.scale, seed, id, first_index + k);
      }
      return;
    case InitSpec::Kind::kConstant:
      for (size_t k = 0; k < n; ++k) out[k] = spec.scale;
      return;
    case InitSpec::Kind::kZeros:
    case InitSpec::Kind::kProvided:
      break;
  }
  for (size_t k = 0; k < n; ++k) out[k] = 0.0f;
}

}  // namespace tether
