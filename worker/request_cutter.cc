#include "worker/request_cutter.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "schema/bf16.h"

namespace tether::client_internal {

Result<std::vector<BlockPart>> CutBlocks(const Slicer& slicer, uint32_t tensor,
                                         uint64_t size, uint32_t block_size,
                                         int num_shards, size_t chunk_bytes) {
  uint64_t num_blocks = (size + block_size - 1) / block_size;
  std::vector<std::vector<uint32_t>> by_shard(num_shards);
  for (uint64_t b = 0; b < num_blocks; ++b) {
    int shard = slicer.dense(tensor, static_cast<uint32_t>(b), num_shards);
    if (shard < 0 || shard >= num_shards) {
      return InvalidArgument("slicer put block " + std::to_string(b) +
                             " on shard " + std::to_string(shard) +
                             ", outside 0.." + std::to_string(num_shards - 1));
    }
    by_shard[shard].push_back(static_cast<uint32_t>(b));
  }
  size_t per_frame =
      std::max<size_t>(1, chunk_bytes / (size_t{block_size} * sizeof(float)));
  std::vector<BlockPart> parts;
  for (int s = 0; s < num_shards; ++s) {
    for (size_t i = 0; i < by_shard[s].size(); i += per_frame) {
      size_t end = std::min(by_shard[s].size(), i + per_frame);
      parts.push_back({s, std::vector<uint32_t>(by_shard[s].begin() + i,
                                                by_shard[s].begin() + end)});
    }
  }
  return parts;
}

Result<std::vector<KeyPart>> CutKeys(const Slicer& slicer, uint32_t table,
                                     std::span<const uint64_t> keys,
                                     uint32_t dim, int num_shards,
                                     size_t chunk_bytes) {
  std::vector<KeyPart> by_shard(num_shards);
  for (size_t i = 0; i < keys.size(); ++i) {
    int shard = slicer.sparse(table, keys[i], num_shards);
    if (shard < 0 || shard >= num_shards) {
      return InvalidArgument("slicer put key " + std::to_string(keys[i]) +
                             " on shard " + std::to_string(shard));
    }
    by_shard[shard].shard = shard;
    by_shard[shard].keys.push_back(keys[i]);
    by_shard[shard].positions.push_back(i);
  }
  size_t per_frame =
      std::max<size_t>(1, chunk_bytes / (size_t{dim} * sizeof(float) + 8));
  std::vector<KeyPart> parts;
  for (KeyPart& whole : by_shard) {
    for (size_t i = 0; i < whole.keys.size(); i += per_frame) {
      size_t end = std::min(whole.keys.size(), i + per_frame);
      KeyPart part;
      part.shard = whole.shard;
      part.keys.assign(whole.keys.begin() + i, whole.keys.begin() + end);
      part.positions.assign(whole.positions.begin() + i,
                            whole.positions.begin() + end);
      parts.push_back(std::move(part));
    }
  }
  return parts;
}

OutFrame PullBlocksFrame(uint64_t request, uint32_t tensor,
                         const std::vector<uint32_t>& blocks, bool bf16,
                         int64_t for_clock, uint64_t landing) {
  flatbuffers::FlatBufferBuilder fbb(64 + blocks.size() * 4);
  auto blocks_offset = fbb.CreateVector(blocks);
  wire::PullBuilder pb(fbb);
  pb.add_request_id(request);
  pb.add_tensor(tensor);
  pb.add_blocks(blocks_offset);
  pb.add_bf16(bf16);
  pb.add_clock(for_clock);
  if (!bf16) pb.add_landing(landing);
  return FinishFrame(fbb, pb.Finish());
}

OutFrame PushBlocksFrame(uint64_t request, uint32_t tensor, int64_t read_clock,
                         bool provide, const std::vector<uint32_t>& blocks,
                         uint32_t block_size, std::span<const float> values,
                         bool bf16, bool direct) {
  const uint32_t bs = block_size;
  bf16 = bf16 && !provide;  // initial values travel exact
  direct = direct && !bf16;
  auto fbb = MakeBuilder(256 + blocks.size() *
                                   ((direct ? 0 : bs * (bf16 ? 2 : 4)) + 48));
  FrameSplicer splicer(fbb);
  std::vector<flatbuffers::Offset<wire::Block>> out;
  out.reserve(blocks.size());
  for (uint32_t b : blocks) {
    uint64_t first = uint64_t{b} * bs;
    uint64_t n = std::min<uint64_t>(bs, values.size() - first);
    if (bf16) {
      uint16_t* half = nullptr;
      auto half_offset = fbb.CreateUninitializedVector(n, &half);
      ToBf16(values.subspan(first, n), half);
      out.push_back(wire::CreateBlock(fbb, b, 0, half_offset));
      continue;
    }
    if (direct) {
      out.push_back(wire::CreateBlock(
          fbb, b, 0, 0, reinterpret_cast<uintptr_t>(values.data() + first),
          static_cast<uint32_t>(n)));
      continue;
    }
    auto spliced = splicer.AddFloats(values.subspan(first, n));
    out.push_back(wire::CreateBlock(fbb, b, spliced));
  }
  auto blocks_offset = fbb.CreateVector(out);
  wire::PushBuilder pb(fbb);
  pb.add_request_id(request);
  pb.add_tensor(tensor);
  pb.add_read_clock(read_clock);
  pb.add_blocks(blocks_offset);
  pb.add_provide(provide);
  return splicer.Finish(pb.Finish());
}

OutFrame PullRowsFrame(uint64_t request, uint32_t table, const KeyPart& part,
                       bool bf16) {
  flatbuffers::FlatBufferBuilder fbb(64 + part.keys.size() * 8);
  auto keys_offset = fbb.CreateVector(part.keys);
  wire::PullBuilder pb(fbb);
  pb.add_request_id(request);
  pb.add_tensor(table);
  pb.add_keys(keys_offset);
  pb.add_sparse(true);
  pb.add_bf16(bf16);
  return FinishFrame(fbb, pb.Finish());
}

OutFrame PushRowsFrame(uint64_t request, uint32_t table, int64_t read_clock,
                       bool provide, const KeyPart& part, uint64_t dim,
                       std::span<const float> values, bool bf16) {
  size_t n = part.keys.size() * dim;
  bf16 = bf16 && !provide;  // initial values travel exact
  auto fbb = MakeBuilder(256 + part.keys.size() * 8 + n * 4);
  auto keys_offset = fbb.CreateVector(part.keys);
  flatbuffers::Offset<flatbuffers::Vector<float>> rows_offset;
  flatbuffers::Offset<flatbuffers::Vector<uint16_t>> half_offset;
  if (bf16) {
    uint16_t* half = nullptr;
    half_offset = fbb.CreateUninitializedVector(n, &half);
    for (size_t i = 0; i < part.positions.size(); ++i) {
      ToBf16(values.subspan(part.positions[i] * dim, dim), half + i * dim);
    }
  } else {
    float* rows = nullptr;
    rows_offset = fbb.CreateUninitializedVector(n, &rows);
    for (size_t i = 0; i < part.positions.size(); ++i) {
      std::memcpy(rows + i * dim, values.data() + part.positions[i] * dim,
                  dim * sizeof(float));
    }
  }
  wire::PushBuilder pb(fbb);
  pb.add_request_id(request);
  pb.add_tensor(table);
  pb.add_read_clock(read_clock);
  pb.add_keys(keys_offset);
  if (bf16) {
    pb.add_rows_bf16(half_offset);
  } else {
    pb.add_rows(rows_offset);
  }
  pb.add_sparse(true);
  pb.add_provide(provide);
  return FinishFrame(fbb, pb.Finish());
}

Status CopyPulledBlocks(const wire::PullReply& reply, uint32_t block_size,
                        std::span<float> out, std::span<const float> landing) {
  if (reply.blocks() == nullptr) {
    return ProtocolError("pull answered without blocks");
  }
  const uint32_t bs = block_size;
  const uint64_t size = out.size();
  size_t landed = 0;  // floats of `landing` taken
  for (const wire::Block* block : *reply.blocks()) {
    uint64_t first = uint64_t{block->index()} * bs;
    const auto* half = block->bf16();
    uint64_t n = block->landed()   ? block->count()
                 : block->values() ? block->values()->size()
                 : half            ? half->size()
                                   : 0;
    if (first >= size || n != std::min<uint64_t>(bs, size - first)) {
      return ProtocolError("pull reply block " +
                           std::to_string(block->index()) +
                           " does not fit the tensor");
    }
    if (block->landed()) {
      if (n > landing.size() - landed) {
        return ProtocolError("pull reply block " +
                             std::to_string(block->index()) +
                             " landed past the buffer it was given");
      }
      std::memcpy(out.data() + first, landing.data() + landed,
                  n * sizeof(float));
      landed += n;
    } else if (block->values() != nullptr) {
      std::memcpy(out.data() + first, block->values()->data(),
                  n * sizeof(float));
    } else {
      FromBf16({half->data(), half->size()}, out.data() + first);
    }
  }
  return Status::Ok();
}

Status CopyPulledRows(const wire::PullReply& reply,
                      std::span<const size_t> positions, uint64_t dim,
                      std::span<float> out) {
  const auto* half = reply.rows_bf16();
  const size_t got = reply.rows() ? reply.rows()->size()
                     : half       ? half->size()
                                  : SIZE_MAX;
  if (got != positions.size() * dim) {
    return ProtocolError("row pull answered with the wrong rows");
  }
  for (size_t i = 0; i < positions.size(); ++i) {
    float* to = out.data() + positions[i] * dim;
    if (reply.rows() != nullptr) {
      std::memcpy(to, reply.rows()->data() + i * dim, dim * sizeof(float));
    } else {
      FromBf16({half->data() + i * dim, dim}, to);
    }
  }
  return Status::Ok();
}

}  // namespace tether::client_internal
