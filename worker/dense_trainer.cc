#include "worker/dense_trainer.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <span>
#include <vector>

#include "worker/reporter.h"
#include "worker/train_step.h"
#include "worker/training_loop.h"

namespace tether {
namespace {

using Clock = std::chrono::steady_clock;

// Issues `start(i, done)` for every parameter i at once; the futures of
// their statuses.
template <typename Start>
std::vector<std::future<Status>> StartEachParam(size_t params, Start start) {
  std::vector<std::future<Status>> parts;
  for (size_t i = 0; i < params; ++i) {
    auto promise = std::make_shared<std::promise<Status>>();
    parts.push_back(promise->get_future());
    start(i, [promise](const Status& s) { promise->set_value(s); });
  }
  return parts;
}

// Waits for every part; returns the first error.
Status WaitForAll(std::vector<std::future<Status>> parts) {
  Status first;
  for (auto& p : parts) {
    Status s = p.get();
    if (first.ok()) first = s;
  }
  return first;
}

class DenseTrainer {
 public:
  DenseTrainer(const TrainerOptions& o, Client& client, DenseModel& model,
               const DenseDataset& train, const DenseDataset* test)
      : o_(o),
        client_(client),
        model_(model),
        train_(train),
        test_(test),
        reporter_(o, client, model.device()) {}

  Status Run() {
    for (const ParamSpec& spec : model_.specs()) {
      TETHER_RETURN_IF_ERROR(
          client_.DefineTensor(spec.name, spec.shape, spec.init));
    }
    batch_x_.resize(size_t(o_.batch) * train_.features);
    batch_y_.resize(o_.batch);
    LoopOptions loop;
    loop.rows = train_.rows;
    loop.batch = o_.batch;
    loop.epochs = o_.epochs;
    loop.chunk_rows = o_.chunk_rows;
    TETHER_RETURN_IF_ERROR(RunTrainingLoop(
        client_, loop,
        [this](std::span<const uint32_t> rows, int epoch) {
          return Step(rows, epoch);
        },
        [this](int epoch) { return AfterClock(epoch); }));
    // The last evaluation, on the weights as they are now.
    TETHER_RETURN_IF_ERROR(PullAll(client_, model_));
    TETHER_ASSIGN_OR_RETURN(EvalResult eval, Evaluate());
    return reporter_.Report(o_.epochs - 1, &eval, /*final=*/true);
  }

 private:
  Result<EvalResult> Evaluate() {
    if (test_ == nullptr) return EvalResult{};
    return model_.Evaluate(test_->x.data(), test_->y.data(), test_->rows);
  }

  // Pull, compute and push one batch; RunTrainingLoop clocks.
  Status Step(std::span<const uint32_t> rows, int epoch) {
    // A step repeated after a lost shard: the last attempt's pushes may
    // still read the gradients from their buffers; their outcome no longer
    // matters.
    (void)WaitForAll(std::move(pushes_));
    pushes_.clear();
    const int n = static_cast<int>(rows.size());
    const size_t f = train_.features;
    for (int i = 0; i < n; ++i) {
      uint32_t row = rows[i];
      std::copy_n(train_.x.data() + size_t{row} * f, f,
                  batch_x_.data() + i * f);
      batch_y_[i] = train_.y[row];
    }
    auto pull_start = Clock::now();
    TETHER_RETURN_IF_ERROR(PullAll(client_, model_));
    reporter_.AddWait(SecondsSince(pull_start));
    auto compute_start = Clock::now();
    TETHER_ASSIGN_OR_RETURN(auto loss,
                            model_.Step(batch_x_.data(), batch_y_.data(), n));
    SlowDown(o_.slowdown, SecondsSince(compute_start));
    TETHER_RETURN_IF_ERROR(CheckLoss(loss, client_, epoch));
    // Sent, not awaited: the clock follows them on every connection at
    // once, and its acknowledgements come after theirs (a shard answers a
    // connection in order). AfterClock collects them.
    pushes_ = StartEachParam(model_.specs().size(), [&](size_t i, auto done) {
      client_.PushAsync(model_.specs()[i].name, model_.grads()[i], done);
    });
    step_samples_ = n;
    step_loss_ = loss;
    return Status::Ok();
  }

  // After the batch's clock: its pushes' outcome (a refused one is
  // counted and dropped), then count it, report and evaluate when due.
  Status AfterClock(int epoch) {
    Status pushed = WaitForAll(std::move(pushes_));
    pushes_.clear();
    TETHER_RETURN_IF_ERROR(
        ToleratingRefused(pushed, client_, &rejected_pushes_));
    if (step_samples_ > 0) reporter_.AddStep(step_samples_, step_loss_);
    step_samples_ = 0;  // counted once, though a lost shard repeats this
    if (reporter_.EvalDue() && test_ != nullptr) {
      TETHER_ASSIGN_OR_RETURN(auto eval, Evaluate());
      return reporter_.Report(epoch, &eval, false);
    }
    if (reporter_.ReportDue()) return reporter_.Report(epoch, nullptr, false);
    return Status::Ok();
  }

  const TrainerOptions& o_;
  Client& client_;
  DenseModel& model_;
  const DenseDataset& train_;
  const DenseDataset* test_;
  Reporter reporter_;
  uint64_t rejected_pushes_ = 0;
  // The batch's pushes, sent before its clock and collected after it.
  std::vector<std::future<Status>> pushes_;
  std::vector<float> batch_x_;
  std::vector<int32_t> batch_y_;
  // The batch Step computed, counted by AfterClock once it is clocked.
  int step_samples_ = 0;
  float step_loss_ = 0;
};

}  // namespace

Status PullAll(Client& client, DenseModel& model) {
  return WaitForAll(
      StartEachParam(model.specs().size(), [&](size_t i, auto done) {
        client.PullAsync(model.specs()[i].name, model.weights()[i], done);
      }));
}

Status RunDenseTrainer(const TrainerOptions& options, Client& client,
                       DenseModel& model, const DenseDataset& train,
                       const DenseDataset* test) {
  DenseTrainer trainer(options, client, model, train, test);
  return trainer.Run();
}

}  // namespace tether
