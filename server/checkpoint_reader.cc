#include "server/checkpoint_reader.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <thread>

#include "server/optimizer.h"

namespace tether::checkpoint {
namespace {

// The floats of `value` from byte `offset` on, in a new buffer (not zeroed
// first: the copy is the one write). Null when there are none.
std::shared_ptr<float[]> CopyFloats(const rocksdb::Slice& value,
                                    size_t offset) {
  const size_t n = (value.size() - offset) / sizeof(float);
  if (n == 0) return nullptr;
  std::shared_ptr<float[]> out(new float[n]);
  std::memcpy(out.get(), value.data() + offset, n * sizeof(float));
  return out;
}

}  // namespace

// Empty string when `shape` is usable with `block_size`, else the problem.
std::string MakeLayout(const std::vector<uint64_t>& shape, uint32_t block_size,
                       DenseLayout* layout) {
  if (shape.empty()) return "the shape is empty";
  if (block_size == 0) return "the block size is 0";
  uint64_t numel = 1;
  for (uint64_t d : shape) {
    if (d == 0) return "a dimension is zero";
    if (__builtin_mul_overflow(numel, d, &numel)) {
      return "it has more than 2^64 elements";
    }
  }
  layout->numel = numel;
  layout->block_size = block_size;
  layout->num_blocks = (numel - 1) / block_size + 1;
  if (layout->num_blocks > (uint64_t{1} << 32)) {
    return "it has more than 2^32 blocks";
  }
  return "";
}

// The one place RocksDB's statuses become tether's: kCorruption for damage
// RocksDB detects (a checksum mismatch, a damaged file), else kIoError.
Status IoError(const std::string& where, const std::string& doing,
               const rocksdb::Status& s) {
  return Status(s.IsCorruption() ? Code::kCorruption : Code::kIoError,
                where + ": " + doing + ": " + s.ToString());
}

// Damage tether's own checks find: a value that does not decode, a key
// missing or out of place.
Status Corrupt(const std::string& where, const std::string& problem) {
  return Corruption(where + ": corrupt: " + problem);
}

Status SliceReader::Start() {
  layouts_.resize(snap_.tensors.size());
  for (size_t i = 0; i < snap_.tensors.size(); ++i) {
    const TensorSnapshot& t = snap_.tensors[i];
    const std::string bad =
        MakeLayout(t.shape, snap_.settings.block_size, &layouts_[i]);
    if (!bad.empty()) return Corrupt(where_, "tensor '" + t.name + "': " + bad);
    tensor_of_[t.id] = i;
  }
  for (size_t i = 0; i < snap_.tables.size(); ++i) {
    table_of_[snap_.tables[i].id] = i;
  }
  slots_per_weight_ = Optimizer(snap_.settings.optimizer).slots_per_weight();
  return Status::Ok();
}

Result<SliceReader::Target> SliceReader::Locate(const DataKey& key,
                                                const std::string& at) const {
  Target target;
  if (key.kind == kBlockKind) {
    auto it = tensor_of_.find(key.id);
    if (it == tensor_of_.end()) {
      return Corrupt(where_, at + " is for tensor id " +
                                 std::to_string(key.id) +
                                 ", which the header does not define");
    }
    const uint32_t block = static_cast<uint32_t>(key.index);
    target.index = it->second;
    target.what = "tensor '" + snap_.tensors[it->second].name + "' block " +
                  std::to_string(block) + " (" + at + ")";
    const DenseLayout& layout = layouts_[it->second];
    if (block >= layout.num_blocks) {
      return Corrupt(where_, target.what + " is past the end");
    }
    target.len = layout.BlockLen(block);
    return target;
  }
  auto it = table_of_.find(key.id);
  if (it == table_of_.end()) {
    return Corrupt(where_, at + " is for table id " + std::to_string(key.id) +
                               ", which the header does not define");
  }
  const TableSnapshot& t = snap_.tables[it->second];
  target.index = it->second;
  target.what = "table '" + t.name + "' row " + std::to_string(key.index) +
                " (" + at + ")";
  target.len = t.dim;
  return target;
}

Result<std::shared_ptr<float[]>> SliceReader::TakeSlots(
    const rocksdb::Slice& key, const Target& target, rocksdb::Iterator* slots,
    Part* part) const {
  // A read error (a checksum mismatch) ends the iterator like the end of
  // the data would: report the error, not missing slots.
  if (!slots->Valid() && !slots->status().ok()) {
    return IoError(where_, "reading optimizer slots", slots->status());
  }
  if (!slots->Valid() || slots->key() != key) {
    return Corrupt(where_, target.what + " has no optimizer slots");
  }
  const uint64_t expected = FloatBytes(slots_per_weight_ * target.len);
  if (slots->value().size() != expected) {
    return Corrupt(
        where_, target.what + " has " + std::to_string(slots->value().size()) +
                    " bytes of slots, expected " + std::to_string(expected));
  }
  std::shared_ptr<float[]> values = CopyFloats(slots->value(), 0);
  slots->Next();
  ++part->keys;
  return values;
}

Status SliceReader::Add(const rocksdb::Slice& key, const rocksdb::Slice& value,
                        rocksdb::Iterator* slots, Part* part) const {
  const std::string at = "key " + Hex(key);
  const std::optional<DataKey> parsed =
      checkpoint::ParseDataKey(key.ToStringView());
  if (!parsed) return Corrupt(where_, at + " is not a block or row key");
  TETHER_ASSIGN_OR_RETURN(Target target, Locate(*parsed, at));
  const uint64_t len = target.len;
  if (value.size() != 8 + FloatBytes(len)) {
    return Corrupt(
        where_, target.what + " holds " + std::to_string(value.size()) +
                    " bytes, expected " + std::to_string(8 + FloatBytes(len)));
  }
  std::shared_ptr<float[]> slot_values;
  if (slots_per_weight_ > 0) {
    TETHER_ASSIGN_OR_RETURN(slot_values, TakeSlots(key, target, slots, part));
  }
  const uint64_t slots_len = slots_per_weight_ * len;
  uint64_t step = 0;
  std::memcpy(&step, value.data(), 8);
  if (parsed->kind == kBlockKind) {
    // Read once, into buffers ParamStore::Restore takes as they are.
    part->blocks.emplace_back(
        target.index,
        TensorSnapshot::Block::Shared(static_cast<uint32_t>(parsed->index),
                                      step, CopyFloats(value, 8), len,
                                      std::move(slot_values), slots_len));
  } else {
    const float* w = reinterpret_cast<const float*>(value.data() + 8);
    const float* sl = slot_values.get();
    part->rows.emplace_back(
        target.index,
        TableSnapshot::Row{parsed->index, step, std::vector<float>(w, w + len),
                           sl ? std::vector<float>(sl, sl + slots_len)
                              : std::vector<float>()});
  }
  ++part->keys;
  return Status::Ok();
}

std::vector<std::string> SliceReader::Bounds(int64_t round, size_t max_parts,
                                             uint64_t part_bytes) const {
  // Blocks by tensor id (key order), each tensor's promised blocks taken as
  // spread evenly over its length.
  struct Span {
    uint32_t id;
    uint64_t blocks;  // in the layout
    uint64_t bytes;   // promised
  };
  std::vector<Span> spans;
  uint64_t total = 0;
  for (const auto& [id, index] : tensor_of_) {
    const uint64_t promised = blocks_.count(id) ? blocks_.at(id) : 0;
    const uint64_t bytes = promised * snap_.settings.block_size *
                           sizeof(float) * (1 + slots_per_weight_);
    spans.push_back({id, layouts_[index].num_blocks, bytes});
    total += bytes;
  }
  const size_t parts = std::clamp<uint64_t>(total / part_bytes, 1,
                                            std::max<size_t>(max_parts, 1));
  std::vector<std::string> bounds = {RoundKey(round)};
  uint64_t before = 0;  // bytes of the spans passed
  for (const Span& span : spans) {
    while (bounds.size() < parts && span.bytes > 0 &&
           before + span.bytes > total / parts * bounds.size()) {
      const uint64_t into = total / parts * bounds.size() - before;
      const auto block = static_cast<uint32_t>(span.blocks * into / span.bytes);
      std::string key = BlockKey(round, span.id, block);
      if (key <= bounds.back()) break;
      bounds.push_back(std::move(key));
    }
    before += span.bytes;
  }
  bounds.push_back(RoundKey(round + 1));
  return bounds;
}

void SliceReader::Merge(std::vector<Part>&& parts) {
  for (Part& part : parts) {
    for (auto& [index, block] : part.blocks) {
      snap_.tensors[index].blocks.push_back(std::move(block));
    }
    for (auto& [index, row] : part.rows) {
      snap_.tables[index].rows.push_back(std::move(row));
    }
    keys_ += part.keys;
  }
}

Status SliceReader::Finish(uint64_t marker_keys) {
  if (keys_ != marker_keys) {
    return Corrupt(where_, std::to_string(keys_) +
                               " keys found, the marker says " +
                               std::to_string(marker_keys));
  }
  for (const TensorSnapshot& t : snap_.tensors) {
    if (t.blocks.size() != blocks_[t.id]) {
      return Corrupt(where_, "tensor '" + t.name + "' has " +
                                 std::to_string(t.blocks.size()) +
                                 " blocks, the header says " +
                                 std::to_string(blocks_[t.id]));
    }
  }
  for (const TableSnapshot& t : snap_.tables) {
    if (t.rows.size() != rows_[t.id]) {
      return Corrupt(where_, "table '" + t.name + "' has " +
                                 std::to_string(t.rows.size()) +
                                 " rows, the header says " +
                                 std::to_string(rows_[t.id]));
    }
  }
  return Status::Ok();
}

namespace {

// The data keys from `lower` up to `upper` into `part`. Weights and slots
// share keys: both families are walked in step.
Status ReadRange(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* weights,
                 rocksdb::ColumnFamilyHandle* slots, const std::string& where,
                 const std::string& lower, const std::string& upper,
                 const SliceReader& reader, SliceReader::Part* part) {
  rocksdb::Slice upper_slice(upper);
  rocksdb::ReadOptions ro;
  ro.iterate_upper_bound = &upper_slice;
  ro.fill_cache = false;  // read once
  std::unique_ptr<rocksdb::Iterator> w(db->NewIterator(ro, weights));
  std::unique_ptr<rocksdb::Iterator> sl(db->NewIterator(ro, slots));
  w->Seek(lower);
  sl->Seek(lower);
  for (; w->Valid(); w->Next()) {
    TETHER_RETURN_IF_ERROR(reader.Add(w->key(), w->value(), sl.get(), part));
  }
  if (!w->status().ok()) {
    return IoError(where, "reading weights", w->status());
  }
  if (!sl->status().ok()) {
    return IoError(where, "reading optimizer slots", sl->status());
  }
  if (sl->Valid()) {
    return Corrupt(where,
                   "key " + Hex(sl->key()) + " has slots but no weights");
  }
  return Status::Ok();
}

}  // namespace

Status ReadRoundData(rocksdb::DB* db, rocksdb::ColumnFamilyHandle* weights,
                     rocksdb::ColumnFamilyHandle* slots,
                     const std::string& where, int64_t round,
                     size_t max_threads, uint64_t part_bytes,
                     SliceReader* reader) {
  if (max_threads == 0) {
    max_threads = std::clamp(2 * std::thread::hardware_concurrency(), 2u, 8u);
  }
  const std::vector<std::string> bounds =
      reader->Bounds(round, max_threads, std::max<uint64_t>(1, part_bytes));
  std::vector<SliceReader::Part> parts(bounds.size() - 1);
  std::vector<Status> status(parts.size());
  auto read = [&](size_t i) {
    try {
      status[i] = ReadRange(db, weights, slots, where, bounds[i], bounds[i + 1],
                            *reader, &parts[i]);
    } catch (const std::bad_alloc&) {
      status[i] =
          Status(Code::kIoError, where + ": out of memory reading the round");
    }
  };
  std::vector<std::thread> threads;
  for (size_t i = 1; i < parts.size(); ++i) threads.emplace_back(read, i);
  read(0);
  for (std::thread& t : threads) t.join();
  for (const Status& s : status) TETHER_RETURN_IF_ERROR(s);
  reader->Merge(std::move(parts));
  return Status::Ok();
}

}  // namespace tether::checkpoint
