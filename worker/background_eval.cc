#include "worker/background_eval.h"

#include <string>
#include <utility>

namespace tether {

BackgroundEvaluator::BackgroundEvaluator(std::unique_ptr<DenseModel> twin,
                                         const DenseDataset& test)
    : twin_(std::move(twin)), test_(test), thread_([this] { Loop(); }) {}

BackgroundEvaluator::~BackgroundEvaluator() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  thread_.join();  // after the evaluation in flight
}

Status BackgroundEvaluator::Start(
    const std::vector<std::vector<float>>& weights, int64_t clock) {
  if (pending_) {
    return Internal("an evaluation is still pending; take it first");
  }
  std::vector<std::vector<float>>& own = twin_->weights();
  if (weights.size() != own.size()) {
    return InvalidArgument("evaluation: " + std::to_string(weights.size()) +
                           " weight buffers, the model has " +
                           std::to_string(own.size()));
  }
  for (size_t i = 0; i < own.size(); ++i) {
    if (weights[i].size() != own[i].size()) {
      return InvalidArgument("evaluation: buffer '" + twin_->specs()[i].name +
                             "' holds " + std::to_string(weights[i].size()) +
                             " floats, expected " +
                             std::to_string(own[i].size()));
    }
  }
  // The thread is idle (nothing pending), so the copy races with nothing.
  for (size_t i = 0; i < own.size(); ++i) own[i] = weights[i];
  clock_ = clock;
  pending_ = true;
  MutexLock lock(&mu_);
  start_ = true;
  cv_.SignalAll();
  return Status::Ok();
}

std::optional<BackgroundEvaluator::Done> BackgroundEvaluator::Take(bool wait) {
  if (!pending_) return std::nullopt;
  MutexLock lock(&mu_);
  while (wait && !done_) cv_.Wait(mu_);
  if (!done_) return std::nullopt;
  std::optional<Done> d = std::move(done_);
  done_.reset();
  pending_ = false;
  return d;
}

void BackgroundEvaluator::Loop() {
  for (;;) {
    {
      MutexLock lock(&mu_);
      while (!start_ && !stop_) cv_.Wait(mu_);
      if (!start_) return;  // stopped, nothing to evaluate
      start_ = false;
    }
    // The weights and clock_ were written before start_ was set.
    Done d;
    d.clock = clock_;
    d.result = twin_->Evaluate(test_.x.data(), test_.y.data(), test_.rows);
    MutexLock lock(&mu_);
    done_ = std::move(d);
    cv_.SignalAll();
  }
}

}  // namespace tether
