// Recycles large byte buffers (received frames, FlatBuffers builders), so
// that moving tensors does not page-fault fresh memory for every frame: on
// virtual machines a fault per 4 KiB page costs more than copying it.
//
// Thread-safe. Buffers of 64 KiB and more come in power-of-two size classes
// and return to a free list on release, up to a cap of bytes held idle;
// smaller ones go straight to the heap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "flatbuffers/flatbuffers.h"
#include "schema/mutex.h"

namespace tether {

class BufferPool {
 public:
  static constexpr size_t kMinPooledBytes = size_t{64} << 10;

  explicit BufferPool(size_t max_idle_bytes) : max_idle_(max_idle_bytes) {}
  ~BufferPool();

  // The process-wide pool (256 MiB idle at most).
  static BufferPool& Default();

  // A buffer of at least `size` bytes, 16-byte aligned. Never null.
  uint8_t* Allocate(size_t size);
  // Returns a buffer from Allocate(size) with the same `size`.
  void Release(uint8_t* buffer, size_t size);

  size_t idle_bytes() const;

 private:
  static int ClassOf(size_t size);  // -1: not pooled

  const size_t max_idle_;
  mutable Mutex mu_;
  // By class.
  std::vector<std::vector<uint8_t*>> free_ TETHER_GUARDED_BY(mu_);
  size_t idle_ TETHER_GUARDED_BY(mu_) = 0;
};

// A FlatBuffers allocator drawing from BufferPool::Default().
class PooledAllocator : public flatbuffers::Allocator {
 public:
  static PooledAllocator& Instance();
  uint8_t* allocate(size_t size) override;
  void deallocate(uint8_t* p, size_t size) override;
};

}  // namespace tether
