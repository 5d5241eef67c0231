#include "schema/shuffle.h"

#include <random>
#include <utility>

namespace tether {
namespace {

// SplitMix64's step: spreads nearby inputs (rank 0, 1, 2...) over
// unrelated seeds.
uint64_t Mix64(uint64_t z) { return MixBits(z + 0x9e3779b97f4a7c15ULL); }

// Uniform in [0, bound), unbiased.
uint64_t UniformBelow(std::mt19937_64& gen, uint64_t bound) {
  // 2^64 mod bound: draws below it would favour small results.
  const uint64_t threshold = (0 - bound) % bound;
  uint64_t r = gen();
  while (r < threshold) r = gen();
  return r % bound;
}

}  // namespace

void Shuffle(std::vector<uint32_t>& items, uint64_t seed, int rank, int epoch) {
  uint64_t mixed = Mix64(seed);
  mixed = Mix64(mixed ^ static_cast<uint64_t>(static_cast<int64_t>(rank)));
  mixed = Mix64(mixed ^ static_cast<uint64_t>(static_cast<int64_t>(epoch)));
  std::mt19937_64 gen(mixed);
  for (size_t i = items.size(); i > 1; --i) {
    std::swap(items[i - 1], items[UniformBelow(gen, i)]);
  }
}

}  // namespace tether
