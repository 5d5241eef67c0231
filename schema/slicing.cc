#include "schema/slicing.h"

#include "schema/shuffle.h"

namespace tether {

int DefaultDenseShard(uint32_t tensor, uint32_t block, int num_shards) {
  return static_cast<int>((uint64_t{tensor} + block) %
                          static_cast<uint64_t>(num_shards));
}

int DefaultSparseShard(uint32_t table, uint64_t key, int num_shards) {
  return static_cast<int>(MixBits(key ^ (uint64_t{table} << 32)) %
                          static_cast<uint64_t>(num_shards));
}

}  // namespace tether
