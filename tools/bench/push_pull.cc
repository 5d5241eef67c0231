// tether-bench-pushpull: push+pull goodput of one dense tensor through a
// running tether cluster, as an observer (pulls never wait).
//
//   tether-bench-pushpull --coordinator 127.0.0.1:N --floats 16777216
//
// Goodput counts tensor bytes moved: each round pushes the whole tensor and
// pulls it back, 2 * 4 * floats bytes. Prints "push_pull GB/s X". With
// --push-only a round is the push alone (4 * floats bytes, the shard's
// optimizer applying it before it answers): "push GB/s X".
#include <chrono>
#include <cstdio>
#include <iostream>
#include <vector>

#include "schema/flags.h"
#include "schema/tls.h"
#include "schema/wire_values.h"
#include "worker/client.h"

int main(int argc, char** argv) {
  std::string coordinator;
  uint64_t floats = uint64_t{16} << 20;
  int rounds = 5;
  int warmup = 1;
  tether::FlagParser p("tether-bench-pushpull", "push+pull goodput");
  p.AddString("coordinator", &coordinator, "HOST:PORT of shard 0");
  std::string auth_key_file;
  p.AddString("auth-key-file", &auth_key_file, "the run's shared key");
  tether::TlsOptions tls;
  tether::BindTlsFlags(p, &tls);
  p.AddUint64("floats", &floats, "tensor size in floats");
  p.AddInt("rounds", &rounds, "timed push+pull rounds");
  p.AddInt("warmup", &warmup, "untimed rounds first");
  bool push_only = false;
  p.AddBool("push-only", &push_only, "rounds push and do not pull");
  std::string wire_dtype = "f32";
  p.AddString("wire-dtype", &wire_dtype,
              "f32, bf16 or int8 (values travel narrowed; goodput still "
              "counts 4 bytes a value)");
  if (auto exit_code = p.ParseForMain(argc, argv)) return *exit_code;
  tether::ClientOptions o;
  o.coordinator = coordinator;
  o.auth_key_file = auth_key_file;
  o.tls = tls;
  o.observer = true;
  o.name = "bench";
  auto dtype = tether::ParseWireDtype(wire_dtype, "--wire-dtype");
  if (!dtype.ok()) {
    std::cerr << "tether-bench-pushpull: " << dtype.status().message() << "\n";
    return 2;
  }
  o.wire_dtype = *dtype;
  auto client = tether::Client::Connect(o);
  if (!client.ok()) {
    std::cerr << "tether-bench-pushpull: " << client.status().message() << "\n";
    return 1;
  }
  tether::Client& c = **client;
  if (auto s = c.DefineTensor("bench", {floats}); !s.ok()) {
    std::cerr << "tether-bench-pushpull: " << s.message() << "\n";
    return 1;
  }
  std::vector<float> grad(floats, 1e-3f), weights(floats);
  auto round = [&] {
    if (auto s = c.Push("bench", grad); !s.ok() || push_only) return s;
    return c.Pull("bench", weights);
  };
  for (int i = 0; i < warmup; ++i) {
    if (auto s = round(); !s.ok()) {
      std::cerr << "tether-bench-pushpull: " << s.message() << "\n";
      return 1;
    }
  }
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < rounds; ++i) {
    if (auto s = round(); !s.ok()) {
      std::cerr << "tether-bench-pushpull: " << s.message() << "\n";
      return 1;
    }
  }
  double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  double bytes = (push_only ? 1.0 : 2.0) * sizeof(float) * floats * rounds;
  std::printf("%s GB/s %.3f\n", push_only ? "push" : "push_pull",
              bytes / secs / 1e9);
  return 0;
}
