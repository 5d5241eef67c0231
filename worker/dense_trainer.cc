#include "worker/dense_trainer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "worker/background_eval.h"
#include "worker/completion.h"
#include "worker/reporter.h"
#include "worker/train_step.h"
#include "worker/training_loop.h"

namespace tether {
namespace {

using Clock = std::chrono::steady_clock;

// Issues `start(i, done)` for every parameter i at once; their statuses,
// to wait for.
template <typename Start>
std::vector<PendingStatus> StartEachParam(size_t params, Start start) {
  std::vector<PendingStatus> parts;
  for (size_t i = 0; i < params; ++i) {
    parts.push_back(
        PendingStatus::Of([&](auto done) { start(i, std::move(done)); }));
  }
  return parts;
}

// Waits for every part; returns the first error.
Status WaitForAll(std::vector<PendingStatus> parts) {
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
    MaybeEvaluateInBackground();
    batch_x_.resize(size_t(o_.batch) * train_.features);
    batch_y_.resize(o_.batch);
    LoopOptions loop;
    loop.rows = train_.rows;
    loop.batch = o_.batch;
    loop.epochs = o_.epochs;
    loop.chunk_rows = o_.chunk_rows;
    // With a bound s != 0 a step overlaps the one before: its weights are
    // prefetched during that step (PrefetchOne, layer by layer; a slowed
    // worker's after its sleep, StartPrefetch), and it computes while that
    // step's pushes and clock are still on their way.
    // Not in a recorded run, whose replay expects each request where the
    // recording has it.
    const bool may_read_ahead = client_.staleness() != 0 && !client_.records();
    pipelined_ = o_.overlap_steps && may_read_ahead;
    // Not pipelined, each layer's next weights may follow its gradients
    // (PushLayer); with s = 0 they could only be answered after the clock.
    prefetch_with_push_ =
        !pipelined_ && o_.prefetch_with_push && may_read_ahead;
    loop.pipelined_clock = pipelined_;
    // The next batch's weights travel right behind this batch's clock,
    // unless they were prefetched during it.
    loop.clock_sent = [this] {
      if (pulled_at_ != client_.clock()) StartPulls(/*prefetched=*/true);
    };
    Status trained = RunTrainingLoop(
        client_, loop,
        [this](std::span<const uint32_t> rows, int epoch) {
          return Step(rows, epoch);
        },
        [this](int epoch) { return AfterClock(epoch); });
    DropPulls();
    TETHER_RETURN_IF_ERROR(trained);
    TETHER_RETURN_IF_ERROR(CollectPushes());
    if (evaluator_ != nullptr && evaluator_->pending()) {
      TETHER_RETURN_IF_ERROR(
          ReportEval(o_.epochs - 1, *evaluator_->Take(/*wait=*/true)));
    }
    evaluator_.reset();
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

  // Reports an evaluation done in the background.
  Status ReportEval(int epoch, BackgroundEvaluator::Done done) {
    TETHER_RETURN_IF_ERROR(done.result.status());
    return reporter_.Report(epoch, &*done.result, false, done.clock);
  }

  // Rank 0's evaluations run in the background (--eval-in-background) on a
  // twin of the model, but not in a recorded run, whose replay expects
  // each report where the recording has it; a model without a twin is
  // evaluated in the foreground.
  void MaybeEvaluateInBackground() {
    if (!o_.eval_in_background || o_.eval_every <= 0 || test_ == nullptr ||
        client_.rank() != 0 || client_.records()) {
      return;
    }
    auto twin = model_.Twin();
    if (!twin.ok()) {
      std::fprintf(stderr,
                   "worker: evaluating in the foreground (no second model "
                   "on %s: %s)\n",
                   model_.device().c_str(), twin.status().ToString().c_str());
      return;
    }
    evaluator_ =
        std::make_unique<BackgroundEvaluator>(std::move(*twin), *test_);
  }

  // Starts pulling every parameter into the model's weights, read at this
  // worker's clock now; `prefetched` when the step that uses them has not
  // started yet.
  void StartPulls(bool prefetched) {
    DropPulls();
    prefetched_ = prefetched;
    pulls_ = StartEachParam(model_.specs().size(), [&](size_t i, auto done) {
      client_.PullAsync(model_.specs()[i].name, model_.weights()[i], done);
    });
    pulled_at_ = client_.clock();
  }

  // A slowed worker with a bound s != 0, once its step's sleep is done:
  // starts pulling the next batch's weights (Client::PrefetchAsync) into
  // spare buffers; each takes the place of the model's buffer when the
  // next step awaits it.
  Status StartPrefetch() {
    // This step's own pulls first, should forward have left one.
    for (size_t i = 0; i < pulls_.size(); ++i) {
      TETHER_RETURN_IF_ERROR(AwaitPull(i));
    }
    DropPulls();
    const auto& specs = model_.specs();
    spare_.resize(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      spare_[i].resize(model_.weights()[i].size());
    }
    prefetched_ = true;
    into_spare_ = true;
    pulls_ = StartEachParam(specs.size(), [&](size_t i, auto done) {
      client_.PrefetchAsync(specs[i].name, spare_[i], done);
    });
    pulled_at_ = client_.clock() + 1;
    return Status::Ok();
  }

  // The spare buffers, one per spec of its weights' size, and no early
  // prefetch yet.
  void PrepareSpares() {
    const auto& specs = model_.specs();
    spare_.resize(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      spare_[i].resize(model_.weights()[i].size());
    }
    early_.clear();
    early_.resize(specs.size());
  }

  // Once spec i's weights for this step are in: prefetches its weights
  // for the next step into its spare buffer (which held the step before's,
  // done with).
  void PrefetchOne(size_t i) {
    early_[i] = PendingStatus::Of([&](auto done) {
      client_.PrefetchAsync(model_.specs()[i].name, spare_[i], done);
    });
  }

  // After the step: the early prefetches become the next step's pulls when
  // the step went through and every spec's was asked for; otherwise they
  // are waited out (their buffers free again) and the next step pulls anew.
  void TakeEarlyPrefetches(bool step_ok) {
    const bool all = std::all_of(early_.begin(), early_.end(),
                                 [](const auto& f) { return f.valid(); });
    if (!step_ok || !all || pulled_at_ > client_.clock()) {
      for (auto& f : early_) {
        if (f.valid()) (void)f.get();
      }
      early_.clear();
      return;
    }
    pulls_ = std::move(early_);
    early_.clear();
    prefetched_ = true;
    into_spare_ = true;
    pulled_at_ = client_.clock() + 1;
  }

  // Waits for the pulls in flight and forgets them: the weights hold no
  // pull's values for the step.
  void DropPulls() {
    for (auto& p : pulls_) {
      if (p.valid()) (void)p.get();
    }
    pulls_.clear();
    pulled_at_ = -1;
    into_spare_ = false;
  }

  // Waits for the pull of spec i. A prefetched one that failed (a shard
  // lost after the last batch) is asked again, within the step that is
  // repeated when the shard is lost.
  Status AwaitPull(size_t i) {
    if (i >= pulls_.size() || !pulls_[i].valid()) return Status::Ok();
    auto start = Clock::now();
    Status s = pulls_[i].get();
    // The prefetched buffer becomes the weights; the old one (the last
    // step's weights, which its backward has done with) the next spare.
    if (s.ok() && into_spare_) std::swap(model_.weights()[i], spare_[i]);
    if (!s.ok() && prefetched_) {
      s = client_.Pull(model_.specs()[i].name, model_.weights()[i]);
    }
    reporter_.AddWait(SecondsSince(start));
    return s;
  }

  // Pull, compute and push one batch; RunTrainingLoop clocks. Layer by
  // layer: forward starts on a layer as soon as its weights are in, and a
  // layer's gradients are sent as soon as backward has them, while it goes
  // on with the layers below.
  Status Step(std::span<const uint32_t> rows, int epoch) {
    // A step repeated after a lost shard: the last attempt's pushes may
    // still read the gradients from their buffers; their outcome no longer
    // matters. (Pipelined, the last step's are still on their way: their
    // gradient buffers are set aside.)
    if (!pipelined_ || pushed_at_ == client_.clock()) {
      (void)WaitForAll(std::move(pushes_));
      pushes_.clear();
    }
    if (pipelined_) TETHER_RETURN_IF_ERROR(SetAsideLastPushes());
    const int n = static_cast<int>(rows.size());
    GatherRows(train_, rows, batch_x_.data(), batch_y_.data());
    // Weights read at another clock (the worker idled, or was moved ahead)
    // or none at all (the first batch, a failed pull): pulled now.
    if (pulled_at_ != client_.clock()) StartPulls(/*prefetched=*/false);
    // Pipelined (and not slowed), each layer's next weights are asked for
    // as soon as this step's are in: the shard answers while this step's
    // forward and backward go on. They are read after this worker's pushes
    // of the step before, as a prefetch after forward would be.
    const bool prefetch_early = pipelined_ && o_.slowdown <= 1;
    // Either way, each layer's prefetch goes into its spare buffer as soon
    // as it is asked for (early_), and after the step they become the next
    // step's pulls.
    const bool early = prefetch_early || prefetch_with_push_;
    if (early) PrepareSpares();
    StepHooks hooks;
    hooks.weights_needed = [this, prefetch_early](size_t layer) -> Status {
      for (size_t i : {2 * layer, 2 * layer + 1}) {
        TETHER_RETURN_IF_ERROR(AwaitPull(i));
        if (prefetch_early) PrefetchOne(i);
      }
      return Status::Ok();
    };
    // A diverged model stops before any of its gradients is sent.
    hooks.loss_known = [this, epoch](float loss) {
      return CheckLoss(loss, client_, epoch);
    };
    // Sent, not awaited: the clock follows them on every connection, and
    // its acknowledgements come after theirs (a shard answers a connection
    // in order). AfterClock collects them.
    // A slowed worker (--slowdown) computes slower: its gradients leave
    // after its sleep.
    std::vector<size_t> held;
    hooks.grads_ready = [this, &held](size_t layer) {
      if (o_.slowdown > 1) return held.push_back(layer);
      PushLayer(layer);
    };
    auto compute_start = Clock::now();
    const double waited_before = reporter_.waited();
    Result<float> loss =
        model_.Step(batch_x_.data(), batch_y_.data(), n, hooks);
    // These weights are this step's; the next needs new ones (unless they
    // were prefetched).
    if (pulled_at_ <= client_.clock()) DropPulls();
    if (loss.ok()) {
      SlowDown(o_.slowdown, SecondsSince(compute_start) -
                                (reporter_.waited() - waited_before));
      if (pipelined_ && o_.slowdown > 1) {
        TETHER_RETURN_IF_ERROR(StartPrefetch());
      }
      for (size_t layer : held) PushLayer(layer);
    }
    // Every layer's prefetch is asked for now, the held pushes' included.
    if (early) TakeEarlyPrefetches(loss.ok());
    if (!loss.ok()) return loss.status();
    step_samples_ = n;
    step_loss_ = *loss;
    return Status::Ok();
  }

  // Sends layer `layer`'s gradients (weight and bias), not awaited; with
  // prefetch_with_push_, each followed part by part by the prefetch of its
  // weights for the next step into its spare buffer.
  void PushLayer(size_t layer) {
    pushed_at_ = client_.clock();
    for (size_t i : {2 * layer, 2 * layer + 1}) {
      const std::string& name = model_.specs()[i].name;
      if (!prefetch_with_push_) {
        pushes_.push_back(PendingStatus::Of([&](auto done) {
          client_.PushAsync(name, model_.grads()[i], done);
        }));
        continue;
      }
      Client::Callback fetched;
      early_[i] = PendingStatus::Of([&](auto done) { fetched = done; });
      pushes_.push_back(PendingStatus::Of([&](auto done) {
        client_.PushAndPrefetchAsync(name, model_.grads()[i], spare_[i], done,
                                     fetched);
      }));
    }
  }

  // After the batch's clock: its pushes' outcome (a refused one is
  // counted and dropped), then count it, report and evaluate when due.
  Status AfterClock(int epoch) {
    if (!pipelined_) TETHER_RETURN_IF_ERROR(CollectPushes());
    if (step_samples_ > 0) reporter_.AddStep(step_samples_, step_loss_);
    step_samples_ = 0;  // counted once, though a lost shard repeats this
    bool reported = false;
    if (evaluator_ != nullptr) {
      if (auto done = evaluator_->Take(/*wait=*/false)) {
        TETHER_RETURN_IF_ERROR(ReportEval(epoch, std::move(*done)));
        reported = true;
      }
    }
    if (reporter_.EvalDue() && test_ != nullptr) {
      // On the next batch's weights, once they are in.
      if (pulled_at_ != client_.clock()) StartPulls(/*prefetched=*/true);
      for (size_t i = 0; i < pulls_.size(); ++i) {
        if (Status s = AwaitPull(i); !s.ok()) {
          DropPulls();
          return s;
        }
      }
      if (evaluator_ == nullptr) {
        TETHER_ASSIGN_OR_RETURN(auto eval, Evaluate());
        return reporter_.Report(epoch, &eval, false);
      }
      // One at a time: the last one, if it still runs, is waited for.
      if (evaluator_->pending()) {
        TETHER_RETURN_IF_ERROR(
            ReportEval(epoch, *evaluator_->Take(/*wait=*/true)));
        reported = true;
      }
      TETHER_RETURN_IF_ERROR(
          evaluator_->Start(model_.weights(), client_.clock()));
    }
    if (!reported && reporter_.ReportDue()) {
      return reporter_.Report(epoch, nullptr, false);
    }
    return Status::Ok();
  }

  // Pipelined, before a step writes gradients: the buffers the last
  // step's pushes are still sent from are swapped for the ones of the step
  // before it, whose pushes are collected first (long answered: the clock
  // after them was). So a step waits for no push of the last.
  Status SetAsideLastPushes() {
    TETHER_RETURN_IF_ERROR(CollectPushes(older_pushes_, older_at_));
    older_pushes_ = std::move(pushes_);
    pushes_.clear();
    older_at_ = pushed_at_;
    auto& grads = model_.grads();
    older_grads_.resize(grads.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      older_grads_[i].resize(grads[i].size());
      std::swap(grads[i], older_grads_[i]);
    }
    return Status::Ok();
  }

  // Waits for every push sent and forgets them; the first error.
  Status CollectPushes() {
    Status older = CollectPushes(older_pushes_, older_at_);
    Status last = CollectPushes(pushes_, pushed_at_);
    return older.ok() ? last : older;
  }

  // Waits for `pushes`, sent at clock `at`, and forgets them; their outcome
  // (a refused one is counted and dropped). Pipelined, pushes of an earlier
  // step to a shard lost since are lost with it: that step is not repeated.
  Status CollectPushes(std::vector<PendingStatus>& pushes, int64_t at) {
    Status pushed = WaitForAll(std::move(pushes));
    pushes.clear();
    if (pipelined_ && at < client_.clock()) {
      pushed =
          LostWithItsShard(pushed, "a push of clock " + std::to_string(at));
    }
    return ToleratingRefused(pushed, client_, &rejected_pushes_);
  }

  const TrainerOptions& o_;
  Client& client_;
  DenseModel& model_;
  const DenseDataset& train_;
  const DenseDataset* test_;
  Reporter reporter_;
  // Rank 0's evaluations, when they run in the background
  // (MaybeEvaluateInBackground).
  std::unique_ptr<BackgroundEvaluator> evaluator_;
  uint64_t rejected_pushes_ = 0;
  // The batch's pushes, sent before its clock and collected after it (or,
  // pipelined, a batch later: SetAsideLastPushes), sent at clock pushed_at_.
  std::vector<PendingStatus> pushes_;
  int64_t pushed_at_ = -1;
  // Pipelined: the step before's pushes, sent at clock older_at_ from
  // older_grads_ (the model's gradient buffers of that step).
  std::vector<PendingStatus> older_pushes_;
  int64_t older_at_ = -1;
  std::vector<std::vector<float>> older_grads_;
  bool pipelined_ = false;
  // Each layer's next weights follow its pushes (PushLayer) into early_.
  bool prefetch_with_push_ = false;
  // Pulls into the model's weights (one per spec; an awaited one is no
  // longer valid), read at clock pulled_at_; -1 when the weights hold no
  // pull for the next step.
  std::vector<PendingStatus> pulls_;
  int64_t pulled_at_ = -1;
  bool prefetched_ = false;
  // Whether pulls_ fill spare_ (prefetches) rather than the weights.
  bool into_spare_ = false;
  std::vector<std::vector<float>> spare_;
  // The next step's weights, asked for spec by spec during this step's
  // forward (pipelined: PrefetchOne) or behind its pushes
  // (prefetch_with_push_); invalid where not asked yet.
  std::vector<PendingStatus> early_;
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
