// The one shuffle behind every data order: a worker's static share and the
// chunked assignment's epoch order. A pure function of (seed, rank, epoch)
// that is the same with every standard library (std::shuffle and
// std::uniform_int_distribution are not).
#pragma once

#include <cstdint>
#include <vector>

namespace tether {

// SplitMix64's finalizer: a bijection on 64-bit words with full avalanche,
// so inputs that differ in a few bits (ranks, ids counting up) come out
// unrelated.
inline uint64_t MixBits(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Shuffles `items` in place (Fisher-Yates) from a generator seeded by
// (seed, rank, epoch).
void Shuffle(std::vector<uint32_t>& items, uint64_t seed, int rank, int epoch);

}  // namespace tether
