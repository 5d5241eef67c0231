// RecyclingAllocator: the memory RocksDB reads a checkpoint's data blocks
// into. Reading a round walks blocks of the same size one after the other,
// each read into a new buffer and dropped once copied out; from malloc, a
// buffer that large is a fresh mapping every time, and the kernel's copy
// into it stops at every page to fault it in. This allocator keeps a few
// freed buffers and hands them out again, so a round is read into the same
// warm memory throughout.
#pragma once

#include <rocksdb/memory_allocator.h>

#include <cstddef>
#include <vector>

#include "schema/mutex.h"

namespace tether {

// Thread-safe. Sizes are rounded up to 4 KiB, so blocks of nearly one size
// (RocksDB's trailer, a tensor's shorter last block) share buffers.
class RecyclingAllocator : public rocksdb::MemoryAllocator {
 public:
  // Keeps at most `keep_bytes` of freed buffers; frees the rest.
  explicit RecyclingAllocator(size_t keep_bytes = size_t{32} << 20);
  ~RecyclingAllocator() override;

  const char* Name() const override { return "TetherRecyclingAllocator"; }
  void* Allocate(size_t size) override;
  void Deallocate(void* p) override;
  size_t UsableSize(void* p, size_t allocation_size) const override;

  // Bytes of freed buffers held for reuse.
  size_t kept_bytes() const TETHER_EXCLUDES(mu_);

 private:
  const size_t keep_bytes_;
  mutable Mutex mu_;
  std::vector<void*> free_ TETHER_GUARDED_BY(mu_);
  size_t kept_ TETHER_GUARDED_BY(mu_) = 0;
};

}  // namespace tether
