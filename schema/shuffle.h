// The one shuffle behind every data order: a worker's static share and the
// chunked assignment's epoch order. A pure function of (seed, rank, epoch)
// that is the same with every standard library (std::shuffle and
// std::uniform_int_distribution are not).
#pragma once

#include <cstdint>
#include <vector>

namespace tether {

// Shuffles `items` in place (Fisher-Yates) from a generator seeded by
// (seed, rank, epoch).
void Shuffle(std::vector<uint32_t>& items, uint64_t seed, int rank, int epoch);

}  // namespace tether
