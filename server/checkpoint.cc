// Layout of a shard's RocksDB (one per --data-dir). Every key of a round
// starts with the round (u64 big-endian), alone or after a one-byte tag, so
// a round -- or every round before some round -- is one contiguous key
// range that DeleteRange removes at once.
//
//   column family "weights"
//     round | 'b' | tensor id (u32 BE) | block (u32 BE)  -> a dense block
//     round | 'r' | table id (u32 BE)  | row key (u64 BE) -> a sparse row
//     value: update count (u64 LE), then the weights (f32 LE)
//   column family "slots": the same keys; value: the optimizer slots (f32 LE,
//     slot-major). Absent when the optimizer has none (sgd).
//   column family "meta"
//     'h' | round -> this shard's header for the round (JSON): shard id,
//                    clocks, run settings, tensor and table definitions with
//                    the number of blocks and rows written
//     'm' | round -> the "shard complete" marker (JSON: keys and bytes),
//                    written last and synced; a round without it is ignored
//     'c' | round -> a round shard 0 announced complete (Prune's argument),
//                    so shards without records know which rounds to keep
//     "round/" + round as 20 decimal digits -> shard 0's RoundRecord (JSON)
//
// WriteShard first deletes any leftovers of the round, then writes the
// header and data in batches of bounded size, and the marker last, synced.
// Readers look at rounds with a marker only, and check every value's length
// and the marker's key count. Floats are stored in the machine's byte
// order, which must be little endian (checked at compile time).
#include "server/checkpoint.h"

#include <fcntl.h>
#include <rocksdb/convenience.h>
#include <rocksdb/db.h>
#include <rocksdb/iterator.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/write_batch.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <boost/json.hpp>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <type_traits>
#include <utility>

#include "schema/log.h"
#include "server/optimizer.h"

namespace tether {
namespace {

namespace json = boost::json;

static_assert(std::endian::native == std::endian::little,
              "checkpoints store floats as little-endian bytes");

constexpr const char* kMetaFamily = "meta";
constexpr const char* kWeightsFamily = "weights";
constexpr const char* kSlotsFamily = "slots";
constexpr int kFormat = 1;

// A round is written in batches of about this many bytes: memory stays
// bounded next to the snapshot's own copy, and each batch is one WAL record
// large enough that per-write costs vanish.
constexpr size_t kBatchBytes = size_t{8} << 20;

constexpr char kHeaderTag = 'h';
constexpr char kMarkerTag = 'm';
constexpr char kAnnouncedTag = 'c';
constexpr char kBlockKind = 'b';
constexpr char kRowKind = 'r';
constexpr const char* kRecordPrefix = "round/";
constexpr size_t kBlockKeySize = 8 + 1 + 4 + 4;
constexpr size_t kRowKeySize = 8 + 1 + 4 + 8;
constexpr int64_t kMaxRound = std::numeric_limits<int64_t>::max() - 1;

void PutBigEndian(std::string* out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) {
    out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
}

uint64_t GetBigEndian(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

std::string RoundKey(int64_t round) {
  std::string k;
  PutBigEndian(&k, static_cast<uint64_t>(round), 8);
  return k;
}

std::string MetaKey(char tag, int64_t round) { return tag + RoundKey(round); }

std::string RecordKey(int64_t round) {
  char digits[32];
  std::snprintf(digits, sizeof(digits), "%020lld",
                static_cast<long long>(round));
  return kRecordPrefix + std::string(digits);
}

std::string BlockKey(int64_t round, uint32_t tensor, uint32_t block) {
  std::string k = RoundKey(round);
  k.push_back(kBlockKind);
  PutBigEndian(&k, tensor, 4);
  PutBigEndian(&k, block, 4);
  return k;
}

std::string RowKey(int64_t round, uint32_t table, uint64_t key) {
  std::string k = RoundKey(round);
  k.push_back(kRowKind);
  PutBigEndian(&k, table, 4);
  PutBigEndian(&k, key, 8);
  return k;
}

std::string Hex(const rocksdb::Slice& s) { return s.ToString(/*hex=*/true); }

uint64_t FloatBytes(size_t n) { return uint64_t{n} * sizeof(float); }

// --- JSON --------------------------------------------------------------------

const char* InitKindName(InitSpec::Kind kind) {
  switch (kind) {
    case InitSpec::Kind::kZeros:
      return "zeros";
    case InitSpec::Kind::kUniform:
      return "uniform";
    case InitSpec::Kind::kNormal:
      return "normal";
    case InitSpec::Kind::kProvided:
      return "provided";
    case InitSpec::Kind::kConstant:
      return "constant";
  }
  return "unknown";
}

bool ParseInitKind(const std::string& name, InitSpec::Kind* kind) {
  for (InitSpec::Kind k : {InitSpec::Kind::kZeros, InitSpec::Kind::kUniform,
                           InitSpec::Kind::kNormal, InitSpec::Kind::kConstant,
                           InitSpec::Kind::kProvided}) {
    if (name == InitKindName(k)) {
      *kind = k;
      return true;
    }
  }
  return false;
}

// Reads typed fields of one JSON object, keeping the first problem so that a
// decoder reads straight through and checks once at the end.
class Fields {
 public:
  Fields(const json::value& v, std::string what) : what_(std::move(what)) {
    object_ = v.if_object();
    if (object_ == nullptr) Fail("is not a JSON object");
  }

  template <typename T>
  T Number(const char* key) {
    const json::value* v = Find(key);
    if (v == nullptr) return T{};
    boost::system::error_code ec;
    // Through double for floats: every float is a double exactly.
    if constexpr (std::is_floating_point_v<T>) {
      const double d = v->to_number<double>(ec);
      if (!ec) return static_cast<T>(d);
    } else {
      const T n = v->to_number<T>(ec);
      if (!ec) return n;
    }
    Fail(std::string("field '") + key + "' is not a number in range");
    return T{};
  }

  std::string String(const char* key) {
    const json::value* v = Find(key);
    if (v == nullptr) return {};
    if (!v->is_string()) {
      Fail(std::string("field '") + key + "' is not a string");
      return {};
    }
    return std::string(v->get_string());
  }

  const json::array& Array(const char* key) {
    static const json::array kEmpty;
    const json::value* v = Find(key);
    if (v == nullptr) return kEmpty;
    if (!v->is_array()) {
      Fail(std::string("field '") + key + "' is not an array");
      return kEmpty;
    }
    return v->get_array();
  }

  bool Bool(const char* key) {
    const json::value* v = Find(key);
    if (v == nullptr) return false;
    if (!v->is_bool()) {
      Fail(std::string("field '") + key + "' is not true or false");
      return false;
    }
    return v->get_bool();
  }

  // Whether a field added after the format's first version is there.
  bool Has(const char* key) const {
    return object_ != nullptr && object_->contains(key);
  }

  // A field added after the format's first version: "" when absent.
  std::string OptionalString(const char* key) {
    if (object_ == nullptr || !object_->contains(key)) return {};
    return String(key);
  }

  const json::value& Value(const char* key) {
    static const json::value kNull;
    const json::value* v = Find(key);
    return v == nullptr ? kNull : *v;
  }

  void Fail(const std::string& problem) {
    if (error_.empty()) error_ = what_ + " " + problem;
  }
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }

 private:
  const json::value* Find(const char* key) {
    if (object_ == nullptr) return nullptr;
    const json::value* v = object_->if_contains(key);
    if (v == nullptr) Fail(std::string("has no field '") + key + "'");
    return v;
  }

  std::string what_;
  const json::object* object_ = nullptr;
  std::string error_;
};

json::value InitToJson(const InitSpec& init) {
  return json::object{{"kind", InitKindName(init.kind)},
                      {"scale", static_cast<double>(init.scale)}};
}

InitSpec InitFromJson(const json::value& v, Fields* parent) {
  Fields f(v, "init");
  InitSpec init;
  const std::string kind = f.String("kind");
  init.scale = f.Number<float>("scale");
  if (f.ok() && !ParseInitKind(kind, &init.kind)) {
    f.Fail("kind '" + kind + "' is unknown");
  }
  if (!f.ok()) parent->Fail(f.error());
  return init;
}

json::value SettingsToJson(const RunSettings& s) {
  const OptimizerOptions& o = s.optimizer;
  return json::object{
      {"run_id", s.run_id},
      {"seed", s.seed},
      {"num_shards", s.num_shards},
      {"keep_checkpoints", s.keep_checkpoints},
      {"num_workers", s.num_workers},
      {"max_staleness", s.max_staleness},
      {"reject_staleness", s.reject_staleness},
      {"block_size", s.block_size},
      {"checkpoint_every", s.checkpoint_every},
      {"resume_round", s.resume_round},
      {"worker_timeout_ms", s.worker_timeout_ms},
      {"heartbeat_ms", s.heartbeat_ms},
      {"backup_workers", s.backup_workers},
      {"staleness_lr", s.staleness_lr},
      {"optimizer", json::object{{"kind", OptimizerName(o.kind)},
                                 {"lr", static_cast<double>(o.lr)},
                                 {"momentum", static_cast<double>(o.momentum)},
                                 {"beta1", static_cast<double>(o.beta1)},
                                 {"beta2", static_cast<double>(o.beta2)},
                                 {"epsilon", static_cast<double>(o.epsilon)}}}};
}

RunSettings SettingsFromJson(const json::value& v, Fields* parent) {
  Fields f(v, "settings");
  RunSettings s;
  s.run_id = f.OptionalString("run_id");
  s.seed = f.Number<uint64_t>("seed");
  s.num_shards = f.Number<int>("num_shards");
  // Fields newer than the first rounds: absent ones keep their defaults.
  if (f.Has("keep_checkpoints")) {
    s.keep_checkpoints = f.Number<int>("keep_checkpoints");
  }
  if (f.Has("worker_timeout_ms")) {
    s.worker_timeout_ms = f.Number<int>("worker_timeout_ms");
  }
  if (f.Has("heartbeat_ms")) s.heartbeat_ms = f.Number<int>("heartbeat_ms");
  if (f.Has("backup_workers")) {
    s.backup_workers = f.Number<int>("backup_workers");
  }
  if (f.Has("staleness_lr")) s.staleness_lr = f.Bool("staleness_lr");
  s.num_workers = f.Number<int>("num_workers");
  s.max_staleness = f.Number<int>("max_staleness");
  s.reject_staleness = f.Number<int>("reject_staleness");
  s.block_size = f.Number<uint32_t>("block_size");
  s.checkpoint_every = f.Number<int64_t>("checkpoint_every");
  s.resume_round = f.Number<int64_t>("resume_round");
  Fields o(f.Value("optimizer"), "optimizer");
  const std::string kind = o.String("kind");
  s.optimizer.lr = o.Number<float>("lr");
  s.optimizer.momentum = o.Number<float>("momentum");
  s.optimizer.beta1 = o.Number<float>("beta1");
  s.optimizer.beta2 = o.Number<float>("beta2");
  s.optimizer.epsilon = o.Number<float>("epsilon");
  if (o.ok()) {
    Result<OptimizerKind> k = ParseOptimizerKind(kind);
    if (k.ok()) {
      s.optimizer.kind = *k;
    } else {
      o.Fail("kind '" + kind + "' is unknown");
    }
  }
  if (!o.ok()) f.Fail(o.error());
  if (f.ok() && (s.num_shards < 1 || s.block_size < 1)) {
    f.Fail("has num_shards or block_size below 1");
  }
  if (!f.ok()) parent->Fail(f.error());
  return s;
}

// The geometry of a dense tensor, from its shape and the block size.
struct DenseLayout {
  uint64_t numel = 0;
  uint64_t num_blocks = 0;
  uint32_t block_size = 0;

  uint32_t BlockLen(uint32_t block) const {
    return static_cast<uint32_t>(
        std::min<uint64_t>(numel - uint64_t{block} * block_size, block_size));
  }
};

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

// OK when every block and row of `s` has the length its shape (or dim) and
// the optimizer's slot count call for; else kInvalidArgument naming it.
Status CheckFits(const std::string& where, const ShardSnapshot& s) {
  const size_t slots_per_weight =
      Optimizer(s.settings.optimizer).slots_per_weight();
  for (const TensorSnapshot& t : s.tensors) {
    const std::string what = where + ": tensor '" + t.name + "'";
    DenseLayout layout;
    const std::string bad = MakeLayout(t.shape, s.settings.block_size, &layout);
    if (!bad.empty()) return InvalidArgument(bad).WithContext(what);
    for (const TensorSnapshot::Block& b : t.blocks) {
      if (b.index >= layout.num_blocks ||
          b.Weights().size() != layout.BlockLen(b.index) ||
          b.Slots().size() != slots_per_weight * b.Weights().size()) {
        return InvalidArgument(what + " block " + std::to_string(b.index) +
                               " does not fit its shape and optimizer");
      }
    }
  }
  for (const TableSnapshot& t : s.tables) {
    for (const TableSnapshot::Row& r : t.rows) {
      if (r.weights.size() != t.dim ||
          r.slots.size() != slots_per_weight * t.dim) {
        return InvalidArgument(where + ": table '" + t.name + "' row " +
                               std::to_string(r.key) +
                               " does not fit its dim and optimizer");
      }
    }
  }
  return Status::Ok();
}

struct HeaderCounts {
  std::map<uint32_t, uint64_t> blocks;  // by tensor id
  std::map<uint32_t, uint64_t> rows;    // by table id
};

std::string HeaderToJson(const ShardSnapshot& s) {
  json::array tensors;
  for (const TensorSnapshot& t : s.tensors) {
    json::array shape;
    for (uint64_t d : t.shape) shape.push_back(d);
    tensors.push_back(json::object{{"id", t.id},
                                   {"name", t.name},
                                   {"shape", std::move(shape)},
                                   {"init", InitToJson(t.init)},
                                   {"blocks", t.blocks.size()}});
  }
  json::array tables;
  for (const TableSnapshot& t : s.tables) {
    tables.push_back(json::object{{"id", t.id},
                                  {"name", t.name},
                                  {"dim", t.dim},
                                  {"init", InitToJson(t.init)},
                                  {"rows", t.rows.size()}});
  }
  json::array clocks;
  for (int64_t c : s.worker_clocks) clocks.push_back(c);
  return json::serialize(json::object{{"format", kFormat},
                                      {"round", s.round},
                                      {"shard_id", s.shard_id},
                                      {"min_clock", s.min_clock},
                                      {"worker_clocks", std::move(clocks)},
                                      {"settings", SettingsToJson(s.settings)},
                                      {"tensors", std::move(tensors)},
                                      {"tables", std::move(tables)}});
}

// Decodes a header into `s` (definitions, no data) and the counts of blocks
// and rows it promises; the problem, or "".
std::string HeaderFromJson(const std::string& text, ShardSnapshot* s,
                           HeaderCounts* counts) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec) return "header is not JSON (" + ec.message() + ")";
  Fields f(v, "header");
  if (f.ok() && f.Number<int>("format") != kFormat) {
    return "header has an unknown format";
  }
  s->round = f.Number<int64_t>("round");
  s->shard_id = f.Number<int>("shard_id");
  s->min_clock = f.Number<int64_t>("min_clock");
  for (const json::value& c : f.Array("worker_clocks")) {
    boost::system::error_code cec;
    s->worker_clocks.push_back(c.to_number<int64_t>(cec));
    if (cec) f.Fail("has a worker clock that is not an integer");
  }
  s->settings = SettingsFromJson(f.Value("settings"), &f);
  for (const json::value& tv : f.Array("tensors")) {
    Fields t(tv, "tensor");
    TensorSnapshot ts;
    ts.id = t.Number<uint32_t>("id");
    ts.name = t.String("name");
    for (const json::value& d : t.Array("shape")) {
      boost::system::error_code dec;
      ts.shape.push_back(d.to_number<uint64_t>(dec));
      if (dec) t.Fail("'" + ts.name + "' has a bad shape");
    }
    ts.init = InitFromJson(t.Value("init"), &t);
    const uint64_t blocks = t.Number<uint64_t>("blocks");
    if (!t.ok()) return t.error();
    if (!counts->blocks.emplace(ts.id, blocks).second) {
      return "header defines tensor id " + std::to_string(ts.id) + " twice";
    }
    s->tensors.push_back(std::move(ts));
  }
  for (const json::value& tv : f.Array("tables")) {
    Fields t(tv, "table");
    TableSnapshot ts;
    ts.id = t.Number<uint32_t>("id");
    ts.name = t.String("name");
    ts.dim = t.Number<uint32_t>("dim");
    ts.init = InitFromJson(t.Value("init"), &t);
    const uint64_t rows = t.Number<uint64_t>("rows");
    if (!t.ok()) return t.error();
    if (ts.dim == 0) return "table '" + ts.name + "' has dim 0";
    if (!counts->rows.emplace(ts.id, rows).second) {
      return "header defines table id " + std::to_string(ts.id) + " twice";
    }
    s->tables.push_back(std::move(ts));
  }
  return f.ok() ? "" : f.error();
}

std::string RecordToJson(const RoundRecord& r) {
  json::array workers;
  for (const WorkerPosition& w : r.workers) {
    workers.push_back(json::object{{"rank", w.rank},
                                   {"clock", w.clock},
                                   {"epoch", w.epoch},
                                   {"samples", w.samples}});
  }
  return json::serialize(json::object{{"format", kFormat},
                                      {"round", r.round},
                                      {"clock", r.clock},
                                      {"unix_ms", r.unix_ms},
                                      {"bytes", r.bytes},
                                      {"settings", SettingsToJson(r.settings)},
                                      {"workers", std::move(workers)}});
}

std::string RecordFromJson(const std::string& text, RoundRecord* r) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec) return "record is not JSON (" + ec.message() + ")";
  Fields f(v, "record");
  r->round = f.Number<int64_t>("round");
  r->clock = f.Number<int64_t>("clock");
  r->unix_ms = f.Number<int64_t>("unix_ms");
  r->bytes = f.Number<uint64_t>("bytes");
  r->settings = SettingsFromJson(f.Value("settings"), &f);
  for (const json::value& wv : f.Array("workers")) {
    Fields w(wv, "worker");
    WorkerPosition p;
    p.rank = w.Number<int>("rank");
    p.clock = w.Number<int64_t>("clock");
    p.epoch = w.Number<int>("epoch");
    p.samples = w.Number<uint64_t>("samples");
    if (!w.ok()) f.Fail(w.error());
    r->workers.push_back(p);
  }
  return f.ok() ? "" : f.error();
}

// --- Statuses
// ------------------------------------------------------------------

Status IoError(const std::string& where, const std::string& doing,
               const rocksdb::Status& s) {
  return Status(Code::kIoError, where + ": " + doing + ": " + s.ToString());
}

Status Corrupt(const std::string& where, const std::string& problem) {
  return BadFrame(where + ": corrupt: " + problem);
}

rocksdb::ColumnFamilyOptions DataFamilyOptions() {
  rocksdb::ColumnFamilyOptions o;
  // Trained floats hardly compress; compressing them only costs CPU.
  o.compression = rocksdb::kNoCompression;
  return o;
}

// RocksDB's own log, sent to tether's (warnings and errors only) instead of
// a LOG file in the data dir: on a full disk RocksDB's file logger aborts the
// process (an assertion on writing after a failed write; Debian's build
// keeps assertions), and its info chatter adds nothing to our statuses.
class RocksLog : public rocksdb::Logger {
 public:
  explicit RocksLog(std::string dir)
      : rocksdb::Logger(rocksdb::InfoLogLevel::WARN_LEVEL),
        dir_(std::move(dir)) {}

  using rocksdb::Logger::Logv;
  void Logv(const rocksdb::InfoLogLevel level, const char* format,
            va_list ap) override {
    if (level < GetInfoLogLevel() ||
        level == rocksdb::InfoLogLevel::HEADER_LEVEL) {
      return;
    }
    char line[1024];
    std::vsnprintf(line, sizeof(line), format, ap);
    std::string text = line;
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) {
      text.pop_back();
    }
    LogLine(level >= rocksdb::InfoLogLevel::ERROR_LEVEL ? LogLevel::kError
                                                        : LogLevel::kWarning,
            "rocksdb " + dir_ + ": " + text);
  }

 private:
  const std::string dir_;
};

rocksdb::DBOptions BaseOptions(const std::string& dir) {
  rocksdb::DBOptions o;
  o.create_if_missing = true;
  o.create_missing_column_families = true;
  o.info_log = std::make_shared<RocksLog>(dir);
  return o;
}

std::vector<rocksdb::ColumnFamilyDescriptor> Families() {
  return {{rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()},
          {kMetaFamily, rocksdb::ColumnFamilyOptions()},
          {kWeightsFamily, DataFamilyOptions()},
          {kSlotsFamily, DataFamilyOptions()}};
}

}  // namespace

struct CheckpointStore::Impl {
  // Constant after Open.
  rocksdb::DB* db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;  // as in Families()
  bool read_only = false;

  std::mutex mu;
  std::string last_write_error;  // guarded by mu

  // Writes `batch`, remembering a failure so that later calls can say why
  // the store stopped.
  Status Write(const std::string& where, const std::string& doing,
               rocksdb::WriteBatch* batch, bool sync = false) {
    rocksdb::WriteOptions options;
    options.sync = sync;
    rocksdb::Status s = db->Write(options, batch);
    if (s.ok()) return Status::Ok();
    std::lock_guard<std::mutex> lock(mu);
    last_write_error = s.ToString();
    return IoError(where, doing, s);
  }

  // RocksDB stops taking writes after a failed one (a full disk) until
  // Resume() succeeds, which it does once the cause is gone.
  Status Recover(const std::string& where) {
    rocksdb::Status s = db->Resume();
    if (s.ok()) return Status::Ok();
    std::lock_guard<std::mutex> lock(mu);
    return Status(Code::kIoError,
                  where + ": stopped since an earlier write failed (" +
                      last_write_error +
                      "); not recovered yet: " + s.ToString());
  }

  rocksdb::ColumnFamilyHandle* meta() const { return handles[1]; }
  rocksdb::ColumnFamilyHandle* weights() const { return handles[2]; }
  rocksdb::ColumnFamilyHandle* slots() const { return handles[3]; }

  ~Impl() {
    if (db == nullptr) return;
    for (rocksdb::ColumnFamilyHandle* h : handles) {
      db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
    }
    // Close errors (e.g. a full disk) cannot be acted on here; what was
    // synced stays.
    db->Close().PermitUncheckedError();
    delete db;
  }

  // Keys of `tag` | round for rounds in [from, to).
  void DeleteMetaRange(rocksdb::WriteBatch* batch, char tag, int64_t from,
                       int64_t to) const {
    batch->DeleteRange(meta(), MetaKey(tag, from), MetaKey(tag, to))
        .PermitUncheckedError();
  }
  // Every shard key (data, header, marker, announcement) of rounds in
  // [from, to); records are left alone.
  void DeleteRounds(rocksdb::WriteBatch* batch, int64_t from,
                    int64_t to) const {
    const std::string a = RoundKey(from), b = RoundKey(to);
    batch->DeleteRange(weights(), a, b).PermitUncheckedError();
    batch->DeleteRange(slots(), a, b).PermitUncheckedError();
    for (char tag : {kHeaderTag, kMarkerTag, kAnnouncedTag}) {
      DeleteMetaRange(batch, tag, from, to);
    }
  }

  // Rounds with a `tag` key in the meta family, ascending.
  rocksdb::Status RoundsWithTag(char tag, std::vector<int64_t>* rounds) const {
    const std::string upper(1, static_cast<char>(tag + 1));
    rocksdb::ReadOptions ro;
    rocksdb::Slice upper_slice(upper);
    ro.iterate_upper_bound = &upper_slice;
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro, meta()));
    for (it->Seek(std::string(1, tag)); it->Valid(); it->Next()) {
      const rocksdb::Slice k = it->key();
      if (k.size() != 9) continue;
      rounds->push_back(static_cast<int64_t>(GetBigEndian(k.data() + 1, 8)));
    }
    return it->status();
  }
};

namespace {

// Who holds `dir`'s RocksDB LOCK (a POSIX record lock), e.g.
// "tether-server pid 123"; empty when nobody else does.
std::string LockHolder(const std::string& dir) {
  const int fd = ::open((dir + "/LOCK").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  std::string holder;
  if (fcntl(fd, F_GETLK, &lock) == 0 && lock.l_type != F_UNLCK) {
    std::string name;
    std::ifstream comm("/proc/" + std::to_string(lock.l_pid) + "/comm");
    std::getline(comm, name);
    holder = (name.empty() ? std::string("a process") : name) + " pid " +
             std::to_string(lock.l_pid);
  }
  ::close(fd);
  return holder;
}

}  // namespace

CheckpointStore::CheckpointStore(std::string dir, std::unique_ptr<Impl> impl)
    : dir_(std::move(dir)), impl_(std::move(impl)) {}

CheckpointStore::~CheckpointStore() = default;

namespace {

// The number in RocksDB's "MANIFEST-000123"; -1 for other names.
int64_t ManifestNumber(const std::string& name) {
  constexpr std::string_view kPrefix = "MANIFEST-";
  if (name.rfind(kPrefix, 0) != 0 || name.size() == kPrefix.size()) return -1;
  int64_t n = 0;
  for (char c : name.substr(kPrefix.size())) {
    if (c < '0' || c > '9' || n > (int64_t{1} << 50)) return -1;
    n = n * 10 + (c - '0');
  }
  return n;
}

// Looks at `dir` before RocksDB does, since RocksDB with create_if_missing
// starts a new database in any directory without a CURRENT file, deleting
// the old one's files. Sets *no_store to why there is no store when `dir`
// is missing or empty ("" when there is one). Returns "" when RocksDB may
// open it, else why not, with how to recover.
std::string CheckStoreFiles(const std::string& dir, std::string* no_store) {
  namespace fs = std::filesystem;
  no_store->clear();
  std::error_code ec;
  const fs::file_status status = fs::status(dir, ec);
  if (!fs::exists(status)) {
    *no_store = "does not exist";
    return "";
  }
  if (!fs::is_directory(status)) return "is not a directory";
  std::vector<std::string> names;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  if (ec) return "cannot be listed: " + ec.message();
  if (names.empty()) {
    *no_store = "is empty";
    return "";
  }
  std::sort(names.begin(), names.end());
  std::string newest_manifest;
  for (const std::string& name : names) {
    if (ManifestNumber(name) > ManifestNumber(newest_manifest)) {
      newest_manifest = name;
    }
  }
  const std::string unchanged = "; nothing was changed";
  if (!std::binary_search(names.begin(), names.end(), "CURRENT")) {
    if (newest_manifest.empty()) {
      std::string some;
      for (size_t i = 0; i < names.size() && i < 3; ++i) {
        some += (i ? ", " : "") + names[i];
      }
      return "holds " + std::to_string(names.size()) + " files (" + some +
             (names.size() > 3 ? ", ..." : "") +
             ") but no RocksDB CURRENT or MANIFEST file: it is not a "
             "checkpoint store, or its metadata is lost" +
             unchanged + ". To start afresh, give an empty directory";
    }
    return "holds a checkpoint store whose CURRENT file is missing" +
           unchanged +
           ". To recover it, name the newest MANIFEST in CURRENT: echo " +
           newest_manifest + " > " + dir + "/CURRENT";
  }
  std::ifstream in(dir + "/CURRENT");
  std::string named;
  std::getline(in, named);
  if (!in && !in.eof()) return "its CURRENT file cannot be read" + unchanged;
  if (ManifestNumber(named) < 0 ||
      !std::binary_search(names.begin(), names.end(), named)) {
    return "its CURRENT file names '" + named + "', which is missing" +
           unchanged +
           (newest_manifest.empty()
                ? std::string(": the store's metadata is lost")
                : ". If " + newest_manifest +
                      " is the store's newest MANIFEST, recover with: echo " +
                      newest_manifest + " > " + dir + "/CURRENT");
  }
  return "";
}

}  // namespace

Result<std::unique_ptr<CheckpointStore>> CheckpointStore::Open(
    const std::string& dir, OpenMode mode) {
  const std::string where = "checkpoint dir " + dir;
  std::string no_store;
  if (std::string bad = CheckStoreFiles(dir, &no_store); !bad.empty()) {
    return Status(Code::kIoError, where + " " + bad);
  }
  auto impl = std::make_unique<Impl>();
  rocksdb::DBOptions options = BaseOptions(dir);
  if (!no_store.empty()) {
    if (mode == OpenMode::kExisting) {
      return NotFound(where + " " + no_store +
                      ": no checkpoint store there (nothing was created)");
    }
    // RocksDB would create it too, but logs a missing dir as an error
    // first; a failure here shows up as Open's own error below.
    std::error_code ignored;
    std::filesystem::create_directories(dir, ignored);
  } else {
    // A read-only open writes nothing: whatever makes the store unusable
    // (damage, a missing file or column family) is found before the
    // read-write open below could change a file.
    options.create_if_missing = false;
    options.create_missing_column_families = false;
    rocksdb::DB* probe = nullptr;
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::Status s = rocksdb::DB::OpenForReadOnly(options, dir, Families(),
                                                     &handles, &probe);
    if (!s.ok()) {
      return IoError(where, "cannot open (nothing was changed)", s);
    }
    for (rocksdb::ColumnFamilyHandle* h : handles) {
      probe->DestroyColumnFamilyHandle(h).PermitUncheckedError();
    }
    delete probe;
  }
  if (std::string holder = LockHolder(dir); !holder.empty()) {
    return Status(Code::kIoError,
                  where + " is held by " + holder +
                      " (it has the store open): stop it first, or give "
                      "this shard its own --data-dir; nothing was changed");
  }
  rocksdb::Status s =
      rocksdb::DB::Open(options, dir, Families(), &impl->handles, &impl->db);
  if (!s.ok()) return IoError(where, "cannot open", s);
  return std::unique_ptr<CheckpointStore>(
      new CheckpointStore(dir, std::move(impl)));
}

Result<std::unique_ptr<CheckpointStore>> CheckpointStore::OpenReadOnly(
    const std::string& dir) {
  const std::string where = "checkpoint dir " + dir;
  std::string no_store;
  if (std::string bad = CheckStoreFiles(dir, &no_store); !bad.empty()) {
    return Status(Code::kIoError, where + " " + bad);
  }
  if (!no_store.empty()) {
    return Status(Code::kIoError,
                  where + " " + no_store + ": no checkpoint store there");
  }
  auto impl = std::make_unique<Impl>();
  impl->read_only = true;
  rocksdb::DBOptions options = BaseOptions(dir);
  options.create_if_missing = false;
  rocksdb::Status s = rocksdb::DB::OpenForReadOnly(options, dir, Families(),
                                                   &impl->handles, &impl->db);
  if (!s.ok()) return IoError(where, "cannot open read-only", s);
  return std::unique_ptr<CheckpointStore>(
      new CheckpointStore(dir, std::move(impl)));
}

Result<uint64_t> CheckpointStore::WriteShard(const ShardSnapshot& snapshot) {
  const int64_t round = snapshot.round;
  const std::string where =
      "checkpoint dir " + dir_ + ": round " + std::to_string(round);
  if (impl_->read_only) return InvalidArgument(where + ": opened read-only");
  if (round < 0 || round > kMaxRound) {
    return InvalidArgument(where + ": round out of range");
  }
  // Checked here, not only when read back: a round that cannot be read
  // must not be written.
  TETHER_RETURN_IF_ERROR(CheckFits(where, snapshot));
  TETHER_RETURN_IF_ERROR(impl_->Recover(where));

  rocksdb::WriteBatch batch;
  uint64_t bytes = 0, keys = 0;
  Status failed;
  auto flush = [&]() {
    failed = impl_->Write(where, "write failed", &batch);
    batch.Clear();
  };
  auto put = [&](rocksdb::ColumnFamilyHandle* family, const std::string& key,
                 rocksdb::SliceParts value, size_t value_bytes) {
    rocksdb::Slice key_slice(key);
    batch.Put(family, rocksdb::SliceParts(&key_slice, 1), value)
        .PermitUncheckedError();
    bytes += key.size() + value_bytes;
    ++keys;
    if (batch.GetDataSize() >= kBatchBytes) flush();
  };

  // Leftovers of an earlier attempt at this round (a crash, a full disk)
  // must not mix with this one; deleted in the same batch as the new
  // header, so the round is never read half old, half new.
  impl_->DeleteRounds(&batch, round, round + 1);
  const std::string header = HeaderToJson(snapshot);
  rocksdb::Slice header_slice(header);
  put(impl_->meta(), MetaKey(kHeaderTag, round),
      rocksdb::SliceParts(&header_slice, 1), header.size());

  auto put_data = [&](const std::string& key, uint64_t step,
                      std::span<const float> weights,
                      std::span<const float> slots) {
    uint64_t step_le = step;
    rocksdb::Slice parts[2] = {
        rocksdb::Slice(reinterpret_cast<const char*>(&step_le), 8),
        rocksdb::Slice(reinterpret_cast<const char*>(weights.data()),
                       FloatBytes(weights.size()))};
    put(impl_->weights(), key, rocksdb::SliceParts(parts, 2),
        8 + FloatBytes(weights.size()));
    if (slots.empty()) return;
    rocksdb::Slice slot_slice(reinterpret_cast<const char*>(slots.data()),
                              FloatBytes(slots.size()));
    put(impl_->slots(), key, rocksdb::SliceParts(&slot_slice, 1),
        FloatBytes(slots.size()));
  };
  for (const TensorSnapshot& t : snapshot.tensors) {
    for (const TensorSnapshot::Block& b : t.blocks) {
      put_data(BlockKey(round, t.id, b.index), b.step, b.Weights(), b.Slots());
      if (!failed.ok()) return failed;
    }
  }
  for (const TableSnapshot& t : snapshot.tables) {
    for (const TableSnapshot::Row& r : t.rows) {
      put_data(RowKey(round, t.id, r.key), r.step, r.weights, r.slots);
      if (!failed.ok()) return failed;
    }
  }
  if (batch.Count() > 0) flush();
  if (!failed.ok()) return failed;

  // Last, and synced: the WAL is sequential, so syncing the marker makes
  // every batch before it durable too.
  const std::string marker =
      json::serialize(json::object{{"keys", keys}, {"bytes", bytes}});
  batch.Put(impl_->meta(), MetaKey(kMarkerTag, round), marker)
      .PermitUncheckedError();
  TETHER_RETURN_IF_ERROR(impl_->Write(where, "writing the completion marker",
                                      &batch, /*sync=*/true));
  return bytes + 9 + marker.size();
}

Result<ShardSnapshot> CheckpointStore::ReadShard(int64_t round) const {
  const std::string where =
      "checkpoint dir " + dir_ + ": round " + std::to_string(round);
  if (round < 0 || round > kMaxRound) {
    return NotFound(where + ": no such round");
  }
  rocksdb::DB* db = impl_->db;
  std::string marker, header;
  rocksdb::Status s = db->Get(rocksdb::ReadOptions(), impl_->meta(),
                              MetaKey(kMarkerTag, round), &marker);
  if (s.IsNotFound()) {
    return NotFound(where + ": not completely written by this shard");
  }
  if (!s.ok()) return IoError(where, "reading the marker", s);
  s = db->Get(rocksdb::ReadOptions(), impl_->meta(), MetaKey(kHeaderTag, round),
              &header);
  if (s.IsNotFound()) return Corrupt(where, "the header is missing");
  if (!s.ok()) return IoError(where, "reading the header", s);

  uint64_t marker_keys = 0;
  {
    boost::system::error_code ec;
    json::value v = json::parse(marker, ec);
    if (ec) v = nullptr;  // then reported as not an object
    Fields f(v, "marker");
    marker_keys = f.Number<uint64_t>("keys");
    if (!f.ok()) return Corrupt(where, f.error());
  }
  ShardSnapshot snap;
  HeaderCounts counts;
  if (std::string bad = HeaderFromJson(header, &snap, &counts); !bad.empty()) {
    return Corrupt(where, bad);
  }
  if (snap.round != round) {
    return Corrupt(where,
                   "the header is for round " + std::to_string(snap.round));
  }
  std::map<uint32_t, size_t> tensor_of, table_of;
  std::vector<DenseLayout> layouts(snap.tensors.size());
  for (size_t i = 0; i < snap.tensors.size(); ++i) {
    const TensorSnapshot& t = snap.tensors[i];
    const std::string bad =
        MakeLayout(t.shape, snap.settings.block_size, &layouts[i]);
    if (!bad.empty()) return Corrupt(where, "tensor '" + t.name + "': " + bad);
    tensor_of[t.id] = i;
  }
  for (size_t i = 0; i < snap.tables.size(); ++i) {
    table_of[snap.tables[i].id] = i;
  }
  const size_t slots_per_weight =
      Optimizer(snap.settings.optimizer).slots_per_weight();

  // Weights and slots share keys: walk both families in step.
  const std::string lower = RoundKey(round), upper = RoundKey(round + 1);
  rocksdb::Slice upper_slice(upper);
  rocksdb::ReadOptions ro;
  ro.iterate_upper_bound = &upper_slice;
  ro.fill_cache = false;  // read once
  std::unique_ptr<rocksdb::Iterator> w(db->NewIterator(ro, impl_->weights()));
  std::unique_ptr<rocksdb::Iterator> sl(db->NewIterator(ro, impl_->slots()));
  w->Seek(lower);
  sl->Seek(lower);
  uint64_t keys = 1;  // the header
  for (; w->Valid(); w->Next()) {
    const rocksdb::Slice key = w->key(), value = w->value();
    const std::string at = "key " + Hex(key);
    const char kind = key.size() > 8 ? key[8] : 0;
    if (!((kind == kBlockKind && key.size() == kBlockKeySize) ||
          (kind == kRowKind && key.size() == kRowKeySize))) {
      return Corrupt(where, at + " is not a block or row key");
    }
    const uint32_t id = static_cast<uint32_t>(GetBigEndian(key.data() + 9, 4));
    uint64_t len = 0;
    std::string what;
    if (kind == kBlockKind) {
      auto it = tensor_of.find(id);
      if (it == tensor_of.end()) {
        return Corrupt(where, at + " is for tensor id " + std::to_string(id) +
                                  ", which the header does not define");
      }
      const uint32_t block =
          static_cast<uint32_t>(GetBigEndian(key.data() + 13, 4));
      const TensorSnapshot& t = snap.tensors[it->second];
      what = "tensor '" + t.name + "' block " + std::to_string(block) + " (" +
             at + ")";
      if (block >= layouts[it->second].num_blocks) {
        return Corrupt(where, what + " is past the end");
      }
      len = layouts[it->second].BlockLen(block);
    } else {
      auto it = table_of.find(id);
      if (it == table_of.end()) {
        return Corrupt(where, at + " is for table id " + std::to_string(id) +
                                  ", which the header does not define");
      }
      const TableSnapshot& t = snap.tables[it->second];
      what = "table '" + t.name + "' row " +
             std::to_string(GetBigEndian(key.data() + 13, 8)) + " (" + at + ")";
      len = t.dim;
    }
    if (value.size() != 8 + FloatBytes(len)) {
      return Corrupt(where, what + " holds " + std::to_string(value.size()) +
                                " bytes, expected " +
                                std::to_string(8 + FloatBytes(len)));
    }
    std::vector<float> slots;
    if (slots_per_weight > 0) {
      // A read error (a checksum mismatch) ends the iterator like the end
      // of the data would: report the error, not missing slots.
      if (!sl->Valid() && !sl->status().ok()) {
        return IoError(where, "reading optimizer slots", sl->status());
      }
      if (!sl->Valid() || sl->key() != key) {
        return Corrupt(where, what + " has no optimizer slots");
      }
      if (sl->value().size() != FloatBytes(slots_per_weight * len)) {
        return Corrupt(where,
                       what + " has " + std::to_string(sl->value().size()) +
                           " bytes of slots, expected " +
                           std::to_string(FloatBytes(slots_per_weight * len)));
      }
      slots.resize(slots_per_weight * len);
      std::memcpy(slots.data(), sl->value().data(), sl->value().size());
      sl->Next();
      ++keys;
    }
    uint64_t step = 0;
    std::memcpy(&step, value.data(), 8);
    std::vector<float> weights(len);
    std::memcpy(weights.data(), value.data() + 8, FloatBytes(len));
    if (kind == kBlockKind) {
      TensorSnapshot& t = snap.tensors[tensor_of[id]];
      TensorSnapshot::Block& b = t.blocks.emplace_back();
      b.index = static_cast<uint32_t>(GetBigEndian(key.data() + 13, 4));
      b.step = step;
      b.weights = std::move(weights);
      b.slots = std::move(slots);
    } else {
      TableSnapshot& t = snap.tables[table_of[id]];
      t.rows.push_back({GetBigEndian(key.data() + 13, 8), step,
                        std::move(weights), std::move(slots)});
    }
    ++keys;
  }
  if (!w->status().ok()) return IoError(where, "reading weights", w->status());
  if (!sl->status().ok()) return IoError(where, "reading slots", sl->status());
  if (sl->Valid()) {
    return Corrupt(where,
                   "key " + Hex(sl->key()) + " has slots but no weights");
  }
  if (keys != marker_keys) {
    return Corrupt(where, std::to_string(keys) +
                              " keys found, the marker says " +
                              std::to_string(marker_keys));
  }
  for (const TensorSnapshot& t : snap.tensors) {
    if (t.blocks.size() != counts.blocks[t.id]) {
      return Corrupt(where, "tensor '" + t.name + "' has " +
                                std::to_string(t.blocks.size()) +
                                " blocks, the header says " +
                                std::to_string(counts.blocks[t.id]));
    }
  }
  for (const TableSnapshot& t : snap.tables) {
    if (t.rows.size() != counts.rows[t.id]) {
      return Corrupt(where, "table '" + t.name + "' has " +
                                std::to_string(t.rows.size()) +
                                " rows, the header says " +
                                std::to_string(counts.rows[t.id]));
    }
  }
  return snap;
}

Result<std::vector<int64_t>> CheckpointStore::ShardRounds() const {
  std::vector<int64_t> rounds;
  rocksdb::Status s = impl_->RoundsWithTag(kMarkerTag, &rounds);
  if (!s.ok()) {
    return IoError("checkpoint dir " + dir_, "listing rounds", s);
  }
  return rounds;
}

Status CheckpointStore::MarkComplete(const RoundRecord& record) {
  const std::string where =
      "checkpoint dir " + dir_ + ": round " + std::to_string(record.round);
  if (impl_->read_only) return InvalidArgument(where + ": opened read-only");
  if (record.round < 0 || record.round > kMaxRound) {
    return InvalidArgument(where + ": round out of range");
  }
  TETHER_RETURN_IF_ERROR(impl_->Recover(where));
  rocksdb::WriteBatch batch;
  batch.Put(impl_->meta(), RecordKey(record.round), RecordToJson(record))
      .PermitUncheckedError();
  return impl_->Write(where, "recording the round complete", &batch,
                      /*sync=*/true);
}

Result<std::vector<RoundRecord>> CheckpointStore::CompleteRounds() const {
  std::vector<RoundRecord> records;
  const std::string prefix = kRecordPrefix;
  std::string upper = prefix;
  upper.back() += 1;
  rocksdb::Slice upper_slice(upper);
  rocksdb::ReadOptions ro;
  ro.iterate_upper_bound = &upper_slice;
  std::unique_ptr<rocksdb::Iterator> it(
      impl_->db->NewIterator(ro, impl_->meta()));
  for (it->Seek(prefix); it->Valid(); it->Next()) {
    RoundRecord r;
    const std::string key = it->key().ToString();
    if (std::string bad = RecordFromJson(it->value().ToString(), &r);
        !bad.empty()) {
      return Corrupt("checkpoint dir " + dir_ + ": " + key, bad);
    }
    if (RecordKey(r.round) != key) {
      return Corrupt("checkpoint dir " + dir_ + ": " + key,
                     "record is for round " + std::to_string(r.round));
    }
    records.push_back(std::move(r));
  }
  if (!it->status().ok()) {
    return IoError("checkpoint dir " + dir_, "listing complete rounds",
                   it->status());
  }
  return records;
}

Status CheckpointStore::Prune(int keep, int64_t newest_complete) {
  const std::string where = "checkpoint dir " + dir_ +
                            ": pruning before round " +
                            std::to_string(newest_complete);
  if (impl_->read_only) return InvalidArgument(where + ": opened read-only");
  if (keep < 1) {
    return InvalidArgument(where + ": keep is " + std::to_string(keep) +
                           ", must be at least 1");
  }
  if (newest_complete > kMaxRound) {
    return InvalidArgument(where + ": round out of range");
  }
  TETHER_RETURN_IF_ERROR(impl_->Recover(where));
  // Complete rounds this shard knows of: shard 0's records, and rounds
  // announced through earlier calls. A shard that missed announcements (it
  // restarted) knows fewer, so it keeps more, never less.
  std::set<int64_t> complete;
  Result<std::vector<RoundRecord>> records = CompleteRounds();
  if (!records.ok()) return records.status();
  for (const RoundRecord& r : *records) complete.insert(r.round);
  std::vector<int64_t> announced, headers, markers;
  for (auto [tag, rounds] :
       {std::pair{kAnnouncedTag, &announced}, std::pair{kHeaderTag, &headers},
        std::pair{kMarkerTag, &markers}}) {
    if (rocksdb::Status s = impl_->RoundsWithTag(tag, rounds); !s.ok()) {
      return IoError(where, "listing rounds", s);
    }
  }
  complete.insert(announced.begin(), announced.end());
  if (newest_complete >= 0) complete.insert(newest_complete);
  if (complete.empty()) return Status::Ok();

  rocksdb::WriteBatch batch;
  if (newest_complete >= 0) {
    batch.Put(impl_->meta(), MetaKey(kAnnouncedTag, newest_complete), "")
        .PermitUncheckedError();
  }
  int64_t cut = 0;  // every round before it goes
  if (complete.size() >= static_cast<size_t>(keep)) {
    cut = *std::prev(complete.end(), keep);
    impl_->DeleteRounds(&batch, 0, cut);
    batch.DeleteRange(impl_->meta(), RecordKey(0), RecordKey(cut))
        .PermitUncheckedError();
  }
  // Between the cut and the newest complete round, a round is deleted only
  // when it is surely incomplete: shard 0 has no record of it, or this shard
  // never finished it (no marker) -- then no shard can have recorded it.
  const std::set<int64_t> finished(markers.begin(), markers.end());
  const bool has_records = !records->empty();
  for (int64_t r : headers) {
    if (r < cut || r >= newest_complete || complete.count(r) > 0) continue;
    if (has_records || finished.count(r) == 0) {
      impl_->DeleteRounds(&batch, r, r + 1);
    }
  }
  TETHER_RETURN_IF_ERROR(impl_->Write(where, "deleting old rounds", &batch));
  if (cut > 0) {
    // Drops whole files of old rounds now, rather than at some later
    // compaction, so the disk space comes back; best effort.
    const std::string a = RoundKey(0), b = RoundKey(cut);
    rocksdb::Slice as(a), bs(b);
    for (rocksdb::ColumnFamilyHandle* family :
         {impl_->weights(), impl_->slots()}) {
      rocksdb::DeleteFilesInRange(impl_->db, family, &as, &bs,
                                  /*include_end=*/false)
          .PermitUncheckedError();
    }
  }
  return Status::Ok();
}

std::string IdentityMismatch(const ShardSnapshot& snapshot, int shard_id,
                             const RunSettings& run) {
  const RunSettings& r = snapshot.settings;
  std::string out;
  auto add = [&out](const std::string& difference) {
    if (!difference.empty()) out += (out.empty() ? "" : "; ") + difference;
  };
  if (snapshot.shard_id != shard_id) {
    add("shard id " + std::to_string(snapshot.shard_id) + " in the round, " +
        std::to_string(shard_id) + " here");
  }
  if (r.run_id != run.run_id) {
    add("run id " + (r.run_id.empty() ? "(none)" : r.run_id) +
        " in the round, " + (run.run_id.empty() ? "(none)" : run.run_id) +
        " here");
  }
  // Seed, shard and worker counts, block size, optimizer: what a resume
  // checks the round's record against too.
  add(SettingsMismatch(r, run));
  return out;
}

}  // namespace tether
