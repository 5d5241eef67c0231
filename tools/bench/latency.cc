// tether-bench-latency: round-trip times of the smallest requests through
// a running tether cluster, as an observer (pulls never wait): a pull and a
// push of a 1-float tensor, and of 1 sparse row.
//
//   tether-bench-latency --coordinator 127.0.0.1:N --ops 20000 --dim 1
//
// Each operation is one blocking call, timed alone. Prints one line per
// kind: "latency KIND median_us X p99_us Y" (KIND: pull, push, pull_row,
// push_row).
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "schema/flags.h"
#include "tools/bench/percentiles.h"
#include "worker/client.h"

namespace {

// Times `ops` calls of `op` after `warmup` untimed ones; prints the line.
bool Measure(const char* kind, int ops, int warmup,
             const std::function<tether::Status()>& op) {
  std::vector<double> us;
  us.reserve(ops);
  for (int i = 0; i < warmup + ops; ++i) {
    const auto start = std::chrono::steady_clock::now();
    if (tether::Status s = op(); !s.ok()) {
      std::cerr << "tether-bench-latency: " << kind << ": " << s.message()
                << "\n";
      return false;
    }
    const auto end = std::chrono::steady_clock::now();
    if (i >= warmup) {
      us.push_back(
          std::chrono::duration<double, std::micro>(end - start).count());
    }
  }
  const tether::bench::Percentiles p = tether::bench::Summarize(us);
  std::printf("latency %s median_us %.1f p99_us %.1f\n", kind, p.median, p.p99);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string coordinator;
  int ops = 20000;
  int warmup = 1000;
  int dim = 1;
  int io_threads = tether::ClientOptions{}.io_threads;
  int spin_us = tether::ClientOptions{}.spin_us;
  tether::FlagParser p("tether-bench-latency",
                       "round trips of 1-float pulls and pushes");
  p.AddString("coordinator", &coordinator, "HOST:PORT of shard 0");
  p.AddInt("ops", &ops, "timed operations of each kind");
  p.AddInt("warmup", &warmup, "untimed operations of each kind first");
  p.AddInt("dim", &dim, "floats in the tensor and in the row");
  p.AddInt("io-threads", &io_threads, "the client's I/O threads");
  p.AddInt("spin-us", &spin_us,
           "how long a blocking call spins for its answer before sleeping");
  if (auto exit_code = p.ParseForMain(argc, argv)) return *exit_code;
  if (ops < 1 || dim < 1) {
    std::cerr << "tether-bench-latency: --ops and --dim must be at least 1\n";
    return 2;
  }
  tether::ClientOptions o;
  o.coordinator = coordinator;
  o.observer = true;
  o.name = "latency bench";
  o.io_threads = io_threads;
  o.spin_us = spin_us;
  auto client = tether::Client::Connect(o);
  if (!client.ok()) {
    std::cerr << "tether-bench-latency: " << client.status().message() << "\n";
    return 1;
  }
  tether::Client& c = **client;
  const uint32_t floats = static_cast<uint32_t>(dim);
  if (auto s = c.DefineTensor("latency", {floats}); !s.ok()) {
    std::cerr << "tether-bench-latency: " << s.message() << "\n";
    return 1;
  }
  if (auto s = c.DefineTable("latency_rows", floats); !s.ok()) {
    std::cerr << "tether-bench-latency: " << s.message() << "\n";
    return 1;
  }
  std::vector<float> values(floats), grad(floats, 1e-6f);
  const std::vector<uint64_t> key = {7};
  const bool ok =
      Measure("pull", ops, warmup, [&] { return c.Pull("latency", values); }) &&
      Measure("push", ops, warmup, [&] { return c.Push("latency", grad); }) &&
      Measure("pull_row", ops, warmup,
              [&] { return c.PullRows("latency_rows", key, values); }) &&
      Measure("push_row", ops, warmup,
              [&] { return c.PushRows("latency_rows", key, grad); });
  return ok ? 0 : 1;
}
