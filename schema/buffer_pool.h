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
#include <memory>
#include <span>
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

// Gives a buffer of `size` bytes back to BufferPool::Default().
struct PooledRelease {
  size_t size;  // no initializer: keeps it default-constructible here
  void operator()(uint8_t* p) const { BufferPool::Default().Release(p, size); }
};
using PooledBytes = std::unique_ptr<uint8_t[], PooledRelease>;

// `size` bytes (uninitialized) from BufferPool::Default(), given back when
// the pointer goes.
inline PooledBytes AllocatePooled(size_t size) {
  return PooledBytes(BufferPool::Default().Allocate(size), PooledRelease{size});
}

// `size` floats (uninitialized) from BufferPool::Default(), given back when
// it goes. Move-only.
class PooledFloats {
 public:
  PooledFloats() = default;
  explicit PooledFloats(size_t size)
      : bytes_(AllocatePooled(size * sizeof(float))), size_(size) {}

  float* data() { return reinterpret_cast<float*>(bytes_.get()); }
  const float* data() const {
    return reinterpret_cast<const float*>(bytes_.get());
  }
  size_t size() const { return size_; }
  std::span<float> span() { return {data(), size_}; }
  std::span<const float> span() const { return {data(), size_}; }

 private:
  PooledBytes bytes_;
  size_t size_ = 0;
};

// A FlatBuffers allocator drawing from BufferPool::Default().
class PooledAllocator : public flatbuffers::Allocator {
 public:
  static PooledAllocator& Instance();
  uint8_t* allocate(size_t size) override;
  void deallocate(uint8_t* p, size_t size) override;
};

}  // namespace tether
