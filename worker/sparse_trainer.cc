#include "worker/sparse_trainer.h"

#include <chrono>
#include <span>
#include <vector>

#include "worker/dataset.h"
#include "worker/model.h"
#include "worker/reporter.h"
#include "worker/train_step.h"
#include "worker/training_loop.h"

namespace tether {
namespace {

using Clock = std::chrono::steady_clock;

class SparseTrainer {
 public:
  SparseTrainer(const TrainerOptions& o, Client& client)
      : o_(o), client_(client), reporter_(o, client, "cpu") {}

  Status Run() {
    using Lr = SparseLogisticRegression;
    TETHER_RETURN_IF_ERROR(client_.DefineTable(Lr::kTable, 1));
    TETHER_RETURN_IF_ERROR(client_.DefineTensor(Lr::kBias, {1}));
    TETHER_ASSIGN_OR_RETURN(
        auto reader,
        LibsvmReader::Open(o_.data, client_.rank(), client_.num_workers()));
    std::vector<SparseExample> batch;
    // A resumed run goes on from the client's clock: one batch a clock.
    const int64_t start_clock = client_.clock();
    int64_t clock = 0;
    Status trained = [&]() -> Status {
      for (int epoch = 0; epoch < o_.epochs; ++epoch) {
        if (epoch > 0) TETHER_RETURN_IF_ERROR(reader->Rewind());
        while (true) {
          TETHER_ASSIGN_OR_RETURN(auto n, reader->Next(o_.batch, &batch));
          if (n == 0) break;
          if (clock++ < start_clock) continue;
          TETHER_RETURN_IF_ERROR(RunBatch(
              client_, [&] { return Step(batch, epoch); },
              [&] { return AfterClock(epoch); }));
        }
      }
      return Status::Ok();
    }();
    TETHER_RETURN_IF_ERROR(EndOfTraining(client_, trained));
    TETHER_ASSIGN_OR_RETURN(EvalResult eval, Evaluate());
    return reporter_.Report(o_.epochs - 1, &eval, /*final=*/true);
  }

 private:
  Status PullWeights(const std::vector<SparseExample>& batch,
                     std::vector<uint64_t>* keys, std::vector<float>* w,
                     float* bias) {
    *keys = SparseLogisticRegression::UniqueKeys(batch);
    w->resize(keys->size());
    TETHER_RETURN_IF_ERROR(
        client_.PullRows(SparseLogisticRegression::kTable, *keys, *w));
    return client_.Pull(SparseLogisticRegression::kBias,
                        std::span<float>(bias, 1));
  }

  // Pull, compute and push one batch; RunBatch clocks.
  Status Step(const std::vector<SparseExample>& batch, int epoch) {
    std::vector<uint64_t> keys;
    std::vector<float> w;
    float bias = 0;
    auto pull_start = Clock::now();
    TETHER_RETURN_IF_ERROR(PullWeights(batch, &keys, &w, &bias));
    reporter_.AddWait(SecondsSince(pull_start));
    auto compute_start = Clock::now();
    std::vector<float> grad(keys.size());
    float grad_bias = 0;
    float loss =
        SparseLogisticRegression::Step(batch, keys, w, bias, grad, &grad_bias);
    SlowDown(o_.slowdown, SecondsSince(compute_start));
    TETHER_RETURN_IF_ERROR(CheckLoss(loss, client_, epoch));
    TETHER_RETURN_IF_ERROR(ToleratingRefused(
        client_.PushRows(SparseLogisticRegression::kTable, keys, grad), client_,
        &rejected_pushes_));
    TETHER_RETURN_IF_ERROR(
        ToleratingRefused(client_.Push(SparseLogisticRegression::kBias,
                                       std::span<const float>(&grad_bias, 1)),
                          client_, &rejected_pushes_));
    step_samples_ = static_cast<int>(batch.size());
    step_loss_ = loss;
    return Status::Ok();
  }

  // After the batch's clock: count it, report and evaluate when due.
  Status AfterClock(int epoch) {
    if (step_samples_ > 0) reporter_.AddStep(step_samples_, step_loss_);
    step_samples_ = 0;  // counted once, though a lost shard repeats this
    if (reporter_.EvalDue() && !o_.test_data.empty()) {
      TETHER_ASSIGN_OR_RETURN(auto eval, Evaluate());
      return reporter_.Report(epoch, &eval, false);
    }
    if (reporter_.ReportDue()) return reporter_.Report(epoch, nullptr, false);
    return Status::Ok();
  }

  // Streams the test file through the current weights.
  Result<EvalResult> Evaluate() {
    EvalResult total;
    if (o_.test_data.empty()) return total;
    TETHER_ASSIGN_OR_RETURN(auto reader, LibsvmReader::Open(o_.test_data));
    std::vector<SparseExample> batch;
    while (true) {
      TETHER_ASSIGN_OR_RETURN(auto n, reader->Next(4096, &batch));
      if (n == 0) break;
      std::vector<uint64_t> keys;
      std::vector<float> w;
      float bias = 0;
      TETHER_RETURN_IF_ERROR(PullWeights(batch, &keys, &w, &bias));
      EvalResult r = SparseLogisticRegression::Evaluate(batch, keys, w, bias);
      total.loss_sum += r.loss_sum;
      total.correct += r.correct;
      total.rows += r.rows;
    }
    return total;
  }

  const TrainerOptions& o_;
  Client& client_;
  Reporter reporter_;
  uint64_t rejected_pushes_ = 0;
  // The batch Step computed, counted by AfterClock once it is clocked.
  int step_samples_ = 0;
  float step_loss_ = 0;
};

}  // namespace

Status RunSparseTrainer(const TrainerOptions& options, Client& client) {
  return SparseTrainer(options, client).Run();
}

}  // namespace tether
