#include "server/recycling_allocator.h"

#include <cstdlib>
#include <new>

namespace tether {
namespace {

// Each buffer starts with a header holding its capacity; the caller's
// memory follows it, aligned for any type.
constexpr size_t kHeader = alignof(std::max_align_t);
constexpr size_t kGranule = size_t{4} << 10;

size_t CapacityOf(const void* raw) { return *static_cast<const size_t*>(raw); }

}  // namespace

RecyclingAllocator::RecyclingAllocator(size_t keep_bytes)
    : keep_bytes_(keep_bytes) {}

RecyclingAllocator::~RecyclingAllocator() {
  MutexLock lock(&mu_);
  for (void* raw : free_) std::free(raw);
}

void* RecyclingAllocator::Allocate(size_t size) {
  const size_t capacity = (size + kGranule - 1) / kGranule * kGranule;
  void* raw = nullptr;
  {
    MutexLock lock(&mu_);
    for (size_t i = free_.size(); i-- > 0;) {
      if (CapacityOf(free_[i]) != capacity) continue;
      raw = free_[i];
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
      kept_ -= capacity;
      break;
    }
  }
  if (raw == nullptr) {
    raw = std::malloc(kHeader + capacity);
    if (raw == nullptr) throw std::bad_alloc();
    *static_cast<size_t*>(raw) = capacity;
  }
  return static_cast<char*>(raw) + kHeader;
}

void RecyclingAllocator::Deallocate(void* p) {
  if (p == nullptr) return;
  void* raw = static_cast<char*>(p) - kHeader;
  const size_t capacity = CapacityOf(raw);
  {
    MutexLock lock(&mu_);
    if (kept_ + capacity <= keep_bytes_) {
      free_.push_back(raw);
      kept_ += capacity;
      return;
    }
  }
  std::free(raw);
}

size_t RecyclingAllocator::UsableSize(void* p,
                                      size_t /*allocation_size*/) const {
  return CapacityOf(static_cast<char*>(p) - kHeader);
}

size_t RecyclingAllocator::kept_bytes() const {
  MutexLock lock(&mu_);
  return kept_;
}

}  // namespace tether
