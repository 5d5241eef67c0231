// Spreads a shard's optimizer arithmetic over its cores. A push of a large
// tensor (many blocks) is applied by several threads at once, each taking a
// run of the blocks; a small one stays on the thread that took it, where a
// handoff would cost more than it saves.
//
// Thread-safe to construct and destroy; Run is for one caller at a time
// (the shard calls it under its lock).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace tether {

class ApplyPool {
 public:
  // `threads` in total, the caller's included: 1 keeps everything on the
  // caller (no thread is started); 0 means one per core.
  explicit ApplyPool(int threads);
  ~ApplyPool();
  ApplyPool(const ApplyPool&) = delete;
  ApplyPool& operator=(const ApplyPool&) = delete;

  int threads() const { return threads_; }

  // Calls fn(part) for each part in [0, parts), part 0 on the calling
  // thread and the others on the pool's, and returns once every call has.
  // `parts` should not exceed threads() (more only queue behind).
  void Run(int parts, const std::function<void(int part)>& fn);

  // Calls of Run that used more than one thread.
  uint64_t spread_runs() const { return spread_runs_; }

 private:
  struct Impl;
  int threads_;
  uint64_t spread_runs_ = 0;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tether
