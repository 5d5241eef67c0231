#include "worker/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>

#include "schema/flags.h"
#include "schema/log.h"
#include "schema/tls.h"
#include "schema/wire_values.h"
#include "worker/client.h"
#include "worker/dataset.h"
#include "worker/dense_trainer.h"
#include "worker/manifest.h"
#include "worker/model.h"
#include "worker/signals.h"
#include "worker/sparse_trainer.h"
#include "worker/train_step.h"
#include "worker/training_loop.h"

namespace tether {
namespace {

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

// A resumed run: says where this worker goes on from.
void SayResuming(const Client& client) {
  if (client.resume_round() < 0) return;
  std::printf("worker %d: resuming from round %lld (clock %lld)\n",
              client.rank(), static_cast<long long>(client.resume_round()),
              static_cast<long long>(client.clock()));
  std::fflush(stdout);
}

// What every client of this worker shares: where the run is and how to
// reach it (key, TLS, connect timeout).
ClientOptions ClientOptionsFor(const TrainerOptions& o) {
  ClientOptions co;
  co.coordinator = o.coordinator;
  co.auth_key_file = o.auth_key_file;
  co.tls = o.tls;
  co.connect_timeout_ms = o.connect_timeout_ms;
  // Checked by CheckTrainerOptions.
  const Result<WireDtype> dtype = ParseWireDtype(o.wire_dtype, "--wire-dtype");
  co.wire_dtype = dtype.ok() ? *dtype : WireDtype::kF32;
  co.direct_memory = o.direct_memory;
  co.rank = o.rank;
  co.staleness = o.staleness;
  co.command = o.command;
  return co;
}

// An observer's client with `model`'s tensors defined and pulled: the
// run's current weights.
Result<std::unique_ptr<Client>> PullAsObserver(const TrainerOptions& o,
                                               DenseModel& model,
                                               const std::string& name) {
  ClientOptions co = ClientOptionsFor(o);
  co.observer = true;
  co.rank = -1;
  co.command.clear();
  co.name = name;
  co.wire_dtype = WireDtype::kF32;  // the weights as they are
  TETHER_ASSIGN_OR_RETURN(auto client, Client::Connect(co));
  for (const ParamSpec& spec : model.specs()) {
    TETHER_RETURN_IF_ERROR(
        client->DefineTensor(spec.name, spec.shape, spec.init));
  }
  TETHER_RETURN_IF_ERROR(PullAll(*client, model));
  return client;
}

Status EvaluateOnly(const TrainerOptions& o, DenseModel& model,
                    const DenseDataset& test) {
  TETHER_ASSIGN_OR_RETURN(
      auto client, PullAsObserver(o, model, "tether-worker --evaluate-only"));
  TETHER_ASSIGN_OR_RETURN(
      auto r, model.Evaluate(test.x.data(), test.y.data(), test.rows));
  std::printf("test accuracy %.4f loss %.4f over %lld rows\n",
              double(r.correct) / std::max<int64_t>(1, r.rows),
              r.loss_sum / std::max<int64_t>(1, r.rows),
              static_cast<long long>(r.rows));
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
  TETHER_ASSIGN_OR_RETURN(
      auto client, PullAsObserver(o, model, "tether-worker --compare-device"));
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

// --compute-only: forward and backward over --epochs of `train` in batches
// of --batch, gathered in the shuffled order a worker alone in a run would
// take them (WorkerShare), with no client; slowdown included, as a worker
// would sleep.
Status ComputeOnly(const TrainerOptions& o, DenseModel& model,
                   const DenseDataset& train) {
  const size_t f = train.features;
  std::vector<float> x(size_t(o.batch) * f);
  std::vector<int32_t> y(o.batch);
  uint64_t samples = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    const std::vector<uint32_t> order =
        WorkerShare(train.rows, 0, 1, /*seed=*/0, epoch);
    for (size_t first = 0; first < order.size(); first += o.batch) {
      const int n = int(std::min<size_t>(o.batch, order.size() - first));
      GatherRows(train, std::span(order).subspan(first, n), x.data(), y.data());
      const auto step_start = std::chrono::steady_clock::now();
      TETHER_RETURN_IF_ERROR(model.Step(x.data(), y.data(), n).status());
      SlowDown(o.slowdown, SecondsSince(step_start));
      samples += n;
    }
  }
  const double seconds = SecondsSince(start);
  std::printf("compute-only samples/s %.0f (%llu samples in %.2f s, %s)\n",
              double(samples) / seconds,
              static_cast<unsigned long long>(samples), seconds,
              model.device().c_str());
  std::fflush(stdout);
  return Status::Ok();
}

}  // namespace

Status CheckTrainerOptions(const TrainerOptions& o) {
  if (!o.compute_only) {
    TETHER_RETURN_IF_ERROR(
        ParseHostPort(o.coordinator, "--coordinator").status());
  }
  if (o.connect_timeout_ms < 0) {
    return InvalidArgument("--connect-timeout-ms: must be >= 0");
  }
  TETHER_RETURN_IF_ERROR(CheckTlsOptions(o.tls));
  TETHER_RETURN_IF_ERROR(ParseWireDtype(o.wire_dtype, "--wire-dtype").status());
  if (o.batch < 1) return InvalidArgument("--batch: must be at least 1");
  if (o.epochs < 1) return InvalidArgument("--epochs: must be at least 1");
  if (o.threads < 1) return InvalidArgument("--threads: must be at least 1");
  if (!(o.slowdown >= 1.0)) {
    return InvalidArgument("--slowdown: must be at least 1");
  }
  if (o.chunk_rows < 0) {
    return InvalidArgument("--chunk-rows: must be >= 0");
  }
  TETHER_ASSIGN_OR_RETURN(auto device, ParseDevice(o.device, "--device"));
  if (o.model == "sparse-lr") {
    if (device.kind != Device::Kind::kCpu) {
      return InvalidArgument("--device " + o.device +
                             ": sparse-lr computes on the CPU only");
    }
    if (o.evaluate_only || o.compare_device || o.compute_only) {
      return InvalidArgument(std::string(o.evaluate_only ? "--evaluate-only"
                                         : o.compare_device
                                             ? "--compare-device"
                                             : "--compute-only") +
                             ": dense models only");
    }
    if (o.chunk_rows > 0) {
      return InvalidArgument(
          "--chunk-rows: dense models only (LIBSVM files are streamed)");
    }
    return Status::Ok();
  }
  if (o.model != "mlp" && o.model != "softmax") {
    return InvalidArgument("--model: unknown '" + o.model +
                           "' (expected softmax, mlp or sparse-lr)");
  }
  TETHER_RETURN_IF_ERROR(ParseWidths(o.hidden, "--hidden").status());
  if (o.evaluate_only && o.test_data.empty() && o.data != "fashion-mnist") {
    return InvalidArgument("--evaluate-only: needs --test-data");
  }
  return Status::Ok();
}

std::string DescribeTrainerOptions(const TrainerOptions& o) {
  std::string line = o.evaluate_only ? "evaluating" : "training";
  line += " " + o.model + " on " + o.data + " against " + o.coordinator;
  line += o.rank >= 0 ? ", rank " + std::to_string(o.rank)
                      : std::string(", rank picked by the coordinator");
  line += ", staleness " + std::to_string(o.staleness);
  line += ", " + std::to_string(o.epochs) + " epoch(s)";
  if (o.slowdown > 1) line += ", slowed " + NumberText(o.slowdown) + "x";
  if (o.wire_dtype == "bf16") line += ", bfloat16 on the wire";
  if (o.wire_dtype == "int8") line += ", int8 on the wire";
  line += o.tls.enabled() ? ", TLS" : ", plain TCP";
  if (!o.auth_key_file.empty()) line += ", key " + o.auth_key_file;
  return line;
}

// Runs `train` with `client` (a signal asks it to stop after a step), then
// leaves the run, saying why: the worker's end is final, so shard 0 stops
// counting it at once.
template <typename Train>
Status TrainThenLeave(Client& client, Train train) {
  Status trained;
  {
    StopOnSignal on_signal(client);
    trained = train();
  }
  const std::string reason = !trained.ok() ? "failed: " + trained.message()
                             : client.stop_requested() ? client.stop_reason()
                                                       : "finished its epochs";
  if (Status left = client.Leave(reason, trained.ok()); !left.ok()) {
    TETHER_LOG(kWarning) << "could not tell shard 0 this worker leaves: "
                         << left.message();
  }
  return trained;
}

Status RunTrainer(const TrainerOptions& o) {
  TETHER_RETURN_IF_ERROR(CheckTrainerOptions(o));
  TETHER_ASSIGN_OR_RETURN(auto device, ParseDevice(o.device, "--device"));
  if (o.model == "sparse-lr") {
    ClientOptions co = ClientOptionsFor(o);
    co.name = "tether-worker sparse-lr";
    if (!o.argv.empty()) co.manifest = WorkerManifest(o, o.argv);
    TETHER_ASSIGN_OR_RETURN(auto client, Client::Connect(co));
    SayResuming(*client);
    return TrainThenLeave(*client,
                          [&] { return RunSparseTrainer(o, *client); });
  }
  TETHER_ASSIGN_OR_RETURN(auto hidden, ParseWidths(o.hidden, "--hidden"));
  std::string test_spec = o.test_data;
  if (test_spec.empty() && o.data == "fashion-mnist") test_spec = o.data;
  std::optional<DenseDataset> test;
  if (!test_spec.empty()) {
    TETHER_ASSIGN_OR_RETURN(
        auto loaded, LoadDense(test_spec, /*train=*/false, "--test-data"));
    test = std::move(loaded);
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
  TETHER_ASSIGN_OR_RETURN(
      auto model,
      o.model == "mlp"
          ? MakeMlp(features, hidden, classes, o.batch, o.threads, device)
          : MakeSoftmaxRegression(features, classes, o.batch, o.threads,
                                  device));
  // Said even with --quiet for a GPU, so a mixed cluster's logs show it.
  if (!o.quiet || device.kind != Device::Kind::kCpu) {
    std::printf("worker: %s computes on %s\n", o.model.c_str(),
                model->device().c_str());
    std::fflush(stdout);
  }
  if (o.evaluate_only) return EvaluateOnly(o, *model, *test);
  if (o.compute_only) return ComputeOnly(o, *model, *train);
  if (o.compare_device) {
    TETHER_ASSIGN_OR_RETURN(
        auto cpu,
        o.model == "mlp"
            ? MakeMlp(features, hidden, classes, o.batch, o.threads)
            : MakeSoftmaxRegression(features, classes, o.batch, o.threads));
    return CompareDevices(o, *model, *cpu, *train, test ? &*test : nullptr);
  }

  ClientOptions co = ClientOptionsFor(o);
  co.name = "tether-worker " + o.model;
  if (!o.argv.empty()) co.manifest = WorkerManifest(o, o.argv);
  TETHER_ASSIGN_OR_RETURN(auto client, Client::Connect(co));
  SayResuming(*client);
  return TrainThenLeave(*client, [&] {
    return RunDenseTrainer(o, *client, *model, *train, test ? &*test : nullptr);
  });
}

}  // namespace tether
