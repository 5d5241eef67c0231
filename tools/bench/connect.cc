// tether-bench-connect: how long an observer takes to connect to every
// shard of a running cluster (TCP connects, Hellos and, with a key, the
// challenge and its proofs), then disconnect. Prints the median in ms.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <vector>

#include "schema/flags.h"
#include "schema/log.h"
#include "schema/tls.h"
#include "worker/client.h"

int main(int argc, char** argv) {
  std::string coordinator, auth_key_file;
  int times = 100;
  tether::FlagParser p("tether-bench-connect",
                       "connect + handshake time of an observer");
  p.AddString("coordinator", &coordinator, "HOST:PORT of shard 0");
  p.AddString("auth-key-file", &auth_key_file, "the run's shared key");
  tether::TlsOptions tls;
  tether::BindTlsFlags(p, &tls);
  p.AddInt("times", &times, "connections to time");
  if (auto exit_code = p.ParseForMain(argc, argv)) return *exit_code;
  tether::InitLogging("bench", tether::LogLevel::kError);
  std::vector<double> ms;
  for (int i = 0; i < times; ++i) {
    tether::ClientOptions o;
    o.coordinator = coordinator;
    o.auth_key_file = auth_key_file;
    o.tls = tls;
    o.observer = true;
    o.name = "bench";
    o.io_threads = 1;
    const auto start = std::chrono::steady_clock::now();
    auto client = tether::Client::Connect(o);
    if (!client.ok()) {
      std::cerr << "tether-bench-connect: " << client.status().message()
                << "\n";
      return 1;
    }
    ms.push_back(std::chrono::duration<double, std::milli>(
                     std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("connect ms %.3f\n", ms[ms.size() / 2]);
  return 0;
}
