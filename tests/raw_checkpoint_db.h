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
  // Overwrites the stored value of `tensor`'s `block` in `round`.
  rocksdb::Status PutBlock(int64_t round, const std::string& tensor,
                           uint32_t block, const std::string& value) {
    return db_->Put(rocksdb::WriteOptions(), weights(),
                    BlockKey(round, tensor, block), value);
  }

 private:
  rocksdb::ColumnFamilyHandle* weights() { return handles_[2]; }

  rocksdb::Status status_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  std::unique_ptr<rocksdb::DB> db_;  // last: handles go first
};

}  // namespace tether::testing
