// Test support: a shard's checkpoint RocksDB opened behind
// CheckpointStore's back, to count what a write left on disk or to damage
// it. Knows the layout documented at the top of server/checkpoint.cc:
// column families meta/weights/slots; data keys are the big-endian round,
// 'b', the big-endian tensor id and block index.
#pragma once

#include <rocksdb/db.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/param_store.h"

namespace tether::testing {

class RawCheckpointDb {
 public:
  RawCheckpointDb(const std::string& dir, bool read_only) {
    std::vector<rocksdb::ColumnFamilyDescriptor> families = {
        {rocksdb::kDefaultColumnFamilyName, {}},
        {"meta", {}},
        {"weights", {}},
        {"slots", {}}};
    rocksdb::DB* db = nullptr;
    status_ = read_only
                  ? rocksdb::DB::OpenForReadOnly(rocksdb::DBOptions(), dir,
                                                 families, &handles_, &db)
                  : rocksdb::DB::Open(rocksdb::DBOptions(), dir, families,
                                      &handles_, &db);
    db_.reset(db);
  }
  ~RawCheckpointDb() {
    for (auto* h : handles_) {
      db_->DestroyColumnFamilyHandle(h).PermitUncheckedError();
    }
  }
  const rocksdb::Status& status() const { return status_; }

  static std::string RoundPrefix(int64_t round) {
    std::string k;
    for (int i = 7; i >= 0; --i) {
      k.push_back(static_cast<char>((uint64_t(round) >> (8 * i)) & 0xff));
    }
    return k;
  }
  static std::string BlockKey(int64_t round, const std::string& tensor,
                              uint32_t block) {
    std::string k = RoundPrefix(round) + 'b';
    const uint32_t id = NameId(tensor);
    for (int i = 3; i >= 0; --i) k.push_back(static_cast<char>(id >> (8 * i)));
    for (int i = 3; i >= 0; --i) {
      k.push_back(static_cast<char>(block >> (8 * i)));
    }
    return k;
  }

  // Keys in the weights family for `round`.
  int CountWeightKeys(int64_t round) {
    const std::string prefix = RoundPrefix(round);
    int count = 0;
    std::unique_ptr<rocksdb::Iterator> it(
        db_->NewIterator(rocksdb::ReadOptions(), weights()));
    for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix);
         it->Next()) {
      ++count;
    }
    return count;
  }
  // Keys in the meta family for `round` (its header, marker, record...:
  // a tag byte, then the round).
  int CountMetaKeys(int64_t round) {
    const std::string prefix = RoundPrefix(round);
    int count = 0;
    std::unique_ptr<rocksdb::Iterator> it(
        db_->NewIterator(rocksdb::ReadOptions(), handles_[1]));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      if (it->key().size() >= 9 &&
          it->key().ToString().substr(1, 8) == prefix) {
        ++count;
      }
    }
    return count;
  }
  // Overwrites the stored value of `tensor`'s `block` in `round`.
  rocksdb::Status PutBlock(int64_t round, const std::string& tensor,
                           uint32_t block, const std::string& value) {
    return db_->Put(rocksdb::WriteOptions(), weights(),
                    BlockKey(round, tensor, block), value);
  }
  // Cuts the first stored value of `round` to 8 bytes: the round no longer
  // reads back (ReadShard says "corrupt").
  rocksdb::Status TruncateFirstValue(int64_t round) {
    const std::string prefix = RoundPrefix(round);
    std::unique_ptr<rocksdb::Iterator> it(
        db_->NewIterator(rocksdb::ReadOptions(), weights()));
    it->Seek(prefix);
    if (!it->Valid() || !it->key().starts_with(prefix)) {
      return rocksdb::Status::NotFound("no data for the round");
    }
    return db_->Put(rocksdb::WriteOptions(), weights(), it->key(),
                    it->value().ToString().substr(0, 8));
  }
  // Overwrites the value at `key` in the meta family (a round's header,
  // marker or record).
  rocksdb::Status PutMeta(const std::string& key, const std::string& value) {
    return db_->Put(rocksdb::WriteOptions(), handles_[1], key, value);
  }
  // Deletes this shard's "round written" marker: the shard no longer holds
  // `round` as far as any reader can tell.
  rocksdb::Status DeleteMarker(int64_t round) {
    return db_->Delete(rocksdb::WriteOptions(), handles_[1],
                       'm' + RoundPrefix(round));
  }
  // The .sst files holding column family `family` ("meta", "weights",
  // "slots"), as paths.
  std::vector<std::string> SstFiles(const std::string& family) {
    std::vector<rocksdb::LiveFileMetaData> files;
    db_->GetLiveFilesMetaData(&files);
    std::vector<std::string> paths;
    for (const auto& f : files) {
      if (f.column_family_name == family) paths.push_back(f.db_path + f.name);
    }
    return paths;
  }
  // Writes what the WAL holds into .sst files.
  rocksdb::Status FlushAll() {
    return db_->Flush(rocksdb::FlushOptions(), handles_);
  }

 private:
  rocksdb::ColumnFamilyHandle* weights() { return handles_[2]; }

  rocksdb::Status status_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  std::unique_ptr<rocksdb::DB> db_;  // last: handles go first
};

}  // namespace tether::testing
