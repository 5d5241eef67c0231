#include "schema/buffer_pool.h"

#include <bit>
#include <new>

namespace tether {

BufferPool::~BufferPool() {
  for (auto& list : free_) {
    for (uint8_t* p : list) ::operator delete[](p);
  }
}

BufferPool& BufferPool::Default() {
  // Leaked on purpose: buffers may be released during static destruction.
  static BufferPool* pool = new BufferPool(size_t{256} << 20);
  return *pool;
}

int BufferPool::ClassOf(size_t size) {
  if (size < kMinPooledBytes) return -1;
  return std::bit_width(size - 1);  // 2^class >= size
}

uint8_t* BufferPool::Allocate(size_t size) {
  int c = ClassOf(size);
  if (c < 0) return new uint8_t[size];
  {
    MutexLock lock(&mu_);
    if (c < static_cast<int>(free_.size()) && !free_[c].empty()) {
      uint8_t* p = free_[c].back();
      free_[c].pop_back();
      idle_ -= size_t{1} << c;
      return p;
    }
  }
  return new uint8_t[size_t{1} << c];
}

void BufferPool::Release(uint8_t* buffer, size_t size) {
  if (buffer == nullptr) return;
  int c = ClassOf(size);
  if (c >= 0) {
    MutexLock lock(&mu_);
    if (idle_ + (size_t{1} << c) <= max_idle_) {
      if (c >= static_cast<int>(free_.size())) free_.resize(c + 1);
      free_[c].push_back(buffer);
      idle_ += size_t{1} << c;
      return;
    }
  }
  delete[] buffer;
}

size_t BufferPool::idle_bytes() const {
  MutexLock lock(&mu_);
  return idle_;
}

PooledAllocator& PooledAllocator::Instance() {
  static PooledAllocator* allocator = new PooledAllocator();
  return *allocator;
}

uint8_t* PooledAllocator::allocate(size_t size) {
  return BufferPool::Default().Allocate(size);
}

void PooledAllocator::deallocate(uint8_t* p, size_t size) {
  BufferPool::Default().Release(p, size);
}

}  // namespace tether
