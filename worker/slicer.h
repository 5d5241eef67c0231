// Which shard holds a dense block or a sparse row. The client cuts every
// request with a Slicer; shards create whatever blocks and rows they are
// asked for, so a different slicer needs no server change. All clients of a
// run must use the same one.
#pragma once

#include <cstdint>
#include <functional>

namespace tether {

struct Slicer {
  // Shard in [0, num_shards) of block `block` of dense tensor `tensor`.
  std::function<int(uint32_t tensor, uint32_t block, int num_shards)> dense;
  // Shard in [0, num_shards) of row `key` of sparse table `table`.
  std::function<int(uint32_t table, uint64_t key, int num_shards)> sparse;
};

// Blocks round-robin from a per-tensor offset, so small tensors do not all
// land on shard 0; rows by a 64-bit hash of the key.
Slicer DefaultSlicer();

}  // namespace tether
