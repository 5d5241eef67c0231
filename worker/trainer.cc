#include "worker/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>
#include <iostream>
#include <optional>
#include <span>
#include <sstream>
#include <thread>

#include "schema/log.h"
#include "worker/client.h"
#include "worker/dataset.h"
#include "worker/model.h"
#include "worker/training_loop.h"

namespace tether {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

Result<std::vector<int>> ParseWidths(const std::string& text) {
  std::vector<int> widths;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    char* end = nullptr;
    long w = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || w < 1 || w > 1 << 20) {
      return InvalidArgument("--hidden: expected widths like 256,128, got '" +
                             text + "'");
    }
    widths.push_back(static_cast<int>(w));
  }
  return widths;
}

// "fashion-mnist" (the train or test split) or "IMAGES,LABELS".
Result<DenseDataset> LoadDense(const std::string& spec, bool train,
                               const std::string& flag) {
  if (spec == "fashion-mnist") return LoadFashionMnist(train);
  auto comma = spec.find(',');
  if (comma == std::string::npos) {
    return InvalidArgument(flag +
                           ": expected fashion-mnist or IMAGES,LABELS "
                           "(two IDX files), got '" +
                           spec + "'");
  }
  return LoadIdx(spec.substr(0, comma), spec.substr(comma + 1));
}

// Issues `start(i, done)` for every parameter i at once and waits for all;
// returns the first error.
template <typename Start>
Status ForEachParamAtOnce(size_t params, Start start) {
  std::vector<std::future<Status>> parts;
  for (size_t i = 0; i < params; ++i) {
    auto promise = std::make_shared<std::promise<Status>>();
    parts.push_back(promise->get_future());
    start(i, [promise](const Status& s) { promise->set_value(s); });
  }
  Status first;
  for (auto& p : parts) {
    Status s = p.get();
    if (first.ok()) first = s;
  }
  return first;
}

Status PullAll(Client& client, DenseModel& model) {
  return ForEachParamAtOnce(model.specs().size(), [&](size_t i, auto done) {
    client.PullAsync(model.specs()[i].name, model.weights()[i], done);
  });
}

Status PushAll(Client& client, const DenseModel& model) {
  return ForEachParamAtOnce(model.specs().size(), [&](size_t i, auto done) {
    client.PushAsync(model.specs()[i].name, model.grads()[i], done);
  });
}

// A push a shard refused as too stale (--reject-staleness), or as holding
// NaN or Inf (or overflowing the weights), costs that gradient only: the
// worker logs it, with the shard's words naming the tensor, and goes on
// with fresh weights. A diverged model stops at its loss (CheckLoss).
Status ToleratingRefused(Status pushed, const Client& client,
                         uint64_t* rejected) {
  if (pushed.code() != Code::kStalePush && pushed.code() != Code::kNonFinite) {
    return pushed;
  }
  if ((*rejected)++ % 100 == 0) {
    TETHER_LOG(kWarning) << "push at clock " << client.clock()
                         << " refused: " << pushed.message() << " (dropped; "
                         << *rejected << " so far)";
  }
  return Status::Ok();
}

// A training loss that is NaN or Inf means the model diverged: nothing it
// would push can help, so training stops (non-zero exit) before pushing.
Status CheckLoss(float loss, const Client& client, int epoch) {
  if (std::isfinite(loss)) return Status::Ok();
  return Status(Code::kNonFinite,
                std::string("the training loss is ") +
                    (std::isnan(loss) ? "NaN" : "Inf") + " at clock " +
                    std::to_string(client.clock()) + " (epoch " +
                    std::to_string(epoch) +
                    "): the model diverged, so this worker stops. Lower "
                    "--lr, or look for extreme values in the data");
}

// Progress: counts samples and loss, reports to the coordinator, prints
// the progress line.
class Reporter {
 public:
  Reporter(const TrainerOptions& o, Client& client, std::string device)
      : o_(o), client_(client), device_(std::move(device)) {}

  // Time spent pulling, which is where a worker waits for slower ones.
  void AddWait(double seconds) { wait_s_ += seconds; }
  void AddStep(int samples, float loss) {
    samples_ += samples;
    loss_sum_ += loss;
    ++loss_count_;
    last_loss_ = loss;
  }
  // Whether this clock calls for a report, and for an evaluation.
  bool ReportDue() const {
    return client_.clock() % std::max(1, o_.report_every) == 0;
  }
  bool EvalDue() const {
    return o_.eval_every > 0 && client_.rank() == 0 &&
           client_.clock() % o_.eval_every == 0;
  }

  // Sends a report (with `eval` when given) and prints the progress line.
  Status Report(int epoch, const EvalResult* eval, bool final) {
    double dt = Seconds(last_report_);
    if (dt > 0) {
      samples_per_s_ =
          static_cast<float>((samples_ - samples_at_last_report_) / dt);
    }
    Progress p;
    if (dt > 0)
      p.wait_fraction = static_cast<float>(std::min(1.0, wait_s_ / dt));
    wait_s_ = 0;
    p.done = final;
    last_report_ = Clock::now();
    samples_at_last_report_ = samples_;
    p.epoch = epoch;
    p.samples = samples_;
    p.loss = loss_count_ > 0 ? static_cast<float>(loss_sum_ / loss_count_)
                             : last_loss_;
    p.samples_per_s = samples_per_s_;
    p.host = HostName();
    p.device = device_;
    loss_sum_ = 0;
    loss_count_ = 0;
    if (eval != nullptr && eval->rows > 0) {
      test_accuracy_ = static_cast<float>(eval->correct) / eval->rows;
      p.test_accuracy = test_accuracy_;
      p.test_loss = static_cast<float>(eval->loss_sum / eval->rows);
    }
    Status s = client_.Report(p);
    Print(epoch, final);
    return s;
  }

  float test_accuracy() const { return test_accuracy_; }

 private:
  void Print(int epoch, bool final) {
    if (o_.quiet && !final) return;
    char acc[32] = "";
    if (test_accuracy_ >= 0) {
      std::snprintf(acc, sizeof acc, " test accuracy %.1f%%",
                    100.0 * test_accuracy_);
    }
    char line[256];
    std::snprintf(
        line, sizeof line,
        "worker %d: epoch %d/%d clock %lld loss %.4f%s %.0f samples/s",
        client_.rank(), epoch + 1, o_.epochs,
        static_cast<long long>(client_.clock()), last_loss_, acc,
        samples_per_s_);
    const bool tty = isatty(STDOUT_FILENO);
    if (final) {
      std::printf("%s%s (done in %.1f s)\n", tty ? "\r" : "", line,
                  Seconds(start_));
    } else {
      std::printf("%s%s%s", tty ? "\r" : "", line, tty ? "   " : "\n");
    }
    std::fflush(stdout);
  }

  const TrainerOptions& o_;
  Client& client_;
  uint64_t samples_ = 0;
  double loss_sum_ = 0;  // since the last report
  int loss_count_ = 0;
  float last_loss_ = 0;
  float test_accuracy_ = -1;
  float samples_per_s_ = 0;
  double wait_s_ = 0;  // pulling, since the last report
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_report_ = Clock::now();
  uint64_t samples_at_last_report_ = 0;
  const std::string device_;  // where the model computes
};

// A resumed run: says where this worker goes on from.
void SayResuming(const Client& client) {
  if (client.resume_round() < 0) return;
  std::printf("worker %d: resuming from round %lld (clock %lld)\n",
              client.rank(), static_cast<long long>(client.resume_round()),
              static_cast<long long>(client.clock()));
  std::fflush(stdout);
}

// Sleeps so that a step that computed for `compute_s` takes `slowdown`
// times as long: a straggler in proportion to its real work.
void SlowDown(double slowdown, double compute_s) {
  if (slowdown > 1.0) {
    std::this_thread::sleep_for(
        std::chrono::duration<double>(compute_s * (slowdown - 1.0)));
  }
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
    Result<EvalResult> eval = Evaluate();
    if (!eval.ok()) return eval.status();
    return reporter_.Report(o_.epochs - 1, &*eval, /*final=*/true);
  }

 private:
  Result<EvalResult> Evaluate() {
    if (test_ == nullptr) return EvalResult{};
    return model_.Evaluate(test_->x.data(), test_->y.data(), test_->rows);
  }

  // Pull, compute and push one batch; RunTrainingLoop clocks.
  Status Step(std::span<const uint32_t> rows, int epoch) {
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
    reporter_.AddWait(Seconds(pull_start));
    auto compute_start = Clock::now();
    auto loss = model_.Step(batch_x_.data(), batch_y_.data(), n);
    if (!loss.ok()) return loss.status();
    SlowDown(o_.slowdown, Seconds(compute_start));
    TETHER_RETURN_IF_ERROR(CheckLoss(*loss, client_, epoch));
    TETHER_RETURN_IF_ERROR(ToleratingRefused(PushAll(client_, model_), client_,
                                             &rejected_pushes_));
    step_samples_ = n;
    step_loss_ = *loss;
    return Status::Ok();
  }

  // After the batch's clock: count it, report and evaluate when due.
  Status AfterClock(int epoch) {
    if (step_samples_ > 0) reporter_.AddStep(step_samples_, step_loss_);
    step_samples_ = 0;  // counted once, though a lost shard repeats this
    if (reporter_.EvalDue() && test_ != nullptr) {
      auto eval = Evaluate();
      if (!eval.ok()) return eval.status();
      return reporter_.Report(epoch, &*eval, false);
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
  std::vector<float> batch_x_;
  std::vector<int32_t> batch_y_;
  // The batch Step computed, counted by AfterClock once it is clocked.
  int step_samples_ = 0;
  float step_loss_ = 0;
};

// Sparse logistic regression over a LIBSVM file: each step pulls only the
// rows its batch touches.
class SparseTrainer {
 public:
  SparseTrainer(const TrainerOptions& o, Client& client)
      : o_(o), client_(client), reporter_(o, client, "cpu") {}

  Status Run() {
    using Lr = SparseLogisticRegression;
    TETHER_RETURN_IF_ERROR(client_.DefineTable(Lr::kTable, 1));
    TETHER_RETURN_IF_ERROR(client_.DefineTensor(Lr::kBias, {1}));
    auto reader =
        LibsvmReader::Open(o_.data, client_.rank(), client_.num_workers());
    if (!reader.ok()) return reader.status();
    std::vector<SparseExample> batch;
    const int64_t start_clock = client_.clock();  // see DenseTrainer
    int64_t clock = 0;
    Status trained = [&]() -> Status {
      for (int epoch = 0; epoch < o_.epochs; ++epoch) {
        if (epoch > 0) TETHER_RETURN_IF_ERROR((*reader)->Rewind());
        while (true) {
          auto n = (*reader)->Next(o_.batch, &batch);
          if (!n.ok()) return n.status();
          if (*n == 0) break;
          if (clock++ < start_clock) continue;
          TETHER_RETURN_IF_ERROR(RunBatch(
              client_, [&] { return Step(batch, epoch); },
              [&] { return AfterClock(epoch); }));
        }
      }
      return Status::Ok();
    }();
    TETHER_RETURN_IF_ERROR(EndOfTraining(client_, trained));
    Result<EvalResult> eval = Evaluate();
    if (!eval.ok()) return eval.status();
    return reporter_.Report(o_.epochs - 1, &*eval, /*final=*/true);
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
    reporter_.AddWait(Seconds(pull_start));
    auto compute_start = Clock::now();
    std::vector<float> grad(keys.size());
    float grad_bias = 0;
    float loss =
        SparseLogisticRegression::Step(batch, keys, w, bias, grad, &grad_bias);
    SlowDown(o_.slowdown, Seconds(compute_start));
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
      auto eval = Evaluate();
      if (!eval.ok()) return eval.status();
      return reporter_.Report(epoch, &*eval, false);
    }
    if (reporter_.ReportDue()) return reporter_.Report(epoch, nullptr, false);
    return Status::Ok();
  }

  // Streams the test file through the current weights.
  Result<EvalResult> Evaluate() {
    EvalResult total;
    if (o_.test_data.empty()) return total;
    auto reader = LibsvmReader::Open(o_.test_data);
    if (!reader.ok()) return reader.status();
    std::vector<SparseExample> batch;
    while (true) {
      auto n = (*reader)->Next(4096, &batch);
      if (!n.ok()) return n.status();
      if (*n == 0) break;
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

// An observer's client with `model`'s tensors defined and pulled: the
// run's current weights.
Result<std::unique_ptr<Client>> PullAsObserver(const TrainerOptions& o,
                                               DenseModel& model,
                                               const std::string& name) {
  ClientOptions co;
  co.coordinator = o.coordinator;
  co.auth_key_file = o.auth_key_file;
  co.observer = true;
  co.name = name;
  auto client = Client::Connect(co);
  if (!client.ok()) return client.status();
  for (const ParamSpec& spec : model.specs()) {
    TETHER_RETURN_IF_ERROR(
        (*client)->DefineTensor(spec.name, spec.shape, spec.init));
  }
  TETHER_RETURN_IF_ERROR(PullAll(**client, model));
  return client;
}

Status EvaluateOnly(const TrainerOptions& o, DenseModel& model,
                    const DenseDataset& test) {
  auto client = PullAsObserver(o, model, "tether-worker --evaluate-only");
  if (!client.ok()) return client.status();
  auto r = model.Evaluate(test.x.data(), test.y.data(), test.rows);
  if (!r.ok()) return r.status();
  std::printf("test accuracy %.4f loss %.4f over %lld rows\n",
              double(r->correct) / std::max<int64_t>(1, r->rows),
              r->loss_sum / std::max<int64_t>(1, r->rows),
              static_cast<long long>(r->rows));
  return Status::Ok();
}

// --compare-device: `model` (on --device) and `cpu` (the oneDNN backend)
// on the run's current weights: one step on the first --batch training
// rows, and the test set. Float accuracy allows a difference of 1e-4 of
// the largest gradient, 1e-4 of the loss, and a few test rows whose two
// best classes are within rounding of each other.
Status CompareDevices(const TrainerOptions& o, DenseModel& model,
                      DenseModel& cpu, const DenseDataset& train,
                      const DenseDataset* test) {
  auto client = PullAsObserver(o, model, "tether-worker --compare-device");
  if (!client.ok()) return client.status();
  cpu.weights() = model.weights();
  const int batch = int(std::min<size_t>(size_t(o.batch), train.rows));
  std::printf("compare-device: %s against cpu, on the run's weights\n",
              model.device().c_str());
  auto a = model.Step(train.x.data(), train.y.data(), batch);
  if (!a.ok()) return a.status().WithContext(model.device());
  auto b = cpu.Step(train.x.data(), train.y.data(), batch);
  if (!b.ok()) return b.status().WithContext("cpu");
  double worst = 0, scale = 0;
  for (size_t t = 0; t < cpu.grads().size(); ++t) {
    for (size_t i = 0; i < cpu.grads()[t].size(); ++i) {
      worst = std::max(
          worst, double(std::abs(model.grads()[t][i] - cpu.grads()[t][i])));
      scale = std::max(scale, double(std::abs(cpu.grads()[t][i])));
    }
  }
  const bool step_ok =
      std::abs(*a - *b) <= 1e-4 * std::max(1.0f, std::abs(*b)) &&
      worst <= 1e-4 * std::max(1e-2, scale);
  std::printf(
      "compare-device: one step on %d training rows: loss %.6f vs %.6f, "
      "largest gradient difference %.3g (largest gradient %.3g): %s\n",
      batch, *a, *b, worst, scale, step_ok ? "OK" : "DIFFERENT");
  bool eval_ok = true;
  if (test != nullptr) {
    auto ea = model.Evaluate(test->x.data(), test->y.data(), test->rows);
    if (!ea.ok()) return ea.status().WithContext(model.device());
    auto eb = cpu.Evaluate(test->x.data(), test->y.data(), test->rows);
    if (!eb.ok()) return eb.status().WithContext("cpu");
    eval_ok = std::abs(ea->correct - eb->correct) <= 2 &&
              std::abs(ea->loss_sum - eb->loss_sum) <=
                  1e-4 * std::max(1.0, eb->loss_sum);
    std::printf(
        "compare-device: test set of %lld rows: accuracy %.2f%% vs %.2f%% "
        "(%lld vs %lld right), loss %.6f vs %.6f: %s\n",
        static_cast<long long>(eb->rows),
        100.0 * double(ea->correct) / double(std::max<int64_t>(1, ea->rows)),
        100.0 * double(eb->correct) / double(std::max<int64_t>(1, eb->rows)),
        static_cast<long long>(ea->correct),
        static_cast<long long>(eb->correct),
        ea->loss_sum / double(std::max<int64_t>(1, ea->rows)),
        eb->loss_sum / double(std::max<int64_t>(1, eb->rows)),
        eval_ok ? "OK" : "DIFFERENT");
  }
  std::fflush(stdout);
  if (!step_ok || !eval_ok) {
    return Internal("--compare-device: " + model.device() +
                    " and the CPU differ beyond float accuracy");
  }
  return Status::Ok();
}

}  // namespace

Status RunTrainer(const TrainerOptions& o) {
  if (o.batch < 1) return InvalidArgument("--batch: must be at least 1");
  if (o.epochs < 1) return InvalidArgument("--epochs: must be at least 1");
  if (o.threads < 1) return InvalidArgument("--threads: must be at least 1");
  if (!(o.slowdown >= 1.0)) {
    return InvalidArgument("--slowdown: must be at least 1");
  }
  if (o.chunk_rows < 0) {
    return InvalidArgument("--chunk-rows: must be >= 0");
  }
  auto device = ParseDevice(o.device, "--device");
  if (!device.ok()) return device.status();
  if (o.model == "sparse-lr") {
    if (device->kind != Device::Kind::kCpu) {
      return InvalidArgument("--device " + o.device +
                             ": sparse-lr computes on the CPU only");
    }
    if (o.evaluate_only || o.compare_device) {
      return InvalidArgument(std::string(o.evaluate_only ? "--evaluate-only"
                                                         : "--compare-device") +
                             ": dense models only");
    }
    if (o.chunk_rows > 0) {
      return InvalidArgument(
          "--chunk-rows: dense models only (LIBSVM files are streamed)");
    }
    ClientOptions co;
    co.coordinator = o.coordinator;
    co.auth_key_file = o.auth_key_file;
    co.rank = o.rank;
    co.staleness = o.staleness;
    co.name = "tether-worker sparse-lr";
    co.command = o.command;
    auto client = Client::Connect(co);
    if (!client.ok()) return client.status();
    SayResuming(**client);
    return SparseTrainer(o, **client).Run();
  }
  if (o.model != "mlp" && o.model != "softmax") {
    return InvalidArgument("--model: unknown '" + o.model +
                           "' (expected softmax, mlp or sparse-lr)");
  }
  auto hidden = ParseWidths(o.hidden);
  if (!hidden.ok()) return hidden.status();
  std::string test_spec = o.test_data;
  if (test_spec.empty() && o.data == "fashion-mnist") test_spec = o.data;
  std::optional<DenseDataset> test;
  if (!test_spec.empty()) {
    auto loaded = LoadDense(test_spec, /*train=*/false, "--test-data");
    if (!loaded.ok()) return loaded.status();
    test = std::move(*loaded);
  }
  Result<DenseDataset> train = [&]() -> Result<DenseDataset> {
    if (o.evaluate_only) return DenseDataset{};
    return LoadDense(o.data, /*train=*/true, "--data");
  }();
  if (!train.ok()) return train.status();
  const DenseDataset& shape_source = o.evaluate_only ? *test : *train;
  if (o.evaluate_only && !test) {
    return InvalidArgument("--evaluate-only: needs --test-data");
  }
  const int features = static_cast<int>(shape_source.features);
  int classes = std::max(2, shape_source.classes);
  if (test) classes = std::max(classes, test->classes);
  auto model =
      o.model == "mlp"
          ? MakeMlp(features, *hidden, classes, o.batch, o.threads, *device)
          : MakeSoftmaxRegression(features, classes, o.batch, o.threads,
                                  *device);
  if (!model.ok()) return model.status();
  // Said even with --quiet for a GPU, so a mixed cluster's logs show it.
  if (!o.quiet || device->kind != Device::Kind::kCpu) {
    std::printf("worker: %s computes on %s\n", o.model.c_str(),
                (*model)->device().c_str());
    std::fflush(stdout);
  }
  if (o.evaluate_only) return EvaluateOnly(o, **model, *test);
  if (o.compare_device) {
    auto cpu =
        o.model == "mlp"
            ? MakeMlp(features, *hidden, classes, o.batch, o.threads)
            : MakeSoftmaxRegression(features, classes, o.batch, o.threads);
    if (!cpu.ok()) return cpu.status();
    return CompareDevices(o, **model, **cpu, *train, test ? &*test : nullptr);
  }

  ClientOptions co;
  co.coordinator = o.coordinator;
  co.auth_key_file = o.auth_key_file;
  co.rank = o.rank;
  co.staleness = o.staleness;
  co.name = "tether-worker " + o.model;
  co.command = o.command;
  auto client = Client::Connect(co);
  if (!client.ok()) return client.status();
  SayResuming(**client);
  DenseTrainer trainer(o, **client, **model, *train, test ? &*test : nullptr);
  return trainer.Run();
}

}  // namespace tether
