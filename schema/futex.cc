#include "schema/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ctime>

namespace tether {

static_assert(sizeof(std::atomic<int>) == sizeof(int));

void FutexWait(std::atomic<int>& word, int expected, int64_t timeout_us) {
  timespec timeout{static_cast<time_t>(timeout_us / 1000000),
                   static_cast<long>(timeout_us % 1000000 * 1000)};
  ::syscall(SYS_futex, reinterpret_cast<int*>(&word), FUTEX_WAIT_PRIVATE,
            expected, timeout_us > 0 ? &timeout : nullptr, nullptr, 0);
}

void FutexWake(std::atomic<int>& word, int count) {
  ::syscall(SYS_futex, reinterpret_cast<int*>(&word), FUTEX_WAKE_PRIVATE, count,
            nullptr, nullptr, 0);
}

}  // namespace tether
