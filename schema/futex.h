// A thread sleeps on an atomic int while it holds a value, and another
// wakes it (Linux futexes, private to the process): the waits that need no
// mutex, for words other threads change with atomics.
#pragma once

#include <atomic>
#include <cstdint>

namespace tether {

// Sleeps while `word` holds `expected`, until woken (FutexWake), for at
// most `timeout_us` (0: no limit). Returns at once if `word` holds another
// value, and may return early for no reason: callers check the word again.
void FutexWait(std::atomic<int>& word, int expected, int64_t timeout_us = 0);

// Wakes at most `count` threads sleeping on `word`.
void FutexWake(std::atomic<int>& word, int count = 1);

}  // namespace tether
