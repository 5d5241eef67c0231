// Internal to the client library (not installed with the SDK; never include
// it from worker/client.h): how one dense or sparse request is cut into
// per-shard frames, and how the shards' replies are put back together.
//
// Pure functions of their arguments: no network, no locks, callable from
// any thread. The Client sends each part on the link of its shard and
// completes the request once every part has answered.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "schema/frame.h"
#include "schema/status.h"
#include "schema/wire_dtype.h"
#include "worker/slicer.h"

namespace tether::client_internal {

// Blocks of a dense tensor that go to one shard in one frame, in
// increasing order.
struct BlockPart {
  int shard = 0;
  std::vector<uint32_t> blocks;
};

// The tensor's ceil(size / block_size) blocks grouped per shard by
// `slicer.dense` (shards in increasing order), each shard's cut into frames
// of at most max(1, chunk_bytes / (block_size * 4)) blocks. Shards with no
// block get no part. kInvalidArgument if the slicer names a shard outside
// [0, num_shards).
Result<std::vector<BlockPart>> CutBlocks(const Slicer& slicer, uint32_t tensor,
                                         uint64_t size, uint32_t block_size,
                                         int num_shards, size_t chunk_bytes);

// Rows of a sparse table that go to one shard in one frame: the keys, and
// where each was in the request (keys may repeat).
struct KeyPart {
  int shard = 0;
  std::vector<uint64_t> keys;
  std::vector<size_t> positions;
};

// The keys grouped per shard by `slicer.sparse` (shards in increasing
// order, keys in request order), each shard's cut into frames of at most
// max(1, chunk_bytes / (dim * 4 + 8)) keys. kInvalidArgument if the slicer
// names a shard outside [0, num_shards).
Result<std::vector<KeyPart>> CutKeys(const Slicer& slicer, uint32_t table,
                                     std::span<const uint64_t> keys,
                                     uint32_t dim, int num_shards,
                                     size_t chunk_bytes);

// Request `request`: the values of `blocks` of dense tensor `tensor`, as
// `dtype` says; for clock `for_clock` (a prefetch, see
// Client::PrefetchAsync), or -1 for the worker's clock now. A `landing`
// (f32 only) asks a shard on this host to write them at that address in
// this process instead (Pull.landing).
OutFrame PullBlocksFrame(uint64_t request, uint32_t tensor,
                         const std::vector<uint32_t>& blocks,
                         WireDtype dtype = WireDtype::kF32,
                         int64_t for_clock = -1, uint64_t landing = 0);

// What a dense push carries: a gradient for the shards' optimizer, the
// initial values of a provided tensor (Push.provide), or values that
// replace the shards' (Push.assign).
enum class PushKind : uint8_t { kGradient, kProvide, kAssign };

// Request `request`: `values` (the whole tensor, `block_size` floats a
// block, the last one shorter) of `blocks`, as `kind` says. The floats are
// spliced in, not copied: `values` must stay valid until the frame is
// sent. A gradient goes as `dtype` says (bf16 or int8 converted into the
// frame, int8 rounded stochastically); values always as f32.
// With `direct` (f32 only) each block names where its floats lie in this
// process instead (Block.address and count): the shard reads them from
// here, so `values` must stay valid and unchanged until the push is
// answered.
OutFrame PushBlocksFrame(uint64_t request, uint32_t tensor, int64_t read_clock,
                         PushKind kind, const std::vector<uint32_t>& blocks,
                         uint32_t block_size, std::span<const float> values,
                         WireDtype dtype = WireDtype::kF32,
                         bool direct = false);

// Request `request`: the rows of `part.keys` of sparse table `table`, as
// `dtype` says.
OutFrame PullRowsFrame(uint64_t request, uint32_t table, const KeyPart& part,
                       WireDtype dtype = WireDtype::kF32);

// Request `request`: the rows of `part.keys`, copied from `values` (the
// whole request, `dim` floats a row, at `part.positions`); a gradient as
// `dtype` says, initial values always as f32.
OutFrame PushRowsFrame(uint64_t request, uint32_t table, int64_t read_clock,
                       bool provide, const KeyPart& part, uint64_t dim,
                       std::span<const float> values,
                       WireDtype dtype = WireDtype::kF32);

// Copies the blocks of a pull reply into `out` (the whole tensor), f32, or
// bfloat16 or int8 widened; a landed block (Block.landed) from `landing`, where
// the shard wrote the landed blocks one after another.
// kProtocolError if the reply holds no blocks or a block that does not fit
// the tensor (outside it, or of the wrong length) or the landing, or int8
// values without their scales; `out` may then be partly written.
Status CopyPulledBlocks(const wire::PullReply& reply, uint32_t block_size,
                        std::span<float> out,
                        std::span<const float> landing = {});

// Copies the rows of a row pull reply into `out` (the whole request):
// row i goes to position positions[i]. kProtocolError unless the reply
// holds exactly positions.size() rows of `dim` values (int8 with their
// scales).
Status CopyPulledRows(const wire::PullReply& reply,
                      std::span<const size_t> positions, uint64_t dim,
                      std::span<float> out);

}  // namespace tether::client_internal
