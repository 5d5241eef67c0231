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
//
// The keys are made and taken apart in checkpoint_keys.cc, the JSON values
// encoded and decoded in checkpoint_codec.cc, a round's data read back and
// checked in checkpoint_reader.cc; this file is the store.
#include "server/checkpoint.h"

#include <fcntl.h>
#include <rocksdb/cache.h>
#include <rocksdb/convenience.h>
#include <rocksdb/db.h>
#include <rocksdb/iterator.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/sst_file_writer.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include "schema/log.h"
#include "schema/mutex.h"
#include "server/checkpoint_codec.h"
#include "server/checkpoint_keys.h"
#include "server/checkpoint_reader.h"
#include "server/optimizer.h"
#include "server/recycling_allocator.h"

namespace tether {

using checkpoint::BlockKey;
using checkpoint::Corrupt;
using checkpoint::DataKey;
using checkpoint::DenseLayout;
using checkpoint::FloatBytes;
using checkpoint::Hex;
using checkpoint::IoError;
using checkpoint::kAnnouncedTag;
using checkpoint::kBlockKind;
using checkpoint::kHeaderTag;
using checkpoint::kMarkerTag;
using checkpoint::kMaxRound;
using checkpoint::kRecordPrefix;
using checkpoint::MakeLayout;
using checkpoint::MetaKey;
using checkpoint::RecordKey;
using checkpoint::RoundKey;
using checkpoint::RowKey;
using checkpoint::SliceReader;

TensorSnapshot::Block TensorSnapshot::Block::Shared(
    uint32_t index, uint64_t step, std::shared_ptr<float[]> weights, size_t len,
    std::shared_ptr<float[]> slots, size_t slots_len) {
  Block b;
  b.index = index;
  b.step = step;
  b.shared_weights = {weights.get(), len};
  b.shared_slots = {slots.get(), slots_len};
  b.shared = std::make_shared<const Buffers>(
      Buffers{std::move(weights), std::move(slots)});
  return b;
}

namespace {

static_assert(std::endian::native == std::endian::little,
              "checkpoints store floats as little-endian bytes");

constexpr const char* kMetaFamily = "meta";
constexpr const char* kWeightsFamily = "weights";
constexpr const char* kSlotsFamily = "slots";
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

// --- Statuses ---------------------------------------------------------------

rocksdb::ColumnFamilyOptions DataFamilyOptions() {
  rocksdb::ColumnFamilyOptions o;
  // Trained floats hardly compress; compressing them only costs CPU.
  o.compression = rocksdb::kNoCompression;
  // Data blocks are read once (fill_cache off), each into a buffer from the
  // cache's allocator: one that hands the same warm buffers out again.
  rocksdb::LRUCacheOptions cache;
  cache.capacity = size_t{8} << 20;
  cache.memory_allocator = std::make_shared<RecyclingAllocator>();
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = rocksdb::NewLRUCache(cache);
  // A round is read from start to end in blocks of 256 KiB and more: read
  // well ahead of them (RocksDB's default stops at one such block).
  table.initial_auto_readahead_size = size_t{4} << 20;
  table.max_auto_readahead_size = size_t{16} << 20;
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
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
  // Rounds are read from start to end: let the kernel read ahead.
  o.advise_random_on_open = false;
  o.info_log = std::make_shared<RocksLog>(dir);
  return o;
}

std::vector<rocksdb::ColumnFamilyDescriptor> Families() {
  return {{rocksdb::kDefaultColumnFamilyName, rocksdb::ColumnFamilyOptions()},
          {kMetaFamily, rocksdb::ColumnFamilyOptions()},
          {kWeightsFamily, DataFamilyOptions()},
          {kSlotsFamily, DataFamilyOptions()}};
}

// An open RocksDB with a handle for each of Families(), released in the
// order RocksDB requires: every handle, then the DB, closed before it is
// deleted.
struct OpenDb {
  std::unique_ptr<rocksdb::DB> db;
  std::vector<std::unique_ptr<rocksdb::ColumnFamilyHandle>> handles;

  OpenDb() = default;
  OpenDb(const OpenDb&) = delete;
  OpenDb& operator=(const OpenDb&) = delete;
  ~OpenDb() {
    handles.clear();
    // Close errors (e.g. a full disk) cannot be acted on here; what was
    // synced stays.
    if (db != nullptr) db->Close().PermitUncheckedError();
  }

  // Opens `dir` (read-only: without the lock, writing nothing). RocksDB's
  // status; on failure nothing is held.
  rocksdb::Status Open(const rocksdb::DBOptions& options,
                       const std::string& dir, bool read_only) {
    rocksdb::DB* opened = nullptr;
    std::vector<rocksdb::ColumnFamilyHandle*> opened_handles;
    rocksdb::Status s =
        read_only ? rocksdb::DB::OpenForReadOnly(options, dir, Families(),
                                                 &opened_handles, &opened)
                  : rocksdb::DB::Open(options, dir, Families(), &opened_handles,
                                      &opened);
    db.reset(opened);
    for (rocksdb::ColumnFamilyHandle* h : opened_handles) {
      handles.emplace_back(h);
    }
    return s;
  }
};

// What a round's meta keys say: its header, and the number of keys its
// marker counted.
struct RoundMeta {
  checkpoint::ShardHeader header;
  uint64_t keys = 0;
};

}  // namespace

// The files a round's data is written into before the store takes them
// in (moved, so none is left after a successful round), named after the
// round in the store's dir; removed when the write fails. A crash leaves
// them for RemoveIngestLeftovers.
constexpr char kIngestPrefix[] = "tether-ingest-";
struct IngestFiles {
  IngestFiles(const std::string& dir, int64_t round)
      : weights(Name(dir, round, "weights")),
        slots(Name(dir, round, "slots")) {}
  ~IngestFiles() {
    std::error_code ignored;
    std::filesystem::remove(weights, ignored);
    std::filesystem::remove(slots, ignored);
  }
  static std::string Name(const std::string& dir, int64_t round,
                          const char* family) {
    return dir + "/" + kIngestPrefix + std::to_string(round) + "-" + family +
           ".sst";
  }
  const std::string weights, slots;
};

// Removes the data files a crashed round write left in `dir`.
void RemoveIngestLeftovers(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().filename().string().starts_with(kIngestPrefix)) {
      std::error_code ignored;
      std::filesystem::remove(e.path(), ignored);
    }
  }
}

struct CheckpointStore::Impl {
  // Constant after Open.
  OpenDb rocks;
  rocksdb::DB* db() const { return rocks.db.get(); }
  bool read_only = false;

  Mutex mu;
  std::string last_write_error TETHER_GUARDED_BY(mu);
  // Held around each change to the store and the reads that decide it
  // (a round's header, its files taken in, its marker; a prune; a
  // record), so that the writer thread and the thread that prunes take
  // turns: RocksDB allows both at once, but its lock-free memtables and
  // reference counts are invisible to ThreadSanitizer, which then reports
  // races inside them. Held for milliseconds: a round's files are built
  // outside it.
  Mutex change_mu;

  // Writes `batch`, remembering a failure so that later calls can say why
  // the store stopped.
  Status Write(const std::string& where, const std::string& doing,
               rocksdb::WriteBatch* batch, bool sync = false) {
    rocksdb::WriteOptions options;
    options.sync = sync;
    return Failed(where, doing, db()->Write(options, batch));
  }

  Status Failed(const std::string& where, const std::string& doing,
                const rocksdb::Status& s) {
    if (s.ok()) return Status::Ok();
    MutexLock lock(&mu);
    last_write_error = s.ToString();
    return IoError(where, doing, s);
  }

  // RocksDB stops taking writes after a failed one (a full disk) until
  // Resume() succeeds, which it does once the cause is gone.
  Status Recover(const std::string& where) {
    rocksdb::Status s = db()->Resume();
    if (s.ok()) return Status::Ok();
    MutexLock lock(&mu);
    return Status(Code::kIoError,
                  where + ": stopped since an earlier write failed (" +
                      last_write_error +
                      "); not recovered yet: " + s.ToString());
  }

  rocksdb::ColumnFamilyHandle* meta() const { return rocks.handles[1].get(); }
  rocksdb::ColumnFamilyHandle* weights() const {
    return rocks.handles[2].get();
  }
  rocksdb::ColumnFamilyHandle* slots() const { return rocks.handles[3].get(); }

  // Keys of `tag` | round for rounds in [from, to).
  void DeleteMetaRange(rocksdb::WriteBatch* batch, char tag, int64_t from,
                       int64_t to) const {
    batch->DeleteRange(meta(), MetaKey(tag, from), MetaKey(tag, to))
        .PermitUncheckedError();
  }
  // Every shard key (data, header, marker, announcement) of rounds in
  // [from, to); records are left alone.
  // With `data` false, only their meta keys (the data families are known
  // to hold none of those rounds).
  void DeleteRounds(rocksdb::WriteBatch* batch, int64_t from, int64_t to,
                    bool data = true) const {
    const std::string a = RoundKey(from), b = RoundKey(to);
    if (data) {
      batch->DeleteRange(weights(), a, b).PermitUncheckedError();
      batch->DeleteRange(slots(), a, b).PermitUncheckedError();
    }
    for (char tag : {kHeaderTag, kMarkerTag, kAnnouncedTag}) {
      DeleteMetaRange(batch, tag, from, to);
    }
  }

  // Whether the weights or slots family holds any key of `round`.
  bool HasData(int64_t round) const {
    const std::string prefix = RoundKey(round);
    for (rocksdb::ColumnFamilyHandle* family : {weights(), slots()}) {
      std::unique_ptr<rocksdb::Iterator> it(
          db()->NewIterator(rocksdb::ReadOptions(), family));
      it->Seek(prefix);
      if (!it->status().ok()) return true;  // deleted to be safe
      if (it->Valid() && it->key().starts_with(prefix)) return true;
    }
    return false;
  }

  // `round`'s header and marker: kNotFound without a marker (the round is
  // not completely written), kCorruption when they do not decode or the
  // header is missing or for another round.
  Result<RoundMeta> ReadMeta(const std::string& where, int64_t round) const {
    std::string marker, header;
    rocksdb::Status s = db()->Get(rocksdb::ReadOptions(), meta(),
                                  MetaKey(kMarkerTag, round), &marker);
    if (s.IsNotFound()) {
      return NotFound(where + ": not completely written by this shard");
    }
    if (!s.ok()) return IoError(where, "reading the marker", s);
    s = db()->Get(rocksdb::ReadOptions(), meta(), MetaKey(kHeaderTag, round),
                  &header);
    if (s.IsNotFound()) return Corrupt(where, "the header is missing");
    if (!s.ok()) return IoError(where, "reading the header", s);
    Result<uint64_t> keys = checkpoint::MarkerKeysFromJson(marker);
    if (!keys.ok()) return Corrupt(where, keys.status().message());
    Result<checkpoint::ShardHeader> decoded =
        checkpoint::HeaderFromJson(header);
    if (!decoded.ok()) return Corrupt(where, decoded.status().message());
    if (decoded->snapshot.round != round) {
      return Corrupt(where, "the header is for round " +
                                std::to_string(decoded->snapshot.round));
    }
    return RoundMeta{std::move(*decoded), *keys};
  }

  // Rounds with a `tag` key in the meta family, ascending.
  rocksdb::Status RoundsWithTag(char tag, std::vector<int64_t>* rounds) const {
    const std::string upper(1, static_cast<char>(tag + 1));
    rocksdb::ReadOptions ro;
    rocksdb::Slice upper_slice(upper);
    ro.iterate_upper_bound = &upper_slice;
    std::unique_ptr<rocksdb::Iterator> it(db()->NewIterator(ro, meta()));
    for (it->Seek(std::string(1, tag)); it->Valid(); it->Next()) {
      const rocksdb::Slice k = it->key();
      if (auto round = checkpoint::ParseMetaKey(tag, k.ToStringView())) {
        rounds->push_back(*round);
      }
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
    OpenDb probe;
    rocksdb::Status s = probe.Open(options, dir, /*read_only=*/true);
    if (!s.ok()) {
      return IoError(where, "cannot open (nothing was changed)", s);
    }
  }
  if (std::string holder = LockHolder(dir); !holder.empty()) {
    return Status(Code::kIoError,
                  where + " is held by " + holder +
                      " (it has the store open): stop it first, or give "
                      "this shard its own --data-dir; nothing was changed");
  }
  rocksdb::Status s = impl->rocks.Open(options, dir, /*read_only=*/false);
  if (!s.ok()) return IoError(where, "cannot open", s);
  RemoveIngestLeftovers(dir);
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
  rocksdb::Status s = impl->rocks.Open(options, dir, /*read_only=*/true);
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

  // The leftovers of an earlier attempt at this round (a crash, a full
  // disk) must not mix with this one: deleted in the same batch as the new
  // header (through the log), so the round is never read half old, half
  // new.
  // Data leftovers are rare (a crash after the store took in the data
  // files), and deleting a range that holds none would cost a file of
  // tombstones and a flush before the new files can be taken in.
  const std::string header = checkpoint::HeaderToJson(snapshot);
  uint64_t bytes = 9 + header.size(), keys = 1;
  {
    MutexLock lock(&impl_->change_mu);
    rocksdb::WriteBatch batch;
    impl_->DeleteRounds(&batch, round, round + 1, impl_->HasData(round));
    batch.Put(impl_->meta(), MetaKey(kHeaderTag, round), header)
        .PermitUncheckedError();
    TETHER_RETURN_IF_ERROR(impl_->Write(where, "write failed", &batch));
  }

  // The data is written once: each family's keys into one SST file of its
  // own, in key order, synced, then ingested whole (moved into the store,
  // not copied). Through the write-ahead log and the memtables every byte
  // was written twice, and a round ran at about half a sequential write.
  // A crash before the ingestion leaves a file the next Open removes.
  struct Entry {
    std::string key;
    uint64_t step;
    std::span<const float> weights, slots;
  };
  std::vector<Entry> entries;
  for (const TensorSnapshot& t : snapshot.tensors) {
    for (const TensorSnapshot::Block& b : t.blocks) {
      entries.push_back(
          {BlockKey(round, t.id, b.index), b.step, b.Weights(), b.Slots()});
    }
  }
  for (const TableSnapshot& t : snapshot.tables) {
    for (const TableSnapshot::Row& r : t.rows) {
      entries.push_back(
          {RowKey(round, t.id, r.key), r.step, r.weights, r.slots});
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.key < b.key; });
  IngestFiles files(dir_, round);
  rocksdb::Options options(BaseOptions(dir_), DataFamilyOptions());
  rocksdb::SstFileWriter weights_file(rocksdb::EnvOptions(), options,
                                      impl_->weights());
  rocksdb::SstFileWriter slots_file(rocksdb::EnvOptions(), options,
                                    impl_->slots());
  auto failed = [&](const rocksdb::Status& st) {
    return impl_->Failed(where, "writing the round's data files", st);
  };
  bool has_slots = false;
  for (const Entry& e : entries) has_slots = has_slots || !e.slots.empty();
  if (!entries.empty()) {
    TETHER_RETURN_IF_ERROR(failed(weights_file.Open(files.weights)));
  }
  if (has_slots) TETHER_RETURN_IF_ERROR(failed(slots_file.Open(files.slots)));
  std::string value;
  for (const Entry& e : entries) {
    uint64_t step_le = e.step;
    value.assign(reinterpret_cast<const char*>(&step_le), 8);
    value.append(reinterpret_cast<const char*>(e.weights.data()),
                 FloatBytes(e.weights.size()));
    TETHER_RETURN_IF_ERROR(failed(weights_file.Put(e.key, value)));
    bytes += e.key.size() + value.size();
    ++keys;
    if (e.slots.empty()) continue;
    TETHER_RETURN_IF_ERROR(failed(slots_file.Put(
        e.key, rocksdb::Slice(reinterpret_cast<const char*>(e.slots.data()),
                              FloatBytes(e.slots.size())))));
    bytes += e.key.size() + FloatBytes(e.slots.size());
    ++keys;
  }
  std::vector<rocksdb::IngestExternalFileArg> ingest;
  auto add = [&](rocksdb::SstFileWriter& file, rocksdb::ColumnFamilyHandle* cf,
                 const std::string& path) {
    rocksdb::IngestExternalFileArg& arg = ingest.emplace_back();
    arg.column_family = cf;
    arg.external_files = {path};
    arg.options.move_files = true;
    return file.Finish();
  };
  if (!entries.empty()) {
    TETHER_RETURN_IF_ERROR(
        failed(add(weights_file, impl_->weights(), files.weights)));
  }
  if (has_slots) {
    TETHER_RETURN_IF_ERROR(
        failed(add(slots_file, impl_->slots(), files.slots)));
  }
  MutexLock lock(&impl_->change_mu);
  if (!ingest.empty()) {
    TETHER_RETURN_IF_ERROR(
        impl_->Failed(where, "taking in the round's data files",
                      impl_->db()->IngestExternalFiles(ingest)));
  }

  // Last, and synced: the data is in synced files the store has taken in,
  // and the log is sequential, so the synced marker comes after everything
  // before it.
  const std::string marker = checkpoint::MarkerToJson(keys, bytes);
  rocksdb::WriteBatch batch;
  batch.Put(impl_->meta(), MetaKey(kMarkerTag, round), marker)
      .PermitUncheckedError();
  TETHER_RETURN_IF_ERROR(impl_->Write(where, "writing the completion marker",
                                      &batch, /*sync=*/true));
  return bytes + 9 + marker.size();
}

Result<ShardSnapshot> CheckpointStore::ReadShard(
    int64_t round, const ReadOptions& options) const {
  const std::string where =
      "checkpoint dir " + dir_ + ": round " + std::to_string(round);
  if (round < 0 || round > kMaxRound) {
    return NotFound(where + ": no such round");
  }
  TETHER_ASSIGN_OR_RETURN(RoundMeta meta, impl_->ReadMeta(where, round));
  SliceReader reader(where, std::move(meta.header));
  TETHER_RETURN_IF_ERROR(reader.Start());
  TETHER_RETURN_IF_ERROR(checkpoint::ReadRoundData(
      impl_->db(), impl_->weights(), impl_->slots(), where, round,
      options.threads, options.part_bytes, &reader));
  TETHER_RETURN_IF_ERROR(reader.Finish(meta.keys));
  return std::move(reader).Take();
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
  MutexLock lock(&impl_->change_mu);
  TETHER_RETURN_IF_ERROR(impl_->Recover(where));
  rocksdb::WriteBatch batch;
  batch
      .Put(impl_->meta(), RecordKey(record.round),
           checkpoint::RecordToJson(record))
      .PermitUncheckedError();
  return impl_->Write(where, "recording the round complete", &batch,
                      /*sync=*/true);
}

Result<std::vector<RoundRecord>> CheckpointStore::CompleteRounds() const {
  std::vector<RoundRecord> records;
  const std::string prefix(kRecordPrefix);
  std::string upper = prefix;
  upper.back() += 1;
  rocksdb::Slice upper_slice(upper);
  rocksdb::ReadOptions ro;
  ro.iterate_upper_bound = &upper_slice;
  std::unique_ptr<rocksdb::Iterator> it(
      impl_->db()->NewIterator(ro, impl_->meta()));
  for (it->Seek(prefix); it->Valid(); it->Next()) {
    const std::string key = it->key().ToString();
    Result<RoundRecord> r =
        checkpoint::RecordFromJson(it->value().ToStringView());
    if (!r.ok()) {
      return Corrupt("checkpoint dir " + dir_ + ": " + key,
                     r.status().message());
    }
    if (RecordKey(r->round) != key) {
      return Corrupt("checkpoint dir " + dir_ + ": " + key,
                     "record is for round " + std::to_string(r->round));
    }
    records.push_back(std::move(*r));
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
  MutexLock lock(&impl_->change_mu);
  TETHER_RETURN_IF_ERROR(impl_->Recover(where));
  // Complete rounds this shard knows of: shard 0's records, and rounds
  // announced through earlier calls. A shard that missed announcements (it
  // restarted) knows fewer, so it keeps more, never less.
  std::set<int64_t> complete;
  TETHER_ASSIGN_OR_RETURN(std::vector<RoundRecord> records, CompleteRounds());
  for (const RoundRecord& r : records) complete.insert(r.round);
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
  const bool has_records = !records.empty();
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
      rocksdb::DeleteFilesInRange(impl_->db(), family, &as, &bs,
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
  // Seed, shard count, block size, optimizer. A round written by another
  // number of shards is merged and cut again before it is served
  // (server/round_merge.h), so its slices never reach a shard as they are.
  add(SettingsMismatch(r, run));
  return out;
}

}  // namespace tether
