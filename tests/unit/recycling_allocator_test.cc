#include "server/recycling_allocator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace tether {
namespace {

bool Aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % alignof(std::max_align_t) == 0;
}

TEST(RecyclingAllocator, HandsAFreedBufferOutAgainForTheSameSize) {
  RecyclingAllocator allocator(size_t{1} << 20);
  void* first = allocator.Allocate(300'000);
  ASSERT_NE(first, nullptr);
  EXPECT_TRUE(Aligned(first));
  EXPECT_GE(allocator.UsableSize(first, 300'000), 300'000u);
  std::memset(first, 1, 300'000);  // all of it is the caller's
  allocator.Deallocate(first);
  EXPECT_GE(allocator.kept_bytes(), 300'000u);
  // A block a few bytes shorter or longer (another trailer, a shorter last
  // block) gets the same buffer back.
  void* again = allocator.Allocate(299'990);
  EXPECT_EQ(again, first);
  EXPECT_EQ(allocator.kept_bytes(), 0u);
  // Another size while it is out: another buffer.
  void* other = allocator.Allocate(100'000);
  EXPECT_NE(other, again);
  allocator.Deallocate(again);
  allocator.Deallocate(other);
  allocator.Deallocate(nullptr);  // as free() does
}

TEST(RecyclingAllocator, KeepsNoMoreThanItsLimit) {
  RecyclingAllocator allocator(size_t{512} << 10);
  std::vector<void*> out;
  for (int i = 0; i < 4; ++i) out.push_back(allocator.Allocate(200'000));
  for (void* p : out) allocator.Deallocate(p);
  // Two buffers of 200,704 bytes fit in 512 KiB, a third does not.
  EXPECT_EQ(allocator.kept_bytes(), 2u * 200'704);
  // Those two come back first, the last freed first.
  EXPECT_EQ(allocator.Allocate(200'000), out[1]);
  EXPECT_EQ(allocator.Allocate(200'000), out[0]);
  EXPECT_EQ(allocator.kept_bytes(), 0u);
  allocator.Deallocate(out[0]);
  allocator.Deallocate(out[1]);
}

TEST(RecyclingAllocator, ThreadsNeverShareABuffer) {
  RecyclingAllocator allocator(size_t{4} << 20);
  std::vector<std::thread> threads;
  std::atomic<int> clashes{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        auto* p = static_cast<unsigned char*>(allocator.Allocate(65'536 + t));
        std::memset(p, t + 1, 65'536);
        for (size_t k = 0; k < 65'536; k += 4096) {
          if (p[k] != t + 1) ++clashes;
        }
        allocator.Deallocate(p);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(clashes.load(), 0);
}

}  // namespace
}  // namespace tether
