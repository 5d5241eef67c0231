// Evaluations beside training: rank 0 evaluates the test set on a copy of
// the weights, on a thread of its own, while training goes on. So the
// other workers do not wait for it at s = 0 (nor at the bound), and the
// evaluation takes cores that the waits around a clock leave idle.
//
// One evaluation at a time. Not thread-safe: one trainer calls it from its
// training thread; the evaluation thread is its own.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "schema/mutex.h"
#include "schema/status.h"
#include "worker/dataset.h"
#include "worker/model.h"

namespace tether {

class BackgroundEvaluator {
 public:
  // Evaluates `twin` (DenseModel::Twin of the trained model) on `test`,
  // which must outlive this.
  BackgroundEvaluator(std::unique_ptr<DenseModel> twin,
                      const DenseDataset& test);
  // Waits for the evaluation in flight, if any.
  ~BackgroundEvaluator();
  BackgroundEvaluator(const BackgroundEvaluator&) = delete;
  BackgroundEvaluator& operator=(const BackgroundEvaluator&) = delete;

  // An evaluation's outcome, with the clock its weights were read at.
  struct Done {
    int64_t clock = 0;
    Result<EvalResult> result = EvalResult{};
  };

  // Whether an evaluation was started and not yet taken.
  bool pending() const { return pending_; }

  // Copies `weights` (one buffer per spec, as DenseModel::weights) and
  // starts evaluating them, labelled `clock`. kInternal while one is
  // pending (Take it first); kInvalidArgument for weights of another
  // shape.
  Status Start(const std::vector<std::vector<float>>& weights, int64_t clock);

  // The pending evaluation once it is done; nullopt while it runs (or
  // when none is pending). With `wait`, blocks until it is done.
  std::optional<Done> Take(bool wait);

 private:
  void Loop();

  std::unique_ptr<DenseModel> twin_;
  const DenseDataset& test_;
  bool pending_ = false;  // the training thread's view

  Mutex mu_;
  CondVar cv_;
  bool start_ TETHER_GUARDED_BY(mu_) = false;  // weights copied, go
  bool stop_ TETHER_GUARDED_BY(mu_) = false;
  std::optional<Done> done_ TETHER_GUARDED_BY(mu_);
  int64_t clock_ = 0;   // written before start_, read by the thread after
  std::thread thread_;  // last: started once the rest is built
};

}  // namespace tether
