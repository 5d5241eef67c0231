#include "worker/slicer.h"

namespace tether {
namespace {

uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

Slicer DefaultSlicer() {
  Slicer s;
  s.dense = [](uint32_t tensor, uint32_t block, int num_shards) {
    return static_cast<int>((uint64_t{tensor} + block) % num_shards);
  };
  s.sparse = [](uint32_t table, uint64_t key, int num_shards) {
    return static_cast<int>(Mix64(key ^ (uint64_t{table} << 32)) %
                            static_cast<uint64_t>(num_shards));
  };
  return s;
}

}  // namespace tether
