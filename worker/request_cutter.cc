#include "worker/request_cutter.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "schema/int8.h"
#include "schema/wire_values.h"

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
                         const std::vector<uint32_t>& blocks, WireDtype dtype,
                         int64_t for_clock, uint64_t landing) {
  flatbuffers::FlatBufferBuilder fbb(64 + blocks.size() * 4);
  auto blocks_offset = fbb.CreateVector(blocks);
  wire::PullBuilder pb(fbb);
  pb.add_request_id(request);
  pb.add_tensor(tensor);
  pb.add_blocks(blocks_offset);
  pb.add_dtype(ToWire(dtype));
  pb.add_clock(for_clock);
  if (dtype == WireDtype::kF32) pb.add_landing(landing);
  return FinishFrame(fbb, pb.Finish());
}

OutFrame PushBlocksFrame(uint64_t request, uint32_t tensor, int64_t read_clock,
                         PushKind kind, const std::vector<uint32_t>& blocks,
                         uint32_t block_size, std::span<const float> values,
                         WireDtype dtype, bool direct) {
  const uint32_t bs = block_size;
  if (kind != PushKind::kGradient) dtype = WireDtype::kF32;  // values: exact
  direct = direct && dtype == WireDtype::kF32;
  auto fbb = MakeBuilder(256 + blocks.size() *
                                   ((direct ? 0 : bs * WireBytes(dtype)) + 48));
  FrameSplicer splicer(fbb);
  std::vector<flatbuffers::Offset<wire::Block>> out;
  out.reserve(blocks.size());
  for (uint32_t b : blocks) {
    uint64_t first = uint64_t{b} * bs;
    uint64_t n = std::min<uint64_t>(bs, values.size() - first);
    if (dtype != WireDtype::kF32) {
      const uint32_t seed = Int8Seed(tensor, (uint64_t{b} << 32) ^ request,
                                     static_cast<uint64_t>(read_clock));
      const NarrowedValues narrow =
          AddNarrowed(fbb, values.subspan(first, n), dtype, &seed);
      out.push_back(wire::CreateBlock(fbb, b, 0, narrow.bf16, 0, 0, false,
                                      narrow.q8, narrow.q8_scale));
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
  pb.add_provide(kind == PushKind::kProvide);
  pb.add_assign(kind == PushKind::kAssign);
  return splicer.Finish(pb.Finish());
}

OutFrame PullRowsFrame(uint64_t request, uint32_t table, const KeyPart& part,
                       WireDtype dtype) {
  flatbuffers::FlatBufferBuilder fbb(64 + part.keys.size() * 8);
  auto keys_offset = fbb.CreateVector(part.keys);
  wire::PullBuilder pb(fbb);
  pb.add_request_id(request);
  pb.add_tensor(table);
  pb.add_keys(keys_offset);
  pb.add_sparse(true);
  pb.add_dtype(ToWire(dtype));
  return FinishFrame(fbb, pb.Finish());
}

OutFrame PushRowsFrame(uint64_t request, uint32_t table, int64_t read_clock,
                       bool provide, const KeyPart& part, uint64_t dim,
                       std::span<const float> values, WireDtype dtype) {
  size_t n = part.keys.size() * dim;
  if (provide) dtype = WireDtype::kF32;  // initial values travel exact
  auto fbb = MakeBuilder(256 + part.keys.size() * 8 + n * WireBytes(dtype));
  auto keys_offset = fbb.CreateVector(part.keys);
  // The rows one after another: copied into the frame as f32, or narrowed.
  flatbuffers::Offset<flatbuffers::Vector<float>> rows_offset;
  if (dtype == WireDtype::kF32) {
    float* rows = nullptr;
    rows_offset = fbb.CreateUninitializedVector(n, &rows);
    GatherRows(values, part.positions, dim, rows);
  }
  const uint32_t seed =
      Int8Seed(table, part.keys.empty() ? 0 : part.keys.front() ^ request,
               static_cast<uint64_t>(read_clock));
  const NarrowedValues narrow =
      AddNarrowedRows(fbb, values, part.positions, dim, dtype, &seed);
  wire::PushBuilder pb(fbb);
  pb.add_request_id(request);
  pb.add_tensor(table);
  pb.add_read_clock(read_clock);
  pb.add_keys(keys_offset);
  pb.add_rows(rows_offset);
  pb.add_rows_bf16(narrow.bf16);
  pb.add_rows_q8(narrow.q8);
  pb.add_rows_q8_scale(narrow.q8_scale);
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
    const NarrowedView narrow{block->bf16(), block->q8(), block->q8_scale()};
    uint64_t n = block->landed()   ? block->count()
                 : block->values() ? block->values()->size()
                                   : narrow.size();
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
      Status s = Widen(narrow, out.data() + first,
                       "pull reply block " + std::to_string(block->index()));
      if (!s.ok()) return ProtocolError(s.message());
    }
  }
  return Status::Ok();
}

Status CopyPulledRows(const wire::PullReply& reply,
                      std::span<const size_t> positions, uint64_t dim,
                      std::span<float> out) {
  const NarrowedView narrow{reply.rows_bf16(), reply.rows_q8(),
                            reply.rows_q8_scale()};
  const size_t got = reply.rows()       ? reply.rows()->size()
                     : narrow.present() ? narrow.size()
                                        : SIZE_MAX;
  if (got != positions.size() * dim) {
    return ProtocolError("row pull answered with the wrong rows");
  }
  if (reply.rows() == nullptr) {
    Status s = WidenRows(narrow, positions, dim, out.data(), "row pull reply");
    return s.ok() ? s : ProtocolError(s.message());
  }
  for (size_t i = 0; i < positions.size(); ++i) {
    std::memcpy(out.data() + positions[i] * dim, reply.rows()->data() + i * dim,
                dim * sizeof(float));
  }
  return Status::Ok();
}

}  // namespace tether::client_internal
