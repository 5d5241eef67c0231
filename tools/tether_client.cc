// tether-client: a small command-line client for a running tether cluster.
//
//   tether-client stats --coordinator HOST:PORT
//   tether-client pull  --coordinator HOST:PORT --tensor w --shape 4,5
//   tether-client train --coordinator HOST:PORT --tensor w --shape 1000
//                       --iterations 100 --staleness 2 [--sleep-ms 20]
//
// `train` runs a worker loop (pull, push, clock) with synthetic gradients,
// for trying a cluster by hand, demos and tests; real models train with
// tether-worker. Like tether-worker, it rides out a lost shard connection
// (the iteration in flight is repeated once the shard is back), and when
// the run is stopped (POST /api/stop) it stops before its next iteration
// and exits 0.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <numeric>
#include <sstream>
#include <thread>

#include "schema/flags.h"
#include "schema/log.h"
#include "schema/tls.h"
#include "worker/client.h"
#include "worker/training_loop.h"

namespace tether {
namespace {

struct CliOptions {
  std::string coordinator = "127.0.0.1:7070";
  std::string auth_key_file;
  TlsOptions tls;
  int connect_timeout_ms = 10000;
  std::string tensor = "w";
  std::string shape = "1024";
  std::string init = "zeros";  // zeros, uniform, normal, constant
  float init_scale = 0.0f;
  int iterations = 100;
  int staleness = 0;
  int rank = -1;
  std::string grad = "const";  // const: every element --grad-value;
                               // pattern: -(rank+1 + k%5 + i%7)
  float grad_value = 1.0f;
  int sleep_ms = 0;  // per iteration, to play a straggler
  int print = 8;     // values `pull` prints
  bool quiet = false;
};

constexpr const char* kSummary =
    "Commands:\n"
    "  stats   print every shard's counters\n"
    "  pull    pull --tensor (defining it with --shape/--init) and print it\n"
    "  train   run a worker loop of --iterations: pull, push a synthetic\n"
    "          gradient (--grad), clock; prints progress";

Result<std::vector<uint64_t>> ParseShape(const std::string& text) {
  std::vector<uint64_t> shape;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) {
    char* end = nullptr;
    unsigned long long d = std::strtoull(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || d == 0) {
      return InvalidArgument(
          "--shape: expected positive integers "
          "separated by commas, got '" +
          text + "'");
    }
    shape.push_back(d);
  }
  if (shape.empty()) return InvalidArgument("--shape: empty");
  return shape;
}

Result<Init> ParseInit(const CliOptions& o) {
  Init init;
  init.scale = o.init_scale;
  if (o.init == "zeros")
    init.kind = InitKind::kZeros;
  else if (o.init == "uniform")
    init.kind = InitKind::kUniform;
  else if (o.init == "normal")
    init.kind = InitKind::kNormal;
  else if (o.init == "constant")
    init.kind = InitKind::kConstant;
  else {
    return InvalidArgument("--init: unknown '" + o.init +
                           "' (expected zeros, uniform, normal or constant)");
  }
  return init;
}

int Fail(const Status& s) {
  std::cerr << "tether-client: " << s.message() << "\n";
  return 1;
}

int RunStats(Client& client) {
  auto stats = client.Stats();
  if (!stats.ok()) return Fail(stats.status());
  for (const ShardStats& s : *stats) {
    std::cout << "shard " << s.shard_id << ": tensors=" << s.tensors
              << " blocks=" << s.dense_blocks << " rows=" << s.sparse_rows
              << " bytes=" << s.bytes << " pushes=" << s.pushes
              << " pulls=" << s.pulls << " rejected=" << s.rejected_pushes
              << " waiting=" << s.waiting_pulls << " min_clock=" << s.min_clock
              << " clocks=[";
    for (size_t i = 0; i < s.workers.size(); ++i) {
      std::cout << (i ? "," : "") << s.workers[i].clock;
    }
    std::cout << "]\n";
  }
  return 0;
}

int RunPull(Client& client, const CliOptions& o,
            const std::vector<uint64_t>& shape, Init init) {
  if (Status s = client.DefineTensor(o.tensor, shape, init); !s.ok()) {
    return Fail(s);
  }
  uint64_t n = std::accumulate(shape.begin(), shape.end(), uint64_t{1},
                               std::multiplies<>());
  std::vector<float> values(n);
  if (Status s = client.Pull(o.tensor, values); !s.ok()) return Fail(s);
  double sum = 0;
  for (float v : values) sum += v;
  std::cout << o.tensor << " (" << n << " floats) sum=" << std::setprecision(9)
            << sum << " values:";
  for (int i = 0; i < o.print && i < static_cast<int>(n); ++i) {
    std::cout << " " << values[i];
  }
  std::cout << "\n";
  return 0;
}

// Sends the last report, whose "done" makes the dashboard show this worker
// finished, not dead, once its connection closes; the exit code.
int ReportFinished(Client& client) {
  Progress p;
  p.loss = -1;  // this tool trains no model: no loss to show
  p.done = true;
  if (Status s = client.Report(p); !s.ok()) return Fail(s);
  return 0;
}

int RunTrain(Client& client, const CliOptions& o,
             const std::vector<uint64_t>& shape, Init init) {
  if (Status s = client.DefineTensor(o.tensor, shape, init); !s.ok()) {
    return Fail(s);
  }
  uint64_t n = std::accumulate(shape.begin(), shape.end(), uint64_t{1},
                               std::multiplies<>());
  std::vector<float> weights(n), grad(n, -o.grad_value);
  auto start = std::chrono::steady_clock::now();
  for (int k = 0; k < o.iterations; ++k) {
    auto iteration = [&]() -> Status {
      TETHER_RETURN_IF_ERROR(client.Pull(o.tensor, weights));
      if (o.grad == "pattern") {
        for (uint64_t i = 0; i < n; ++i) {
          grad[i] = -static_cast<float>(client.rank() + 1 + k % 5 + i % 7);
        }
      }
      if (o.sleep_ms > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(o.sleep_ms));
      }
      TETHER_RETURN_IF_ERROR(client.Push(o.tensor, grad));
      return client.Clock();
    };
    Status s = SurvivingLostShards(client, iteration);
    const bool stopped = s.code() == Code::kCancelled;
    s = EndOfTraining(client, std::move(s));
    if (!s.ok()) return Fail(s);
    if (stopped) return ReportFinished(client);
    if (!o.quiet && (k + 1) % std::max(1, o.iterations / 10) == 0) {
      double secs = std::chrono::duration<double>(
                        std::chrono::steady_clock::now() - start)
                        .count();
      std::cout << "worker " << client.rank() << ": clock " << client.clock()
                << "/" << o.iterations << ", w[0]=" << std::setprecision(6)
                << weights[0] << ", max push staleness "
                << client.max_push_staleness() << ", " << std::fixed
                << std::setprecision(1) << (k + 1) / secs << " it/s"
                << std::defaultfloat << std::endl;
    }
  }
  std::cout << "worker " << client.rank() << ": done, " << o.iterations
            << " iterations\n";
  return ReportFinished(client);
}

int Main(int argc, char** argv) {
  CliOptions o;
  FlagParser p("tether-client COMMAND", kSummary);
  p.AddString("coordinator", &o.coordinator, "HOST:PORT of shard 0");
  p.AddString("auth-key-file", &o.auth_key_file,
              "file holding the run's shared key, when the shards have one");
  BindTlsFlags(p, &o.tls);
  p.AddInt("connect-timeout-ms", &o.connect_timeout_ms,
           "how long to keep dialling a shard that refuses, or whose host "
           "name does not resolve yet");
  p.AddString("tensor", &o.tensor, "tensor name");
  p.AddString("shape", &o.shape, "tensor shape, e.g. 784,10");
  p.AddString("init", &o.init, "zeros, uniform, normal or constant");
  p.AddFloat("init-scale", &o.init_scale,
             "uniform bound, normal stddev or "
             "the constant");
  p.AddInt("iterations", &o.iterations, "train: iterations to run");
  p.AddInt("staleness", &o.staleness, "train: SSP bound (0 BSP, -1 async)");
  p.AddInt("rank", &o.rank, "train: rank to claim (-1: any)");
  p.AddString("grad", &o.grad, "train: const or pattern");
  p.AddFloat("grad-value", &o.grad_value,
             "train: the const gradient is "
             "minus this");
  p.AddInt("sleep-ms", &o.sleep_ms, "train: sleep per iteration (straggler)");
  p.AddInt("print", &o.print, "pull: values to print");
  p.AddBool("quiet", &o.quiet, "train: no progress lines");
  if (auto exit_code =
          p.ParseForMain(argc, argv, /*positional_allowed=*/true)) {
    return *exit_code;
  }
  if (p.positional().size() != 1) {
    return Fail(InvalidArgument(
        "expected one command (stats, pull or train); see --help"));
  }
  const std::string command = p.positional()[0];
  if (command != "stats" && command != "pull" && command != "train") {
    return Fail(InvalidArgument("unknown command '" + command +
                                "' (expected stats, pull or train)"));
  }
  if (o.grad != "const" && o.grad != "pattern") {
    return Fail(InvalidArgument("--grad: expected const or pattern, got '" +
                                o.grad + "'"));
  }
  auto shape = ParseShape(o.shape);
  if (!shape.ok()) return Fail(shape.status());
  auto init = ParseInit(o);
  if (!init.ok()) return Fail(init.status());
  InitLogging("client", LogLevel::kWarning);

  ClientOptions co;
  co.coordinator = o.coordinator;
  co.auth_key_file = o.auth_key_file;
  co.tls = o.tls;
  co.connect_timeout_ms = o.connect_timeout_ms;
  co.observer = command != "train";
  co.rank = o.rank;
  co.staleness = o.staleness;
  co.name = "tether-client " + command;
  if (command == "train") co.command = ShellCommand(argc, argv);
  auto client = Client::Connect(co);
  if (!client.ok()) return Fail(client.status());
  if (command == "stats") return RunStats(**client);
  if (command == "pull") return RunPull(**client, o, *shape, *init);
  return RunTrain(**client, o, *shape, *init);
}

}  // namespace
}  // namespace tether

int main(int argc, char** argv) { return tether::Main(argc, argv); }
