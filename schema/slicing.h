// The default placement of parameters on shards: the rule the client's
// DefaultSlicer (worker/slicer.h) cuts requests by, and the one a shard
// applies when it takes its part of a checkpoint round written by another
// number of shards (server/round_merge.h). One rule, so the two agree.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>

namespace tether {

// Shard in [0, num_shards) of block `block` of the dense tensor with id
// `tensor`: blocks round-robin from a per-tensor offset, so small tensors do
// not all land on shard 0. num_shards >= 1.
int DefaultDenseShard(uint32_t tensor, uint32_t block, int num_shards);

// Shard in [0, num_shards) of row `key` of the sparse table with id
// `table`: a 64-bit hash of the key and table. num_shards >= 1.
int DefaultSparseShard(uint32_t table, uint64_t key, int num_shards);

}  // namespace tether
